#!/bin/sh
# bench/ab.sh, against two test doubles of seqpar-bench (shell scripts that print a
# figure and the arguments they got): the runs alternate, before first, each labelled by
# its program; only the picked lines are printed; the arguments reach the program; a
# failed run is reported with its status; bad arguments are refused with status 2.
#
#   tests/bench_ab_test.sh SOURCE_DIR
set -u
script="$1/bench/ab.sh"
fail() { echo "FAIL: bench/ab.sh $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/before" "$work/after/bench" "$work/broken"
printf '#!/bin/sh\necho "step/fake_before  1.00 us $*"\necho "noise"\n' > "$work/before/seqpar-bench"
printf '#!/bin/sh\necho "kernel/fake_after  2.00 us $*"\n' > "$work/after/bench/seqpar-bench"
printf '#!/bin/sh\necho "step/fake_broken  3.00 us"\necho "it broke"\nexit 3\n' > "$work/broken/seqpar-bench"
chmod +x "$work/before/seqpar-bench" "$work/after/bench/seqpar-bench" "$work/broken/seqpar-bench"

bash "$script" "$work/before" "$work/after" > "$work/out.txt" 2>&1 || fail "two working builds: status $?"
[ "$(grep -c '^== ' "$work/out.txt")" -eq 4 ] || fail "default: not 4 runs"
[ "$(grep '^== ' "$work/out.txt" | sed 's/,.*//' | tr '\n' ' ')" = \
  "== $work/before/seqpar-bench == $work/after/bench/seqpar-bench == $work/before/seqpar-bench == $work/after/bench/seqpar-bench " ] ||
  fail "default: runs not alternating, before first"
grep -q '^step/fake_before  1.00 us --no-stress$' "$work/out.txt" || fail "default: --no-stress not passed"
grep -q '^kernel/fake_after  2.00 us --no-stress$' "$work/out.txt" || fail "default: a kernel line dropped"
! grep -q noise "$work/out.txt" || fail "default: an unpicked line printed"

bash "$script" "$work/before" "$work/after" 1 --repeats 5 > "$work/out.txt" 2>&1 || fail "one round: status $?"
[ "$(grep -c '^== ' "$work/out.txt")" -eq 2 ] || fail "one round: not 2 runs"
grep -q '^step/fake_before  1.00 us --repeats 5$' "$work/out.txt" || fail "one round: arguments not passed"

bash "$script" "$work/before" "$work/broken" 1 > "$work/out.txt" 2>&1
[ $? -eq 1 ] || fail "a failing build: status is not 1"
grep -q '^failed: exit 3$' "$work/out.txt" || fail "a failing build: its status not reported"
grep -q '^it broke$' "$work/out.txt" || fail "a failing build: its last lines not shown"

bash "$script" "$work/before" "$work/nowhere" > "$work/out.txt" 2>&1
[ $? -eq 2 ] || fail "a folder without seqpar-bench: status is not 2"
grep -q "no seqpar-bench in $work/nowhere" "$work/out.txt" || fail "a folder without seqpar-bench: message"
bash "$script" "$work/before" "$work/after" x > "$work/out.txt" 2>&1
[ $? -eq 2 ] || fail "ROUNDS x: status is not 2"
grep -q "ROUNDS must be a positive whole number, got 'x'" "$work/out.txt" || fail "ROUNDS x: message"
bash "$script" "$work/before" > "$work/out.txt" 2>&1
[ $? -eq 2 ] || fail "one folder: status is not 2"
echo "bench/ab.sh ok"
