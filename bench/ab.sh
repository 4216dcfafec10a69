#!/usr/bin/env bash
# Before and after on one machine: two builds' seqpar-bench, alternately, ROUNDS runs of
# each (default 2), each run's figures labelled by its folder. Alternating puts a drift
# of the machine (clocks, temperature, a neighbour) on both sides alike; the "before and
# after" figures of bench/RESULTS.md are read this way.
#
#   bash bench/ab.sh BEFORE AFTER [ROUNDS] [arguments for seqpar-bench]
#
# BEFORE, AFTER: folders holding seqpar-bench (or build folders: X/bench/seqpar-bench).
# The arguments default to --no-stress. AB_LINES (a grep -E pattern, default
# '^(step|kernel)/') picks the lines printed.
set -u
pick() {  # pick FOLDER: its seqpar-bench
  if [ -x "$1/seqpar-bench" ]; then echo "$1/seqpar-bench"
  elif [ -x "$1/bench/seqpar-bench" ]; then echo "$1/bench/seqpar-bench"
  else echo "bench/ab.sh: no seqpar-bench in $1 or $1/bench" >&2; exit 2
  fi
}
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
before=$(pick "$1") || exit 2
after=$(pick "$2") || exit 2
rounds=${3:-2}
case "$rounds" in ''|*[!0-9]*|0) echo "bench/ab.sh: ROUNDS must be a positive whole number, got '$rounds'" >&2; exit 2 ;; esac
shift $(( $# >= 3 ? 3 : 2 ))
[ $# -gt 0 ] || set -- --no-stress
lines=${AB_LINES:-'^(step|kernel)/'}
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
status=0
for round in $(seq 1 "$rounds"); do
  for program in "$before" "$after"; do
    echo "== $program, run $round of $rounds, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    output=$("$program" "$@" 2>&1)
    code=$?
    echo "$output" | grep -E "$lines"
    if [ $code -ne 0 ]; then
      echo "$output" | tail -n 5
      echo "failed: exit $code"
      status=1
    fi
  done
done
exit $status
