#!/usr/bin/python3
"""seqpar-diagnose names the attention signature of each ulysses variant from its dump.

    scripts/diagnose_ulysses_dumps.py SEQPAR_REPRO SEQPAR_DIAGNOSE WORK_DIR

seqpar-repro --scenario ulysses --dump DIR writes, per variant, DIR/<key>.safetensors
with the step-1 attention output of every rank gathered in one-rank row order, and
DIR/reference.safetensors with the one-rank run's (apps/repro/README.md). For each
variant, at sp 4 (the report's sizes) and at sp 2 x dp 2:
  - the gathered file as it is: --ranks DIR/<key>.safetensors --baseline
    DIR/reference.safetensors (the mesh from the configuration in its metadata);
  - split into one file per rank, as a DeepSpeed user's ranks would save their own
    tokens' attention output (world rank w holds the w-th block of S/sp rows);
each must give the variant's signature (docs/ulysses.md): correct, exact and
issue-6868 match one-rank attention; no-all-to-all and local-positions leave shard 0
equal and change later shards; local-mask changes shard 0. The per-shard figures must
be seqpar-repro's own (its --json attention_difference_by_shard).

Only the standard library. Exit status 1 when any check fails.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

EXPECTED = {
    "correct": "matches", "exact": "matches", "issue-6868": "matches",
    "no-all-to-all": "keys-or-positions-lost", "local-positions": "keys-or-positions-lost",
    "local-mask": "first-shard-differs",
}


def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def read_header(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        return header, f.read()


def split_by_rank(path, ranks, folder):
    """One file per rank holding its block of the gathered 'attention' rows."""
    header, data = read_header(path)
    entry = header["attention"]
    rows, width = entry["shape"][0], entry["shape"][1]
    begin = entry["data_offsets"][0]
    block = rows // ranks
    os.makedirs(folder, exist_ok=True)
    for rank in range(ranks):
        start = begin + rank * block * width * 4
        payload = data[start:start + block * width * 4]
        own = {"attention": {"dtype": "F32", "shape": [block, width], "data_offsets": [0, len(payload)]},
               "__metadata__": header.get("__metadata__", {})}
        text = json.dumps(own).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(folder, f"rank{rank}.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + payload)
    return os.path.join(folder, "rank*.safetensors")


class Checks:
    def __init__(self):
        self.failures = 0

    def expect(self, what, ok, detail):
        self.failures += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'}  {what}: {detail}")


def check_mesh(checks, repro, program, work, mesh, arguments):
    dump = os.path.join(work, mesh)
    shutil.rmtree(dump, ignore_errors=True)
    run([repro, "--scenario", "ulysses", "--device", "cpu", "--backend", "local", "--dump", dump,
         "--json", dump + ".json", *arguments])
    with open(dump + ".json") as f:
        figures = json.load(f)
    ranks = figures["sequence_parallel_size"] * figures["data_parallel_size"]
    reference = os.path.join(dump, "reference.safetensors")
    for variant in figures["variants"]:
        key = variant["key"]
        gathered = os.path.join(dump, key + ".safetensors")
        per_rank = split_by_rank(gathered, ranks, os.path.join(dump, "ranks", key))
        for layout, files in (("gathered", gathered), ("per rank", per_rank)):
            result = json.loads(run([program, "--ranks", files, "--baseline", reference, "--json", "-"]))
            attention = result["attention"]
            what = f"{mesh} {key} ({layout})"
            checks.expect(what + ": signature", attention["signature"] == EXPECTED[key], attention["signature"])
            shards = [s["max_difference"] for s in attention["output"]["shards"]]
            expected = variant["attention_difference_by_shard"]
            same = len(shards) == len(expected) and all(
                abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(shards, expected))
            checks.expect(what + ": max |difference| by shard", same, f"{shards} (seqpar-repro {expected})")
            checks.expect(what + ": verdict drawn only on attention", result["verdict"] == "SKIPPED",
                          result["verdict"])
            checks.expect(what + ": no parameters compared", result["parameters_agree"] is None,
                          result["parameters_agree"])


def main():
    repro, program, work = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(work, exist_ok=True)
    checks = Checks()
    check_mesh(checks, repro, program, work, "sp4", [])
    check_mesh(checks, repro, program, work, "sp2dp2",
               ["--set", "ds_config.sequence_parallel_size=2", "--set", "ds_config.data_parallel_size=2",
                "--set", "repro.rows=256"])
    print(f"{checks.failures} failure(s)")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
