#!/usr/bin/env python3
"""Stall samples and executed instructions of a kernel, part by part.

Reads what `ncu --section WarpStateStats --section SourceCounters --page source
--print-source sass --csv ...` printed for one kernel launch (plain or gzipped; ncu's
own lines before the table are skipped) and sums the columns "Warp Stall Sampling (All
Samples)" and "Instructions Executed" over ranges of SASS instructions, counted in
address order from 0:

  scripts/ncu_source_parts.py PROFILE.csv[.gz] prologue:0:700 loop:700:1285 epilogue:1285:end

A range's end may be `end`. Without ranges it lists every 100 instructions with its most
frequent opcodes, to find the parts' boundaries.
"""
import collections
import csv
import gzip
import sys


def rows_of(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    return list(csv.DictReader(lines[start:]))


def number(text):
    text = (text or "").replace(",", "")
    try:
        return float(text)
    except ValueError:
        return 0.0


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    rows = rows_of(argv[1])
    samples = [number(r["Warp Stall Sampling (All Samples)"]) for r in rows]
    executed = [number(r["Instructions Executed"]) for r in rows]
    total = sum(samples) or 1.0
    print(f"{len(rows)} instructions, {sum(samples):.0f} stall samples, "
          f"{sum(executed):.0f} warp instructions executed")
    if len(argv) == 2:
        for first in range(0, len(rows), 100):
            last = min(first + 100, len(rows))
            opcodes = collections.Counter(
                r["Source"].split()[1 if r["Source"].lstrip().startswith("@") else 0]
                for r in rows[first:last] if r["Source"].strip())
            print(f"  {first:5d}-{last:5d} {sum(samples[first:last]):6.0f} samples "
                  f"{sum(executed[first:last]):10.0f} instructions  {opcodes.most_common(4)}")
        return
    for part in argv[2:]:
        name, first, last = part.rsplit(":", 2)
        first, last = int(first), len(rows) if last == "end" else int(last)
        s = sum(samples[first:last])
        print(f"  {name:24s} [{first}, {last}): {s:6.0f} samples ({100 * s / total:4.1f} %), "
              f"{sum(executed[first:last]):10.0f} instructions")


if __name__ == "__main__":
    main(sys.argv)
