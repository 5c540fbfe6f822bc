#!/usr/bin/env bash
# CLI tests: cairn inspect and cairn verify on a good, a corrupted and an incomplete checkpoint.
# usage: cli_test.sh CAIRN MAKE_CHECKPOINT
set -u
cairn=$1 make=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
contains() { grep -q -- "$2" "$1"; }

"$make" "$dir/ckpt" || { echo "FAIL could not make a checkpoint"; exit 1; }

"$cairn" inspect "$dir/ckpt" >"$dir/out" 2>&1; rc=$?
check "inspect exits 0" test $rc -eq 0
check "inspect lists keys, dtype, shape" contains "$dir/out" "model.w  *F32  *\[128, 8\]"
check "inspect shows world size" contains "$dir/out" "saved by *2 rank"
check "inspect shows content metadata" contains "$dir/out" "purpose = cli test"

"$cairn" inspect "$dir/ckpt" --json >"$dir/json" 2>"$dir/err"; rc=$?
check "inspect --json exits 0" test $rc -eq 0
check "inspect --json prints only JSON" "$make" check-json "$dir/json"
check "inspect --json has the world size" contains "$dir/json" '"world_size":2'
check "inspect --json has the format version" contains "$dir/json" '"format_version":2'

"$cairn" verify "$dir/ckpt" >"$dir/out" 2>&1; rc=$?
check "verify of an intact checkpoint exits 0" test $rc -eq 0

# Flip one byte in the middle of rank 1's data file.
data=$(ls "$dir/ckpt"/data.1.*.cairn)
size=$(stat -c %s "$data")
off=$((size / 2))
byte=$(od -An -tu1 -j "$off" -N1 "$data" | tr -d ' ')
printf "$(printf '\\%03o' $(((byte + 1) % 256)))" | dd of="$data" bs=1 seek="$off" conv=notrunc status=none
"$cairn" verify "$dir/ckpt" >"$dir/out" 2>&1; rc=$?
check "verify of a corrupted checkpoint fails" test $rc -ne 0
check "verify names the chunk" contains "$dir/out" "tensor 'model.w' chunk"
check "verify names the file" contains "$dir/out" "$(basename "$data")"
cat "$dir/out"

rm "$dir/ckpt/metadata.json"
"$cairn" inspect "$dir/ckpt" >"$dir/out" 2>&1; rc=$?
check "inspect without metadata.json fails" test $rc -ne 0
check "inspect says incomplete checkpoint" contains "$dir/out" "incomplete checkpoint"
"$cairn" verify "$dir/ckpt" >"$dir/out" 2>&1; rc=$?
check "verify without metadata.json fails" test $rc -ne 0
check "verify says incomplete checkpoint" contains "$dir/out" "incomplete checkpoint"

echo "$fails failure(s)"
exit $((fails > 0))
