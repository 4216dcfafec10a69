#!/bin/sh
# docs/library.md's "Using seqpar as a library" program is examples/train_linear.cpp, byte for
# byte, and the output the README shows is the program's; that output is training that
# learns (example_output.sh).
#
#   tests/package/library_example_test.sh TRAIN_LINEAR SOURCE_DIR
set -u
program=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$source_dir/tests/package/example_output.sh"

# A README block: from the line FIRST to the closing fence.
readme_block() {
  awk -v first="$1" '$0 == first { inside = 1 } inside && /^```/ { exit } inside { print }' \
    "$source_dir/docs/library.md"
}
example=$source_dir/examples/train_linear.cpp
readme_block "$(head -n 1 "$example")" > "$work/readme.cpp"
if ! diff "$work/readme.cpp" "$example"; then
  echo "FAIL: docs/library.md's program differs from examples/train_linear.cpp (diff above)"
  exit 1
fi
"$program" > "$work/run" || { echo "FAIL: $program exited $?"; exit 1; }
cat "$work/run"
check_training_output "$work/run" || { echo "FAIL: the example's loss above"; exit 1; }
readme_block "$(head -n 1 "$work/run")" > "$work/readme.out"
if ! diff "$work/readme.out" "$work/run"; then
  echo "FAIL: docs/library.md's output of the example differs from the run above (diff above)"
  exit 1
fi
echo "ok: docs/library.md's program is examples/train_linear.cpp, its output the program's"
