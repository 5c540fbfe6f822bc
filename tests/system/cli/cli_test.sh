#!/usr/bin/env bash
# CLI tests: cairn inspect, verify, unshard, convert, diff, ls and rm on a good, a corrupted and an
# incomplete checkpoint, and the mistakes a user makes (a missing path, a root given as a
# checkpoint and the reverse, a destination that holds a checkpoint).
# usage: cli_test.sh CAIRN MAKE_CHECKPOINT
set -u
cairn=$1 make=$2
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh"

"$make" "$dir/ckpt" || { echo "FAIL could not make a checkpoint"; exit 1; }

"$cairn" inspect "$dir/ckpt" >"$dir/out" 2>&1; rc=$?
check "inspect exits 0" test $rc -eq 0
check "inspect lists keys, dtype, shape" contains "$dir/out" "model.w  *F32  *\[128, 8\]"
check "inspect shows world size" contains "$dir/out" "saved by *2 rank"
check "inspect shows content metadata" contains "$dir/out" "purpose = cli test"
check "inspect shows a common value's value" contains "$dir/out" "^  step  *I64 scalar  *12$"
check "inspect lists the per-rank objects" contains "$dir/out" "rng/shard_1_2"

"$cairn" --help >"$dir/out" 2>"$dir/err"; rc=$?
check "--help exits 0" test $rc -eq 0
check "--help prints the usage on stdout" contains "$dir/out" "usage: cairn inspect"
check "--help prints nothing on stderr" test ! -s "$dir/err"
"$cairn" frobnicate "$dir/ckpt" >"$dir/out" 2>"$dir/err"; rc=$?
check "a wrong command line exits 2 with the usage on stderr" test $rc -eq 2 -a -s "$dir/err"

# Path mistakes: a missing path, and a checkpointer's root given as a checkpoint.
"$cairn" inspect "$dir/ckpt_typo" >"$dir/out" 2>&1; rc=$?
check "inspect of a missing path fails" test $rc -eq 2
check "inspect says the path does not exist, once" contains "$dir/out" "^cairn inspect: not found: no checkpoint here: the location does not exist"
"$cairn" verify "$dir/ckpt_typo" >"$dir/out" 2>&1; rc=$?
check "verify of a missing path says not found" contains "$dir/out" "not found: no checkpoint here"

"$cairn" inspect "$dir/ckpt" --json >"$dir/json" 2>"$dir/err"; rc=$?
check "inspect --json exits 0" test $rc -eq 0
check "inspect --json prints only JSON" "$make" check-json "$dir/json"
check "inspect --json has the world size" contains "$dir/json" '"world_size":2'
check "inspect --json has the format version" contains "$dir/json" '"format_version":2'

"$cairn" verify "$dir/ckpt" >"$dir/out" 2>&1; rc=$?
check "verify of an intact checkpoint exits 0" test $rc -eq 0
"$cairn" verify "file://$dir/ckpt" >"$dir/out" 2>&1; rc=$?
check "verify of a file:// URI exits 0" test $rc -eq 0
"$cairn" verify "$dir/ckpt" --json >"$dir/json" 2>"$dir/err"; rc=$?
check "verify --json exits 0" test $rc -eq 0
check "verify --json prints only JSON" "$make" check-json "$dir/json"
check "verify --json says checksummed and ok" contains "$dir/json" '"format":"cairn","checksummed":true,"ok":true,"problems":\[\]'
check "verify --json draws no bar on a non-terminal" test ! -s "$dir/err"
"$cairn" verify "$dir/ckpt" --progress >"$dir/out" 2>"$dir/err"; rc=$?
check "verify --progress exits 0" test $rc -eq 0
check "verify --progress draws a bar to 100%" contains "$dir/err" "verify   \[#*\] 100.0%"
"$cairn" inspect "gs://bucket/ckpt" >"$dir/out" 2>&1; rc=$?
check "an unknown URI scheme fails" test $rc -eq 2
check "an unknown URI scheme is named" contains "$dir/out" "unknown storage URI scheme in \"gs://bucket/ckpt\""

# A zstd-compressed checkpoint: inspect shows the ratio, verify decompresses every block.
"$make" zstd "$dir/zstd" || { echo "FAIL could not make a compressed checkpoint"; exit 1; }
"$cairn" inspect "$dir/zstd" >"$dir/out" 2>&1; rc=$?
check "inspect of a compressed checkpoint exits 0" test $rc -eq 0
check "inspect shows the compression ratio" contains "$dir/out" "compression *zstd: tensor data 4176 bytes stored in .* (ratio [0-9.]*)"
check "inspect shows format version 3" contains "$dir/out" "format version 3"
"$cairn" inspect "$dir/zstd" --json >"$dir/json" 2>&1
check "inspect --json has the ratio" contains "$dir/json" '"compression_ratio":'
"$cairn" verify "$dir/zstd" >"$dir/out" 2>&1; rc=$?
check "verify of a compressed checkpoint exits 0" test $rc -eq 0

# Format version 5: inspect lists the index files; verify reads them whole and refuses a flipped
# byte in one, naming it.
"$make" index "$dir/v5" || { echo "FAIL could not make a version 5 checkpoint"; exit 1; }
"$cairn" inspect "$dir/v5" >"$dir/out" 2>&1; rc=$?
check "inspect of a version 5 checkpoint exits 0" test $rc -eq 0
check "inspect shows format version 5" contains "$dir/out" "format version 5"
check "inspect shows the index files" contains "$dir/out" "index  *[0-9]* index files"
check "inspect lists the tensors of version 5" contains "$dir/out" "model.w  *F32  *\[128, 8\]"
"$cairn" verify "$dir/v5" >"$dir/out" 2>&1; rc=$?
check "verify of a version 5 checkpoint exits 0" test $rc -eq 0
idx=$(ls "$dir/v5" | grep '^index\.' | head -1)
byte=$(od -An -tu1 -j40 -N1 "$dir/v5/$idx" | tr -d ' ')
printf "\\x$(printf %02x $((byte ^ 1)))" | dd of="$dir/v5/$idx" bs=1 seek=40 conv=notrunc status=none
"$cairn" verify "$dir/v5" >"$dir/out" 2>&1; rc=$?
check "verify of a damaged index file fails" test $rc -ne 0
check "verify names the damaged index file" contains "$dir/out" "$idx"

# ls / rm on a checkpoint manager's root.
"$make" manager "$dir/root" || { echo "FAIL could not make a checkpointer root"; exit 1; }
"$cairn" ls "$dir/root" >"$dir/out" 2>&1; rc=$?
check "ls exits 0" test $rc -eq 0
check "ls shows a complete checkpoint with its step" contains "$dir/out" "^step_000020  *complete  *cairn  *20 "
check "ls marks latest" contains "$dir/out" "^step_000030  *complete .* latest$"
check "ls shows tags" contains "$dir/out" "^step_000010  .* tags/best$"
check "ls shows an incomplete checkpoint" contains "$dir/out" "^step_000040  *incomplete  *-  *-  *1 "
"$cairn" ls "$dir/root" --json >"$dir/json" 2>"$dir/err"; rc=$?
check "ls --json exits 0" test $rc -eq 0
check "ls --json prints only JSON" "$make" check-json "$dir/json"
check "ls --json has the latest one" contains "$dir/json" '"name":"step_000030","complete":true,"format":"cairn","step":30,"objects":[0-9]*,"bytes":[0-9]*,"latest":true,"tags":\[\]'
check "ls --json has the incomplete one" contains "$dir/json" '"name":"step_000040","complete":false,"format":"","step":null'
"$cairn" ls "$dir/root" --name 'step_{rank}' >"$dir/out" 2>&1; rc=$?
check "ls refuses a bad template" test $rc -eq 2
"$cairn" rm "$dir/root" step_000030 >"$dir/out" 2>&1; rc=$?
check "rm refuses the latest checkpoint" test $rc -eq 1
check "rm says latest names it" contains "$dir/out" "step_000030: not removed: the latest pointer names it"
"$cairn" rm "$dir/root" step_000010 >"$dir/out" 2>&1; rc=$?
check "rm refuses a tagged checkpoint" test $rc -eq 1
"$cairn" rm "$dir/root" step_000040 >"$dir/out" 2>&1; rc=$?
check "rm refuses an incomplete checkpoint" contains "$dir/out" "pass --incomplete"
"$cairn" rm "$dir/root" step_000040 --incomplete >"$dir/out" 2>&1; rc=$?
check "rm --incomplete removes it" test $rc -eq 0 -a ! -e "$dir/root/step_000040/data.0.0123456789ab.cairn"
"$cairn" rm "$dir/root" step_000020 nothing_here step_000030 --json >"$dir/json" 2>"$dir/err"; rc=$?
check "rm --json of a missing one fails" test $rc -eq 1
check "rm --json prints only JSON" "$make" check-json "$dir/json"
check "rm --json lists what it removed" contains "$dir/json" '"removed":\[{"name":"step_000020","objects":[0-9]*,"bytes":[0-9]*}\]'
check "rm --json lists what it refused, and why" contains "$dir/json" '"refused":\[{"name":"nothing_here","reason":"no such checkpoint"},{"name":"step_000030","reason":"the latest pointer names it"}\]'
check "rm removed the other" test ! -e "$dir/root/step_000020/metadata.json"
"$cairn" ls "$dir/root" >"$dir/out" 2>&1
check "ls no longer lists removed files" test "$(grep -c '^step_' "$dir/out")" -eq 2
"$cairn" verify "$dir/root/step_000030" >"$dir/out" 2>&1; rc=$?
check "a checkpoint under the root verifies" test $rc -eq 0
"$cairn" inspect "$dir/root" >"$dir/out" 2>&1; rc=$?
check "inspect of a checkpointer root fails" test $rc -eq 2
check "inspect of a root names the latest checkpoint" contains "$dir/out" "latest. names step_000030: load .*root/step_000030"
"$cairn" ls "$dir/root/step_000030" >"$dir/out" 2>&1; rc=$?
check "ls refuses a checkpoint given as the root" test $rc -eq 2
check "ls says it is a checkpoint" contains "$dir/out" "is a checkpoint (cairn), not a folder of checkpoints"
"$cairn" rm "$dir/root/step_000030" x >"$dir/out" 2>&1; rc=$?
check "rm refuses a checkpoint given as the root" test $rc -eq 2
# inspect and ls count the files and bytes of a checkpoint alike
"$cairn" inspect "$dir/root/step_000030" --json >"$dir/json" 2>&1
"$cairn" ls "$dir/root" --json >"$dir/json2" 2>&1
files=$(grep -o '"files":[0-9]*' "$dir/json" | cut -d: -f2)
bytes=$(grep -o '"total_bytes":[0-9]*' "$dir/json" | cut -d: -f2)
check "inspect and ls count the same files and bytes" contains "$dir/json2" "\"name\":\"step_000030\",[^}]*\"objects\":$files,\"bytes\":$bytes,"

# diff: the same tensors in two layouts, then another checkpoint.
"$cairn" diff "$dir/ckpt" "$dir/zstd" >"$dir/out" 2>&1; rc=$?
check "diff of the same tensors exits 0" test $rc -eq 0
check "diff says they are the same" contains "$dir/out" "both saved by 2 rank(s); the same$"
"$cairn" diff "$dir/ckpt" "$dir/root/step_000030" >"$dir/out" 2>&1; rc=$?
check "diff of different checkpoints exits 1" test $rc -eq 1
check "diff names a removed tensor" contains "$dir/out" "^tensor  removed  model.ids  *I64 \[10\]"
check "diff counts differing elements" contains "$dir/out" "^tensor  values  *model.w  *1024 of 1024 elements differ, max |a - b| = 28.5"
check "diff names a removed common value" contains "$dir/out" "^common  removed  step  *12$"
check "diff names removed objects" contains "$dir/out" "^object  removed  rng/shard_0_2  *16 bytes$"
"$make" changed "$dir/changed" || { echo "FAIL could not make the changed checkpoint"; exit 1; }
"$cairn" diff "$dir/ckpt" "$dir/changed" >"$dir/out" 2>&1; rc=$?
check "diff of a changed step and RNG state exits 1" test $rc -eq 1
check "diff shows the common value on both sides" contains "$dir/out" "^common  values  *step  *12 -> 13$"
check "diff finds the changed object" contains "$dir/out" "^object  values  *rng/shard_1_2  *16 bytes -> 16 bytes$"
check "diff leaves the same object out" test "$(grep -c shard_0_2 "$dir/out")" -eq 0
check "diff counts 2 differences" contains "$dir/out" "; 2 difference(s)$"
"$cairn" diff "$dir/ckpt" "$dir/root/step_000030" --json >"$dir/json" 2>&1; rc=$?
check "diff --json exits 1" test $rc -eq 1
check "diff --json prints only JSON" "$make" check-json "$dir/json"
check "diff --json has the change" contains "$dir/json" '"key":"model.w","change":"values"'
"$cairn" diff "$dir/ckpt" "$dir/zstd" --progress >"$dir/out" 2>"$dir/err"; rc=$?
check "diff --progress exits 0" test $rc -eq 0
check "diff --progress draws a bar to 100%" contains "$dir/err" "diff     \[#*\] 100.0%"

# unshard / convert (stderr is not a terminal here: no progress bar).
"$cairn" unshard "$dir/ckpt" "$dir/one" --strategy one_file >"$dir/out" 2>"$dir/err"; rc=$?
check "unshard one_file exits 0" test $rc -eq 0
check "unshard one_file writes model.safetensors" test -s "$dir/one/model.safetensors"
check "unshard is quiet on a non-terminal stderr" test ! -s "$dir/err"
check "unshard reports what it left out" contains "$dir/out" "not carried over.*step"
"$cairn" unshard "$dir/ckpt" "$dir/one_bar" --format one_file --progress >"$dir/out" 2>"$dir/err"; rc=$?
check "unshard --progress draws a bar to 100%" contains "$dir/err" "convert  \[#*\] 100.0%"
"$cairn" unshard "$dir/ckpt" "$dir/chunks" --format chunks --chunk-size 1KB --dtype f64 \
  >"$dir/out" 2>&1; rc=$?
check "unshard chunks exits 0" test $rc -eq 0
check "unshard chunks writes the index" contains "$dir/chunks/model.safetensors.index.json" '"model.w": "model-00002-of-00002.safetensors"'
check "unshard --dtype f64 converts" grep -aq '"F64"' "$dir/chunks/model-00002-of-00002.safetensors"
"$cairn" unshard "$dir/ckpt" "$dir/x" --format torch_dist >"$dir/out" 2>&1; rc=$?
check "unshard refuses torch_dist" test $rc -ne 0
"$cairn" convert "$dir/ckpt" "$dir/dist" --format torch_dist >"$dir/out" 2>&1; rc=$?
check "convert torch_dist exits 0" test $rc -eq 0
check "convert torch_dist writes .metadata" test -s "$dir/dist/.metadata"
check "convert torch_dist writes Megatron metadata.json" contains "$dir/dist/metadata.json" torch_dist
check "convert torch_dist carries the per-rank objects" contains "$dir/out" ", 2 object(s) from"
"$cairn" convert "$dir/ckpt" "$dir/dist" --format torch_dist >"$dir/out" 2>&1; rc=$?
check "convert refuses a checkpoint already at DST" test $rc -eq 1
check "convert says --overwrite" contains "$dir/out" "already exists: convert: a torch_dist checkpoint is already there.*--overwrite"
"$cairn" convert "$dir/ckpt" "$dir/dist" --format torch_dist --overwrite >"$dir/out" 2>&1; rc=$?
check "convert --overwrite writes over it" test $rc -eq 0
"$cairn" diff "$dir/ckpt" "$dir/dist" >"$dir/out" 2>&1; rc=$?
check "the torch_dist conversion holds the same tensors, common values and objects" test $rc -eq 0
"$cairn" inspect "$dir/dist" >"$dir/out" 2>&1; rc=$?
check "inspect reads a DCP checkpoint" contains "$dir/out" "format *torch_dist"
check "inspect shows common.pt's values" contains "$dir/out" "^  step  *I64 scalar  *12$"
check "inspect shows no native-only field for DCP" test "$(grep -c 'format version\|checksum blocks\|save id' "$dir/out")" -eq 0
"$cairn" verify "$dir/dist" >"$dir/out" 2>&1; rc=$?
check "verify of a DCP checkpoint exits 0" test $rc -eq 0
check "verify says DCP stores no checksums" contains "$dir/out" "torch_dist checkpoint: .* stores no checksums"
"$cairn" verify "$dir/one" >"$dir/out" 2>&1; rc=$?
check "verify of a safetensors file exits 0" test $rc -eq 0
cp -r "$dir/one" "$dir/one_cut"
truncate -s -4 "$dir/one_cut/model.safetensors"
"$cairn" verify "$dir/one_cut" >"$dir/out" 2>&1; rc=$?
check "verify of a truncated safetensors file fails" test $rc -ne 0
"$cairn" unshard "$dir/dist" "$dir/one2" --format one_file >"$dir/out" 2>&1; rc=$?
check "unshard of the DCP output exits 0" test $rc -eq 0
check "DCP round trip gives identical safetensors" cmp -s "$dir/one/model.safetensors" "$dir/one2/model.safetensors"
"$cairn" convert "$dir/ckpt" "$dir/nat" --format native >"$dir/out" 2>&1; rc=$?
check "convert native of a cairn checkpoint exits 0" test $rc -eq 0
"$cairn" convert "$dir/ckpt" "$dir/nat" --format native >"$dir/out" 2>&1; rc=$?
check "convert native over a checkpoint refuses" test $rc -eq 1
"$cairn" convert "$dir/dist" "$dir/nat2" --format cairn >"$dir/out" 2>&1; rc=$?
check "convert native (--format cairn) of the DCP output exits 0" test $rc -eq 0
"$cairn" diff "$dir/ckpt" "$dir/nat2" >"$dir/out" 2>&1; rc=$?
check "DCP -> native keeps tensors, common values and objects" test $rc -eq 0
check "diff tells the world sizes apart" contains "$dir/out" "saved by 2 and 1 ranks; the same$"
"$cairn" verify "$dir/nat2" >"$dir/out" 2>&1; rc=$?
check "the converted native checkpoint verifies" test $rc -eq 0
"$cairn" unshard "$dir/nat2" "$dir/one3" --format one_file >"$dir/out" 2>&1; rc=$?
check "DCP -> native -> safetensors gives identical safetensors" cmp -s "$dir/one/model.safetensors" "$dir/one3/model.safetensors"
"$cairn" unshard "$dir/one" "$dir/one4" --format safetensors >"$dir/out" 2>&1; rc=$?
check "unshard reads safetensors too (--format safetensors)" cmp -s "$dir/one/model.safetensors" "$dir/one4/model.safetensors"
"$cairn" unshard "$dir/ckpt" "$dir/one4" --format one_file >"$dir/out" 2>&1; rc=$?
check "unshard refuses a checkpoint already at DST" test $rc -eq 1
"$cairn" unshard "$dir/ckpt" "$dir/one4" --format one_file --overwrite >"$dir/out" 2>&1; rc=$?
check "unshard --overwrite writes over it" test $rc -eq 0
"$cairn" unshard "$dir/ckpt" "$dir/y" --format one_file --chunk-size 5XB >"$dir/out" 2>&1; rc=$?
check "unshard rejects a bad size" test $rc -eq 2
# A pseudo-terminal (util-linux script, where it can open one): the progress bar appears.
if command -v script >/dev/null && script -qec true /dev/null >/dev/null 2>&1; then
  script -qec "\"$cairn\" unshard \"$dir/ckpt\" \"$dir/tty\" --format one_file" /dev/null >"$dir/out" 2>&1
  check "unshard shows a progress bar on a terminal" contains "$dir/out" "100.0%"
else
  echo "skip unshard shows a progress bar on a terminal: script(1) cannot open a pseudo-terminal"
fi

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

finish
