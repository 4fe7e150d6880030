#!/usr/bin/env python3
"""Python's share of a stream: the raw client (conveyor.Client) against ConveyorDataset on
the same stream, inline (TCP loopback) and shared memory (unix socket), next to the C++
client (`conveyor bench`) on the same daemon and file, in one run.

    /usr/bin/python3 bench/python_bench.py [--build build] [--bytes 268435456] \
        [--minibatch-size 256] [--epochs 2] [--repeat 3]

It writes a dense CTF file (x: 100 floats, y: 1 per line; bench/gen_ctf), serves it from
memory (keepDataInMemory: true, file order, so the first epoch's parse is the only parse)
and reads whole epochs. Each figure is batches/s and GB/s of batch bytes; the median of
--repeat runs taken in turn (A B C D, A B C D, ...) so that load drifts hit each alike.

What each reader does per batch, as a trainer would:
  raw:      the numpy views of every stream (batch.dense), no copy;
  dataset:  ConveyorDataset yields a dict of torch tensors (from those arrays, no copy
            inline; copied out of the daemon's slot for shm, which is then acknowledged).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--bytes", type=int, default=256 << 20, help="size of the generated CTF file")
    ap.add_argument("--minibatch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    import conveyor  # noqa: F401  (before torch and grpc: fork-safe gRPC settings)
    from conveyor import Client
    from conveyor.torch import ConveyorDataset

    tmp = tempfile.TemporaryDirectory()
    data = os.path.join(tmp.name, "dense.ctf")
    subprocess.run([os.path.join(build, "bench", "gen_ctf"), "dense", str(args.bytes), data], check=True)
    config = os.path.join(tmp.name, "serve.yaml")
    with open(config, "w") as f:
        f.write(f"""datasets:
  dense:
    randomize: false
    keepDataInMemory: true
    file: {data}
    input:
      x: {{dim: 100, format: dense}}
      y: {{dim: 1, format: dense}}
""")
    port_file = os.path.join(tmp.name, "port")
    sock = os.path.join(tmp.name, "d.sock")
    daemon = subprocess.Popen([os.path.join(build, "server", "conveyord"), config, "--listen", "127.0.0.1:0",
                               "--port-file", port_file, "--unix", sock], stderr=subprocess.DEVNULL)
    try:
        for _ in range(3000):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            time.sleep(0.05)
        tcp = "127.0.0.1:" + open(port_file).read().strip()
        unix = "unix:" + sock
        mb, epochs = args.minibatch_size, args.epochs

        def cpp(address, transport):
            out = subprocess.run([os.path.join(build, "client", "conveyor"), "bench", address, "--dataset", "dense",
                                  "--epochs", str(epochs), "--minibatch-size", str(mb), "--transport", transport,
                                  "--json"], check=True, capture_output=True, text=True).stdout
            d = json.loads(out.strip().splitlines()[-1])
            return d["batches"], d["bytes"], d["seconds"]

        def raw(address, transport):
            client = Client(address)
            batches = nbytes = 0
            start = time.perf_counter()
            for b in client.subscribe("dense", minibatch_size=mb, epochs=epochs, transport=transport):
                b.dense("x")
                b.dense("y")
                batches += 1
                nbytes += b.descriptor.total_bytes
            seconds = time.perf_counter() - start
            client.close()
            return batches, nbytes, seconds

        def dataset(address, transport):
            ds = ConveyorDataset(address, "dense", minibatch_size=mb, epochs=epochs, transport=transport)
            batches = nbytes = 0
            start = time.perf_counter()
            for _ in range(epochs):
                for b in ds:
                    batches += 1
                    nbytes += (b["x"].numel() + b["y"].numel()) * 4
            return batches, nbytes, time.perf_counter() - start

        cases = [("C++ client (conveyor bench)", cpp), ("Python raw client", raw), ("ConveyorDataset", dataset)]
        results = {}
        for _ in range(args.repeat):
            for name, fn in cases:
                for transport, address in (("inline", tcp), ("shm", unix)):
                    results.setdefault((name, transport), []).append(fn(address, transport))
        print(f"file {args.bytes / 1e6:.0f} MB dense (100 + 1 floats per sample), minibatch {mb}, "
              f"{epochs} epochs per run, median of {args.repeat}")
        print(f"{'reader':30} {'transport':9} {'batches/s':>10} {'GB/s':>6}")
        rate = {}
        for (name, transport), runs in results.items():
            per_s = statistics.median(b / s for b, _, s in runs)
            gbs = statistics.median(n / s / 1e9 for _, n, s in runs)
            rate[(name, transport)] = per_s
            print(f"{name:30} {transport:9} {per_s:10.0f} {gbs:6.2f}")
        for transport in ("inline", "shm"):
            ratio = rate[("ConveyorDataset", transport)] / rate[("Python raw client", transport)]
            print(f"ConveyorDataset / raw client, {transport}: {ratio:.2f} (target >= 0.90)")
        ratio = rate[("ConveyorDataset", "shm")] / rate[("ConveyorDataset", "inline")]
        print(f"ConveyorDataset shm / inline: {ratio:.2f} (target >= 1.0)")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        tmp.cleanup()


if __name__ == "__main__":
    main()
