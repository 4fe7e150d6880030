"""The conveyor client: connect, subscribe, iterate batches as numpy views.

The daemon is treated as untrusted, with the C++ client's checks (conveyor.stream_reader):
sizes bounded by the client's limits, serials, parts, arrays, shapes, pieces, lengths and
pointers checked before a batch is handed out, and a malformed stream is a ConveyorError
(never a hang, never a silent end); shared-memory segments must be sealed against
shrinking. Keepalive pings notice a frozen or vanished daemon within seconds, and a stream
that receives nothing for `idle_timeout` seconds is treated as broken: both resume from the
last cursor on the next daemon.
"""

import collections
import fcntl
import mmap
import os
import queue
import socket
import stat
import sys
import threading
import time
import weakref

import grpc
import numpy as np

from conveyor import cuda_ipc
from conveyor.stream_reader import ProtocolError, StreamReader, check_bytes, stream_layout
from conveyor.v1 import conveyor_pb2 as pb
from conveyor.v1 import conveyor_pb2_grpc as pb_grpc

MAX_BATCH_BYTES = 16 << 30  # the daemon's own limit on a batch
MAX_SEGMENT_BYTES = 1 << 40
_STREAM = "/conveyor.v1.Loader/Stream"
_END_GRACE = 2.0  # seconds the call may stay open after the end of the stream (the daemon ends it at once)

_DTYPES = {
    pb.DTYPE_FLOAT32: np.float32,
    pb.DTYPE_FLOAT64: np.float64,
    pb.DTYPE_INT32: np.int32,
    pb.DTYPE_INT64: np.int64,
    pb.DTYPE_UINT8: np.uint8,
    pb.DTYPE_FLOAT16: np.float16,
    pb.DTYPE_BFLOAT16: np.uint16,  # bfloat16 bits (numpy has no bfloat16; conveyor.torch views them as one)
}


class ConveyorError(RuntimeError):
    """A stream or call failed; `code` is the gRPC status code, `cursor` the last one received."""

    def __init__(self, code, message, cursor=""):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.cursor = cursor


def _hint(address, code, details, tls=False, received=False):
    """What a person can do about the usual failures of a call to `address` ("" when nothing
    useful can be said), as `conveyor` says it. `tls`: the client connects with TLS;
    `received`: the call had delivered something before it failed."""
    text = (details or "").lower()  # OpenSSL's "wrong version number", BoringSSL's WRONG_VERSION_NUMBER

    def says(*words):
        return any(w in text for w in words)

    first = address.split(",")[0]
    if code == grpc.StatusCode.UNAVAILABLE:
        if says("wrong version number", "wrong_version_number"):
            return "; the daemon does not serve TLS there: connect without root_certificates"
        if says("certificate verify failed", "certificate_verify_failed", "unknown ca"):
            return ("; the daemon's certificate is not signed by root_certificates: give the CA that signed its "
                    "--tls-cert")
        if says("not in peer certificate", "no match found for server name"):
            return "; its certificate is for another name: pass that name as server_name"
        if says("ssl", "handshake"):
            return "; TLS did not start: check root_certificates and server_name against the daemon's --tls-cert"
        if says("socket closed", "connection reset"):
            if received or tls:
                return "; the connection broke (was the daemon stopped or restarted?)"
            return "; the daemon closed the connection at once: one serving TLS is reached with root_certificates"
        if says("dns resolution failed"):
            return "; the host name does not resolve"
        if says("failed to connect"):
            return "; is conveyord running and listening there?" + ("" if tls else f" ('conveyor health {first}' asks it)")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return ("; pass the daemon's token (Client(..., token=...); a wrong one is refused alike), or connect "
                "through its unix socket")
    return ""


class Batch:
    """One minibatch. Arrays are views (no copy) into the batch's buffer: a writable bytearray
    (inline transport), or the daemon's shared-memory slot (read-only; valid until the next
    batch is asked for, which acknowledges this one and lets the daemon reuse the slot)."""

    def __init__(self, descriptor, buffer, block=None, offset=0):
        self.descriptor = descriptor
        self.buffer = buffer  # bytearray of descriptor.total_bytes (None for a device batch)
        self._streams = {s.name: s for s in descriptor.streams}
        # transport="cuda": the batch lies in the daemon's device memory, in `block` at
        # `offset`; arrays are torch CUDA tensors over it (no copy).
        self._block = block
        self._offset = offset
        self._event = None

    @property
    def on_device(self):
        return self._block is not None

    @property
    def device(self):
        """The CUDA device (this process's ordinal) of a device batch, else None."""
        return self._block.device if self._block is not None else None

    def release(self, stream=None):
        """A device batch: say the work reading it is queued on `stream` (default: the
        device's current torch stream). The subscription acknowledges the batch, letting the
        daemon reuse its slot, only once that work has completed (an event recorded now).
        Without release(), the event is recorded on the current stream when the next batch
        is asked for. Acks never wait while the daemon still has a free slot."""
        if self._block is None:
            return
        import torch
        self._event = torch.cuda.Event()
        self._event.record(stream or torch.cuda.current_stream(self._block.device))

    def _mark_released(self):
        """Handed back (the next batch was asked for): without release(), the work queued
        on the device's current stream so far is taken to be its readers."""
        if self._block is not None and self._event is None:
            self.release()

    def _released(self):
        return self._event is None or self._event.query()

    def _wait_released(self):
        if self._event is not None:
            self._event.synchronize()

    epoch = property(lambda self: self.descriptor.epoch)
    index = property(lambda self: self.descriptor.batch)
    cursor = property(lambda self: self.descriptor.cursor)
    rows = property(lambda self: self.descriptor.rows)
    samples = property(lambda self: self.descriptor.samples)
    end_of_epoch = property(lambda self: self.descriptor.end_of_epoch)
    # Pieces of this batch left out because their sequence was dropped as bad input (the
    # dataset's maxErrors): whole sequences, frames in frame mode, fragments in truncated BPTT
    # (so many rows fewer, or gaps).
    dropped = property(lambda self: self.descriptor.dropped)

    @property
    def stream_names(self):
        return list(self._streams)

    def keys(self):
        """The sequence keys, one per piece (row order as the daemon placed them): the numeric
        ids of CTF/CBF datasets (ints), the utterance ids of Kaldi/HTK ones as the bytes written
        (`bytes`: they need not be UTF-8; `conveyor dump` prints a byte that is not as \\udcXX,
        so json.loads(line)["key"].encode("utf-8", "surrogateescape") equals the key)."""
        if len(self.descriptor.pieces.name):
            return list(self.descriptor.pieces.name)
        return list(self.descriptor.pieces.key)

    def _array(self, ref):
        if self._block is not None:
            return cuda_ipc.tensor(self._block, self._offset, ref)
        if len(ref.shape) == 0:
            return None
        dtype = _DTYPES[ref.dtype]
        count = 1
        for d in ref.shape:
            count *= d
        end = ref.offset + count * np.dtype(dtype).itemsize  # checked before any view is made
        if end > len(self.buffer) or end - ref.offset != ref.bytes:
            raise ConveyorError(grpc.StatusCode.INVALID_ARGUMENT, "an array lies outside the batch")
        return np.frombuffer(self.buffer, dtype=dtype, count=count, offset=ref.offset).reshape(tuple(ref.shape))

    def _stream(self, name):
        try:
            return self._streams[name]
        except KeyError:
            raise KeyError(f"no stream {name!r} in this batch (streams: {', '.join(self._streams)})") from None

    def layout(self, name):
        """How the stream was delivered: "dense", "csc", "csr" or "ids"."""
        return stream_layout(self._stream(name))

    def dense(self, name):
        """Dense values: [rows, T, dim] (sequence mode) or [rows, dim] (frame mode). Also a
        sparse stream subscribed with layouts={name: "dense"}."""
        s = self._stream(name)
        if self.layout(name) != "dense":
            raise ValueError(f"stream {name!r} was delivered as {self.layout(name)} (use {self.layout(name)}())")
        return self._array(s.values)

    def ids(self, name):
        """An ids stream (format: ids, e.g. Kaldi alignments): int32 [rows, T] (sequence
        mode, padding 0: see lengths()) or [rows] (frame mode)."""
        s = self._stream(name)
        if s.format != pb.FORMAT_IDS:
            raise ValueError(f"stream {name!r} was delivered as {self.layout(name)} (use {self.layout(name)}())")
        a = self._array(s.values)
        if self._block is not None:
            return a
        if a is None or a.dtype != np.int32:
            raise ConveyorError(grpc.StatusCode.INVALID_ARGUMENT, "ids must be int32")
        return a

    def lengths(self, name):
        """int32[rows]: valid steps per row (None in frame mode)."""
        return self._array(self._stream(name).lengths)

    def _compressed(self, name, layout, ptr_ref, ind_ref, outer, inner):
        """(ptr, ind, values) of a CSC or CSR stream, checked so that indexing is safe."""
        s = self._stream(name)
        if self.layout(name) != layout:
            raise ValueError(f"stream {name!r} was delivered as {self.layout(name)} (use {self.layout(name)}())")
        ptr, ind, values = self._array(ptr_ref(s)), self._array(ind_ref(s)), self._array(s.values)
        if self._block is not None:  # device memory: assembled and checked by the daemon's CUDA assembler
            return ptr, ind, values
        if len(ptr) != outer + 1 or ptr[0] != 0 or ptr[-1] != len(values) or (np.diff(ptr) < 0).any():
            raise ConveyorError(grpc.StatusCode.INVALID_ARGUMENT, f"bad {layout.upper()} pointers")
        if len(ind) and (ind.min() < 0 or ind.max() >= inner):
            raise ConveyorError(grpc.StatusCode.INVALID_ARGUMENT, f"{layout.upper()} index out of range")
        return ptr, ind, values

    def _columns(self, name):
        s = self._stream(name)
        return self.descriptor.rows * (s.max_length if s.sequence_axis else 1)

    def csc(self, name):
        """Sparse CSC, one column per (row, step): (colptr, rowind, values, (dim, columns))."""
        dim, columns = self._stream(name).dim, self._columns(name)
        colptr, rowind, values = self._compressed(name, "csc", lambda s: s.colptr, lambda s: s.rowind, columns, dim)
        return colptr, rowind, values, (dim, columns)

    def csr(self, name):
        """A sparse stream subscribed with layouts={name: "csr"}: the same dim x columns
        matrix by rows: (rowptr, colind, values, (dim, columns))."""
        dim, columns = self._stream(name).dim, self._columns(name)
        rowptr, colind, values = self._compressed(name, "csr", lambda s: s.rowptr, lambda s: s.colind, dim, columns)
        return rowptr, colind, values, (dim, columns)

    def mask(self):
        """Truncated BPTT: uint8[rows, T] (1 valid) and flags (bit 0 begin, bit 1 end), else None."""
        return self._array(self.descriptor.mask), self._array(self.descriptor.flags)


class _Watchdog:
    """One thread per subscription that cancels a wait past its deadline (a timer thread per
    message cost more than the rest of the client's per-batch work together)."""

    def __init__(self, callback):
        self._callback = callback  # a WeakMethod: the watchdog does not keep its subscription
        self._cv = threading.Condition()
        self._deadline = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="conveyor-idle-deadline", daemon=True)
        self._thread.start()

    def arm(self, timeout):
        with self._cv:
            self._deadline = time.monotonic() + timeout
            self._cv.notify()

    def disarm(self):
        with self._cv:
            self._deadline = None

    def stop(self):
        with self._cv:
            self._stopped = True
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._stopped:
                    if self._deadline is None:
                        self._cv.wait()
                        continue
                    remaining = self._deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cv.wait(remaining)
                if self._stopped:
                    return
                self._deadline = None
            callback = self._callback()
            if callback is None:  # the subscription is gone
                return
            callback()
            del callback


# Subscriptions of this process with a call in flight, all subscriptions, and all clients
# (see _before_fork).
_IN_FLIGHT = weakref.WeakSet()
_SUBSCRIPTIONS = weakref.WeakSet()
_CLIENTS = weakref.WeakSet()
# Held from just before a fork until it is done (in the parent), so that no thread opens a
# channel meanwhile.
_FORK_LOCK = threading.Lock()
# The GIL's switch interval while a fork is under way when gRPC's child handler could not be
# kept from running Python (see _before_fork), and the one before.
_FORK_SWITCH_INTERVAL = 0.05
_switch_interval = None


class _GrpcChildHandlerGuard:
    """Keeps gRPC's fork handler from running Python code in a forked child.

    gRPC Python (1.51 here) registers its fork handlers with pthread_atfork when its first
    channel is made. The child's handler runs inside fork(), before the interpreter has
    re-initialized its GIL for the child, and it runs Python code there (threading.Condition(),
    time.sleep()). If another thread of the parent was asking for the GIL when the fork copied
    the process, the child's eval loop honours that inherited request: it hands the GIL to a
    thread that does not exist in the child and waits forever (gdb: inside os.fork(), in
    cygrpc's handler, on the GIL's switch condition). Raising the switch interval around the
    fork only narrows that window (forks of a 3 GB trainer beside busy threads: 1 child of
    300 and 5 of 500 still hung; 0 of 1000 with this guard), so the handler is kept from
    running any Python at all:

    - its first statement returns when `cygrpc._fork_handler_failed` is true (the flag gRPC's
      prepare handler sets when it could not stop its threads), a module global read without
      running Python code;
    - a prepare handler of ours, registered with pthread_atfork before gRPC registers its own
      (so run after gRPC's prepare, which clears the flag: prepare handlers run in reverse
      order), sets the flag right before the fork;
    - in the child, after the interpreter is whole again (os.register_at_fork's after_in_child),
      `after_fork_in_child` does what gRPC's handler would have done: new locks and thread
      counts, the reset of calls that were waiting for the fork, the next fork epoch, its
      channels closed, the fork over. (Its last step, waiting up to 1.5 s for gRPC's core to
      shut down, is not needed: conveyor's own calls and channels ended before the fork, and
      gRPC's core restarts its threads in the child in a C handler of its own.)

    Installed only where gRPC has fork support on, has these internals, and has not registered
    its handlers yet (a channel made before conveyor was imported): otherwise `active` is false
    and forks fall back to the switch-interval guard of _before_fork.
    """

    _STATE = ("fork_handler_registered", "fork_in_progress_condition", "fork_in_progress", "active_thread_count",
              "postfork_states_to_reset", "fork_epoch", "channels")

    def __init__(self):
        self.active = False
        self.cygrpc = None
        self._callback = None
        try:
            import ctypes
            from grpc._cython import cygrpc
        except ImportError:
            return
        state = getattr(cygrpc, "_fork_state", None)
        if (not getattr(cygrpc, "is_fork_support_enabled", lambda: False)() or state is None
                or not hasattr(cygrpc, "_fork_handler_failed") or not hasattr(cygrpc, "_ActiveThreadCount")
                or not all(hasattr(state, a) for a in self._STATE) or state.fork_handler_registered):
            return
        try:
            register = getattr(ctypes.CDLL(None), "__register_atfork")  # what pthread_atfork calls (glibc)
        except AttributeError:
            return
        register.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        register.restype = ctypes.c_int
        self.cygrpc = cygrpc
        self._active_thread_count = cygrpc._ActiveThreadCount  # as loaded, whatever replaces it later
        self._callback = ctypes.CFUNCTYPE(None)(self._prepare)
        # glibc keeps the handler for the life of the process: its code must outlive this
        # object and the interpreter's teardown of this module (a fork then would call freed
        # memory), so it is given a reference that is never dropped.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._callback))
        self.active = register(ctypes.cast(self._callback, ctypes.c_void_p), None, None, None) == 0

    def _prepare(self):
        # Runs in the parent, last of the prepare handlers, right before the fork: gRPC's
        # prepare handler has just cleared the flag.
        self.cygrpc._fork_handler_failed = True

    def after_fork_in_parent(self):
        self.cygrpc._fork_handler_failed = False

    def after_fork_in_child(self):
        # The flag stays set until the next fork's prepare handler clears it: a gRPC whose
        # child handler is a Python one (registered with os.register_at_fork, run after this
        # one) finds it too, and leaves the child as this left it.
        cygrpc = self.cygrpc
        state = cygrpc._fork_state
        if not cygrpc._fork_handler_failed or not state.fork_handler_registered:
            return  # gRPC's handler ran (or there is none): nothing was left undone
        state.fork_in_progress_condition = threading.Condition()
        state.active_thread_count = self._active_thread_count()
        for reset in state.postfork_states_to_reset:
            reset.reset_postfork_child()
        state.postfork_states_to_reset = []
        state.fork_epoch += 1
        for channel in list(state.channels):
            channel._close_on_fork()
        with state.fork_in_progress_condition:
            state.fork_in_progress = False


_GRPC_FORK_GUARD = _GrpcChildHandlerGuard()


def _before_fork():
    """Makes a fork safe for gRPC (DataLoader workers fork the trainer).

    - every call of this process ends (its subscription resumes at its cursor with the next
      batch, exactly as after a broken connection) and every client closes its channels
      (reopened when next used, in the parent and the child alike): the child inherits no
      call, and gRPC's prepare handler finds none of our threads to wait for;
    - gRPC's child handler runs no Python code (_GrpcChildHandlerGuard): a child forked by
      Python (os.fork, multiprocessing, DataLoader workers) can no longer hang inside the fork
      on a request for the GIL inherited from another thread. (A fork() called from C by a
      thread without the GIL can still hang in that handler's first step, taking the GIL,
      as before: nothing of conveyor's runs early enough to prevent it.)
    - where that guard could not be installed, the switch interval is raised to 50 ms for the
      length of the fork, and this thread gives up the GIL once and takes it back: taking it
      clears any pending request, and no other thread asks again before an interval has
      passed (narrows the window only: 11 of 300 children hung before, 0 of 400 after, with
      a thread spinning in Python beside small forks).
    """
    global _switch_interval
    for sub in list(_IN_FLIGHT):
        sub._end_call()
    for client in list(_CLIENTS):
        client._disconnect()
    _FORK_LOCK.acquire()
    if not _GRPC_FORK_GUARD.active:
        if _switch_interval is None:
            _switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(max(_switch_interval, _FORK_SWITCH_INTERVAL))
        time.sleep(0)  # releases the GIL and takes it again: no request is pending now


def _restore_switch_interval():
    global _switch_interval
    if _switch_interval is not None:
        sys.setswitchinterval(_switch_interval)
        _switch_interval = None


def _after_fork_in_parent():
    _restore_switch_interval()
    if _GRPC_FORK_GUARD.active:
        _GRPC_FORK_GUARD.after_fork_in_parent()
    _FORK_LOCK.release()


def _after_fork_in_child():
    global _FORK_LOCK
    _restore_switch_interval()
    _FORK_LOCK = threading.Lock()
    for client in list(_CLIENTS):
        client._lock = threading.Lock()
        client._channels = client._stubs = None  # another thread's, opened after _before_fork
    for sub in list(_SUBSCRIPTIONS):
        sub._watchdog = None  # its thread stayed in the parent
        sub._responses = None
    _IN_FLIGHT.clear()
    if _GRPC_FORK_GUARD.active:
        try:
            _GRPC_FORK_GUARD.after_fork_in_child()
        except BaseException as e:  # noqa: BLE001 (os.register_at_fork would swallow it)
            # gRPC's state in this child is half reset: exit as gRPC's own handler does in
            # that case, rather than leave a worker that hangs on its first call.
            sys.stderr.write(f"conveyor: gRPC could not be reset after a fork ({e!r}); the child exits\n")
            sys.stderr.flush()
            os._exit(os.EX_USAGE)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


class Subscription:
    """An iterator of Batch. Each batch is acknowledged when the next one is asked for."""

    def __init__(self, client, subscribe, reconnect=True, max_reconnects=5, first=0, idle_timeout=60.0):
        self._client = client  # its channels: one per daemon address; a failed daemon's stream resumes on the next
        self._current = first
        self._subscribe = subscribe
        self._reconnect = reconnect
        self._max_reconnects = max_reconnects
        self._idle_timeout = idle_timeout
        self._cursor = subscribe.resume_cursor
        self._requests = None
        self._responses = None
        self._reader = None
        self._pending_ack = None
        self._done = False
        self._reconnects = 0
        self._segments = {}  # shared memory: id -> mmap
        self._blocks = {}  # CUDA IPC: id -> cuda_ipc.Block
        self._held = None  # the device batch handed out last (acked once its readers finish)
        # Device batches given back but whose readers may still run: (serial, batch), oldest
        # first. Each is acked once its event completes, so the GPU keeps working on batch k
        # while the daemon refills the slots of the batches before it.
        self._releasing = collections.deque()
        self._credits = subscribe.initial_credits or 4
        self._idle = False
        self._watchdog = None  # the idle deadline's thread, started with the first wait
        _SUBSCRIPTIONS.add(self)

    @property
    def cursor(self):
        """The cursor of the last batch handed out ('' before the first)."""
        return self._cursor

    @property
    def address_index(self):
        """Which of the client's addresses the stream is on."""
        return self._current

    def _open(self):
        self._segments = {}  # a new stream announces its own segments
        cuda_ipc.wait_released(held for _, held in self._releasing)  # readers of the old blocks first
        self._blocks = {}
        self._reader = StreamReader(self._client.max_batch_bytes, self._client.max_segment_bytes)
        self._requests = queue.Queue()
        first = pb.StreamRequest()
        first.subscribe.CopyFrom(self._subscribe)
        if self._cursor and self._cursor != self._subscribe.resume_cursor:
            # Resumed after the last batch handed out: the resumed stream starts at the batch
            # after it, so this subscription's next batch (`stride` batches on) is at offset
            # stride - 1 of it; and the cursor says where (a first epoch would be refused).
            first.subscribe.resume_cursor = self._cursor
            if first.subscribe.batch_stride > 1:
                first.subscribe.batch_offset = first.subscribe.batch_stride - 1
            first.subscribe.ClearField("first_epoch")
        self._requests.put(first)

        def requests(q=self._requests):
            while True:
                item = q.get()
                if item is None:
                    return
                yield item

        self._responses = self._client._stream(self._current)(requests())
        _IN_FLIGHT.add(self)
        self._pending_ack = None
        self._releasing.clear()  # a new stream: the old one's slots are gone

    def _ack(self, serial):
        ack = pb.StreamRequest()
        ack.ack.serial = serial
        self._requests.put(ack)

    def _map_segment(self, seg):
        """The segment's descriptor from the daemon's descriptor socket, checked (a regular
        file at least as large as announced, sealed against shrinking) and mapped read-only."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(seg.fd_socket)
                sock.sendall(seg.token)
                _, fds, _, _ = socket.recv_fds(sock, 1, 1)
        except OSError as e:
            raise ConveyorError(grpc.StatusCode.UNAVAILABLE,
                                f"cannot reach the daemon's descriptor socket {seg.fd_socket}: {e}", self._cursor) from None
        if not fds:
            raise ConveyorError(grpc.StatusCode.UNAVAILABLE, "the daemon sent no segment descriptor", self._cursor)
        fd = fds[0]
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ProtocolError("the shared-memory segment is not a memory file")
            if st.st_size < seg.bytes:
                raise ProtocolError(f"the shared-memory segment has {st.st_size} bytes, {seg.bytes} were announced")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                seals = 0
            if not seals & fcntl.F_SEAL_SHRINK:
                raise ProtocolError("the shared-memory segment is not sealed against shrinking (F_SEAL_SHRINK): "
                                    "a truncation could crash the client")
            self._segments[seg.id] = mmap.mmap(fd, seg.bytes, prot=mmap.PROT_READ)
        finally:
            for f in fds:
                os.close(f)

    def close(self):
        _IN_FLIGHT.discard(self)
        if self._requests is not None:
            self._requests.put(None)
        if self._responses is not None:
            self._responses.cancel()
        self._responses = None

    def _end_call(self):
        """Ends the call in flight, not the subscription (the next batch resumes at the cursor)."""
        call = self._responses
        self.close()
        deadline = time.monotonic() + 1.0
        while call is not None and not call.done() and time.monotonic() < deadline:
            time.sleep(0.001)

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self._done:
                raise StopIteration
            try:
                if self._responses is None:
                    self._open()
                if self._pending_ack is not None and self._held is not None:
                    self._held._mark_released()
                    self._releasing.append((self._pending_ack, self._held))
                    self._held = None
                    self._pending_ack = None
                # Ack device batches whose readers are done; wait for the oldest only when
                # holding more would leave the daemon no slot to fill.
                while self._releasing and (self._releasing[0][1]._released() or
                                           len(self._releasing) >= max(1, self._credits - 1)):
                    serial, held = self._releasing.popleft()
                    held._wait_released()
                    self._ack(serial)
                if self._pending_ack is not None:
                    self._ack(self._pending_ack)
                    self._pending_ack = None
                batch = self._receive()
                self._reconnects = 0
                return batch
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
                if self._idle:
                    code = grpc.StatusCode.UNAVAILABLE
                    details = f"no message from the daemon for {self._idle_timeout} s (the idle deadline)"
                elif code == grpc.StatusCode.CANCELLED:
                    # Not by this client (it stops reading once it cancels): a daemon shutting
                    # down cancels the calls it has not ended, a broken stream to resume.
                    code = grpc.StatusCode.UNAVAILABLE
                    details = f"the daemon cancelled the stream ({details})"
                self._fail_over(code, details)
            except ProtocolError as e:
                self.close()  # cancels the call: a daemon that keeps it open must not hold the client
                code = grpc.StatusCode.RESOURCE_EXHAUSTED if e.resource else grpc.StatusCode.INVALID_ARGUMENT
                raise ConveyorError(code, str(e), self._cursor) from None
            except ConveyorError:
                self.close()
                raise

    def _fail_over(self, code, details):
        """A broken stream: resume from the cursor on the next daemon (UNAVAILABLE, while
        reconnects last), else raise."""
        self.close()
        limit = self._max_reconnects * len(self._client.addresses)
        if code != grpc.StatusCode.UNAVAILABLE or not self._reconnect or self._reconnects >= limit:
            address = self._client.addresses[self._current]
            hint = _hint(address, code, details, tls=self._client._root_certificates is not None,
                         received=bool(self._cursor))
            raise ConveyorError(code, f"{details}{hint}", self._cursor) from None
        # Resume from the cursor on the next daemon; back off after trying them all.
        self._reconnects += 1
        self._current = (self._current + 1) % len(self._client.addresses)
        if self._reconnects % len(self._client.addresses) == 0:
            time.sleep(0.1 * 2 ** min(self._reconnects // len(self._client.addresses), 5))

    def _next_message(self, timeout):
        """The next message's bytes, or None when the call ended with OK. Cancels the call
        when nothing arrives within `timeout` seconds (None: no limit; the RpcError then says
        CANCELLED, and self._idle is set)."""
        self._idle = False
        if not timeout:
            return next(self._responses, None)
        if self._watchdog is None:
            self._watchdog = _Watchdog(weakref.WeakMethod(self._expire))
        self._watchdog.arm(timeout)
        try:
            return next(self._responses, None)
        finally:
            self._watchdog.disarm()

    def _expire(self):
        """The idle deadline passed (called on the watchdog's thread)."""
        self._idle = True
        responses = self._responses
        if responses is not None:
            responses.cancel()

    def __del__(self):
        if self._watchdog is not None:
            self._watchdog.stop()

    def _receive(self):
        while True:
            raw = self._next_message(self._idle_timeout)
            if raw is None:  # the call ended with OK: only after an end of stream
                try:
                    self._reader.finished()
                except ProtocolError as e:
                    raise _Broken(str(e)) from None
                self._done = True
                raise StopIteration
            kind, value = self._reader.feed(raw)
            if kind == "more":
                continue
            if kind == "segment":
                self._map_segment(value)
                continue
            if kind == "cuda_segment":
                try:
                    self._blocks[value.id] = cuda_ipc.Block(value)
                except (RuntimeError, ValueError) as e:
                    raise ConveyorError(grpc.StatusCode.FAILED_PRECONDITION, str(e), self._cursor) from None
                continue
            if kind == "end":
                self._after_end()
            d, buffer = value
            if d.HasField("cuda_ipc"):
                block = self._blocks.get(d.cuda_ipc.segment)
                if block is None or d.cuda_ipc.offset + d.total_bytes > block.size:
                    raise ProtocolError("the daemon sent a batch outside its CUDA IPC segment")
                self._pending_ack = d.serial
                self._cursor = d.cursor
                self._held = Batch(d, None, block, d.cuda_ipc.offset)
                return self._held
            if d.HasField("shm"):
                seg = self._segments.get(d.shm.segment)
                if seg is None or d.shm.offset + d.total_bytes > len(seg):
                    raise ProtocolError("the daemon sent a batch outside its shared-memory segment")
                buffer = memoryview(seg)[d.shm.offset:d.shm.offset + d.total_bytes]
                try:
                    check_bytes(d, buffer)
                except ProtocolError as e:
                    raise ProtocolError(f"batch {d.serial}: {e}") from None
            self._pending_ack = d.serial
            self._cursor = d.cursor
            return Batch(d, buffer)


    def _after_end(self):
        """The daemon ends the call right after the end of the stream: one more read says so.
        A message there is a protocol error; a call held open past the grace is cancelled (the
        data is complete); another status is the stream's."""
        self._requests.put(None)  # no more requests (writes done)
        try:
            raw = self._next_message(_END_GRACE)
        except grpc.RpcError:
            if not self._idle:
                raise
            raw = None
        if raw is not None:
            self._reader.feed(raw)  # raises: a message after the end of the stream
        self._done = True
        if self._watchdog is not None:
            self._watchdog.stop()
        self.close()
        raise StopIteration


class _Broken(grpc.RpcError):
    """A call that ended with OK before its data did: broken off like a daemon that went
    away (UNAVAILABLE), so the stream resumes from its cursor."""

    def __init__(self, details):
        super().__init__(details)
        self._details = details

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return self._details


class _Stub:
    """The generated stub with the bearer token added to every call."""

    def __init__(self, stub, token):
        self._stub = stub
        self._metadata = (("authorization", "Bearer " + token),) if token else None

    def __getattr__(self, name):
        method = getattr(self._stub, name)
        if self._metadata is None:
            return method
        return lambda *args, **kwargs: method(*args, metadata=self._metadata, **kwargs)


class Client:
    """A connection to conveyord: "host:port", "unix:/path" (or the socket's path: "/path",
    "./d.sock"), "dns:///name:port", or several
    replicas serving the same datasets (a list, or addresses separated by commas): calls go
    to the first that answers, and a subscription whose daemon fails resumes from its cursor
    on the next.

    root_certificates (PEM bytes): connect with TLS trusting them; server_name: the name the
    daemon's certificate carries, if not the host's; token: the daemon's bearer token.
    max_batch_bytes, max_segment_bytes: the largest batch and shared-memory segment accepted
    from a daemon. keepalive_time/keepalive_timeout (seconds): a ping that often; a daemon that
    does not answer within the timeout is gone (its streams fail over)."""

    def __init__(self, address, root_certificates=None, server_name=None, token=None,
                 max_batch_bytes=MAX_BATCH_BYTES, max_segment_bytes=MAX_SEGMENT_BYTES,
                 keepalive_time=3.0, keepalive_timeout=3.0):
        addresses = address if isinstance(address, (list, tuple)) else address.split(",")
        # A socket's path, as the CLI takes it: "/run/conveyor.sock", "./d.sock".
        self.addresses = ["unix:" + a if a.startswith(("/", "./", "../")) else a
                          for a in (a.strip() for a in addresses) if a]
        if not self.addresses:
            raise ValueError("no daemon address given")
        for a in self.addresses:
            # gRPC takes a port past 65535 and wraps it ("127.0.0.1:99999" dials port 34463).
            if a.startswith(("unix:", "unix-abstract:")) or ":" not in a or "]" in a.rpartition(":")[2]:
                continue
            port = a.rpartition(":")[2]
            if port.isdigit() and int(port) > 65535:
                raise ValueError(f"daemon address '{a}': {port[:32]} is not a TCP port (0 to 65535)")
        self.address = self.addresses[0]
        self.max_batch_bytes = max_batch_bytes
        self.max_segment_bytes = max_segment_bytes
        options = [
            # A message holds a descriptor and at most one inline part.
            ("grpc.max_receive_message_length", min(max_batch_bytes + (64 << 20), 2**31 - 1)),
            ("grpc.keepalive_time_ms", int(keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # Flow control sized for batches of megabytes, as the C++ client's: a fixed 16 MiB
            # receive window rather than BDP probing (which starts at 64 KiB and pings and
            # updates the window all along), DATA frames as large as HTTP/2 allows.
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", 16 << 20),
            ("grpc.http2.max_frame_size", (1 << 24) - 1),
        ]
        if root_certificates is not None and server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        self._options = options
        self._root_certificates = root_certificates
        self._token = token
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        self._current = 0
        self._lock = threading.Lock()
        self._closed = False
        self._channels = self._stubs = None  # opened when first used (and again after a fork)
        _CLIENTS.add(self)

    def _connect(self):
        """The channels and stubs, opened if they are not (a fork closes them)."""
        with self._lock:
            if self._closed:
                raise ValueError("conveyor: this Client is closed")
            if self._channels is None:
                with _FORK_LOCK:
                    channels = []
                    for a in self.addresses:
                        if self._root_certificates is not None:
                            creds = grpc.ssl_channel_credentials(self._root_certificates)
                            channels.append(grpc.secure_channel(a, creds, options=self._options))
                        else:
                            channels.append(grpc.insecure_channel(a, options=self._options))
                    self._stubs = [_Stub(pb_grpc.LoaderStub(c), self._token) for c in channels]
                    self._channels = channels
            return self._channels, self._stubs

    def _disconnect(self):
        """Closes the channels (reopened when next used): gRPC shuts down with the last one."""
        with self._lock:
            channels, self._channels, self._stubs = self._channels, None, None
        for c in channels or ():
            c.close()

    def _stream(self, index):
        """The Stream call on daemon `index`, raw bytes back: the subscription parses them."""
        channels, _ = self._connect()
        call = channels[index].stream_stream(_STREAM, request_serializer=pb.StreamRequest.SerializeToString,
                                             response_deserializer=None)
        if self._metadata is None:
            return call
        return lambda requests: call(requests, metadata=self._metadata)

    def close(self):
        """Closes the client's channels; it cannot be used afterwards."""
        self._disconnect()
        self._closed = True

    def _unary(self, name, request):
        """Calls `name` on each daemon in turn while they are UNAVAILABLE; a failure is a
        ConveyorError naming the daemon that answered last, with a hint as a stream's has."""
        error = None
        _, stubs = self._connect()
        for _ in range(len(stubs)):
            address = self.addresses[self._current]
            try:
                return getattr(stubs[self._current], name)(request, timeout=30)
            except grpc.RpcError as e:
                hint = _hint(address, e.code(), e.details(), tls=self._root_certificates is not None)
                error = ConveyorError(e.code(), f"{address}: {e.details()}{hint}")
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    break
                self._current = (self._current + 1) % len(stubs)
        raise error from None

    def list_datasets(self):
        """The names of the datasets the daemon serves. Raises ConveyorError."""
        return list(self._unary("ListDatasets", pb.ListDatasetsRequest()).datasets)

    def describe(self, dataset):
        """A conveyor.v1.DatasetDescription: the dataset's streams (name, alias, format, dim),
        sequences, samples, chunks and randomization defaults. Raises ConveyorError (NOT_FOUND
        for a dataset the daemon does not serve; the message lists those it does)."""
        return self._unary("DescribeDataset", pb.DescribeDatasetRequest(dataset=dataset))

    def subscribe(self, dataset, minibatch_size=256, epochs=1, seed=None, randomize=None, epoch_size=None,
                  rank=None, world=None, frame_mode=None, truncation=0, parallel=0, credits=4, resume=None,
                  reconnect=True, transport="inline", layouts=None, cuda_device=None, dtypes=None,
                  distribution=None, first_epoch=None, batch_stride=1, batch_offset=0, minibatch_mode=None,
                  idle_timeout=60.0):
        """A Subscription (iterate it for Batch objects). `resume`: a cursor to continue after.
        transport="shm" (same host, through the daemon's unix socket): batches stay in the
        daemon's shared-memory slots and only descriptors travel. transport="cuda" (same host,
        torch with CUDA): the daemon assembles batches on its GPU (`cuda_device`, its ordinal;
        default its --device) and they stay there: arrays are torch CUDA tensors over the
        daemon's slot, valid until the next batch is asked for (see Batch.release).
        `layouts`: {stream: "csc" | "csr" | "dense"} for sparse streams (the daemon converts;
        default CSC). `dtypes`: {stream: "float16" | "bfloat16"}: values narrowed by the daemon
        (bfloat16 arrays are uint16 bit patterns). `distribution`: "balanced" or "chunks" (how
        ranks share a minibatch; default the dataset's). `first_epoch`: start at that epoch's
        first batch. `batch_stride`/`batch_offset`: only batches k with k % stride == offset
        (DataLoader workers sharing a stream; cursors stay the whole stream's).
        `minibatch_mode`: "partial" or "full" (default: the dataset's). `idle_timeout`
        (seconds, None for none): a stream that receives nothing for this long is treated as
        broken and resumed on the next daemon."""
        transports = {"inline": pb.TRANSPORT_INLINE, "shm": pb.TRANSPORT_SHARED_MEMORY, "cuda": pb.TRANSPORT_CUDA_IPC}
        if transport not in transports:
            raise ValueError("transport must be 'inline', 'shm' or 'cuda'")
        names = {"csc": pb.LAYOUT_CSC, "csr": pb.LAYOUT_CSR, "dense": pb.LAYOUT_DENSE}
        for stream, layout in (layouts or {}).items():
            if layout not in names:
                raise ValueError(f"layout of {stream!r} must be csc, csr or dense, not {layout!r}")
        s = pb.Subscribe(dataset=dataset, minibatch_size=minibatch_size, epochs=epochs,
                         truncation=truncation, parallel=parallel, initial_credits=credits,
                         resume_cursor=resume or "",
                         transport=transports[transport],
                         # batches of one-sample rows come with their keys only (the reader
                         # checks them as Pieces.single_sample_rows says)
                         compact_pieces=True)
        if cuda_device is not None:
            s.cuda_device = cuda_device
        dtype_names = {"float16": pb.DTYPE_FLOAT16, "bfloat16": pb.DTYPE_BFLOAT16}
        for stream, dtype in (dtypes or {}).items():
            if dtype not in dtype_names:
                raise ValueError(f"dtype of {stream!r} must be float16 or bfloat16, not {dtype!r}")
            s.dtypes[stream] = dtype_names[dtype]
        if distribution is not None:
            if distribution not in ("balanced", "chunks"):
                raise ValueError(f"distribution must be balanced or chunks, not {distribution!r}")
            s.distribution = pb.DISTRIBUTION_BALANCED if distribution == "balanced" else pb.DISTRIBUTION_CHUNKS
        if first_epoch is not None:
            s.first_epoch = first_epoch
        if not 0 <= batch_offset < batch_stride:
            raise ValueError(f"batch_offset {batch_offset} must be below batch_stride {batch_stride}")
        s.batch_stride, s.batch_offset = batch_stride, batch_offset
        for stream, layout in (layouts or {}).items():
            s.layouts[stream] = names[layout]
        if seed is not None:
            s.seed = seed
        if randomize is not None:
            s.randomize = randomize
        if epoch_size is not None:
            s.epoch_size = epoch_size
        if rank is not None:
            s.rank = rank
        if world is not None:
            s.world = world
        if frame_mode is not None:
            s.frame_mode = frame_mode
        if minibatch_mode is not None:
            modes = {"partial": pb.MINIBATCH_MODE_PARTIAL, "full": pb.MINIBATCH_MODE_FULL}
            if minibatch_mode not in modes:
                raise ValueError("minibatch_mode must be 'partial' or 'full'")
            s.minibatch_mode = modes[minibatch_mode]
        return Subscription(self, s, reconnect=reconnect, first=self._current, idle_timeout=idle_timeout)
