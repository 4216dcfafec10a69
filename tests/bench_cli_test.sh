#!/bin/sh
# A bench program's command line: --help and --version on stdout with status 0; an
# unknown option or a malformed value one line on stderr with status 2. Parsing comes
# before any device is touched, so this runs on a machine without a GPU.
#
#   tests/bench_cli_test.sh PROGRAM NAME VERSION
set -u
program=$1 name=$2 version=$3
fail() { echo "FAIL: $name $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

"$program" --help > out.txt 2> err.txt || fail "--help: status $?"
grep -q "^usage: $name" out.txt || fail "--help: no usage on stdout"
[ "$("$program" --version)" = "$name $version" ] || fail "--version"
"$program" --repeats=x > out.txt 2> err.txt
[ $? -eq 2 ] || fail "--repeats=x: status is not 2"
grep -q "option --repeats 'x' is not an integer (try --help)" err.txt || fail "--repeats=x: message"
[ "$(wc -l < err.txt)" -eq 1 ] || fail "--repeats=x: not one line"
"$program" --bogus > out.txt 2> err.txt
[ $? -eq 2 ] || fail "--bogus: status is not 2"
grep -q "unknown option '--bogus'" err.txt || fail "--bogus: message"
echo "$name: command line ok"
