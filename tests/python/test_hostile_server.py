"""The Python client against a hostile daemon: the streams of tests/fuzz/corpus/stream_reader_fuzzer
(recorded from conveyord by tests/fuzz/make_stream_corpus.py, and malformed variants of them),
which also seed the C++ reader's fuzzer and tests/server/hostile_server_test.cc.

Every well-formed stream is read to its end with all its batches; every malformed one is a
ConveyorError with the code the C++ client gives (INVALID_ARGUMENT; RESOURCE_EXHAUSTED for a
size past the client's limits; UNAVAILABLE for a call that ends OK too early), within seconds
(the fake daemon holds a call open for 10 s unless the client cancels it), never a hang and
never a silent end. Shared-memory segments that are not sealed against shrinking, or smaller
than announced, are refused before they are mapped: a daemon that truncates one cannot crash
the client with SIGBUS.
"""

import concurrent.futures
import fcntl
import os
import socket
import struct
import sys
import tempfile
import threading
import time
import unittest

BUILD = os.environ["CONVEYOR_BUILD_DIR"]
SOURCE = os.environ["CONVEYOR_SOURCE_DIR"]
sys.path.insert(0, os.path.join(BUILD, "python"))

import grpc  # noqa: E402

import conveyor  # noqa: E402
from conveyor.stream_reader import ProtocolError, StreamReader, check_descriptor  # noqa: E402
from conveyor.v1 import conveyor_pb2 as pb  # noqa: E402

CORPUS = os.path.join(SOURCE, "tests", "fuzz", "corpus", "stream_reader_fuzzer")
HOLD_SECONDS = 10


def records(name):
    """The messages of a corpus file: 4-byte little-endian lengths, each followed by its bytes."""
    with open(os.path.join(CORPUS, name), "rb") as f:
        data = f.read()
    out, at = [], 0
    while at + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, at)
        at += 4
        out.append(data[at:at + n])
        at += n
    return out


def batch_messages(recs):
    n = 0
    for r in recs:
        try:
            if pb.StreamResponse.FromString(r).HasField("batch"):
                n += 1
        except Exception:  # noqa: BLE001 (a record that does not parse is no batch)
            pass
    return n


def expected_code(name):
    """As tests/server/hostile_server_test.cc's ExpectedCode."""
    if "ok-end" in name:
        return grpc.StatusCode.UNAVAILABLE
    if name in ("bad-claims-64-gib.bin", "bad-segment-huge.bin"):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INVALID_ARGUMENT


def corpus():
    names = sorted(os.listdir(CORPUS))
    assert len(names) >= 55, names
    return names


class FakeDaemon:
    """A gRPC server whose Stream replays the records set by serve(): it ends the call with OK
    after them (finish True; None: when the last is an end of stream), else holds it open
    until the client cancels (or HOLD_SECONDS pass)."""

    def __init__(self):
        self._records, self._finish, self._abort = [], None, None
        self._lock = threading.Lock()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8), options=[
            # The daemon's keepalive settings: conveyor clients ping every few seconds.
            ("grpc.http2.min_ping_interval_without_data_ms", 1000), ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_permit_without_calls", 1)])
        handler = grpc.stream_stream_rpc_method_handler(self._stream)  # raw bytes both ways
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("conveyor.v1.Loader",
                                                                                  {"Stream": handler})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def serve(self, recs, finish=None, abort=None):
        """abort: a status code to end the call with instead of OK."""
        with self._lock:
            self._records, self._finish, self._abort = list(recs), finish, abort

    def _stream(self, requests, context):
        with self._lock:
            recs, finish, abort = self._records, self._finish, self._abort
        for r in recs:
            yield r
        if abort is not None:
            context.abort(abort, "Cancelled")
        last_is_end = False
        if recs:
            try:
                last_is_end = pb.StreamResponse.FromString(recs[-1]).HasField("end")
            except Exception:  # noqa: BLE001
                pass
        if finish or (finish is None and last_is_end):
            return
        gone = threading.Event()
        context.add_callback(gone.set)
        gone.wait(HOLD_SECONDS)

    def stop(self):
        self.server.stop(0)


def read_all(address, **kwargs):
    """(batches read, the ConveyorError or None, seconds) of one subscription without reconnects."""
    client = conveyor.Client(address, **kwargs)
    t0 = time.monotonic()
    n, error = 0, None
    try:
        for _ in client.subscribe("any", minibatch_size=1, reconnect=False):
            n += 1
    except conveyor.ConveyorError as e:
        error = e
    finally:
        client.close()
    return n, error, time.monotonic() - t0


class CorpusReaderTest(unittest.TestCase):
    """The reader alone (what the C++ fuzzer drives): every malformed stream raises while its
    messages are fed (or, for an early OK end, when the call ends), every valid one yields its
    batches, and every array of an accepted batch is readable through Batch."""

    def test_every_corpus_stream(self):
        for name in corpus():
            with self.subTest(name=name):
                recs = records(name)
                reader = StreamReader(conveyor.client.MAX_BATCH_BYTES, conveyor.client.MAX_SEGMENT_BYTES)
                batches, error = [], None
                try:
                    for r in recs:
                        kind, value = reader.feed(r)
                        if kind == "batch":
                            batches.append(value)
                    if "ok-end" in name:
                        reader.finished()
                except ProtocolError as e:
                    error = e
                if name.startswith("ok-"):
                    self.assertIsNone(error, name)
                    reader.finished()
                    self.assertEqual(len(batches), batch_messages(recs))
                    for d, buffer in batches:
                        b = conveyor.Batch(d, buffer)
                        for s in b.stream_names:
                            layout = b.layout(s)
                            if layout in ("csc", "csr"):
                                getattr(b, layout)(s)
                            elif layout == "ids":
                                b.ids(s)
                            else:
                                self.assertIsNotNone(b.dense(s))
                            b.lengths(s)
                        b.mask()
                        self.assertEqual(len(b.keys()), len(d.pieces.key))
                else:
                    self.assertIsNotNone(error, f"{name}: a malformed stream was accepted ({len(batches)} batches)")
                    self.assertTrue(str(error).startswith(("the daemon ", "batch ")), str(error))
                    self.assertEqual(error.resource, expected_code(name) == grpc.StatusCode.RESOURCE_EXHAUSTED)

    def test_non_utf8_keys_are_bytes(self):
        reader = StreamReader(conveyor.client.MAX_BATCH_BYTES, conveyor.client.MAX_SEGMENT_BYTES)
        keys = []
        for r in records("ok-non-utf8-key.bin"):
            kind, value = reader.feed(r)
            if kind == "batch":
                keys.extend(conveyor.Batch(*value).keys())
        self.assertEqual(keys, [b"m\xfcller", b"plain"])

    def test_narrowed_values_are_float16_and_bfloat16_bits(self):
        reader = StreamReader(conveyor.client.MAX_BATCH_BYTES, conveyor.client.MAX_SEGMENT_BYTES)
        kind, value = reader.feed(records("ok-narrowed.bin")[0])
        self.assertEqual(kind, "batch")
        b = conveyor.Batch(*value)
        self.assertEqual(str(b.dense("features").dtype), "float16")
        self.assertEqual(str(b.dense("labels").dtype), "uint16")
        self.assertEqual(b.dense("features").shape[0], 100)


class CompactPiecesTest(unittest.TestCase):
    """Pieces.single_sample_rows, checked as the C++ reader (DescriptorToPlan) checks it."""

    @staticmethod
    def descriptor(rows=4, pieces=4, streams=1):
        d = pb.BatchDescriptor(total_bytes=rows * 4, rows=rows, frame_mode=True, samples=rows, parts=1)
        for i in range(streams):
            s = d.streams.add(name=f"s{i}", format=pb.FORMAT_DENSE, dim=1)
            s.values.dtype = pb.DTYPE_FLOAT32
            s.values.bytes = rows * 4
            s.values.shape.extend([rows, 1])
        d.pieces.key.extend(range(100, 100 + pieces))
        d.pieces.single_sample_rows = True
        return d

    def test_keys_only_are_accepted(self):
        check_descriptor(self.descriptor())
        check_descriptor(self.descriptor(pieces=3))

    def test_the_lists_it_implies_are_refused(self):
        for field, values in (("row", [0, 1, 2, 3]), ("t0", [0] * 4), ("sample_begin", [0] * 4), ("counts", [1] * 4)):
            d = self.descriptor()
            getattr(d.pieces, field).extend(values)
            with self.assertRaisesRegex(ProtocolError, "^single-sample rows with the piece lists they imply"):
                check_descriptor(d)

    def test_more_pieces_than_rows_or_counts_than_allowed_are_refused(self):
        with self.assertRaisesRegex(ProtocolError, "^a batch of 4 rows cannot hold 5 pieces$"):
            check_descriptor(self.descriptor(pieces=5))
        d = self.descriptor(rows=8, pieces=5)
        d.steps = 2  # 16 places for pieces, but row i must be < 8 for each
        d.mask.dtype = d.flags.dtype = pb.DTYPE_UINT8
        for a in (d.mask, d.flags):
            a.bytes = 16
            a.shape.extend([8, 2])
        check_descriptor(d)
        d.pieces.key.extend(range(4))  # 9 pieces in 8 rows
        with self.assertRaisesRegex(ProtocolError, "^a piece lies outside the batch's rows$"):
            check_descriptor(d)
        d = self.descriptor(streams=2)  # a stream with no step for the pieces' one sample
        s = d.streams[1]
        s.sequence_axis, s.max_length = True, 0
        s.values.bytes = 0
        del s.values.shape[:]
        s.values.shape.extend([4, 0, 1])
        s.lengths.dtype, s.lengths.bytes = pb.DTYPE_INT32, 16
        s.lengths.shape.append(4)
        with self.assertRaisesRegex(ProtocolError, "^a piece runs past its row$"):
            check_descriptor(d)
        rows = (1 << 26) // 4096 + 1
        with self.assertRaisesRegex(ProtocolError, f"^single-sample rows implying {rows} pieces x 4096 streams"):
            check_descriptor(self.descriptor(rows=rows, pieces=rows, streams=4096))


class HostileServerTest(unittest.TestCase):
    """The whole client (Subscription) against a fake daemon replaying the corpus."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = FakeDaemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_every_corpus_stream_is_read_or_refused_within_seconds(self):
        for name in corpus():
            with self.subTest(name=name):
                recs = records(name)
                # bad-ok-end-*: the daemon ends the call with OK after the records (a silent
                # end); the others hold it open: the client must see the violation itself.
                self.daemon.serve(recs, finish=True if "ok-end" in name else None)
                n, error, seconds = read_all(self.daemon.address)
                self.assertLess(seconds, 5.0, f"{name}: the client waited for the daemon to end the call")
                if name.startswith("ok-"):
                    self.assertIsNone(error, name)
                    self.assertEqual(n, batch_messages(recs), name)
                else:
                    self.assertIsNotNone(error, f"{name}: a malformed stream was accepted ({n} batches)")
                    self.assertEqual(error.code, expected_code(name), f"{name}: {error}")

    def test_a_message_after_the_end_is_refused_and_a_call_held_open_after_it_is_not_waited_for(self):
        recs = records("ok-sparse-csc.bin")
        self.daemon.serve(recs + [recs[0]])
        n, error, seconds = read_all(self.daemon.address)
        self.assertEqual(error.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("a message after the end of the stream", str(error))
        self.assertLess(seconds, 5.0)
        # The end, then nothing, the call kept open: the data is complete, the call cancelled
        # after the grace.
        self.daemon.serve(recs, finish=False)
        n, error, seconds = read_all(self.daemon.address)
        self.assertIsNone(error)
        self.assertEqual(n, batch_messages(recs))
        self.assertLess(seconds, 5.0)

    def test_a_call_the_daemon_cancels_is_a_broken_stream(self):
        # As gRPC cancels the calls of a server shutting down: UNAVAILABLE, resumable.
        recs = records("ok-sparse-csc.bin")[:-1]  # no end of stream
        self.daemon.serve(recs, finish=True, abort=grpc.StatusCode.CANCELLED)
        n, error, _ = read_all(self.daemon.address)
        self.assertEqual(n, batch_messages(recs))
        self.assertEqual(error.code, grpc.StatusCode.UNAVAILABLE, str(error))
        self.assertIn("cancelled the stream", str(error))

    def test_a_batch_beyond_the_clients_limit_is_refused_before_allocating(self):
        recs = records("bad-claims-8-gib.bin")
        self.daemon.serve(recs)
        _, error, _ = read_all(self.daemon.address, max_batch_bytes=1 << 30)
        self.assertEqual(error.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("claims 8589934592 bytes, more than the client's limit of 1073741824", str(error))


class FdSocket:
    """A fake descriptor socket: hands `fd` to whoever connects and sends 16 bytes."""

    def __init__(self, path, fd):
        self.path = path
        self._listen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listen.bind(path)
        self._listen.listen(4)
        self._thread = threading.Thread(target=self._serve, args=(fd,), daemon=True)
        self._thread.start()

    def _serve(self, fd):
        try:
            conn, _ = self._listen.accept()
        except OSError:
            return
        with conn:
            got = b""
            while len(got) < 16:
                more = conn.recv(16 - len(got))
                if not more:
                    return
                got += more
            socket.send_fds(conn, [b"S"], [fd])

    def close(self):
        self._listen.close()
        self._thread.join(timeout=5)
        os.unlink(self.path)


def shm_stream(fd, announced, fd_socket):
    """The first batch of ok-sparse-csc.bin moved into a memfd segment: an announcement, the
    batch (shared-memory slot at offset 0) and an end."""
    batch = pb.StreamResponse.FromString(records("ok-sparse-csc.bin")[0])
    os.pwrite(fd, batch.batch.payload.data, 0)
    batch.batch.ClearField("payload")
    batch.batch.parts = 0
    batch.batch.shm.segment = 0
    batch.batch.shm.offset = 0
    segment = pb.StreamResponse()
    segment.segment.id = 0
    segment.segment.bytes = announced
    segment.segment.token = b"t" * 16
    segment.segment.fd_socket = fd_socket
    end = pb.StreamResponse(end=pb.EndOfStream(batches=1, cursor=batch.batch.cursor))
    return [segment.SerializeToString(), batch.SerializeToString(), end.SerializeToString()]


class SharedMemoryTest(unittest.TestCase):
    def test_segments_must_be_sealed_against_shrinking_and_as_large_as_announced(self):
        daemon = FakeDaemon()
        cases = [("sealed", fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW, 65536, 65536, None),
                 ("not sealed", 0, 65536, 65536, "not sealed against shrinking"),
                 ("smaller than announced", fcntl.F_SEAL_SHRINK, 4096, 65536, "has 4096 bytes, 65536 were announced")]
        try:
            with tempfile.TemporaryDirectory() as tmp:
                for what, seals, size, announced, refusal in cases:
                    with self.subTest(what=what):
                        fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
                        os.ftruncate(fd, size)
                        if seals:
                            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
                        path = os.path.join(tmp, "fd.sock")
                        sock = FdSocket(path, fd)
                        try:
                            daemon.serve(shm_stream(fd, announced, path))
                            n, error, _ = read_all(daemon.address)
                            if refusal is None:
                                self.assertIsNone(error)
                                self.assertEqual(n, 1)
                                with self.assertRaises(OSError):  # what sealing guarantees
                                    os.ftruncate(fd, 0)
                            else:
                                self.assertEqual(error.code, grpc.StatusCode.INVALID_ARGUMENT)
                                self.assertIn(refusal, str(error))
                                self.assertEqual(n, 0)
                                if not seals & fcntl.F_SEAL_SHRINK:
                                    # What a hostile daemon would do next: truncate it. The
                                    # client never mapped it, so this process lives on.
                                    os.ftruncate(fd, 0)
                        finally:
                            sock.close()
                            os.close(fd)
        finally:
            daemon.stop()


if __name__ == "__main__":
    unittest.main()
