#!/usr/bin/env bash
# The reference trainer (a Llama-architecture model) end to end: examples/gpt/run.sh BIN_DIR WORK_DIR [trainer flags]
#   1. an uninterrupted reference run on 4 processes (tensor-parallel 2 x data-parallel 2)
#   2. the same run on 4 processes as 2 pipeline stages (tp 2 x pp 2), checkpointing every 10
#      steps, interrupted with a save in flight
#   3. resumed from its latest checkpoint without a pipeline: on 2 processes (tp 2 x dp 1) and
#      on 3 (tp 1 x dp 3)
#   4. the run again without a pipeline (tp 2 x dp 2, checkpoints in ckpt_pp1), interrupted,
#      and resumed as 2 pipeline stages: tp 2 x pp 2, and tp 1 x pp 2 x dp 2
#   5. mixed precision (a bf16 model, the distributed optimizer's fp32 masters saved with its
#      state): trained on 4 processes (tp 2 x dp 2), interrupted, resumed on 2 (tp 2 x dp 1)
#      and 3 (tp 1 x dp 3); `cairn unshard --fp32-masters` of its last checkpoint equals the
#      masters the trainer held at that step, and the bf16 model merely cast to fp32 does not
#   6. each resume's loss curve against the reference (the mixed-precision ones against the
#      interrupted mixed-precision run): bit-exact when tp is unchanged
#   7. the final state converted to safetensors and torch_dist, loaded by Python's torch
#   8. the loss curves drawn as WORK_DIR/loss.svg (with gnuplot)
#   9. the Hugging Face hand-off both ways, where the today tier's root exists (hf_check.py)
# Flags after WORK_DIR go to every trainer phase (e.g. --steps 400 --layers 4 --width 128).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$1" dir="$2"
shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run=(mpirun --oversubscribe)
trainer="$bin/gpt_trainer"
rm -rf "$dir"
"${run[@]}" -np 4 "$trainer" --phase reference --tp 2 --dir "$dir" "$@"
"${run[@]}" -np 4 "$trainer" --phase train --tp 2 --pp 2 --dir "$dir" "$@"
"${run[@]}" -np 2 "$trainer" --phase resume --tp 2 --dir "$dir" "$@"
"${run[@]}" -np 3 "$trainer" --phase resume --tp 1 --dir "$dir" "$@"
"${run[@]}" -np 4 "$trainer" --phase train --tp 2 --ckpt ckpt_pp1 --dir "$dir" "$@"
"${run[@]}" -np 4 "$trainer" --phase resume --tp 2 --pp 2 --ckpt ckpt_pp1 --dir "$dir" "$@"
"${run[@]}" -np 4 "$trainer" --phase resume --tp 1 --pp 2 --ckpt ckpt_pp1 --dir "$dir" "$@"
bf16=(--precision bf16 --ckpt ckpt_bf16 --dir "$dir")
"${run[@]}" -np 4 "$trainer" --phase train --tp 2 "${bf16[@]}" "$@"
"${run[@]}" -np 2 "$trainer" --phase resume --tp 2 "${bf16[@]}" "$@"
"${run[@]}" -np 3 "$trainer" --phase resume --tp 1 "${bf16[@]}" "$@"
last="$(cat "$dir/ckpt_bf16/latest")"  # the checkpoint the resumes started from
"$bin/cairn" unshard "$dir/ckpt_bf16/$last" "$dir/masters_unshard" --format one_file \
  --fp32-masters --no-progress
"$bin/cairn" diff "$dir/masters_unshard" "$dir/masters_ckpt_bf16/$last" --no-progress
"$bin/cairn" unshard "$dir/ckpt_bf16/$last" "$dir/masters_cast" --format one_file --dtype f32 \
  --no-progress
cast="$("$bin/cairn" diff "$dir/masters_cast" "$dir/masters_ckpt_bf16/$last" --no-progress || true)"
if ! grep -q "^tensor  values   model\." <<<"$cast"; then
  echo "the bf16 model cast to fp32 equals the fp32 masters: the check above proves nothing" >&2
  exit 1
fi
echo "the bf16 model cast to fp32 is not the masters: $(grep -c "^tensor  values   model\." <<<"$cast") tensors differ"
"$trainer" --phase compare --tp 2 --dir "$dir" "$@"

"$bin/cairn" convert "$dir/final_resume_2x2" "$dir/safetensors" --format one_file --no-progress
"$bin/cairn" convert "$dir/final_resume_2x2" "$dir/torch_dist" --format torch_dist --no-progress
if command -v gnuplot >/dev/null 2>&1; then
  "$here/plot.sh" "$dir" "$dir/loss.svg"
else
  echo "gnuplot not installed (gnuplot-nox): no loss.svg"
fi
# 8. Hugging Face, both ways, in the today tier's root (transformers 5, torch 2.x): the final
#    model converted by cairn to sharded safetensors + index, with the trainer's config.json,
#    loads with from_pretrained and computes the C++ trainer's logits; a LlamaForCausalLM that
#    transformers saved loads into the trainer on 1, 2 and 4 tensor-parallel ranks and trains on.
repo="$(cd "$here/../.." && pwd)"
export CAIRN_TODAY_BIND="$(cd "$dir" && pwd)"  # the work folder, wherever it is
if why="$("$repo/scripts/today-root" check)"; then
  "$bin/cairn" convert "$dir/model_resume_2x2" "$dir/hf" --format chunks --chunk-size 64KB \
    --no-progress
  cp "$dir/config.json" "$dir/hf/config.json"
  "$repo/scripts/today-root" run python3 "$here/hf_check.py" export "$dir"
  "$repo/scripts/today-root" run python3 "$here/hf_check.py" init "$dir"
  for tp in 1 2 4; do  # processes = tp: every tensor-parallel size the 4 heads allow
    "${run[@]}" -np $tp "$trainer" --phase import --tp $tp --from "$dir/hf_init" --dir "$dir" \
      "$@" --steps 20
  done
  "$repo/scripts/today-root" run python3 "$here/hf_check.py" import "$dir" import_1x1 import_2x2 \
    import_4x4
else
  echo "SKIPPED the Hugging Face hand-off (transformers lives in the today tier's root): $why"
fi

# Debian's interpreter: the python3 first on PATH may be another one without torch.
py=/usr/bin/python3
[[ -x $py ]] || py=python3
if "$py" -c "import torch" 2>/dev/null; then
  "$py" "$here/check_python.py" "$dir"
else
  echo "SKIPPED: Python's torch (python3-torch) not installed: converted checkpoints not loaded"
  exit 77  # ctest: skipped
fi
