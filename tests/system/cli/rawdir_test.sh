#!/usr/bin/env bash
# A format registered from outside include/ works through the unchanged cairn tool: the
# test-only format rawdir (tests/format/rawdir/driver.hpp), linked into a copy of the tool, is
# written by `convert --format rawdir`, read back by convert, diff, inspect and verify, and
# listed as complete by ls.
# usage: rawdir_test.sh CAIRN_WITH_RAWDIR MAKE_CHECKPOINT
set -u
cairn=$1 make=$2
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh"

"$make" "$dir/ckpt" || { echo "FAIL could not make a checkpoint"; exit 1; }
mkdir -p "$dir/root"

"$cairn" convert "$dir/ckpt" "$dir/root/raw" --format rawdir >"$dir/out" 2>&1; rc=$?
check "convert --format rawdir exits 0" test $rc -eq 0
check "it writes the catalog and one data file" test -s "$dir/root/raw/rawdir.json" -a -s "$dir/root/raw/data.0.raw"
check "the summary names the format" contains "$dir/out" "file(s) in .*(rawdir)$"
check "common values and objects are not carried over" contains "$dir/out" "not carried over (no place in rawdir): .*rng/shard_0_2.*step"
"$cairn" convert "$dir/root/raw" "$dir/back" --format native >"$dir/out" 2>&1; rc=$?
check "convert reads rawdir back into native" test $rc -eq 0
check "the source is named rawdir" contains "$dir/out" "(rawdir) -> "
"$cairn" diff "$dir/root/raw" "$dir/back" >"$dir/out" 2>&1; rc=$?
check "diff finds the same tensors" test $rc -eq 0
"$cairn" inspect "$dir/root/raw" >"$dir/out" 2>&1; rc=$?
check "inspect reads rawdir" test $rc -eq 0
check "inspect names the format" contains "$dir/out" "format *rawdir"
check "inspect lists its tensors" contains "$dir/out" "model.w  *F32  *\[128, 8\]"
"$cairn" verify "$dir/root/raw" >"$dir/out" 2>&1; rc=$?
check "verify of rawdir exits 0" test $rc -eq 0
check "verify says it stores no checksums" contains "$dir/out" "rawdir checkpoint: .* stores no checksums"
truncate -s -4 "$dir/root/raw/data.0.raw"
"$cairn" verify "$dir/root/raw" >"$dir/out" 2>&1; rc=$?
check "verify of a truncated rawdir data file fails" test $rc -ne 0
check "the failure names the data file" contains "$dir/out" "data.0.raw"
"$cairn" ls "$dir/root" >"$dir/out" 2>&1; rc=$?
check "ls exits 0" test $rc -eq 0
check "ls lists the rawdir checkpoint as complete, in its format" contains "$dir/out" "raw .*complete.*rawdir"
"$cairn" convert "$dir/ckpt" "$dir/root/raw" --format rawdir >"$dir/out" 2>&1; rc=$?
check "convert refuses to write over it" test $rc -eq 1
check "the refusal names the format there" contains "$dir/out" "a rawdir checkpoint is already there"

finish
