"""client/python/conveyor/cuda_ipc.py without a GPU: which CUDA runtime it loads (the one
already in the process first, CUDA 13 wheel layouts), that the device UUID comes from the
driver's cuDeviceGetUuid_v2 by name, that a tensor's array object holds its block, and that
closing a block waits for the device before unmapping. The CUDA libraries are stand-ins that
record the calls; on a device, conveyor_gpu_tests compares the UUIDs with the C++ side's."""

import ctypes
import importlib.util
import os
import tempfile
import types
import unittest

SOURCE = os.environ.get("CONVEYOR_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
spec = importlib.util.spec_from_file_location(
    "cuda_ipc", os.path.join(SOURCE, "client", "python", "conveyor", "cuda_ipc.py"))
cuda_ipc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cuda_ipc)


class Recorder:
    """A stand-in CUDA library: every function records (name, args) and returns 0."""

    def __init__(self, missing=(), **results):
        self.calls = []
        self._missing = set(missing)
        self._results = results

    def __getattr__(self, name):
        if name.startswith("_") or name in self._missing:
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            if name in self._results:
                return self._results[name](*args)
            return 0
        call.argtypes = None
        return call


class RuntimeLookup(unittest.TestCase):
    def test_the_runtime_already_mapped_comes_first_then_cuda13_wheels_then_sonames(self):
        with tempfile.TemporaryDirectory() as d:
            maps = os.path.join(d, "maps")
            with open(maps, "w") as f:
                f.write("7f00-7f01 r-xp 00000000 08:01 1 /opt/torch/lib/libtorch.so\n"
                        "7f01-7f02 r-xp 00000000 08:01 2 /site/nvidia/cuda_runtime/lib/libcudart.so.12\n"
                        "7f02-7f03 rw-p 00000000 00:00 0 [heap]\n")
            site = os.path.join(d, "site")
            os.makedirs(os.path.join(site, "nvidia", "cu13", "lib"))
            open(os.path.join(site, "nvidia", "cu13", "lib", "libcudart.so.13"), "w").close()
            got = cuda_ipc._runtime_candidates(maps, site_dirs=[site])
        self.assertEqual(got[0], "/site/nvidia/cuda_runtime/lib/libcudart.so.12")
        self.assertEqual(got[1], os.path.join(site, "nvidia", "cu13", "lib", "libcudart.so.13"))
        self.assertEqual(got[2:], ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"])

    def test_without_a_mapped_runtime_the_sonames_remain_newest_first(self):
        with tempfile.TemporaryDirectory() as d:
            maps = os.path.join(d, "maps")
            open(maps, "w").close()
            self.assertEqual(cuda_ipc._runtime_candidates(maps, site_dirs=[])[0], "libcudart.so.13")


class DeviceUuid(unittest.TestCase):
    def tearDown(self):
        cuda_ipc._driver = None
        cuda_ipc._runtime = None

    @staticmethod
    def fake_driver(missing=()):
        def get_uuid(buf, dev):
            ctypes.memmove(buf, bytes(range(dev.value, dev.value + 16)), 16)
            return 0

        def device_get(out, ordinal):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = ordinal.value + 100
            return 0
        return Recorder(missing=missing, cuDeviceGetUuid_v2=get_uuid, cuDeviceGetUuid=get_uuid,
                        cuDeviceGet=device_get)

    def test_reads_the_uuid_with_cuDeviceGetUuid_v2_by_name(self):
        cuda_ipc._driver = self.fake_driver()
        self.assertEqual(cuda_ipc.device_uuid(1), bytes(range(101, 117)))
        names = [c[0] for c in cuda_ipc._driver.calls]
        self.assertEqual(names, ["cuInit", "cuDeviceGet", "cuDeviceGetUuid_v2"])

    def test_falls_back_to_cuDeviceGetUuid_on_drivers_before_11_4(self):
        cuda_ipc._driver = self.fake_driver(missing={"cuDeviceGetUuid_v2"})
        self.assertEqual(cuda_ipc.device_uuid(0), bytes(range(100, 116)))
        self.assertIn("cuDeviceGetUuid", [c[0] for c in cuda_ipc._driver.calls])

    def test_finds_the_ordinal_whose_uuid_the_daemon_announced(self):
        cuda_ipc._driver = self.fake_driver()

        def count(out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = 3
            return 0
        cuda_ipc._runtime = Recorder(cudaGetDeviceCount=count)
        self.assertEqual(cuda_ipc.device_by_uuid(bytes(range(102, 118))), 2)
        with self.assertRaisesRegex(RuntimeError, "not visible to this process"):
            cuda_ipc.device_by_uuid(b"\0" * 16)


class BlockLifetime(unittest.TestCase):
    def tearDown(self):
        cuda_ipc._runtime = None

    def test_close_waits_for_the_device_before_unmapping_and_restores_the_device(self):
        def get_device(out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = 0
            return 0
        rt = cuda_ipc._runtime = Recorder(cudaGetDevice=get_device)
        block = cuda_ipc.Block.__new__(cuda_ipc.Block)
        block.ptr, block.device, block.size = 0x1000, 1, 4096
        block.close()
        names = [(c[0], c[1][0] if c[0] == "cudaSetDevice" else None) for c in rt.calls]
        self.assertEqual(names, [("cudaGetDevice", None), ("cudaSetDevice", 1), ("cudaDeviceSynchronize", None),
                                 ("cudaIpcCloseMemHandle", None), ("cudaSetDevice", 0)])
        block.close()  # once only
        self.assertEqual(len(rt.calls), 5)

    def test_an_array_object_holds_its_block(self):
        block = types.SimpleNamespace(ptr=0x1000, device=0, size=4096)
        array = cuda_ipc._DeviceArray(block, 0x1010, 0, (2, 2))
        self.assertIs(array.block, block)
        self.assertEqual(array.__cuda_array_interface__["data"], (0x1010, False))

    def test_wait_released_waits_for_every_batch(self):
        waited = []
        batches = [types.SimpleNamespace(_wait_released=lambda i=i: waited.append(i)) for i in range(3)]
        cuda_ipc.wait_released(iter(batches))
        self.assertEqual(waited, [0, 1, 2])


if __name__ == "__main__":
    unittest.main()
