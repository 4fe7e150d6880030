"""A Stream call read with the daemon treated as untrusted: the checks of the C++ client's
proto/stream_reader.cc and proto/wire.cc (DescriptorToPlan, ValidateBatchBytes), so that
both clients refuse the same malformed streams.

Messages go in one at a time (as bytes: one that does not parse is an error too); out come
segment announcements, whole batches (inline parts reassembled, the buffer growing only as
bytes arrive) and the end. Serials must count 0, 1, 2, ... without duplicates or gaps;
parts must come in order with their batch's serial and offsets; an empty, stray, misplaced
or late message, an OK end mid-batch or without an end-of-stream message, a size past the
client's limits, an array, shape, piece, length or pointer that does not fit: each raises
ProtocolError naming it.
"""

import numpy as np
from google.protobuf.message import DecodeError

from conveyor.v1 import conveyor_pb2 as pb

_ITEMSIZE = {pb.DTYPE_FLOAT32: 4, pb.DTYPE_FLOAT64: 8, pb.DTYPE_INT32: 4, pb.DTYPE_INT64: 8, pb.DTYPE_UINT8: 1,
             pb.DTYPE_FLOAT16: 2, pb.DTYPE_BFLOAT16: 2}
_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_FLOAT64: np.float64, pb.DTYPE_INT32: np.int32,
          pb.DTYPE_INT64: np.int64, pb.DTYPE_UINT8: np.uint8, pb.DTYPE_FLOAT16: np.float16,
          pb.DTYPE_BFLOAT16: np.uint16}
_NARROWED = (pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16)
_LAYOUTS = {pb.LAYOUT_NATIVE: "native", pb.LAYOUT_CSC: "csc", pb.LAYOUT_CSR: "csr", pb.LAYOUT_DENSE: "dense"}
MAX_STREAMS = 4096
MAX_IMPLIED_COUNTS = 1 << 26  # pieces x streams a compact descriptor may imply (proto/wire.h)
MAX_CURSOR_BYTES = 4096


class ProtocolError(Exception):
    """The daemon broke the protocol; `resource` is True for a size past the client's limits."""

    def __init__(self, message, resource=False):
        super().__init__(message)
        self.resource = resource


def _bad(what):
    raise ProtocolError("the daemon sent " + what)


def _array(ref, total, what):
    """The array if present (checked to lie inside the batch), else None."""
    if len(ref.shape) == 0:
        return None
    if ref.dtype not in _ITEMSIZE:
        raise ProtocolError(f"{what}: unknown dtype")
    n = _ITEMSIZE[ref.dtype]
    for d in ref.shape:
        n *= d
    if n != ref.bytes or ref.offset > total or ref.bytes > total - ref.offset:
        raise ProtocolError(f"{what} does not fit the batch (offset {ref.offset}, {ref.bytes} bytes, "
                            f"batch {total} bytes)")
    return ref


def stream_layout(s):
    """How a stream was delivered: "ids", "dense", "csr" or "csc" (of a checked stream)."""
    if s.format == pb.FORMAT_IDS:
        return "ids"
    if s.format != pb.FORMAT_SPARSE or s.layout == pb.LAYOUT_DENSE:
        return "dense"
    return "csr" if s.layout == pb.LAYOUT_CSR else "csc"


def check_descriptor(d):
    """DescriptorToPlan's checks: every enum known, every array inside the batch with the dtype
    and shape its stream's layout implies, every piece inside its row."""
    total, rows, steps = d.total_bytes, d.rows, d.steps
    if d.precision not in (pb.PRECISION_FLOAT, pb.PRECISION_DOUBLE):
        raise ProtocolError(f"unknown precision {d.precision}")
    for what, ref in (("mask", d.mask), ("flags", d.flags)):
        a = _array(ref, total, what)
        if a is not None and (a.dtype != pb.DTYPE_UINT8 or a.bytes != rows * steps):
            raise ProtocolError("the BPTT mask and flags must be uint8 [rows][steps]")
    value_type = pb.DTYPE_FLOAT32 if d.precision == pb.PRECISION_FLOAT else pb.DTYPE_FLOAT64

    def is_value(a):
        # The dataset's precision, or narrowed from float32 on request (float16, bfloat16).
        return a is not None and (a.dtype == value_type or (value_type == pb.DTYPE_FLOAT32 and a.dtype in _NARROWED))

    def value_size(a):
        return _ITEMSIZE[a.dtype] if a is not None else 0

    if len(d.streams) > MAX_STREAMS:
        raise ProtocolError(f"a batch of {len(d.streams)} streams (at most {MAX_STREAMS})")
    longest = []
    for s in d.streams:
        name = s.name[:64]
        if s.format not in (pb.FORMAT_DENSE, pb.FORMAT_SPARSE, pb.FORMAT_IDS):
            raise ProtocolError(f"stream '{name}': unknown format {s.format}")
        if s.layout not in _LAYOUTS:
            raise ProtocolError(f"stream '{name}': unknown layout {s.layout}")
        if s.format != pb.FORMAT_SPARSE and s.layout not in (pb.LAYOUT_NATIVE, pb.LAYOUT_DENSE):
            raise ProtocolError(f"stream '{name}' is not sparse but delivered as {_LAYOUTS[s.layout]}")
        arrays = {k: _array(getattr(s, k), total, f"stream '{name}' {k}")
                  for k in ("lengths", "values", "colptr", "rowind", "rowptr", "colind")}
        t = s.max_length if s.sequence_axis else 1
        longest.append(t)
        values, layout = arrays["values"], stream_layout(s)

        def nbytes(a):
            return -1 if a is None else a.bytes

        def dtype(a):
            return None if a is None else a.dtype

        if layout == "ids":
            if nbytes(values) != rows * t * 4 or dtype(values) != pb.DTYPE_INT32:
                raise ProtocolError(f"stream '{name}': ids do not match rows x T")
        elif layout == "dense":
            if not is_value(values) or nbytes(values) != rows * t * s.dim * value_size(values):
                raise ProtocolError(f"stream '{name}': values do not match rows x T x dim")
        else:
            csr = layout == "csr"
            ptr, ind = (arrays["rowptr"], arrays["colind"]) if csr else (arrays["colptr"], arrays["rowind"])
            outer = s.dim if csr else rows * t
            ptr_size = 8 if dtype(ptr) == pb.DTYPE_INT64 else 4
            if (dtype(ptr) not in (pb.DTYPE_INT32, pb.DTYPE_INT64) or dtype(ind) != pb.DTYPE_INT32 or
                    not is_value(values) or nbytes(ptr) != (outer + 1) * ptr_size or
                    nbytes(ind) != s.nnz * 4 or nbytes(values) != s.nnz * value_size(values)):
                raise ProtocolError(f"stream '{name}': {'CSR' if csr else 'CSC'} arrays do not match the batch")
        lengths = arrays["lengths"]
        if (nbytes(lengths) != rows * 4 or dtype(lengths) != pb.DTYPE_INT32) if s.sequence_axis else lengths is not None:
            raise ProtocolError(f"stream '{name}': lengths do not match the rows")
    q = d.pieces
    n = len(q.key)
    # Single-sample rows (asked for with Subscribe.compact_pieces): piece i in row i, from
    # step 0 and its sequence's first sample, one sample of every stream; the lists are empty.
    single = q.single_sample_rows
    listed = 0 if single else n
    if (len(q.row) != listed or len(q.t0) != listed or len(q.sample_begin) != listed or len(q.frame) not in (0, n) or
            len(q.name) not in (0, n) or len(q.counts) != listed * len(d.streams)):
        raise ProtocolError("single-sample rows with the piece lists they imply, or lists of another length" if single
                            else "the pieces' lists do not have one entry per piece (and stream)")
    if n > rows * max(1, steps):
        raise ProtocolError(f"a batch of {rows} rows cannot hold {n} pieces")
    if single:
        if n * len(d.streams) > MAX_IMPLIED_COUNTS:
            raise ProtocolError(f"single-sample rows implying {n} pieces x {len(d.streams)} streams "
                                f"(at most {MAX_IMPLIED_COUNTS})")
        if n and any(t < 1 for t in longest):
            raise ProtocolError("a piece runs past its row")
        if n > rows:
            raise ProtocolError("a piece lies outside the batch's rows")
    elif n:
        if max(q.row) >= rows:
            raise ProtocolError("a piece lies outside the batch's rows")
        if d.streams:
            counts = np.asarray(q.counts, dtype=np.uint64).reshape(n, len(d.streams))
            t0 = np.asarray(q.t0, dtype=np.uint64).reshape(n, 1)
            if ((t0 + counts) > np.asarray(longest, dtype=np.uint64).reshape(1, -1)).any():
                raise ProtocolError("a piece runs past its row")


def check_bytes(d, buffer):
    """ValidateBatchBytes: lengths within T, CSC/CSR pointers rising from 0 to nnz, indices
    inside the matrix, so that views index safely."""
    if len(buffer) != d.total_bytes:
        raise ProtocolError(f"the batch has {len(buffer)} bytes, its descriptor says {d.total_bytes}")

    def view(ref):
        count = ref.bytes // _ITEMSIZE[ref.dtype]
        return np.frombuffer(buffer, dtype=_NUMPY[ref.dtype], count=count, offset=ref.offset)

    for s in d.streams:
        name = s.name[:64]
        t = s.max_length if s.sequence_axis else 1
        if len(s.lengths.shape):
            lengths = view(s.lengths)
            if len(lengths) and (lengths.min() < 0 or lengths.max() > t):
                raise ProtocolError(f"stream '{name}': a row's length exceeds T = {t}")
        layout = stream_layout(s)
        if layout not in ("csc", "csr"):
            continue
        csr = layout == "csr"
        ptr = view(s.rowptr if csr else s.colptr).astype(np.int64)
        ind = view(s.colind if csr else s.rowind)
        inner = d.rows * t if csr else s.dim
        if ptr[0] != 0 or ptr[-1] != s.nnz or (len(ptr) > 1 and (np.diff(ptr) < 0).any()):
            raise ProtocolError(f"stream '{name}': bad {'CSR row' if csr else 'CSC column'} pointers")
        if len(ind) and (ind.min() < 0 or ind.max() >= inner):
            raise ProtocolError(f"stream '{name}': {'column' if csr else 'row'} index out of range")


class StreamReader:
    """One Stream call's messages, checked. feed() returns (kind, value): ("more", None),
    ("segment", SharedMemorySegment), ("cuda_segment", CudaIpcSegment),
    ("batch", (descriptor, bytearray or None)), ("end", EndOfStream)."""

    def __init__(self, max_batch_bytes, max_segment_bytes):
        self._max_batch = max_batch_bytes
        self._max_segment = max_segment_bytes
        self._ended = False
        self._serial = 0
        self._batch = None  # descriptor of the batch whose parts are arriving
        self._buffer = None
        self._parts_left = 0
        self.segments = {}  # id -> bytes announced
        self.cuda_segments = {}

    def feed(self, raw):
        try:
            m = pb.StreamResponse.FromString(raw)
        except (DecodeError, ValueError, RuntimeError):
            raise ProtocolError("the daemon sent a message that does not parse as a StreamResponse") from None
        if self._ended:
            _bad("a message after the end of the stream")
        kind = m.WhichOneof("kind")
        if self._batch is not None and kind != "more":
            _bad(f"another message in the middle of batch {self._batch.serial} "
                 f"({self._parts_left} of its parts missing)")
        if kind == "more":
            return self._part(m.more)
        if kind == "batch":
            return self._begin(m.batch)
        if kind == "end":
            if m.end.batches != self._serial:
                _bad(f"an end of stream counting {m.end.batches} batches after {self._serial} were received")
            if len(m.end.cursor) > MAX_CURSOR_BYTES:
                _bad("an end-of-stream cursor too long to resume with")
            self._ended = True
            return "end", m.end
        if kind == "segment":
            s = m.segment
            if len(s.token) != 16 or s.bytes == 0 or not s.fd_socket or len(s.fd_socket.encode()) >= 108:
                _bad("a malformed shared-memory segment announcement")
            if s.bytes > self._max_segment:
                raise ProtocolError(f"the daemon announced a segment of {s.bytes} bytes, more than the client's "
                                    f"limit of {self._max_segment}", resource=True)
            if s.id in self.segments:
                _bad(f"shared-memory segment {s.id} twice")
            self.segments[s.id] = s.bytes
            return "segment", s
        if kind == "cuda_segment":
            s = m.cuda_segment
            if len(s.handle) != 64 or len(s.device_uuid) != 16 or s.bytes == 0:
                _bad("a malformed CUDA IPC segment announcement")
            if s.bytes > self._max_segment:
                raise ProtocolError(f"the daemon announced a device block of {s.bytes} bytes, more than the "
                                    f"client's limit of {self._max_segment}", resource=True)
            if s.id in self.cuda_segments:
                _bad(f"CUDA IPC segment {s.id} twice")
            self.cuda_segments[s.id] = s.bytes
            return "cuda_segment", s
        _bad("an empty message")

    def finished(self):
        """The call ended with OK: raises unless the end came and no batch is half received."""
        if self._batch is not None:
            _bad(f"an OK end of the call in the middle of batch {self._batch.serial} "
                 f"({self._parts_left} of its parts missing)")
        if not self._ended:
            _bad("an OK end of the call without an end-of-stream message")

    def _begin(self, d):
        if d.serial != self._serial:
            _bad(f"batch serial {d.serial} where {self._serial} was due (a duplicate, a gap or a reordering)")
        total = d.total_bytes
        if total > self._max_batch:
            raise ProtocolError(f"batch {d.serial} claims {total} bytes, more than the client's limit of "
                                f"{self._max_batch}", resource=True)
        if len(d.cursor) > MAX_CURSOR_BYTES:
            _bad(f"batch {d.serial} with a cursor too long to resume with")
        places = int(d.HasField("shm")) + int(d.HasField("cuda_ipc")) + int(d.parts > 0)
        if places != 1:
            _bad(f"batch {d.serial} with {'no' if places == 0 else 'more than one'} place for its bytes "
                 "(inline parts, shared memory, CUDA IPC)")
        first = d.payload.data
        offset = d.payload.offset
        d.ClearField("payload")
        try:
            check_descriptor(d)
        except ProtocolError as e:
            raise ProtocolError(f"batch {d.serial}: {e}") from None
        if d.HasField("shm") or d.HasField("cuda_ipc"):
            if first:
                _bad(f"inline bytes with batch {d.serial}, which is in a segment")
            device = d.HasField("cuda_ipc")
            slot = d.cuda_ipc if device else d.shm
            size = (self.cuda_segments if device else self.segments).get(slot.segment, 0)
            if size == 0 or slot.offset > size or total > size - slot.offset:
                _bad(f"batch {d.serial} outside its {'CUDA IPC' if device else 'shared-memory'} segment {slot.segment}")
            self._serial += 1
            return "batch", (d, None)
        if (offset != 0 or d.parts > max(total, 1) or len(first) > total or (d.parts == 1) != (len(first) == total)
                or (total > 0 and not first)):
            _bad(f"batch {d.serial} whose first part ({len(first)} bytes of {total}, {d.parts} parts) does not fit")
        self._buffer = bytearray(first)  # grows as parts arrive, never to a size only claimed
        self._parts_left = d.parts - 1
        if self._parts_left == 0:
            return self._complete(d)
        self._batch = d
        return "more", None

    def _part(self, more):
        d = self._batch
        if d is None:
            _bad(f"a part of batch {more.serial} with no batch begun")
        data, have = more.payload.data, len(self._buffer)
        if (more.serial != d.serial or more.payload.offset != have or not data or len(data) > d.total_bytes - have or
                (self._parts_left == 1) != (len(data) == d.total_bytes - have)):
            _bad(f"a part (batch {more.serial}, offset {more.payload.offset}, {len(data)} bytes) out of order for "
                 f"batch {d.serial} ({have} of {d.total_bytes} bytes, {self._parts_left} parts to come)")
        self._buffer += data
        self._parts_left -= 1
        if self._parts_left:
            return "more", None
        self._batch = None
        return self._complete(d)

    def _complete(self, d):
        buffer, self._buffer = self._buffer, None
        try:
            check_bytes(d, buffer)
        except ProtocolError as e:
            raise ProtocolError(f"batch {d.serial}: {e}") from None
        self._serial += 1
        return "batch", (d, buffer)
