#!/usr/bin/env python3
"""Dumps every dataset under tests/data and examples/ with `conveyor dump`, several ways.

Used to show that a change of the code's shape changes no byte of what a reader gets:

    scripts/dump-all.py --conveyor OLD/conveyor --out /tmp/before
    scripts/dump-all.py --conveyor NEW/conveyor --out /tmp/after
    diff -r /tmp/before/dumps /tmp/after/dumps && echo identical

(scripts/dump-compare.sh does exactly this for two builds, or for a git revision against the
working tree.) Every dump keeps its stdout, its stderr and its exit status, so error messages
and refusals are compared too. Configurations are generated (standard library only):
  * every CNTK text file: its streams inferred from the text (dense: the most values an
    alias has; sparse: the highest index + 1), read with maxErrors 0 and with 100000;
  * every CNTK binary file, all its streams; pairs of binary files joined by key;
  * every Kaldi case of tests/data/kaldi/CASES.tsv (matrices, vectors, ranges, corrupt
    files), features joined with alignments, compressed matrices;
  * the HTK features + MLF labels subset, as CNTK's configuration and as YAML;
  * a CTF file joined with itself as two deserializers (a composite of CTF members);
  * examples/conveyor.yaml and examples/reader.cntk, every dataset.
Each is dumped in file order, randomized over 2 epochs on 2 threads, as rank 1 of
2, and (speech data) in frame mode.
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {
    "order": ["--randomize", "off", "--minibatch-size", "5"],
    "random": ["--randomize", "on", "--seed", "7", "--minibatch-size", "16", "--epochs", "2", "--threads", "2"],
    "rank1of2": ["--randomize", "on", "--seed", "3", "--minibatch-size", "8", "--world", "2", "--rank", "1"],
}
FRAME_VARIANT = ["--frame-mode", "--randomize", "on", "--seed", "5", "--minibatch-size", "64"]


def infer_ctf_streams(path):
    """Alias -> (format, dim) from the text itself."""
    streams = {}
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8", "replace").strip()
            for field in line.split("|")[1:]:
                tokens = field.split()
                if not tokens or tokens[0].startswith("#"):
                    continue
                alias, values = tokens[0], tokens[1:]
                fmt, dim = streams.get(alias, ("dense", 1))
                if any(":" in v for v in values):
                    fmt = "sparse"
                    for v in values:
                        try:
                            dim = max(dim, int(v.split(":")[0]) + 1)
                        except ValueError:
                            pass
                elif fmt == "dense":
                    dim = max(dim, len(values))
                streams[alias] = (fmt, dim)
    return streams


def ctf_input(streams):
    return "{" + ", ".join(f"{a}: {{dim: {d}, format: {f}}}" for a, (f, d) in sorted(streams.items())) + "}"


def yaml_dataset(name, deserializers, extra=""):
    body = f"datasets:\n  {name}:\n    randomize: false\n{extra}    deserializers:\n"
    for d in deserializers:
        body += "      - " + d + "\n"
    return body


def configs():
    """(name, config text or existing path, suffix, dataset or None, speech?)"""
    out = []
    data = os.path.join(REPO, "tests", "data")
    text_dirs = [os.path.join(data, "cntk", "CNTKTextFormatReader", "Data"), os.path.join(data, "cntk", "python_io_tests")]
    for d in text_dirs:
        for f in sorted(os.listdir(d)):
            if not (f.endswith(".txt") or f.endswith(".ctf")):
                continue
            p = os.path.join(d, f)
            inp = ctf_input(infer_ctf_streams(p))
            for errors in (0, 100000):
                out.append((f"ctf_{f}_maxerr{errors}",
                            yaml_dataset("d", [f"{{type: CNTKTextFormat, file: \"{p}\", chunkSizeInBytes: 1024, input: {inp}}}"],
                                         f"    maxErrors: {errors}\n"), ".yaml", None, False))
    bins = []
    for sub in ("Data", "ctf2bin"):
        d = os.path.join(data, "cntk", "CNTKBinaryReader", sub)
        for f in sorted(os.listdir(d)):
            if f.endswith(".bin"):
                p = os.path.join(d, f)
                bins.append(p)
                for precision in ("float", "double"):
                    out.append((f"cbf_{sub}_{f}_{precision}",
                                yaml_dataset("d", [f"{{type: CNTKBinary, file: \"{p}\"}}"], f"    precision: {precision}\n"),
                                ".yaml", None, False))
    first = os.path.join(data, "cntk", "CNTKBinaryReader", "Data", "Simple_dense.bin")
    second = os.path.join(data, "cntk", "CNTKBinaryReader", "ctf2bin", "Simple_dense.bin")
    out.append(("cbf_join_two_files",
                yaml_dataset("d", [f"{{type: CNTKBinary, file: \"{first}\", input: {{a: {{alias: features}}}}}}",
                                   f"{{type: CNTKBinary, file: \"{second}\", input: {{b: {{alias: labels}}}}}}"]),
                ".yaml", None, False))
    seq = os.path.join(REPO, "examples", "sequences.ctf")
    out.append(("ctf_join_self",
                yaml_dataset("d", [f"{{type: CNTKTextFormat, file: \"{seq}\", chunkSizeInBytes: 2000, input: {{word: {{dim: 1000, format: sparse}}}}}}",
                                   f"{{type: CNTKTextFormat, file: \"{seq}\", input: {{tag: {{dim: 17, format: sparse}}}}}}"]),
                ".yaml", None, False))
    kaldi = os.path.join(data, "kaldi")
    with open(os.path.join(kaldi, "CASES.tsv")) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    for row in rows:
        case, reader, rspec = row[0], row[1], row[2]
        kind, precision = {"fm": ("matrix", "float"), "dm": ("matrix", "double"), "iv": ("int32-vector", "float")}[reader]
        spec_type, spec_path = rspec.split(":", 1)
        rspecifier = f"{spec_type}:{os.path.join(kaldi, spec_path)}"
        inp = "{labels: {format: ids}}" if kind == "int32-vector" else "{features: {}}"
        for compressed in ([False, True] if case.startswith("cm_") else [False]):
            out.append((f"kaldi_{case}" + ("_small_chunks" if compressed else ""),
                        yaml_dataset("d", [f"{{type: KaldiTable, rspecifier: \"{rspecifier}\", kind: {kind}, "
                                           f"chunkSizeInBytes: {2000 if compressed else 32768}, input: {inp}}}"],
                                     f"    precision: {precision}\n    maxErrors: 5\n"),
                        ".yaml", None, True))
    for feats in ("feats.scp", "cm_speech.scp", "feats_text.scp", "feats_ranges.scp"):
        out.append((f"kaldi_join_{feats}_ali",
                    yaml_dataset("d", [f"{{type: KaldiTable, rspecifier: \"scp:{os.path.join(kaldi, feats)}\", chunkSizeInBytes: 20000, input: {{features: {{}}}}}}",
                                       f"{{type: KaldiTable, rspecifier: \"ark:{os.path.join(kaldi, 'ali.ark')}\", kind: int32-vector, input: {{labels: {{format: ids}}}}}}"]),
                    ".yaml", None, True))
    htk = os.path.join(data, "cntk", "HTK", "an4_first3_reconstructed")
    out.append(("htk_an4_cntk_config", os.path.join(htk, "an4_first3_Config.cntk"), None, None, True))
    out.append(("htk_an4_yaml_window",
                yaml_dataset("d", [f"{{type: HTKFeature, chunkSizeInBytes: 100000, input: {{x: {{scpFile: \"{htk}/an4_first3.scp\", dim: 363}}}}}}",
                                   f"{{type: HTKMLF, input: {{y: {{mlfFile: \"{htk}/an4_first3.mlf\", labelMappingFile: \"{htk}/state.list\", labelDim: 132, format: ids}}}}}}"]),
                ".yaml", None, True))
    out.append(("htk_an4_yaml_context",
                yaml_dataset("d", [f"{{type: HTKFeature, input: {{x: {{scpFile: \"{htk}/an4_first3.scp\", dim: 99, contextWindow: 3}}}}}}",
                                   f"{{type: HTKMLF, input: {{y: {{mlfFile: \"{htk}/an4_first3.mlf\", labelMappingFile: \"{htk}/state.list\", labelDim: 132}}}}}}"]),
                ".yaml", None, True))
    examples = os.path.join(REPO, "examples")
    for ds in ("simple", "sparse", "sequences"):
        out.append((f"examples_{ds}", os.path.join(examples, "conveyor.yaml"), None, ds, False))
    out.append(("examples_reader_cntk", os.path.join(examples, "reader.cntk"), None, None, False))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conveyor", required=True, help="the conveyor binary to dump with")
    ap.add_argument("--out", required=True, help="directory for configs/ and dumps/ (created)")
    args = ap.parse_args()
    cfg_dir = os.path.join(args.out, "configs")
    dump_dir = os.path.join(args.out, "dumps")
    os.makedirs(cfg_dir, exist_ok=True)
    os.makedirs(dump_dir, exist_ok=True)
    env = dict(os.environ, CONVEYOR_INDEX_CACHE_DIR=os.path.join(args.out, "index-cache"))
    total = 0
    for name, config, suffix, dataset, speech in configs():
        if suffix is not None:
            path = os.path.join(cfg_dir, name + suffix)
            with open(path, "w") as f:
                f.write(config)
        else:
            path = config
        variants = dict(VARIANTS)
        if speech:
            variants["frames"] = FRAME_VARIANT
        for vname, vargs in variants.items():
            cmd = [args.conveyor, "dump", path] + (["--dataset", dataset] if dataset else []) + vargs
            p = subprocess.run(cmd, capture_output=True, env=env, timeout=300)
            with open(os.path.join(dump_dir, f"{name}__{vname}.txt"), "wb") as f:
                f.write(p.stdout)
                f.write(b"\n--- stderr ---\n")
                err = p.stderr.replace(os.path.abspath(args.out).encode(), b"<out>")
                err = re.sub(rb"\d+(\.\d+)? ?(ms|s|MB/s|GB/s)\b", b"<t>", err)
                # Parser threads report a chunk's warnings as they parse it, and a chunk may be
                # parsed again in a later epoch depending on timing: their order and repetition
                # are not promised, their set is.
                # (So is the count of errors skipped: a chunk parsed again counts its errors again.)
                err = re.sub(rb"conveyor: \d+ input errors skipped", b"conveyor: N input errors skipped", err)
                err = re.sub(rb"and \d+ more '", b"and N more '", err)
                f.write(b"\n".join(sorted(set(err.split(b"\n")))))
                f.write(f"\n--- exit {p.returncode}\n".encode())
            total += 1
    print(f"{total} dumps in {dump_dir}")


if __name__ == "__main__":
    sys.exit(main())
