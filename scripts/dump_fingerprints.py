#!/usr/bin/python3
"""Fingerprints of a seqpar-repro dump: one line per tensor, the SHA-256 of its bytes.

    scripts/dump_fingerprints.py DIR                 print them
    scripts/dump_fingerprints.py DIR --check FILE    compare with FILE; exit 1 on any difference

Two runs that wrote the same bits print the same lines, whatever the placement (CPU
threads, threads sharing one GPU, one process per GPU over NCCL): the numerics are
exact where they sum rows and canonical where they do not (docs/numerics.md). The
files' metadata (which names the placement) is not fingerprinted, only tensor data.
Standard library only; the safetensors layout is read here directly (an 8-byte
little-endian header length, a JSON header, the raw data).
"""
import hashlib
import json
import os
import sys


def tensors_of(path):
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
        data = f.read()
    header.pop("__metadata__", None)
    for name in sorted(header):
        begin, end = header[name]["data_offsets"]
        yield name, header[name]["dtype"], header[name]["shape"], data[begin:end]


def fingerprints(directory):
    lines = []
    for root, _, files in sorted(os.walk(directory)):
        for file in sorted(files):
            if not file.endswith(".safetensors"):
                continue
            path = os.path.join(root, file)
            label = os.path.relpath(path, directory)
            for name, dtype, shape, raw in tensors_of(path):
                digest = hashlib.sha256(raw).hexdigest()[:32]
                lines.append(f"{label} {name} {dtype}{shape} {digest}".replace(" ", " ", 1))
    return lines


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--check"):
        sys.exit(__doc__)
    lines = fingerprints(argv[1])
    if len(argv) == 2:
        print("\n".join(lines))
        return 0
    with open(argv[3]) as f:
        expected = [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]
    if lines == expected:
        print(f"fingerprints: {len(lines)} tensors, every one the same bits as {argv[3]}")
        return 0
    got, want = set(lines), set(expected)
    for line in sorted(want - got):
        print("  expected:", line)
    for line in sorted(got - want):
        print("  got:     ", line)
    print(f"fingerprints: DIFFERENT from {argv[3]}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
