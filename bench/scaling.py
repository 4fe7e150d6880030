#!/usr/bin/env python3
"""Thread scaling of `conveyor bench` for every format, on one machine, same run.

Generates the datasets of bench/RESULTS.md ("Issue 19: assembly on several threads") in
WORKDIR: CTF dense and sparse (gen_ctf), CBF dense and sparse (`conveyor convert`), HTK
features + MLF labels (the an4 archive of tests/data tiled) plain and with an 11-frame
context window, Kaldi FM, CM, CM2 and CM3 archives (tests/data/kaldi concatenated). Then runs
`conveyor bench CONFIG --dataset D --threads T --minibatch-size 4096 --json` for every dataset
and thread count, REPS times in turn (a warm-up run each first: index built, pages cached),
and prints MB/s of input (median, min-max), the CPU it used over wall time (children's
rusage), how busy the loader's thread was (its CPU over the run: near 1, it is what binds),
and the ratio of each thread count's median to --threads 1; then the same for the
rates after each run's first batch (bench's steady_mbs), which leave out the start (index,
first chunks, memory mapped new) that short runs on a virtual machine are dominated by.
`--threads T` is every thread of the read, the loader's included (T = 1: one thread does
everything). With --pair, each round also runs two `--threads 1` processes at once: their
combined rate over one alone is what two threads doing this work get from this machine
(memory bandwidth, caches, the host), the ceiling a two-thread loader is measured against.

Usage: bench/scaling.py --conveyor build/client/conveyor --gen-ctf build/bench/gen_ctf \
           --work /tmp/scaling [--threads 1,2,4,8] [--reps 3] [--scale 1.0] [--pair]
Standard library only (no numpy), so that it runs under any python3.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KALDI = os.path.join(REPO, "tests", "data", "kaldi")
AN4 = os.path.join(REPO, "tests", "data", "cntk", "HTK", "an4_first3_reconstructed")


def run(cmd, **kw):
    subprocess.run(cmd, check=True, **kw)


def make_htk(work, copies):
    """One archive of the three an4 utterances tiled `copies` times (one HTK header), an scp
    with a [s,e] range per utterance and a renamed copy of the MLF for each tile."""
    with open(os.path.join(AN4, "an4_first3.htk"), "rb") as f:
        raw = f.read()
    n, period, size, kind = struct.unpack(">iihh", raw[:12])
    frames = raw[12:]
    assert len(frames) == n * size, "an4 archive: header and size disagree"
    with open(os.path.join(work, "big.htk"), "wb") as f:
        f.write(struct.pack(">iihh", n * copies, period, size, kind))
        for _ in range(copies):
            f.write(frames)
    scp = open(os.path.join(AN4, "an4_first3.scp")).read().split()
    mlf = open(os.path.join(AN4, "an4_first3.mlf")).read().split("\n")
    assert mlf[0] == "#!MLF!#"
    with open(os.path.join(work, "big.scp"), "w") as s, open(os.path.join(work, "big.mlf"), "w") as m:
        m.write("#!MLF!#\n")
        for c in range(copies):
            for line in scp:
                name, rng = line.split("=")
                first, last = (int(v) for v in rng[rng.index("[") + 1:-1].split(","))
                base = f"t{c}_" + os.path.basename(name)
                s.write(f"{base}=big.htk[{first + c * n},{last + c * n}]\n")
            for line in mlf[1:]:
                if line.startswith('"'):
                    line = '"t%d_%s"' % (c, os.path.basename(line.strip('"')))
                if line:
                    m.write(line + "\n")
    shutil.copy(os.path.join(AN4, "state.list"), work)
    return len(frames) * copies


def concat(src, dst, times):
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        for _ in range(times):
            f.write(data)


def config(work):
    k = lambda f: (f"{{type: KaldiTable, rspecifier: \"ark:{work}/{f}\", chunkSizeInBytes: 2000000, "
                   "input: {features: {}}}")
    htk = lambda window: (
        f"{{type: HTKFeature, input: {{x: {{scpFile: \"{work}/big.scp\", dim: {33 * window}"
        + (f", contextWindow: {window}" if window > 1 else "") + "}}}, "
        f"{{type: HTKMLF, input: {{y: {{mlfFile: \"{work}/big.mlf\", labelMappingFile: \"{work}/state.list\", "
        "labelDim: 132}}}")
    ctf = {"dense": "{x: {dim: 100, format: dense}, y: {dim: 1, format: dense}}",
           "sparse": "{q: {dim: 50000, format: sparse}, d: {dim: 50000, format: sparse}}"}
    ds = {
        "ctf_dense": f"{{type: CNTKTextFormat, file: {work}/dense.ctf, input: {ctf['dense']}}}",
        "ctf_sparse": f"{{type: CNTKTextFormat, file: {work}/sparse.ctf, input: {ctf['sparse']}}}",
        "cbf_dense": f"{{type: CNTKBinary, file: {work}/dense.cbf}}",
        "cbf_sparse": f"{{type: CNTKBinary, file: {work}/sparse.cbf}}",
        "htk": htk(1),
        "htk_win": htk(11),
        "k_feats": k("feats.ark"),
        "k_cm": k("cm.ark"),
        "k_cm2": k("cm2.ark"),
        "k_cm3": k("cm3.ark"),
    }
    lines = ["datasets:"]
    for name, body in ds.items():
        lines += [f"  {name}:", "    randomize: false", "    cacheIndex: true",
                  f"    deserializers: [{body}]"]
    return "\n".join(lines) + "\n"


# (HTK's frames are decoded at assembly since 2026-12-07, 2-4x faster: more epochs for as long a run.)
EPOCHS = {"ctf_dense": 1, "ctf_sparse": 1, "cbf_dense": 10, "htk": 40, "k_feats": 10,
          "htk_win": 10, "k_cm": 3, "k_cm2": 3, "k_cm3": 3, "cbf_sparse": 5}


def bench(conveyor, cfg, dataset, threads, epochs):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([conveyor, "bench", cfg, "--dataset", dataset, "--threads", str(threads),
                          "--minibatch-size", "4096", "--epochs", str(epochs), "--json"],
                         check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = json.loads(out.strip().splitlines()[-1])
    # steady_mbs: the rate after the first batch (without the start: index, first chunks, new memory)
    # loader_cpu_seconds over seconds: how busy the loader's thread was (near 1: it binds)
    busy = summary.get("loader_cpu_seconds", 0.0) / max(summary["seconds"], 1e-9)
    return summary["bytes"] / summary["seconds"] / 1e6, cpu / wall, summary.get("steady_mbs", 0.0), busy


def bench_pair(conveyor, cfg, dataset, epochs):
    """Two `--threads 1` runs at once: their bytes over the wall of both, MB/s. What this
    machine gives two independent threads doing this work (memory bandwidth, caches, the
    host's scheduling): the ceiling of any two-thread loader, the reference for 2 vs 1."""
    cmd = [conveyor, "bench", cfg, "--dataset", dataset, "--threads", "1", "--minibatch-size", "4096",
           "--epochs", str(epochs), "--json"]
    t0 = time.monotonic()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate()[0] for p in procs]
    wall = time.monotonic() - t0
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"{dataset}: a paired run failed")
    total = sum(json.loads(o.strip().splitlines()[-1])["bytes"] for o in outs)
    return total / wall / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conveyor", required=True)
    ap.add_argument("--gen-ctf", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="dataset sizes relative to RESULTS.md's")
    ap.add_argument("--datasets", default=",".join(EPOCHS))
    ap.add_argument("--epoch-factor", type=int, default=1,
                    help="epochs of each run times this (the first epoch maps its memory new: more epochs "
                         "show the steady state)")
    ap.add_argument("--pair", action="store_true",
                    help="also run two --threads 1 processes at once each round: their combined rate over one "
                         "alone is what two threads can reach on this machine (the reference for 2 vs 1)")
    args = ap.parse_args()
    conveyor = os.path.abspath(args.conveyor)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    s = args.scale
    cfg = os.path.join(work, "scaling.yaml")
    marker = os.path.join(work, f"made-at-scale-{s}")
    if not os.path.exists(marker):  # a second call with the same --work and --scale reuses the data
        run([args.gen_ctf, "dense", str(int(268435456 * s)), f"{work}/dense.ctf"], stdout=subprocess.DEVNULL)
        run([args.gen_ctf, "sparse", str(int(134217728 * s)), f"{work}/sparse.ctf"], stdout=subprocess.DEVNULL)
        with open(cfg, "w") as f:
            f.write(config(work))
        for kind in ("dense", "sparse"):
            run([conveyor, "convert", f"{work}/{kind}.ctf", f"{work}/{kind}.cbf", "--config", cfg,
                 "--dataset", f"ctf_{kind}", "--chunk-size", "8388608"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
        times = max(1, int(600 * s))
        concat(f"{KALDI}/feats.ark", f"{work}/feats.ark", times)
        concat(f"{KALDI}/cm_auto.ark", f"{work}/cm.ark", times)
        concat(f"{KALDI}/cm_2byte_auto.ark", f"{work}/cm2.ark", times)
        concat(f"{KALDI}/cm_1byte_auto.ark", f"{work}/cm3.ark", times)
        make_htk(work, max(1, int(700 * s)))

        open(marker, "w").close()
    print(f"data made in {time.monotonic() - t0:.1f} s; {os.cpu_count()} cores", flush=True)
    threads = [int(t) for t in args.threads.split(",")]
    datasets = args.datasets.split(",")
    unknown = [d for d in datasets if d not in EPOCHS]
    if unknown:
        ap.error(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(EPOCHS)}")
    rates = {}
    for d in datasets:
        bench(conveyor, cfg, d, 2, 1)  # warm-up: index built and cached, pages in memory
        for _ in range(args.reps):
            for t in threads:
                rates.setdefault((d, t), []).append(bench(conveyor, cfg, d, t, EPOCHS[d] * args.epoch_factor))
            if args.pair:
                rates.setdefault((d, "pair"), []).append(bench_pair(conveyor, cfg, d, EPOCHS[d] * args.epoch_factor))
    def table(title, width, value, extra=lambda runs: ""):
        """One row a dataset: each thread count's median (min-max) of value(run), extra(runs)
        after it, then each count's median over the first one's."""
        print(title)
        print("dataset     " + "".join(f"{'--threads ' + str(t):>{width}}" for t in threads)
              + "".join(f"{f'{t} vs {threads[0]}':>9}" for t in threads[1:]))
        for d in datasets:
            row, med = f"{d:<12}", {}
            for t in threads:
                vals = [value(r) for r in rates[(d, t)]]
                med[t] = statistics.median(vals)
                row += f"{med[t]:>8.0f} ({min(vals):.0f}-{max(vals):.0f}){extra(rates[(d, t)])}"
            base = med[threads[0]]
            row += "".join(f"{med[t] / base if base > 0 else 0:>9.2f}" for t in threads[1:])
            print(row, flush=True)

    table(f"\n`conveyor bench --minibatch-size 4096`, epochs x{args.epoch_factor}, MB/s of input, median (min-max) "
          f"of {args.reps}; cpu = CPU time over wall time; ld = the loader's thread's CPU over the run (near 1: it binds)",
          34, lambda r: r[0],
          lambda runs: f" cpu {statistics.median(r[1] for r in runs):4.1f} ld {statistics.median(r[3] for r in runs):4.2f}")
    table("\nthe same runs after their first batch (bench's steady_mbs: the start left out), median (min-max)",
          20, lambda r: r[2])
    if args.pair and 1 in threads:
        print("\ntwo --threads 1 processes at once (the same runs' rounds): MB/s of both together, median (min-max); "
              "over one --threads 1 alone, and each thread count's rate over the pair's (1.0: all two threads "
              "can give here)")
        for d in datasets:
            pair = rates[(d, "pair")]
            one = statistics.median(r[0] for r in rates[(d, 1)])
            med = statistics.median(pair)
            row = f"{d:<12}{med:>8.0f} ({min(pair):.0f}-{max(pair):.0f}) pair/one {med / one if one > 0 else 0:5.2f}"
            row += "".join(f"   --threads {t}/pair {statistics.median(r[0] for r in rates[(d, t)]) / med:5.2f}"
                           for t in threads if t > 1)
            print(row, flush=True)

if __name__ == "__main__":
    sys.exit(main())
