#!/usr/bin/env python3
"""Writes tests/fuzz/corpus/stream_reader_fuzzer/: streams of StreamResponse messages as a
daemon sends them, recorded from a real conveyord, and malformed variants of them.

A file is a sequence of records, each a 4-byte little-endian length and that many bytes (a
serialized StreamResponse, or bytes that are not one). `ok-*` files are well-formed streams
that end with an end-of-stream message; `bad-*` files are not: both clients must refuse
them with an error (never hang, never end silently). The corpus seeds the libFuzzer harness
of the C++ reader (stream_reader_fuzzer) and drives a fake daemon in the C++ and Python
client tests (tests/server/hostile_server_test.cc, tests/python/test_hostile_server.py).

Run from the repository root with a build:  /usr/bin/python3 tests/fuzz/make_stream_corpus.py
(it starts build/server/conveyord on a temporary port).
"""

import os
import queue
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CONVEYOR_BUILD_DIR", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))

import grpc  # noqa: E402
from conveyor.v1 import conveyor_pb2 as pb  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fuzz", "corpus", "stream_reader_fuzzer")


def start(tmp, config, *flags):
    port_file = os.path.join(tmp, "port")
    if os.path.exists(port_file):
        os.remove(port_file)
    proc = subprocess.Popen([os.path.join(BUILD, "server", "conveyord"), config, "--listen", "127.0.0.1:0",
                             "--port-file", port_file, "--no-unix", *flags], stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(port_file):
            with open(port_file) as f:
                return proc, "127.0.0.1:" + f.read().strip()
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("conveyord did not start")


def record(address, subscribe, batches):
    """The raw messages of the first `batches` batches (parts included), acking each."""
    channel = grpc.insecure_channel(address)
    call = channel.stream_stream("/conveyor.v1.Loader/Stream", request_serializer=pb.StreamRequest.SerializeToString,
                                 response_deserializer=None)
    q = queue.Queue()
    q.put(pb.StreamRequest(subscribe=subscribe))

    def requests():
        while True:
            item = q.get()
            if item is None:
                return
            yield item

    responses = call(requests())
    out, seen, cursor = [], 0, ""
    for raw in responses:
        m = pb.StreamResponse.FromString(raw)
        if m.HasField("batch") or m.HasField("more"):
            if m.HasField("batch"):
                if seen == batches:
                    break
                seen += 1
                cursor = m.batch.cursor
                q.put(pb.StreamRequest(ack=pb.Ack(serial=m.batch.serial)))
        out.append(raw)
        if m.HasField("end"):
            break
    responses.cancel()
    q.put(None)
    channel.close()
    return out, seen, cursor


def end(batches, cursor):
    return pb.StreamResponse(end=pb.EndOfStream(cursor=cursor, batches=batches)).SerializeToString()


def write(name, records):
    with open(os.path.join(OUT, name), "wb") as f:
        for r in records:
            f.write(struct.pack("<I", len(r)))
            f.write(r)


def parse(raw):
    return pb.StreamResponse.FromString(raw)


def edit(records, index, change):
    """records with message `index` parsed, changed by change(message), serialized again."""
    m = parse(records[index])
    change(m)
    return records[:index] + [m.SerializeToString()] + records[index + 1:]


def batch_indices(records):
    return [i for i, r in enumerate(records) if parse(r).HasField("batch")]


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    examples = os.path.join(ROOT, "examples", "conveyor.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        proc, address = start(tmp, examples, "--inline-part-bytes", "4096")
        try:
            sparse, n, cursor = record(address, pb.Subscribe(dataset="sparse", minibatch_size=8), 3)
            sparse_ok = sparse + [end(n, cursor)]
            dense = pb.Subscribe(dataset="sparse", minibatch_size=1, frame_mode=True)
            dense.layouts["words"] = pb.LAYOUT_DENSE
            parts, pn, pcursor = record(address, dense, 2)  # 20 KB batches: 5 parts of 4096 bytes
            parts_ok = parts + [end(pn, pcursor)]
            csr = pb.Subscribe(dataset="sequences", minibatch_size=20)
            csr.layouts["word"] = pb.LAYOUT_CSR
            csr_records, cn, ccursor = record(address, csr, 2)
            bptt, bn, bcursor = record(address, pb.Subscribe(dataset="sequences", minibatch_size=20, truncation=5,
                                                             parallel=2), 2)
            simple, sn, scursor = record(address, pb.Subscribe(dataset="simple", minibatch_size=500, epochs=1), 5)
            narrow = pb.Subscribe(dataset="simple", minibatch_size=100)
            narrow.dtypes["features"] = pb.DTYPE_FLOAT16
            narrow.dtypes["labels"] = pb.DTYPE_BFLOAT16
            narrowed, nn, ncursor = record(address, narrow, 2)
        finally:
            proc.terminate()
            proc.wait()
        kaldi_dir = os.path.join(tmp, "kaldi")
        os.makedirs(kaldi_dir)
        with open(os.path.join(kaldi_dir, "feats.ark"), "wb") as f:
            f.write(b"m\xfcller  [\n  1 2\n  3 4 ]\nplain  [\n  5 6 ]\n")
        config = os.path.join(kaldi_dir, "kaldi.yaml")
        with open(config, "w") as f:
            f.write('datasets:\n  speech:\n    randomize: false\n    deserializers:\n      - type: KaldiTable\n'
                    '        rspecifier: "ark:feats.ark"\n        input: {features: {dim: 2}}\n')
        proc, address = start(tmp, config)
        try:
            kaldi, kn, kcursor = record(address, pb.Subscribe(dataset="speech", minibatch_size=10), 5)
        finally:
            proc.terminate()
            proc.wait()

    write("ok-sparse-csc.bin", sparse_ok)
    write("ok-dense-parts.bin", parts_ok)
    write("ok-csr.bin", csr_records + [end(cn, ccursor)])
    write("ok-bptt.bin", bptt + [end(bn, bcursor)])
    write("ok-simple-whole-stream.bin", simple)  # the daemon's own end
    write("ok-non-utf8-key.bin", kaldi)
    write("ok-narrowed.bin", narrowed + [end(nn, ncursor)])

    first = sparse_ok[0]
    b0 = batch_indices(sparse_ok)
    pb0 = batch_indices(parts_ok)
    # Messages that are empty, stray, misplaced or late.
    write("bad-empty-message.bin", sparse_ok[:1] + [b""] + sparse_ok[1:])
    stray = pb.StreamResponse()
    stray.more.serial = 0
    stray.more.payload.offset = 0
    stray.more.payload.data = b"x" * 16
    write("bad-stray-part.bin", [stray.SerializeToString()] + sparse_ok)
    write("bad-message-after-end.bin", sparse_ok + [first])
    write("bad-unparsable.bin", sparse_ok[:1] + [b"\xff\xff\xff\xff\x0f"] + sparse_ok[1:])
    write("bad-truncated-message.bin", [first[:len(first) // 2]])
    # The end in the wrong place, or missing.
    write("bad-ok-end-without-end-message.bin", sparse)
    write("bad-ok-end-mid-batch.bin", parts[:pb0[1] + 2])
    write("bad-end-mid-batch.bin", parts[:pb0[1] + 2] + [end(1, "")])
    write("bad-end-count.bin", sparse + [end(n + 1, cursor)])
    # Serials: duplicates, gaps.
    write("bad-duplicate-serial.bin", [sparse_ok[0], sparse_ok[0]] + sparse_ok[1:])
    write("bad-serial-gap.bin", [sparse_ok[0]] + sparse_ok[2:])
    write("bad-serial-starts-at-one.bin", edit(sparse_ok, 0, lambda m: setattr(m.batch, "serial", 1)))
    # Parts out of order, of another batch, overlapping, empty, too many, too few.
    more = [i for i, r in enumerate(parts_ok) if parse(r).HasField("more")]
    swapped = list(parts_ok)
    swapped[more[0]], swapped[more[1]] = swapped[more[1]], swapped[more[0]]
    write("bad-parts-out-of-order.bin", swapped)
    write("bad-part-of-another-batch.bin", edit(parts_ok, more[0], lambda m: setattr(m.more, "serial", 7)))
    write("bad-part-overlapping.bin", edit(parts_ok, more[1], lambda m: setattr(m.more.payload, "offset", 0)))
    write("bad-part-empty.bin", edit(parts_ok, more[0], lambda m: setattr(m.more.payload, "data", b"")))
    write("bad-part-too-long.bin", edit(parts_ok, more[-1], lambda m: setattr(m.more.payload, "data",
                                                                                m.more.payload.data + b"\0" * 300)))
    write("bad-parts-count-too-high.bin", edit(parts_ok, pb0[0], lambda m: setattr(m.batch, "parts", 9)))
    write("bad-parts-zero.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch, "parts", 0)))
    # Sizes: a batch claiming 8 GiB (it would be refused past a client limit; here its
    # first part does not fit it either), and one past the 16 GiB limit.
    write("bad-claims-8-gib.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch, "total_bytes", 8 << 30)))
    write("bad-claims-64-gib.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch, "total_bytes", 64 << 30)))
    write("bad-cursor-too-long.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch, "cursor", "c" * 5000)))

    # Descriptors: arrays, shapes, pieces, enums.
    def set_array(stream, array, attr, value):
        def change(m):
            setattr(getattr(m.batch.streams[stream], array), attr, value)
        return change

    write("bad-array-outside.bin", edit(sparse_ok, b0[0], set_array(0, "values", "offset", 1 << 40)))
    write("bad-array-shape.bin", edit(sparse_ok, b0[0], lambda m: m.batch.streams[0].colptr.shape.append(2)))
    write("bad-array-dtype.bin", edit(sparse_ok, b0[0], set_array(0, "colptr", "dtype", 9)))
    write("bad-array-wrong-dtype.bin", edit(sparse_ok, b0[0], set_array(0, "rowind", "dtype", pb.DTYPE_FLOAT32)))
    write("bad-format.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch.streams[0], "format", 7)))
    write("bad-layout.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch.streams[0], "layout", 9)))
    write("bad-precision.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch, "precision", 5)))
    write("bad-rows.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch, "rows", m.batch.rows + 1)))
    write("bad-nnz.bin", edit(sparse_ok, b0[0], lambda m: setattr(m.batch.streams[0], "nnz", m.batch.streams[0].nnz + 1)))
    write("bad-piece-row.bin", edit(sparse_ok, b0[0], lambda m: m.batch.pieces.row.__setitem__(0, 1000)))
    write("bad-piece-lists.bin", edit(sparse_ok, b0[0], lambda m: m.batch.pieces.key.append(5)))
    write("bad-piece-counts.bin", edit(sparse_ok, b0[0], lambda m: m.batch.pieces.counts.__setitem__(0, 1 << 20)))
    write("bad-piece-t0.bin", edit(csr_records, batch_indices(csr_records)[0],
                                   lambda m: m.batch.pieces.t0.__setitem__(0, 1 << 30)) + [end(cn, ccursor)])
    write("bad-too-many-pieces.bin", edit(sparse_ok, b0[0], lambda m: (
        m.batch.pieces.key.extend([1] * 100), m.batch.pieces.row.extend([0] * 100), m.batch.pieces.t0.extend([0] * 100),
        m.batch.pieces.sample_begin.extend([0] * 100), m.batch.pieces.counts.extend([0] * 200))))
    ni = batch_indices(narrowed)[0]
    # float16 values in a double-precision batch (narrowing is from float32 only), and
    # float16 values half the size the stream's dim implies.
    write("bad-narrowed-double.bin", edit(narrowed, ni, lambda m: setattr(m.batch, "precision", pb.PRECISION_DOUBLE))
          + [end(nn, ncursor)])
    write("bad-narrowed-dim.bin", edit(narrowed, ni, lambda m: setattr(m.batch.streams[0], "dim",
                                                                         m.batch.streams[0].dim * 2)) + [end(nn, ncursor)])
    write("bad-mask.bin", edit(bptt, batch_indices(bptt)[0], lambda m: setattr(m.batch.mask, "dtype", pb.DTYPE_INT32)))
    write("bad-lengths-dtype.bin", edit(bptt, batch_indices(bptt)[0], set_array(0, "lengths", "dtype", pb.DTYPE_UINT8)))

    # Bytes a reader indexes with: pointers and indices, lengths.
    def corrupt(records, index, array, value, fmt="<i"):
        m = parse(records[index])
        ref = getattr(m.batch.streams[0], array)
        data = bytearray(m.batch.payload.data)
        if ref.offset + 4 > len(data):
            raise RuntimeError("the array is not in the first part")
        struct.pack_into(fmt, data, ref.offset + (4 if array == "colptr" else 0), value)
        m.batch.payload.data = bytes(data)
        return records[:index] + [m.SerializeToString()] + records[index + 1:]

    write("bad-colptr-decreasing.bin", corrupt(sparse_ok, b0[0], "colptr", -5))
    write("bad-rowind-out-of-range.bin", corrupt(sparse_ok, b0[0], "rowind", 5000))
    write("bad-rowind-negative.bin", corrupt(sparse_ok, b0[0], "rowind", -1))
    ci = batch_indices(csr_records)[0]
    write("bad-rowptr.bin", corrupt(csr_records, ci, "rowptr", 1 << 30) + [end(cn, ccursor)])
    write("bad-length-past-t.bin", corrupt(csr_records, ci, "lengths", 1000) + [end(cn, ccursor)])
    # Shared memory and CUDA IPC references that do not hold.
    write("bad-shm-unknown-segment.bin", edit(sparse_ok, b0[0], lambda m: (
        m.batch.ClearField("payload"), setattr(m.batch, "parts", 0), m.batch.shm.SetInParent())))
    write("bad-two-places.bin", edit(sparse_ok, b0[0], lambda m: m.batch.shm.SetInParent()))
    seg = pb.StreamResponse()
    seg.segment.id = 0
    seg.segment.bytes = 4096
    seg.segment.token = b"t" * 15
    seg.segment.fd_socket = "/nonexistent.fd"
    write("bad-segment-token.bin", [seg.SerializeToString()] + sparse_ok)
    seg.segment.token = b"t" * 16
    seg.segment.bytes = 1 << 50
    write("bad-segment-huge.bin", [seg.SerializeToString()] + sparse_ok)
    cuda = pb.StreamResponse()
    cuda.cuda_segment.id = 0
    cuda.cuda_segment.bytes = 4096
    cuda.cuda_segment.handle = b"h" * 63
    cuda.cuda_segment.device_uuid = b"u" * 16
    write("bad-cuda-segment-handle.bin", [cuda.SerializeToString()] + sparse_ok)
    print(f"{len(os.listdir(OUT))} files in {OUT}")


if __name__ == "__main__":
    main()
