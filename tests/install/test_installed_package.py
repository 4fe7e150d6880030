"""The pip-installed Python package, run from outside the source tree against an installed
conveyord (tests/install/test_install.sh sets CONVEYOR_ADDRESS, CONVEYOR_VERSION and
CONVEYOR_PREFIX)."""

import os
import subprocess
import sys
import unittest

import conveyor


class InstalledPackageTest(unittest.TestCase):
    def test_it_is_the_installed_package_with_the_projects_version(self):
        self.assertTrue(conveyor.__file__.startswith(sys.prefix), conveyor.__file__)
        self.assertEqual(conveyor.__version__, os.environ["CONVEYOR_VERSION"])
        from conveyor.v1 import conveyor_pb2  # generated at build time
        self.assertTrue(hasattr(conveyor_pb2, "Subscribe"))

    def test_streams_an_epoch_equal_to_the_installed_dump(self):
        client = conveyor.Client(os.environ["CONVEYOR_ADDRESS"])
        self.assertEqual(sorted(client.list_datasets()), ["sequences", "simple", "sparse"])
        rows, firsts = 0, []
        for batch in client.subscribe("simple", minibatch_size=100, randomize=False):
            x = batch.dense("features")
            firsts.append(float(x.reshape(-1)[0]))
            rows += batch.rows
        client.close()
        self.assertEqual(rows, 1000)
        prefix = os.environ["CONVEYOR_PREFIX"]
        dump = subprocess.run([os.path.join(prefix, "bin", "conveyor"), "dump",
                               os.path.join(prefix, "share", "conveyor", "examples", "conveyor.yaml"),
                               "--dataset", "simple", "--minibatch-size", "100", "--randomize", "off"],
                              check=True, capture_output=True, text=True).stdout.splitlines()
        self.assertEqual(len(dump), 1000)
        import json
        expected = [json.loads(dump[i])["streams"]["features"]["dense"][0][0] for i in range(0, 1000, 100)]
        import numpy as np  # dumps print float32 with 9 digits: equal once rounded to float32
        self.assertEqual(firsts, [float(np.float32(v)) for v in expected])

    def test_the_torch_dataset_imports_when_torch_is_there(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not installed in this environment")
        from conveyor.torch import ConveyorDataset
        ds = ConveyorDataset(os.environ["CONVEYOR_ADDRESS"], "simple", minibatch_size=250, randomize=False)
        self.assertEqual(sum(b["features"].shape[0] for b in ds), 1000)


if __name__ == "__main__":
    unittest.main()
