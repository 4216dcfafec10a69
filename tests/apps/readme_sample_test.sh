#!/bin/sh
# The README's sample output is what seqpar-repro prints, byte for byte apart from the
# timings (on a CPU: the sample is the run of a machine without a GPU).
#
#   tests/apps/readme_sample_test.sh SEQPAR_REPRO SOURCE_DIR
set -u
repro=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The README's block: from the report's first line to the closing fence.
first="seqpar-repro: DeepSpeed issue #6868, sequence-parallel ranks end a step with different parameters"
awk -v first="$first" '$0 == first { inside = 1 } inside && /^```/ { exit } inside { print }' \
  "$source_dir/README.md" > "$work/readme"
(cd "$work" && "$repro" --device cpu --backend local -q) > "$work/run" || exit 1
without_timings() { sed -E 's/[0-9.]+ ms\/step/T ms\/step/g' "$1"; }
if [ ! -s "$work/readme" ]; then
  echo "FAIL: no sample output found in README.md"
  exit 1
fi
# (the report's trailing blank line is not in the README's block)
printf '%s\n' "$(without_timings "$work/run")" > "$work/run.masked"
if without_timings "$work/readme" | diff - "$work/run.masked"; then
  echo "ok: README.md's sample output is the program's ($(wc -l < "$work/run") lines)"
else
  echo "FAIL: README.md's sample output differs from the run above (timings aside)"
  exit 1
fi
