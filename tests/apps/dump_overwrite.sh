#!/usr/bin/env bash
# --dump and --overwrite against a directory that holds a user's files and links, and
# SIGINT/SIGTERM while a dump is written:
#
#   tests/apps/dump_overwrite.sh path/to/seqpar-repro
#
# Nothing outside the earlier dump's manifest may be touched; a link inside the dump
# directory is never followed; a failed or interrupted --overwrite leaves the earlier
# dump as it was, and no temporary or staging folder stays behind.
set -uo pipefail
program=$(readlink -f "$1")
work=$(mktemp -d "${TMPDIR:-/tmp}/seqpar_dump_overwrite.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
small=(--device cpu --backend local --steps 2 --set repro.rows=64 --set repro.in_features=8
       --set repro.out_features=2 --plot '')
passed=0
failed=0
judge() {  # judge NAME PROBLEM...: no problems given is a pass
  local name=$1
  shift
  if [ $# -eq 0 ]; then
    passed=$((passed + 1)); echo "ok    $name"
  else
    failed=$((failed + 1)); echo "FAIL  $name: $*"
  fi
}
run() { timeout -s KILL 120 "$program" "$@" > "$work/stdout" 2> "$work/stderr"; }
# Every file under DIR with its checksum, links as links (not followed).
snapshot() { (cd "$1" && find . -mindepth 1 -printf '%y %p %l\n' | sort &&
              find . -type f -exec md5sum {} + | sort); }
leftovers() { find "$1" -name '.*tmp*'; }

# The user's things: files beside the dump, in its folders, named like its files, and
# links out of it to precious files.
mkdir precious && echo precious > precious/rank0.safetensors && echo precious > precious/notes
run "${small[@]}" --policy exact --dump d || judge "first dump" "exit $?: $(cat stderr)"
echo mine > d/model.safetensors
echo mine > d/exact/ranking.txt
mkdir d/deepspeed-0.16 && echo mine > d/deepspeed-0.16/rank-notes.txt
mkdir d/notes && echo mine > d/notes/rank0.safetensors
ln -s ../precious/notes d/link.safetensors
user_files=(model.safetensors exact/ranking.txt deepspeed-0.16/rank-notes.txt notes/rank0.safetensors)
before_precious=$(snapshot precious)

# 1. --overwrite replaces the dump's files and nothing else.
run "${small[@]}" --dump d --overwrite
status=$?
problems=()
[ $status -eq 0 ] || problems+=("exit $status: $(cat stderr)")
for file in "${user_files[@]}"; do [ "$(cat "d/$file")" = mine ] || problems+=("$file changed"); done
[ -L d/link.safetensors ] || problems+=("the user's link is gone")
[ "$(snapshot precious)" = "$before_precious" ] || problems+=("precious/ changed")
while read -r name; do
  [ -s "d/$name" ] || problems+=("the manifest names $name, which is missing")
done < <(grep -v '^#' d/seqpar-dump.manifest)
[ "$(grep -c 'rank' d/seqpar-dump.manifest)" -eq 12 ] || problems+=("manifest: $(cat d/seqpar-dump.manifest)")
[ -z "$(leftovers d)" ] || problems+=("left: $(leftovers d)")
judge "--overwrite keeps the user's files and links" "${problems[@]}"

# 2. A dump's folder replaced by a link out of the directory: refused, nothing touched.
run "${small[@]}" --policy exact --dump e || judge "second dump" "exit $?"
rm -rf e/exact && ln -s ../precious e/exact
before=$(snapshot e)
run "${small[@]}" --policy exact --dump e --overwrite
status=$?
problems=()
[ $status -eq 2 ] || problems+=("exit $status")
grep -q "e/exact: is a symbolic link" stderr || problems+=("stderr: $(cat stderr)")
[ -s stdout ] && problems+=("the run went ahead")
[ "$(snapshot precious)" = "$before_precious" ] || problems+=("precious/ changed")
[ "$(snapshot e)" = "$before" ] || problems+=("e/ changed")
judge "a linked folder inside the dump is refused" "${problems[@]}"

# 3. The dump directory itself a link: refused.
ln -s d linked-dump
run "${small[@]}" --dump linked-dump --overwrite
judge "the dump directory as a link is refused" \
  $( [ $? -eq 2 ] && grep -q "is a symbolic link" stderr || echo "exit/stderr: $(cat stderr)")

# 4. A directory of the user's without a manifest: refused even with --overwrite.
mkdir f && echo mine > f/model.safetensors && mkdir f/exact && echo mine > f/exact/rank0.safetensors
before=$(snapshot f)
run "${small[@]}" --dump f --overwrite
status=$?
problems=()
[ $status -eq 2 ] || problems+=("exit $status")
grep -q "no seqpar-dump.manifest" stderr || problems+=("stderr: $(cat stderr)")
[ "$(snapshot f)" = "$before" ] || problems+=("f/ changed")
judge "no manifest, no --overwrite" "${problems[@]}"

# 5. A manifest that names a path outside the directory: refused.
run "${small[@]}" --policy exact --dump g
printf '../precious/notes\n' >> g/seqpar-dump.manifest
run "${small[@]}" --dump g --overwrite
judge "a manifest naming ../ is refused" \
  $( [ $? -eq 2 ] && grep -q "is not a file a dump holds" stderr || echo "exit/stderr: $(cat stderr)")

# 6. An --overwrite that fails (a user's file where the new dump puts one of its own)
# leaves the earlier dump as it was.
run "${small[@]}" --policy exact --dump h
mkdir h/with-mpu && echo mine > h/with-mpu/rank0.safetensors
before=$(snapshot h)
run "${small[@]}" --dump h --overwrite
status=$?
problems=()
[ $status -ne 0 ] || problems+=("exit 0")
grep -q "h/with-mpu/rank0.safetensors: exists and is not a file of the earlier dump" stderr ||
  problems+=("stderr: $(cat stderr)")
[ "$(snapshot h)" = "$before" ] || problems+=("h/ changed: $(snapshot h)")
judge "a failed --overwrite keeps the earlier dump" "${problems[@]}"

# 7. A pitfall scenario's flat dump: the user's *.safetensors beside it stay.
run --scenario dropout --device cpu --backend local --set repro.rows=64 --dump p
echo mine > p/model.safetensors
run --scenario dropout --device cpu --backend local --set repro.rows=64 --dump p --overwrite
status=$?
judge "a flat dump's --overwrite keeps model.safetensors" \
  $( [ $status -eq 0 ] && [ "$(cat p/model.safetensors)" = mine ] && [ -s p/inputs.safetensors ] ||
     echo "exit $status: $(cat stderr)")

# 8. SIGINT and SIGTERM while a dump is written: 130 and 143, no staging folder or
# temporary left, and the earlier dump whole (the new one, if the swap had begun).
big=(--device cpu --backend local --steps 1 --set repro.rows=256 --set repro.in_features=1024
     --set repro.out_features=256 --plot '')
run "${big[@]}" --policy exact --dump s || judge "big dump" "exit $?: $(cat stderr)"
set -m  # job control: a background job's SIGINT is not ignored
for signal in INT TERM INT TERM; do
  before=$(snapshot s)
  "$program" "${big[@]}" --dump s --overwrite > stdout 2> stderr &
  pid=$!
  for _ in $(seq 2000); do  # until the staging folder appears
    compgen -G 's/.seqpar-dump.tmp.*' > /dev/null && break
    kill -0 $pid 2> /dev/null || break
    sleep 0.01
  done
  kill -s $signal $pid 2> /dev/null
  wait $pid
  status=$?
  expected=$([ $signal = INT ] && echo 130 || echo 143)
  problems=()
  [ -z "$(leftovers s)" ] || problems+=("left: $(leftovers s)")
  if [ $status -eq "$expected" ]; then
    grep -q "unfinished output removed" stderr || problems+=("stderr: $(cat stderr)")
    after=$(snapshot s)
    # Either the earlier dump, untouched, or the whole new one (renamed in with the
    # signal held), whose manifest names every file present.
    if [ "$after" != "$before" ]; then
      while read -r name; do [ -s "s/$name" ] || problems+=("$name missing"); done \
        < <(grep -v '^#' s/seqpar-dump.manifest)
    fi
  elif [ $status -ne 0 ]; then
    problems+=("exit $status, expected $expected (or 0 when the dump ended first): $(cat stderr)")
  fi
  judge "SIG$signal during the dump (exit $status)" "${problems[@]}"
  rm -rf s/.seqpar-dump.tmp.*  # so that the next round waits for its own
done
set +m

echo "dump --overwrite tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
