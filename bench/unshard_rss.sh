#!/usr/bin/env bash
# Peak resident memory of `cairn unshard` on a large checkpoint (not part of ctest: it needs
# about 3 x SIZE of disk and a minute or two).
#
#   bench/unshard_rss.sh [BUILD_DIR] [SIZE_GIB] [WORK_DIR]
#
# Saves a SIZE_GIB (default 2.2) checkpoint from 4 thread ranks, then runs
#   cairn unshard CKPT OUT --strategy chunks --chunk-size 256MB
#   cairn unshard CKPT OUT --strategy one_file --dtype f32
# under /usr/bin/time -v and prints each peak RSS; exits 1 if one reaches 1 GiB.
set -euo pipefail
build=${1:-build}
size=${2:-2.2}
work=${3:-$(mktemp -d "${TMPDIR:-/tmp}/cairn-unshard-rss.XXXXXX")}
cmake --build "$build" -j2 --target cairn-cli cairn-bench-make-checkpoint >/dev/null
cairn=$build/bin/cairn
trap 'rm -rf "$work"' EXIT
"$build/bin/cairn-bench-make-checkpoint" "$work/ckpt" "$size"
echo "checkpoint: $(du -sb "$work/ckpt" | cut -f1) bytes"
limit_kb=$((1024 * 1024))
status=0
run() {  # run NAME ARGS...
  local name=$1; shift
  rm -rf "$work/out"
  /usr/bin/time -v "$cairn" unshard "$work/ckpt" "$work/out" "$@" >"$work/log" 2>"$work/time"
  local rss secs
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time")
  secs=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$work/time")
  echo "$name: $(cat "$work/log" | head -1)"
  echo "$name: output $(du -sb "$work/out" | cut -f1) bytes in $(ls "$work/out" | wc -l) files," \
       "wall $secs, peak RSS $((rss / 1024)) MiB"
  if [ "$rss" -ge "$limit_kb" ]; then echo "FAIL $name: peak RSS >= 1 GiB"; status=1; fi
}
run "chunks 256MB" --strategy chunks --chunk-size 256MB
run "one_file f32" --strategy one_file --dtype f32
exit $status
