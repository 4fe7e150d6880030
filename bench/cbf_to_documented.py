#!/usr/bin/env python3
"""Rewrites a CBF file in ctf2bin's layout whose streams are all sparse float with one sample a
sequence (e.g. `gen_ctf sparse` converted with `conveyor convert`) in the documented layout
(common/formats/cbf/cbf_reader.h, layout 2), chunk for chunk, every input isSequence 0: the
input of the documented layout's line of `conveyor bench` in bench/RESULTS.md.

  bench/cbf_to_documented.py sparse.cbf sparse_doc.cbf
"""
import struct
import sys


def main(src, dst):
    b = open(src, "rb").read()
    pos = struct.unpack_from("<q", b, len(b) - 8)[0] + 8  # past the header's magic
    nchunks, nstreams = struct.unpack_from("<II", b, pos)
    pos += 8
    header = struct.pack("<qqi", 1, nchunks, nstreams)
    for _ in range(nstreams):
        matrix, name_len = struct.unpack_from("<BI", b, pos)
        name = b[pos + 5:pos + 5 + name_len]
        elem, dim = struct.unpack_from("<BI", b, pos + 5 + name_len)
        pos += 10 + name_len
        if matrix != 1 or elem != 0:
            sys.exit(f"{src}: stream {name!r} is not sparse float")
        # name, SparseBinaryDataDeserializer, storage CSC, float, isSequence 0, sample size
        header += struct.pack("<i", name_len) + name + struct.pack("<iiiii", 1, 0, 0, 0, dim)
    chunks = [struct.unpack_from("<qII", b, pos + 16 * c) for c in range(nchunks)]
    table, data, at = b"", [], 0
    for offset, nseq, nsamples in chunks:
        p = offset + 4 * nseq  # past the sequence lengths
        chunk = b""
        for _ in range(nstreams):
            values, rows, starts = [], [], [0]
            for _ in range(nseq):
                n, nnz = struct.unpack_from("<Ii", b, p)
                if n != 1:
                    sys.exit(f"{src}: a sequence of {n} samples")
                values.append(b[p + 8:p + 8 + 4 * nnz])
                rows.append(b[p + 8 + 4 * nnz:p + 8 + 8 * nnz])  # sample 0: row = index
                p += 12 + 8 * nnz
                starts.append(starts[-1] + nnz)
            chunk += struct.pack("<i", starts[-1]) + b"".join(values) + b"".join(rows)
            chunk += struct.pack(f"<{len(starts)}i", *starts)
        table += struct.pack("<qii", at, nseq, nsamples)
        data.append(chunk)
        at += len(chunk)
    with open(dst, "wb") as out:
        out.write(header + table + b"".join(data))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
