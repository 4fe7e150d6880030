"""CUDA IPC for TRANSPORT_CUDA_IPC: open the daemon's device blocks (cudaIpcOpenMemHandle
through the CUDA runtime, via ctypes) and view batch arrays as torch CUDA tensors without a
copy (__cuda_array_interface__). Needs torch with CUDA and the daemon on this host."""

import ctypes
import glob
import os

_TYPESTR = {0: "<f4", 1: "<f8", 2: "<i4", 3: "<i8", 4: "|u1"}  # pb.DType -> array interface
_runtime = None


def _cudart():
    """The CUDA runtime library: torch's own copy first, then the system's."""
    global _runtime
    if _runtime is not None:
        return _runtime
    candidates = []
    try:
        import torch
        lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        candidates += sorted(glob.glob(os.path.join(lib, "libcudart*.so*")))
        site = os.path.dirname(os.path.dirname(torch.__file__))
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    except ImportError:
        pass
    candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    errors = []
    for c in candidates:
        try:
            _runtime = ctypes.CDLL(c)
            return _runtime
        except OSError as e:
            errors.append(str(e))
    raise RuntimeError("TRANSPORT_CUDA_IPC needs the CUDA runtime (libcudart), which was not found: " + "; ".join(errors[-2:]))


def _check(err, what):
    if err != 0:
        rt = _cudart()
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: {rt.cudaGetErrorString(err).decode()}")


def device_by_uuid(uuid):
    """This process's ordinal of the device whose 16-byte UUID the daemon announced."""
    rt = _cudart()
    n = ctypes.c_int(0)
    _check(rt.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
    props = ctypes.create_string_buffer(8192)  # cudaDeviceProp: char name[256], then the UUID
    for d in range(n.value):
        _check(rt.cudaGetDeviceProperties(props, d), "cudaGetDeviceProperties")
        if props.raw[256:272] == uuid:
            return d
    raise RuntimeError(f"the daemon's CUDA device is not visible to this process ({n.value} visible; "
                       "check CUDA_VISIBLE_DEVICES), so its batches cannot be opened here")


class Block:
    """One of the daemon's device blocks, opened once; closed when garbage collected."""

    def __init__(self, segment):
        if len(segment.handle) != 64 or len(segment.device_uuid) != 16:
            raise ValueError("a CUDA IPC segment announcement is malformed")
        self.device = device_by_uuid(segment.device_uuid)
        self.size = segment.bytes
        rt = _cudart()
        previous = ctypes.c_int(0)
        rt.cudaGetDevice(ctypes.byref(previous))
        _check(rt.cudaSetDevice(self.device), "cudaSetDevice")
        ptr = ctypes.c_void_p()
        handle = ctypes.create_string_buffer(segment.handle, 64)
        # cudaIpcOpenMemHandle takes the 64-byte handle by value: pass it as a struct.
        class Handle(ctypes.Structure):
            _fields_ = [("reserved", ctypes.c_char * 64)]
        h = Handle()
        ctypes.memmove(ctypes.byref(h), handle, 64)
        rt.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), Handle, ctypes.c_uint]
        err = rt.cudaIpcOpenMemHandle(ctypes.byref(ptr), h, 1)  # cudaIpcMemLazyEnablePeerAccess
        rt.cudaSetDevice(previous.value)
        _check(err, "cudaIpcOpenMemHandle (CUDA IPC needs the daemon on this host)")
        self.ptr = ptr.value

    def __del__(self):
        ptr = getattr(self, "ptr", None)
        if ptr:
            try:
                _cudart().cudaIpcCloseMemHandle(ctypes.c_void_p(ptr))
            except Exception:  # interpreter shutdown
                pass


class _DeviceArray:
    """A device array described by the CUDA array interface, for torch.as_tensor."""

    def __init__(self, ptr, dtype, shape):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": _TYPESTR[dtype], "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


def tensor(block, offset, ref):
    """A torch CUDA tensor over array `ref` of the batch at `offset` in `block` (no copy)."""
    import torch
    if len(ref.shape) == 0:
        return None
    count = 1
    for d in ref.shape:
        count *= d
    item = {0: 4, 1: 8, 2: 4, 3: 8, 4: 1}[ref.dtype]
    if ref.offset + count * item > block.size - offset or count * item != ref.bytes:
        raise ValueError("an array lies outside the batch")
    if count == 0:
        return torch.empty(tuple(ref.shape), dtype={0: torch.float32, 1: torch.float64, 2: torch.int32,
                                                     3: torch.int64, 4: torch.uint8}[ref.dtype],
                           device=f"cuda:{block.device}")
    return torch.as_tensor(_DeviceArray(block.ptr + offset + ref.offset, ref.dtype, ref.shape),
                           device=f"cuda:{block.device}")
