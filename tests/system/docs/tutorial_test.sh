#!/usr/bin/env bash
# docs/tutorial.md, run as printed: its trainer (the C++ snippets, built as tutorial_trainer) on
# 4 MPI processes to step 200, resumed on 3 to step 300, then its command-line steps, all from
# the shell snippets in order; an uninterrupted 4-process run must reach the same tensors and
# common values; then its Python in the today tier's root (torch 2.x, safetensors). Exits 77
# (ctest SKIP), after the rest, when that root is not there.
# usage: tutorial_test.sh REPO TRAINER CLI_DIR SNIPPETS_DIR WORK_DIR
set -euo pipefail
repo=$1 trainer=$2 cli_dir=$3 snippets=$4 work=$5
rm -rf "$work"
mkdir -p "$work/straight"
cd "$work"
ln -s "$trainer" trainer
export PATH="$cli_dir:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1  # as printed: mpirun -np 4 on a machine of 2 cores
fail() { echo "FAIL: $*"; exit 1; }

echo "--- the tutorial's shell steps ($snippets/tutorial_run.sh)"
bash -euxo pipefail "$snippets/tutorial_run.sh" >run.log 2>&1 || { cat run.log; fail "a step failed"; }
cat run.log
grep -q "resumed step_000200 at step 200 on 3 ranks" run.log || fail "no resume on 3 ranks"
grep -q "trained to step 300" run.log || fail "the resumed run did not finish"
grep -q "^step_000300 .*latest" <(cairn ls ckpt) || fail "latest does not name step_000300"

echo "--- an uninterrupted run on 4 processes reaches the same state"
(cd straight && mpirun -np 4 ../trainer 300 >/dev/null)
cairn diff straight/ckpt/step_000300 ckpt/step_000300 --json >diff.json || true
cat diff.json
grep -q '"tensors":\[\]' diff.json || fail "the resumed weights differ from the uninterrupted run's"
grep -q '"commons":\[\]' diff.json || fail "the resumed common values differ"

echo "--- the tutorial's Python, in torch 2.x"
cp "$snippets/tutorial_python.py" .
if why="$("$repo/scripts/today-root" check)"; then
  CAIRN_TODAY_BIND="$work" "$repo/scripts/today-root" run bash -c "cd '$work' && python3 tutorial_python.py" \
    | tee python.log
  grep -q "step 300: model.weight (1000, 64) in DCP and safetensors" python.log || fail "python"
  echo "PASS docs/tutorial"
else
  echo "SKIP: the tutorial's Python step (torch 2.x and safetensors live in the today tier's root): $why"
  exit 77
fi
