"""CUDA IPC for TRANSPORT_CUDA_IPC: open the daemon's device blocks (cudaIpcOpenMemHandle
through the CUDA runtime, via ctypes) and view batch arrays as torch CUDA tensors without a
copy (__cuda_array_interface__). Needs torch with CUDA and the daemon on this host.

Lifetimes: a tensor keeps its Block alive (the array-interface object it was made from holds
the block, and torch holds that object for the tensor's life), so a block is closed only once
no tensor over it is left; closing waits for all work queued on the block's device first, so
kernels still reading it finish before the memory is unmapped.

Functions are resolved by name (ctypes), never by struct layout: the device UUID comes from
the driver's cuDeviceGetUuid_v2, not from an offset into a runtime cudaDeviceProp whose
layout changes between CUDA versions."""

import ctypes
import glob
import os
import sys

_TYPESTR = {0: "<f4", 1: "<f8", 2: "<i4", 3: "<i8", 4: "|u1"}  # pb.DType -> array interface
_runtime = None  # the CUDA runtime (libcudart), once found
_driver = None  # the CUDA driver (libcuda)


def _mapped_libraries(maps="/proc/self/maps"):
    """Paths of the shared objects mapped into this process, in the order first mapped."""
    paths = []
    try:
        with open(maps) as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith("/"):
                    paths.append(fields[5].strip())
    except OSError:
        pass
    return list(dict.fromkeys(paths))


def _runtime_candidates(maps="/proc/self/maps", site_dirs=None):
    """Where libcudart may be, best first: the runtime already in the process (torch's: one
    runtime for torch and us, so both see the same devices and contexts), torch's own lib
    directory and the NVIDIA wheels beside it (CUDA 11/12: nvidia/cuda_runtime/lib; CUDA 13:
    nvidia/cu13/lib), then the system's by soname, newest first, the bare development name
    (possibly another toolkit's) last."""
    candidates = [p for p in _mapped_libraries(maps) if os.path.basename(p).startswith("libcudart.so")]
    if site_dirs is None:
        site_dirs = []
        try:
            import torch
            site_dirs.append(os.path.dirname(os.path.dirname(torch.__file__)))
            candidates += sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcudart*.so*")),
                                 reverse=True)
        except ImportError:
            pass
    for site in site_dirs:
        for lib in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib"):
            candidates += sorted(glob.glob(os.path.join(site, lib, "libcudart.so*")), reverse=True)
    candidates += ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"]
    return list(dict.fromkeys(candidates))


def _cudart():
    """The CUDA runtime library (torch imported first, so that its runtime is the one found)."""
    global _runtime
    if _runtime is not None:
        return _runtime
    try:
        import torch  # noqa: F401  (loads torch's libcudart, which _runtime_candidates then prefers)
    except ImportError:
        pass
    errors = []
    for c in _runtime_candidates():
        try:
            _runtime = ctypes.CDLL(c)
            return _runtime
        except OSError as e:
            errors.append(str(e))
    raise RuntimeError("TRANSPORT_CUDA_IPC needs the CUDA runtime (libcudart), which was not found: " + "; ".join(errors[-2:]))


def _cuda_driver():
    """The CUDA driver library (installed with the driver, whatever the toolkit)."""
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise RuntimeError(f"TRANSPORT_CUDA_IPC needs the CUDA driver (libcuda.so.1): {e}") from None
    return _driver


def _check(err, what):
    if err != 0:
        rt = _cudart()
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: {rt.cudaGetErrorString(err).decode()}")


def _check_driver(err, what):
    if err != 0:
        raise RuntimeError(f"{what}: CUDA driver error {err}")


def device_uuid(ordinal):
    """The 16-byte UUID of this process's device `ordinal` (a runtime ordinal, which is the
    driver's: both number the devices CUDA_VISIBLE_DEVICES leaves, in the same order), as the
    daemon's DeviceUuid() reads it (a MIG instance's own UUID under MIG)."""
    drv = _cuda_driver()
    _check_driver(drv.cuInit(0), "cuInit")
    dev = ctypes.c_int(0)
    _check_driver(drv.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal)), "cuDeviceGet")
    try:
        get_uuid = drv.cuDeviceGetUuid_v2  # CUDA >= 11.4; cuda.h maps cuDeviceGetUuid to it
    except AttributeError:
        get_uuid = drv.cuDeviceGetUuid
    uuid = ctypes.create_string_buffer(16)
    _check_driver(get_uuid(uuid, dev), "cuDeviceGetUuid")
    return uuid.raw[:16]


def device_by_uuid(uuid):
    """This process's ordinal of the device whose 16-byte UUID the daemon announced."""
    rt = _cudart()
    n = ctypes.c_int(0)
    _check(rt.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
    for d in range(n.value):
        if device_uuid(d) == uuid:
            return d
    raise RuntimeError(f"the daemon's CUDA device is not visible to this process ({n.value} visible; "
                       "check CUDA_VISIBLE_DEVICES), so its batches cannot be opened here")


class _Handle(ctypes.Structure):
    """cudaIpcMemHandle_t: 64 opaque bytes, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


class Block:
    """One of the daemon's device blocks, opened once; closed when no tensor over it is left
    (tensors hold their block) and garbage collected, or by close()."""

    def __init__(self, segment):
        if len(segment.handle) != 64 or len(segment.device_uuid) != 16:
            raise ValueError("a CUDA IPC segment announcement is malformed")
        self.ptr = None
        self.device = device_by_uuid(segment.device_uuid)
        self.size = segment.bytes
        rt = _cudart()
        previous = ctypes.c_int(0)
        rt.cudaGetDevice(ctypes.byref(previous))
        _check(rt.cudaSetDevice(self.device), "cudaSetDevice")
        ptr = ctypes.c_void_p()
        h = _Handle()
        ctypes.memmove(ctypes.byref(h), segment.handle, 64)
        rt.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _Handle, ctypes.c_uint]
        err = rt.cudaIpcOpenMemHandle(ctypes.byref(ptr), h, 1)  # cudaIpcMemLazyEnablePeerAccess
        rt.cudaSetDevice(previous.value)
        _check(err, "cudaIpcOpenMemHandle (CUDA IPC needs the daemon on this host)")
        self.ptr = ptr.value

    def close(self):
        """Unmaps the block once every kernel queued on its device, on any stream, has run (a
        reader may still be queued after its tensor is gone). Tensors over the block must be
        gone: they hold the block, so the garbage collector never closes it under them."""
        ptr, self.ptr = self.ptr, None
        if not ptr:
            return
        rt = _cudart()
        previous = ctypes.c_int(0)
        rt.cudaGetDevice(ctypes.byref(previous))
        rt.cudaSetDevice(self.device)
        rt.cudaDeviceSynchronize()
        rt.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr))
        rt.cudaSetDevice(previous.value)

    def __del__(self):
        if sys.is_finalizing():  # the process is ending: the driver unmaps everything
            return
        try:
            self.close()
        except Exception:
            pass


class _DeviceArray:
    """A device array described by the CUDA array interface, for torch.as_tensor. It holds
    its block: torch keeps this object for the tensor's life, so the block outlives the
    tensor."""

    def __init__(self, block, ptr, dtype, shape):
        self.block = block
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": _TYPESTR[dtype], "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


def tensor(block, offset, ref):
    """A torch CUDA tensor over array `ref` of the batch at `offset` in `block` (no copy); it
    keeps `block` open for as long as it lives."""
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
    return torch.as_tensor(_DeviceArray(block, block.ptr + offset + ref.offset, ref.dtype, ref.shape),
                           device=f"cuda:{block.device}")


def wait_released(batches):
    """Waits until the readers of each of `batches` (device batches given back) are done,
    before their stream's blocks are dropped (a reconnect)."""
    for batch in batches:
        batch._wait_released()
