#!/bin/sh
# Checks that seqpar-repro's memory does not grow with the number of steps: runs the
# same scenario on the CPU for a short and a long number of steps and fails if the
# peak resident memory (GNU time's %M, the kernel's VmHWM) differs by 10 % or more.
#
#   scripts/repro-memory.sh                       # the default scenario, 100 vs 2000 steps
#   scripts/repro-memory.sh --short 50 --long 500 -- --set repro.rows=2000   # quicker (ctest)
#
# Options: --binary PATH (default build/apps/repro/seqpar-repro), --short N, --long N;
# everything after `--` goes to seqpar-repro. The default scenario takes about 0.5 s a
# step on two cores, so the default comparison runs for about 20 minutes.
set -eu

binary=build/apps/repro/seqpar-repro
short=100
long=2000
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --short) short=$2; shift 2 ;;
    --long) long=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "repro-memory.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x /usr/bin/time ] || { echo "repro-memory.sh: needs GNU time (/usr/bin/time)" >&2; exit 2; }
[ -x "$binary" ] || { echo "repro-memory.sh: no program at $binary" >&2; exit 2; }

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT

# peak_kb STEPS ARGS...: the peak resident memory of one run, in KiB.
peak_kb() {
  steps=$1
  shift
  start=$(date +%s)
  /usr/bin/time -f %M -o "$workdir/peak" "$binary" --device cpu --backend local --plot "" \
    --steps "$steps" "$@" > "$workdir/report.txt"
  echo "  $steps steps: $(cat "$workdir/peak") KiB peak, $(($(date +%s) - start)) s" >&2
  cat "$workdir/peak"
}

echo "seqpar-repro peak resident memory, $short vs $long steps${*:+ ($*)}:" >&2
small=$(peak_kb "$short" "$@")
large=$(peak_kb "$long" "$@")
# |large - small| / small < 10 %, in integers: 10 * |large - small| < small.
difference=$((large > small ? large - small : small - large))
percent=$(awk -v d="$difference" -v s="$small" 'BEGIN { printf "%.1f", 100 * d / s }')
if [ $((10 * difference)) -lt "$small" ]; then
  echo "PASS: peak memory differs by $percent % (< 10 %)" >&2
else
  echo "FAIL: peak memory differs by $percent % ($small KiB vs $large KiB): it grows with the steps" >&2
  exit 1
fi
