#!/usr/bin/env bash
# Draws the reference trainer's loss curves (WORK_DIR/loss_*.txt) as an SVG:
#   examples/gpt/plot.sh WORK_DIR OUT.svg
# The uninterrupted run is the wide grey line; the interrupted runs (2 pipeline stages, and
# none) stop where they were killed; each resumed run is drawn as points from the checkpoint it
# resumed from, so they can be seen lying on the grey line. The mixed-precision run (bf16 model,
# fp32 masters), when there, is a thin orange line with its resumes as small crosses.
set -euo pipefail
dir="$1" out="$2"
interrupted="$(tail -n 1 "$dir/loss_train.txt" | cut -d' ' -f1)"
plots=("'$dir/loss_reference.txt' using 1:2 with lines lw 6 lc rgb '#cccccc' title 'uninterrupted (tp 2 x dp 2)'")
plots+=("'$dir/loss_train.txt' using 1:2 with lines lw 1.5 lc rgb '#1f77b4' title 'interrupted at step $interrupted (tp 2 x dp 2)'")
if [[ -f $dir/loss_train_p2.txt ]]; then
  plots+=("'$dir/loss_train_p2.txt' using 1:2 with lines lw 1.5 dt 2 lc rgb '#17becf' title 'interrupted (tp 2 x pp 2)'")
fi
points=(7 2 6 4 8 12)
colors=("#d62728" "#2ca02c" "#ff7f0e" "#9467bd" "#8c564b" "#e377c2")
resumed=0
i=0
for f in "$dir"/loss_resume_*.txt; do
  name="$(basename "$f" .txt)"
  layout="${name#loss_resume_}"  # NxT or NxTpP: N processes, tensor-parallel T, P stages
  n="${layout%%x*}" t="${layout#*x}" p=1
  if [[ $t == *p* ]]; then p="${t#*p}" t="${t%p*}"; fi
  resumed=$(($(head -n 1 "$f" | cut -d' ' -f1) - 1))
  plots+=("'$f' using 1:2 with points pt ${points[i % 6]} ps 0.5 lc rgb '${colors[i % 6]}' title 'resumed on $n processes (tp $t x pp $p x dp $((n / t / p)))'")
  i=$((i + 1))
done
if [[ -f $dir/loss_bf16_train.txt ]]; then
  plots+=("'$dir/loss_bf16_train.txt' using 1:2 with lines lw 1 lc rgb '#ff7f0e' title 'mixed precision (bf16, fp32 masters), interrupted'")
  for f in "$dir"/loss_bf16_resume_*.txt; do
    [[ -f $f ]] || continue
    layout="$(basename "$f" .txt)" layout="${layout#loss_bf16_resume_}"
    n="${layout%%x*}" t="${layout#*x}"
    plots+=("'$f' using 1:2 with points pt 1 ps 0.4 lc rgb '#a05a00' title 'mixed precision resumed on $n processes (tp $t x dp $((n / t)))'")
  done
fi
joined="$(printf '%s, ' "${plots[@]}")"
gnuplot <<GNUPLOT
set terminal svg size 860,460 dynamic font 'sans,12'
set output '$out'
set title 'Reference trainer (examples/gpt, a Llama-architecture model): loss per step'
set xlabel 'step'
set ylabel 'training loss'
set key top right
set grid
set arrow from $resumed, graph 0 to $resumed, graph 1 nohead dt 2 lc rgb '#555555'
set label 'last committed checkpoint (step $resumed)' at $resumed, graph 0.55 offset 0.5,0
set arrow from $interrupted, graph 0 to $interrupted, graph 1 nohead dt 3 lc rgb '#1f77b4'
set label 'killed (save in flight)' at $interrupted, graph 0.45 offset 0.5,0
plot ${joined%, }
GNUPLOT
echo "wrote $out"
