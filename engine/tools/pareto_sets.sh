#!/bin/bash
# Quality at equal TTFT on models/infoflow-tiny: one command per eval set.
#
#   engine/tools/pareto_sets.sh SET [OUT_DIR]
#
# runs `infoflow-eval --pareto` on SET and writes OUT_DIR/SET.{csv,json,svg,png,gp}
# (OUT_DIR defaults to models/infoflow-tiny/pareto). SET is one of
#   card sets (seed 0, the card's geometries; INFOFLOW_BLEND was designed on
#   split2k and needle4k of these):
#     split2k   split,  8 chunks x 220 words, seed 0
#     split4k   split, 16 chunks x 200 words, seed 0
#     needle4k  needle, 16 chunks x 200 words, seed 0
#     twohop2k  twohop, 8 chunks x 220 words, seed 0
#   held-out sets (other seeds and chunk geometries, never looked at while
#   designing; they decide the server default):
#     split2k-ho   split, 10 chunks x 180 words, seed 1
#     split4k-ho   split, 14 chunks x 230 words, seed 2
#     needle4k-ho  needle, 12 chunks x 260 words, seed 3
#     twohop2k-ho  twohop, 10 chunks x 180 words, seed 4
# Environment: EVAL (default build/engine/tools/infoflow-eval), N (examples;
# default 30 for ~2K sets, 20 for ~4K sets), RATIOS (default
# 0.01,0.02,0.05,0.1,0.15,0.3,0.5), THREADS (default 1).
# engine/tools/pareto_table.py OUT_DIR/*.csv then interpolates every method's
# curve at TTFT = 0.15 / 0.3 / 0.5 x FULL.
set -euo pipefail
SET=${1:?usage: pareto_sets.sh SET [OUT_DIR]}
OUT=${2:-models/infoflow-tiny/pareto}
EVAL=${EVAL:-build/engine/tools/infoflow-eval}
RATIOS=${RATIOS:-0.01,0.02,0.05,0.1,0.15,0.3,0.5}
THREADS=${THREADS:-1}
case "$SET" in
  split2k)     args=(--task split  --chunks 8  --chunk-words 220 --seed 0); n=30 ;;
  split4k)     args=(--task split  --chunks 16 --chunk-words 200 --seed 0); n=20 ;;
  needle4k)    args=(--task needle --chunks 16 --chunk-words 200 --seed 0); n=20 ;;
  twohop2k)    args=(--task twohop --chunks 8  --chunk-words 220 --seed 0); n=30 ;;
  split2k-ho)  args=(--task split  --chunks 10 --chunk-words 180 --seed 1); n=30 ;;
  split4k-ho)  args=(--task split  --chunks 14 --chunk-words 230 --seed 2); n=20 ;;
  needle4k-ho) args=(--task needle --chunks 12 --chunk-words 260 --seed 3); n=20 ;;
  twohop2k-ho) args=(--task twohop --chunks 10 --chunk-words 180 --seed 4); n=30 ;;
  *) echo "pareto_sets.sh: unknown set '$SET' (see the header of $0)" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
"$EVAL" --model models/infoflow-tiny --synthetic "${N:-$n}" "${args[@]}" --threads "$THREADS" \
  --device cpu --pareto --ratios "$RATIOS" --out-csv "$OUT/$SET.csv" --out-json "$OUT/$SET.json" \
  --out-plot "$OUT/$SET.svg"
