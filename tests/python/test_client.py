"""The Python client and the torch IterableDataset against a real conveyord (port 0)."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

BUILD = os.environ["CONVEYOR_BUILD_DIR"]
SOURCE = os.environ["CONVEYOR_SOURCE_DIR"]
sys.path.insert(0, os.path.join(BUILD, "python"))

import conveyor  # noqa: E402

EXAMPLES = os.path.join(SOURCE, "examples", "conveyor.yaml")
CONVEYOR = os.path.join(BUILD, "client", "conveyor")
CONVEYORD = os.path.join(BUILD, "server", "conveyord")


def start_daemon(tmp, config=EXAMPLES):
    port_file = os.path.join(tmp, "port")
    proc = subprocess.Popen([CONVEYORD, config, "--listen", "127.0.0.1:0", "--port-file", port_file,
                             "--unix", os.path.join(tmp, "d.sock")], stderr=subprocess.PIPE)
    for _ in range(200):
        if os.path.exists(port_file):
            with open(port_file) as f:
                return proc, "127.0.0.1:" + f.read().strip()
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("conveyord did not start: " + proc.stderr.read().decode())


def wait_child(pid, seconds):
    """The exit status of child `pid`; killed (and failing the test) past `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"child {pid} still running after {seconds} s (hung)")
        time.sleep(0.01)


def dump_lines(*args):
    out = subprocess.run([CONVEYOR, "dump", EXAMPLES, *args], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.daemon, cls.address = start_daemon(cls.tmp.name)
        cls.client = conveyor.Client(cls.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.terminate()
        cls.daemon.wait(timeout=30)
        cls.daemon.stderr.close()
        cls.tmp.cleanup()

    def test_list_and_describe(self):
        self.assertEqual(self.client.list_datasets(), ["sequences", "simple", "sparse"])
        d = self.client.describe("simple")
        self.assertEqual([s.name for s in d.streams], ["features", "labels"])
        self.assertEqual(d.sequences, 1000)

    def test_unary_calls_fail_as_conveyor_errors_that_say_what_to_do(self):
        # A name the daemon does not serve: NOT_FOUND naming the daemon and what it serves.
        with self.assertRaises(conveyor.ConveyorError) as e:
            self.client.describe("nope")
        self.assertEqual(e.exception.code.name, "NOT_FOUND")
        self.assertEqual(str(e.exception),
                         f"NOT_FOUND: {self.address}: no dataset 'nope' (served: sequences, simple, sparse)")
        # A name with control bytes comes back escaped (it may be printed on a terminal).
        with self.assertRaises(conveyor.ConveyorError) as e:
            self.client.describe("\x1b[31mred\n")
        self.assertIn("no dataset '\\x1b[31mred\\n'", str(e.exception))
        # Nothing listening: UNAVAILABLE from each replica in turn, then the last one's error.
        dead = conveyor.Client("127.0.0.1:1")
        with self.assertRaises(conveyor.ConveyorError) as e:
            dead.list_datasets()
        self.assertEqual(e.exception.code.name, "UNAVAILABLE")
        self.assertIn("127.0.0.1:1: failed to connect", str(e.exception))
        self.assertIn("is conveyord running and listening there? ('conveyor health 127.0.0.1:1' asks it)",
                      str(e.exception))
        dead.close()
        # A stream that cannot connect says the same once it gives up.
        with self.assertRaises(conveyor.ConveyorError) as e:
            next(iter(conveyor.Client("127.0.0.1:1").subscribe("simple", reconnect=False)))
        self.assertIn("is conveyord running", str(e.exception))

    def test_batches_say_how_many_bad_sequences_they_left_out(self):
        # maxErrors 2, lines 3 and 7 bad, minibatches of 4 in file order: 3 + 3 + 2 rows.
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "bad.ctf"), "w") as f:
                f.writelines("|x 1 abc\n" if i in (3, 7) else f"|x {i} 0.5\n" for i in range(10))
            config = os.path.join(tmp, "bad.yaml")
            with open(config, "w") as f:
                f.write("datasets:\n  bad:\n    randomize: false\n    maxErrors: 2\n    deserializers:\n"
                        "      - type: CNTKTextFormat\n        file: bad.ctf\n"
                        "        input:\n          x: {dim: 2, format: dense}\n")
            daemon, address = start_daemon(tmp, config)
            try:
                client = conveyor.Client(address)
                got = [(b.rows, b.dropped, b.dense("x")[0, 0, 0]) for b in client.subscribe("bad", minibatch_size=4)]
                self.assertEqual(got, [(3, 1, 0.0), (3, 1, 4.0), (2, 0, 8.0)])
                client.close()
                out = subprocess.run([CONVEYOR, "subscribe", address, "--dataset", "bad", "--minibatch-size", "4"],
                                     capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn("conveyor: 2 pieces (whole sequences; frames in frame mode; fragments in truncated BPTT) left out "
                              "of the batches: "
                              "dropped as bad input under the dataset's maxErrors", out.stderr)
            finally:
                daemon.terminate()
                daemon.wait(timeout=30)
                daemon.stderr.close()

    def test_a_port_past_65535_is_refused_not_wrapped(self):
        for address in ("127.0.0.1:99999", "[::1]:70000", "127.0.0.1:1,localhost:65536"):
            with self.assertRaisesRegex(ValueError, "is not a TCP port"):
                conveyor.Client(address)

    def test_unknown_dataset_is_not_found(self):
        with self.assertRaises(conveyor.ConveyorError) as e:
            next(iter(self.client.subscribe("nope")))
        self.assertEqual(e.exception.code.name, "NOT_FOUND")

    def test_batches_equal_dump(self):
        expected = dump_lines("--dataset", "sparse", "--randomize", "on", "--seed", "4", "--minibatch-size", "300")
        got = []
        for b in self.client.subscribe("sparse", minibatch_size=300, randomize=True, seed=4):
            colptr, rowind, values, (dim, columns) = b.csc("words")
            labels = b.dense("label")
            self.assertEqual(dim, 5000)
            self.assertEqual(columns, b.rows)  # one sample per sequence: T = 1
            for row, key in enumerate(b.keys()):
                entries = [[int(r), float(v)] for r, v in zip(rowind[colptr[row]:colptr[row + 1]],
                                                              values[colptr[row]:colptr[row + 1]])]
                got.append((str(key), entries, float(labels[row, 0, 0])))
        self.assertEqual(len(got), len(expected))
        for (key, entries, label), line in zip(got, expected):
            self.assertEqual(key, line["key"])
            self.assertEqual(entries, line["streams"]["words"]["sparse"][0])
            self.assertEqual(label, line["streams"]["label"]["dense"][0][0])

    def test_a_fork_ends_the_call_in_flight_and_the_stream_resumes_exactly(self):
        # gRPC forks safely only without calls in flight (a child may hang in its fork
        # handler): the call ends before the fork, and the next batch resumes at the cursor.
        unix = "unix:" + os.path.join(self.tmp.name, "d.sock")
        for address, transport in ((self.address, "inline"), (unix, "shm")):
            with self.subTest(transport=transport):
                client = conveyor.Client(address)
                def keys_of(batches):
                    return [(b.index, tuple(b.keys())) for b in batches]
                whole = keys_of(client.subscribe("sequences", minibatch_size=30, randomize=True, seed=2,
                                                 transport=transport))
                sub = client.subscribe("sequences", minibatch_size=30, randomize=True, seed=2, transport=transport)
                it = iter(sub)
                got = keys_of(next(it) for _ in range(3))
                self.assertIsNotNone(sub._responses)
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                self.assertIsNone(sub._responses)  # ended before the fork
                self.assertEqual(os.waitpid(pid, 0)[1], 0)
                got += keys_of(it)
                self.assertEqual(got, whole)
                client.close()

    def test_a_client_used_before_a_fork_serves_the_child_and_the_parent_after_it(self):
        # A fork closes every channel of the process (gRPC shuts down); each process reopens
        # them when it next uses the client.
        client = conveyor.Client(self.address)
        def keys(c):
            return [tuple(b.keys()) for b in c.subscribe("sequences", minibatch_size=30, randomize=True, seed=3)]
        whole = keys(client)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                ok = keys(client) == whole and keys(conveyor.Client(self.address)) == whole
            except BaseException:
                ok = False
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
        os.close(w)
        self.assertEqual(keys(client), whole)
        self.assertEqual(wait_child(pid, 60), 0)
        self.assertEqual(os.read(r, 1), b"1")
        os.close(r)
        client.close()
        with self.assertRaisesRegex(ValueError, "closed"):
            client.list_datasets()

    # The forking script of the two tests below: forks while a thread spins in Python (asking
    # for the GIL all the time) and two threads enter and leave it; every child must end at
    # once, and every tenth uses gRPC (one batch of a new subscription). argv: build/python,
    # address, forks, whether to make a gRPC channel before importing conveyor.
    FORKS = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
forks, channel_first = int(sys.argv[3]), sys.argv[4] == "1"
if channel_first:  # gRPC registers its fork handlers before conveyor is imported
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "true"; os.environ["GRPC_POLL_STRATEGY"] = "poll"
    import grpc
    grpc.insecure_channel(sys.argv[2]).close()
intervals = set()
os.register_at_fork(before=lambda: intervals.add(sys.getswitchinterval()))  # runs after conveyor's
import conveyor
from conveyor import client as conveyor_client
from grpc._cython import cygrpc
client = conveyor.Client(sys.argv[2])
stream = iter(client.subscribe("simple", minibatch_size=10, epochs=100000))
next(stream)  # gRPC and its fork handlers are set up; a stream is open
import grpc
user_channel = grpc.insecure_channel(sys.argv[2])  # one of the trainer's own, open across forks
list_datasets = user_channel.unary_unary("/conveyor.v1.Loader/ListDatasets")
list_datasets(b"", timeout=10)
handler_ran = []  # gRPC's child handler makes a new thread count when it runs its Python
class Counting(cygrpc._ActiveThreadCount):
    def __init__(self):
        handler_ran.append(1)
        super().__init__()
cygrpc._ActiveThreadCount = Counting
def busy():
    while True:
        sum(range(50))
def in_and_out():
    while True:
        time.sleep(0.0002)
for f in (busy, in_and_out, in_and_out):
    threading.Thread(target=f, daemon=True).start()
hung = failed = ran = 0
for i in range(forks):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, bytes([len(handler_ran)]))
        if i % 10:
            os._exit(0)
        try:  # gRPC closes the parent's channels in a child (ours or gRPC's handler does)
            list_datasets(b"", timeout=10)
            os._exit(4)
        except ValueError:
            pass
        rows = len(next(iter(conveyor.Client(sys.argv[2]).subscribe("simple", minibatch_size=10, epochs=1))).keys())
        os._exit(0 if rows == 10 else 3)
    os.close(w)
    deadline = time.monotonic() + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            failed += status != 0
            ran += os.read(r, 1) == bytes([1])
            break
        if time.monotonic() > deadline:
            hung += 1
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            break
        time.sleep(0.001)
    os.close(r)
    if i % 50 == 0:
        next(stream)  # the stream resumes between forks
print(f"guard {conveyor_client._GRPC_FORK_GUARD.active}; {hung} hung, {failed} failed of {forks}; "
      f"gRPC's child handler ran Python in {ran}; switch interval during forks "
      f"{sorted(round(x, 4) for x in intervals)}, after {round(sys.getswitchinterval(), 4)}", flush=True)
os._exit(0)
"""

    def test_grpc_runs_no_python_in_a_forked_child_and_no_child_hangs(self):
        # gRPC's child fork handler runs Python code inside fork(), before the interpreter has
        # reset its GIL: a request for the GIL pending at the fork (another thread waited one
        # switch interval) hung the child inside os.fork(): 11 of 300 small forks here before
        # any guard, and with the switch-interval guard still 5 of 500 forks of a 3 GB process
        # beside two busy processes. conveyor keeps that handler from running Python at all
        # (conveyor.client._GrpcChildHandlerGuard) and does its work after the fork: the
        # mechanism is checked in every child (gRPC's handler made no thread count), the
        # children use gRPC, and no fork waits on the switch interval.
        out = subprocess.run([sys.executable, "-c", self.FORKS, os.path.join(BUILD, "python"), self.address, "200", "0"],
                             capture_output=True, text=True, timeout=240)
        self.assertEqual(out.stdout.strip(), "guard True; 0 hung, 0 failed of 200; gRPC's child handler ran Python "
                         "in 0; switch interval during forks [0.005], after 0.005", out.stderr[-2000:])

    def test_a_child_whose_grpc_cannot_be_reset_exits_instead_of_hanging(self):
        # What gRPC's own handler does when its reset fails: the child exits (EX_USAGE), so a
        # DataLoader reports a dead worker instead of waiting on one that hangs on its first
        # call (conveyor's own locks are new in the child either way).
        script = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import conveyor
import grpc, grpc._channel
client = conveyor.Client(sys.argv[2])
client.list_datasets()
channel = grpc.insecure_channel(sys.argv[2])
def broken(self):
    raise RuntimeError("cannot close")
grpc._channel.Channel._close_on_fork = broken
pid = os.fork()
if pid == 0:
    client.list_datasets()
    os._exit(0)
deadline = time.monotonic() + 20
while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
    if time.monotonic() > deadline:
        os.kill(pid, 9); os.waitpid(pid, 0)
        print("hung"); os._exit(0)
    time.sleep(0.01)
print("exit", os.waitstatus_to_exitcode(done[1]))
"""
        out = subprocess.run([sys.executable, "-c", script, os.path.join(BUILD, "python"), self.address],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.strip(), f"exit {os.EX_USAGE}", out.stderr[-2000:])
        self.assertIn("conveyor: gRPC could not be reset after a fork (RuntimeError('cannot close'))", out.stderr)

    def test_with_a_channel_made_before_conveyor_forks_fall_back_to_the_switch_interval(self):
        # gRPC's handlers registered before conveyor's: its prepare handler would run after
        # ours and clear the flag, so the guard stays off, gRPC's child handler runs its
        # Python, and the fork raises the switch interval to 50 ms instead (a pending request
        # is cleared, and none can be made for 50 ms). That only narrows the window: beside
        # these threads a child in 50 may still hang (it did here), so only the mechanism is
        # checked, and that every child that did not hang ended well.
        out = subprocess.run([sys.executable, "-c", self.FORKS, os.path.join(BUILD, "python"), self.address, "50", "1"],
                             capture_output=True, text=True, timeout=240)
        m = re.fullmatch(r"guard False; (\d+) hung, 0 failed of 50; gRPC's child handler ran Python in (\d+); "
                         r"switch interval during forks \[0.05\], after 0.005", out.stdout.strip())
        self.assertIsNotNone(m, out.stdout + out.stderr[-2000:])
        self.assertEqual(int(m.group(1)) + int(m.group(2)), 50, out.stdout)

    def test_a_trainer_that_made_a_channel_before_conveyor_is_told_before_its_workers_fork(self):
        # Without the guard (a gRPC channel made first), forked DataLoader workers rarely hang:
        # the trainer hears it once, with what to do; with conveyor imported first it hears
        # nothing.
        script = """
import os, sys, warnings
sys.path.insert(0, sys.argv[1])
if sys.argv[3] == "1":
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "true"; os.environ["GRPC_POLL_STRATEGY"] = "poll"
    import grpc
    grpc.insecure_channel(sys.argv[2]).close()
import conveyor.torch
class It:
    _multiprocessing_context = None
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    conveyor.torch._warn_if_fork_unsafe(It())
    conveyor.torch._warn_if_fork_unsafe(It())
print(len(seen), *(str(w.message) for w in seen))
"""
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not installed")
        for channel_first, expected in (("1", "1 conveyor: a gRPC channel was made before conveyor was imported"),
                                        ("0", "0")):
            out = subprocess.run([sys.executable, "-c", script, os.path.join(BUILD, "python"), self.address,
                                  channel_first], capture_output=True, text=True, timeout=120)
            self.assertTrue(out.stdout.startswith(expected), out.stdout + out.stderr[-2000:])
            if channel_first == "1":
                self.assertIn("multiprocessing_context='forkserver'", out.stdout)

    def test_shared_memory_equals_inline(self):
        unix = "unix:" + os.path.join(self.tmp.name, "d.sock")
        client = conveyor.Client(unix)
        def collect(transport):
            out = []
            for b in client.subscribe("sequences", minibatch_size=30, randomize=True, transport=transport):
                colptr, rowind, values, _ = b.csc("word")
                out.append((b.index, tuple(b.keys()), colptr.tolist(), rowind.tolist(), values.tolist(),
                            b.lengths("word").tolist()))
            return out
        self.assertEqual(collect("shm"), collect("inline"))
        client.close()

    def test_cuda_transport_is_refused_without_a_device_or_equals_shm(self):
        unix = "unix:" + os.path.join(self.tmp.name, "d.sock")
        client = conveyor.Client(unix)
        try:
            import torch
            has_device = torch.cuda.is_available()
        except ImportError:
            has_device = False
        if not has_device:
            with self.assertRaises(conveyor.ConveyorError) as e:
                next(iter(client.subscribe("sequences", minibatch_size=30, transport="cuda")))
            self.assertEqual(e.exception.code.name, "FAILED_PRECONDITION")
            self.assertIn("TRANSPORT_CUDA_IPC needs a CUDA device", str(e.exception))
            self.assertIn("TRANSPORT_SHARED_MEMORY", str(e.exception))
        else:  # the same batches as shared memory, as CUDA tensors in the daemon's slots
            def collect(transport):
                out = []
                for b in client.subscribe("sequences", minibatch_size=30, randomize=True, transport=transport):
                    colptr, rowind, values, _ = b.csc("word")
                    t = lambda a: a.cpu().tolist() if hasattr(a, "cpu") else a.tolist()
                    out.append((b.index, t(colptr), t(rowind), t(values), t(b.lengths("word"))))
                    b.release()
                return out
            self.assertEqual(collect("cuda"), collect("shm"))
        with self.assertRaises(ValueError):
            client.subscribe("sequences", transport="nvlink")
        client.close()

    def test_cli_subscribe_dumps_what_dump_prints_and_names_what_cuda_needs(self):
        unix = "unix:" + os.path.join(self.tmp.name, "d.sock")
        args = ["--dataset", "sequences", "--minibatch-size", "30", "--randomize", "on", "--seed", "2"]
        want = subprocess.run([CONVEYOR, "dump", EXAMPLES, *args], check=True, capture_output=True, text=True).stdout
        for transport in ("inline", "shm"):
            got = subprocess.run([CONVEYOR, "subscribe", unix, "--dump", "--transport", transport, *args],
                                 check=True, capture_output=True, text=True).stdout
            self.assertEqual(got, want, transport)
        cuda = subprocess.run([CONVEYOR, "subscribe", unix, "--dump", "--transport", "cuda", *args],
                              capture_output=True, text=True)
        try:
            import torch
            has_device = torch.cuda.is_available()
        except ImportError:
            has_device = False
        if has_device:
            self.assertEqual(cuda.returncode, 0, cuda.stderr)
            self.assertEqual(cuda.stdout, want)
        else:
            self.assertNotEqual(cuda.returncode, 0)
            self.assertIn("TRANSPORT_CUDA_IPC needs a CUDA device", cuda.stderr)

    def test_arrays_are_views_without_copy(self):
        b = next(iter(self.client.subscribe("simple", minibatch_size=10)))
        x = b.dense("features")
        self.assertEqual(x.shape, (10, 1, 2))
        self.assertFalse(x.flags.owndata)
        self.assertTrue(np.shares_memory(x, np.frombuffer(b.buffer, dtype=np.uint8)))

    def test_resume_from_cursor_gives_the_rest(self):
        full = [(b.index, tuple(b.keys())) for b in self.client.subscribe("sequences", minibatch_size=50, randomize=True)]
        sub = self.client.subscribe("sequences", minibatch_size=50, randomize=True)
        head = []
        for b in sub:
            head.append((b.index, tuple(b.keys())))
            if len(head) == 5:
                break
        cursor = sub.cursor
        sub.close()
        rest = [(b.index, tuple(b.keys())) for b in
                self.client.subscribe("sequences", minibatch_size=50, randomize=True, resume=cursor)]
        self.assertEqual(head + rest, full)

    def test_torch_dataset_trains_and_resumes(self):
        import torch
        from conveyor.torch import ConveyorDataset
        ds = ConveyorDataset(self.address, "simple", minibatch_size=100, epochs=1, randomize=True, seed=2)
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        for i, batch in enumerate(torch.utils.data.DataLoader(ds, batch_size=None)):
            x = batch["features"]  # single-sample sequences: [rows, dim]
            y = batch["labels"].argmax(dim=1)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if i == 4:
                state = ds.state_dict()
        self.assertEqual(len(losses), 10)
        self.assertLess(losses[-1], losses[0])
        resumed = ConveyorDataset(self.address, "simple", minibatch_size=100, epochs=1, randomize=True, seed=2)
        resumed.load_state_dict(state)
        self.assertEqual(sum(1 for _ in resumed), 5)

    def test_torch_sparse_layouts(self):
        import torch
        from conveyor.torch import ConveyorDataset
        for layout, expected in (("csc", torch.sparse_csc), ("csr", torch.sparse_csr)):
            ds = ConveyorDataset(self.address, "sparse", minibatch_size=64, sparse_layout=layout)
            batch = next(iter(ds))
            self.assertEqual(batch["words"].layout, expected)
            self.assertEqual(tuple(batch["words"].shape), (5000, 64))
        # Dense is laid out as a dense stream would be: [rows, dim] for single-sample sequences.
        dense = next(iter(ConveyorDataset(self.address, "sparse", minibatch_size=64, sparse_layout="dense")))["words"]
        self.assertEqual(dense.layout, torch.strided)
        self.assertEqual(tuple(dense.shape), (64, 5000))
        csc = next(iter(ConveyorDataset(self.address, "sparse", minibatch_size=64)))["words"]
        csr = next(iter(ConveyorDataset(self.address, "sparse", minibatch_size=64, sparse_layout="csr")))["words"]
        self.assertTrue(torch.equal(csc.to_dense().T.reshape(64, 5000), dense))
        self.assertTrue(torch.equal(csr.to_dense(), csc.to_dense()))

    def test_daemon_converts_layouts(self):
        client = conveyor.Client(self.address)
        try:
            csc = next(iter(client.subscribe("sparse", minibatch_size=100, seed=5, randomize=True)))
            csr = next(iter(client.subscribe("sparse", minibatch_size=100, seed=5, randomize=True, layouts={"words": "csr"})))
            self.assertEqual(csr.layout("words"), "csr")
            self.assertEqual(csr.layout("label"), "dense")
            with self.assertRaises(ValueError):
                csr.csc("words")
            colptr, rowind, values, (dim, columns) = csc.csc("words")
            rowptr, colind, cvalues, shape = csr.csr("words")
            self.assertEqual(shape, (dim, columns))
            a = np.zeros((dim, columns), np.float32)
            for j in range(columns):
                a[rowind[colptr[j]:colptr[j + 1]], j] += values[colptr[j]:colptr[j + 1]]
            b = np.zeros((dim, columns), np.float32)
            for i in range(dim):
                b[i, colind[rowptr[i]:rowptr[i + 1]]] += cvalues[rowptr[i]:rowptr[i + 1]]
            np.testing.assert_array_equal(a, b)
            with self.assertRaises(ValueError):
                client.subscribe("sparse", layouts={"words": "coo"})
            with self.assertRaises(conveyor.ConveyorError) as refused:
                next(iter(client.subscribe("sparse", layouts={"label": "csr"})))
            self.assertIn("applies to sparse streams only", str(refused.exception))
        finally:
            client.close()


KALDI = os.path.join(SOURCE, "tests", "data", "kaldi")


def read_gt(name):
    """Kaldi's own decoding (tests/data/kaldi/gt): key (bytes) -> float32 matrix or int32 vector."""
    out = {}
    with open(os.path.join(KALDI, "gt", name)) as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("#"):
            continue
        f = line.split()
        if f[1] == "iv":
            out[f[0].encode()] = np.array([int(v) for v in f[3:]], dtype=np.int32)
        else:
            rows, cols = int(f[2]), int(f[3])
            out[f[0].encode()] = np.array([float(v) for v in f[4:]], dtype=np.float32).reshape(rows, cols)
    return out


class KaldiTest(unittest.TestCase):
    """Kaldi features joined with alignments, served by a daemon: utterance ids as keys, dense
    features and int32 ids exactly as Kaldi decodes them, over TCP and shared memory."""

    def test_features_and_alignments(self):
        feats, ali = read_gt("feats.gt"), read_gt("ali.gt")
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "kaldi.yaml")
            with open(config, "w") as f:
                f.write(f"""datasets:
  speech:
    randomize: false
    deserializers:
      - type: KaldiTable
        rspecifier: "scp:{KALDI}/feats.scp"
        input: {{features: {{dim: 40}}}}
      - type: KaldiTable
        rspecifier: "ark:{KALDI}/ali.ark"
        kind: int32-vector
        input: {{labels: {{format: ids}}}}
""")
            proc, address = start_daemon(tmp, config)
            try:
                client = conveyor.Client(address)
                unix = conveyor.Client("unix:" + os.path.join(tmp, "d.sock"))
                for transport in ("inline", "shm"):
                    seen = []
                    c = unix if transport == "shm" else client
                    for batch in c.subscribe("speech", minibatch_size=700, transport=transport):
                        self.assertEqual(batch.layout("labels"), "ids")
                        x, y = batch.dense("features"), batch.ids("labels")
                        lx, ly = batch.lengths("features"), batch.lengths("labels")
                        self.assertEqual(y.dtype, np.int32)
                        for row, key in enumerate(batch.keys()):
                            np.testing.assert_array_equal(x[row, :lx[row]], feats[key])
                            np.testing.assert_array_equal(y[row, :ly[row]], ali[key])
                            self.assertTrue((y[row, ly[row]:] == 0).all())
                            seen.append(key)
                    self.assertEqual(seen, list(feats))
                import conveyor.torch as ct
                ds = ct.ConveyorDataset(address, "speech", minibatch_size=700)
                first = next(iter(ds))
                self.assertEqual(first["labels"].dtype, __import__("torch").int64)
                client.close()
                unix.close()
            finally:
                proc.terminate()
                proc.wait(timeout=30)
                proc.stderr.close()


class NonUtf8KeysTest(unittest.TestCase):
    """Keys are bytes end to end: a Kaldi utterance id that is not UTF-8 (m\\xfcller, Latin-1)
    reaches the Python client unchanged over TCP and shared memory, and `conveyor dump` prints
    it as valid UTF-8 JSON whose surrogate escapes give the bytes back."""

    def test_keys_travel_as_bytes_and_dump_as_valid_json(self):
        keys = [b"m\xfcller", b"plain", b"\xff\xfe"]
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "feats.ark"), "wb") as f:
                f.write(b"m\xfcller  [\n  1 2\n  3 4 ]\nplain  [\n  5 6 ]\n\xff\xfe  [\n  7 8 ]\n")
            config = os.path.join(tmp, "kaldi.yaml")
            with open(config, "w") as f:
                f.write("datasets:\n  speech:\n    randomize: false\n    deserializers:\n      - type: KaldiTable\n"
                        "        rspecifier: \"ark:feats.ark\"\n        input: {features: {dim: 2}}\n")
            proc, address = start_daemon(tmp, config)
            try:
                for c in (conveyor.Client(address), conveyor.Client("unix:" + os.path.join(tmp, "d.sock"))):
                    transport = "shm" if c.address.startswith("unix:") else "inline"
                    batches = list(c.subscribe("speech", minibatch_size=100, transport=transport))
                    self.assertEqual(len(batches), 1)
                    self.assertEqual(batches[0].keys(), keys, transport)
                    x = batches[0].dense("features")
                    np.testing.assert_array_equal(x[0], [[1, 2], [3, 4]])
                    np.testing.assert_array_equal(x[2, 0], [7, 8])
                    c.close()
            finally:
                proc.terminate()
                proc.wait(timeout=30)
                proc.stderr.close()
            out = subprocess.run([CONVEYOR, "dump", config, "--dataset", "speech", "--minibatch-size", "100"],
                                 check=True, capture_output=True).stdout
            lines = [json.loads(line) for line in out.decode("utf-8").splitlines()]  # strict: valid UTF-8
            self.assertEqual([line["key"].encode("utf-8", "surrogateescape") for line in lines], keys)
            self.assertIn(b'"key":"m\\udcfcller"', out)


class FrozenDaemonTest(unittest.TestCase):
    """A daemon frozen by SIGSTOP keeps its connections open; the client's keepalive pings or
    its idle deadline notice within seconds: the stream ends UNAVAILABLE, or, with a replica,
    resumes there from its cursor and the epoch arrives exactly once."""

    def _frozen_error(self, **kwargs):
        with tempfile.TemporaryDirectory() as tmp:
            proc, address = start_daemon(tmp)
            try:
                client = conveyor.Client(address, keepalive_time=kwargs.pop("keepalive_time"), keepalive_timeout=1.0)
                sub = iter(client.subscribe("sparse", minibatch_size=100, epochs=100, reconnect=False, **kwargs))
                for _ in range(3):
                    next(sub)
                os.kill(proc.pid, signal.SIGSTOP)
                frozen = time.monotonic()
                with self.assertRaises(conveyor.ConveyorError) as e:
                    for _ in range(100):  # what was sent before the freeze, then the error
                        next(sub)
                seconds = time.monotonic() - frozen
                client.close()
                return e.exception, seconds
            finally:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=30)
                proc.stderr.close()

    def test_keepalive_notices_a_frozen_daemon_within_seconds(self):
        error, seconds = self._frozen_error(keepalive_time=1.0, idle_timeout=None)
        self.assertEqual(error.code.name, "UNAVAILABLE", str(error))
        self.assertGreater(seconds, 0.5)
        self.assertLess(seconds, 6.0)

    def test_the_idle_deadline_notices_a_frozen_daemon_without_keepalive(self):
        error, seconds = self._frozen_error(keepalive_time=3600.0, idle_timeout=1.5)
        self.assertEqual(error.code.name, "UNAVAILABLE", str(error))
        self.assertIn("the idle deadline", str(error))
        self.assertGreater(seconds, 1.4)
        self.assertLess(seconds, 6.0)

    def test_a_daemon_frozen_before_the_stream_starts_is_left_after_the_idle_deadline(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc, address = start_daemon(tmp)
            try:
                os.kill(proc.pid, signal.SIGSTOP)
                client = conveyor.Client(address, keepalive_time=3600.0)
                t0 = time.monotonic()
                with self.assertRaises(conveyor.ConveyorError) as e:
                    next(iter(client.subscribe("sparse", reconnect=False, idle_timeout=1.5)))
                self.assertLess(time.monotonic() - t0, 6.0)
                self.assertEqual(e.exception.code.name, "UNAVAILABLE")
                self.assertIn("the idle deadline", str(e.exception))
                client.close()
            finally:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=30)
                proc.stderr.close()

    def test_a_frozen_daemon_is_left_for_a_replica_and_the_epoch_arrives_once(self):
        with tempfile.TemporaryDirectory() as a_dir, tempfile.TemporaryDirectory() as b_dir:
            a, a_address = start_daemon(a_dir)
            b, b_address = start_daemon(b_dir)
            try:
                client = conveyor.Client([a_address, b_address], keepalive_time=1.0, keepalive_timeout=1.0)
                keys, longest, last = [], 0.0, time.monotonic()
                sub = client.subscribe("sparse", minibatch_size=100, seed=4, randomize=True, idle_timeout=5.0)
                for n, batch in enumerate(sub):
                    now = time.monotonic()
                    longest, last = max(longest, now - last), now
                    keys.extend(batch.keys())
                    if n == 4:
                        self.assertEqual(sub.address_index, 0)
                        os.kill(a.pid, signal.SIGSTOP)
                self.assertEqual(sub.address_index, 1)
                self.assertLess(longest, 6.0)
                self.assertEqual(len(keys), 2000)
                self.assertEqual(len(set(keys)), 2000)
                client.close()
            finally:
                os.kill(a.pid, signal.SIGCONT)
                for p in (a, b):
                    p.kill()
                    p.wait(timeout=30)
                    p.stderr.close()


class FailoverTest(unittest.TestCase):
    @contextlib.contextmanager
    def two_daemons(self):
        """Two replicas (process, address) on the bundled examples; both gone afterwards."""
        with tempfile.TemporaryDirectory() as a_dir, tempfile.TemporaryDirectory() as b_dir:
            a, a_address = start_daemon(a_dir)
            b, b_address = start_daemon(b_dir)
            try:
                yield (a, a_address), (b, b_address)
            finally:
                for p in (a, b):
                    if p.poll() is None:
                        p.kill()
                    p.wait(timeout=30)
                    p.stderr.close()

    def test_a_killed_daemon_fails_over_to_the_replica(self):
        with self.two_daemons() as ((a, a_address), (_, b_address)):
            client = conveyor.Client([a_address, b_address])
            keys = []
            sub = client.subscribe("sparse", minibatch_size=100, seed=4, randomize=True)
            for n, batch in enumerate(sub):
                keys.extend(batch.keys())
                if n == 3:
                    self.assertEqual(sub.address_index, 0)
                    a.kill()
                    a.wait(timeout=30)
            self.assertEqual(sub.address_index, 1)
            self.assertEqual(len(keys), 2000)
            self.assertEqual(len(set(keys)), 2000)
            self.assertIn("sparse", client.list_datasets())  # unary calls skip the dead one
            client.close()

    def test_failover_keeps_a_batch_stride_and_a_first_epoch(self):
        # A DataLoader worker's share (every second batch) from epoch 1 on: the resumed stream
        # starts after the last batch handed out, so the client asks for the batch `stride`
        # on from there, and no first epoch next to the cursor (the daemon refuses both).
        with self.two_daemons() as ((a, a_address), (_, b_address)):
            def read(client, kill_after=None):
                got = []
                sub = client.subscribe("sparse", minibatch_size=100, seed=4, randomize=True, epochs=3,
                                       first_epoch=1, batch_stride=2, batch_offset=1)
                for batch in sub:
                    got.append((batch.epoch, batch.index, tuple(batch.keys())))
                    if kill_after is not None and len(got) == kill_after:
                        a.kill()
                        a.wait(timeout=30)
                return got
            alone = conveyor.Client(b_address)
            expected = read(alone)
            alone.close()
            self.assertEqual([(e, i) for e, i, _ in expected],
                             [(e, i) for e in (1, 2) for i in range(1, 20, 2)])
            client = conveyor.Client([a_address, b_address])
            self.assertEqual(read(client, kill_after=5), expected)
            client.close()

if __name__ == "__main__":
    unittest.main()
