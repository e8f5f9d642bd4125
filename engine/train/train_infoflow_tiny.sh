#!/usr/bin/env bash
# Trains models/infoflow-tiny from scratch: the exact command behind its model
# card. One LR schedule (--steps 6200) over three data phases joined by
# --resume/--until:
#   1. single-needle documents of 2-3 short chunks: the copy circuit forms;
#   2. needle/coref/multihop (eval layout) and multi-fact "mixed" documents of
#      2-8 chunks, with positional skips up to 4096 (PoSE-style);
#   3. real long documents: 4-16 chunks of 60-200 words (up to ~4K tokens).
# Tied embeddings and the answer-heavy loss (answer 20 : context 0.1) are what
# made retrieval learnable at this size; see MODEL_CARD.md.
#
#   engine/train/train_infoflow_tiny.sh [TRAIN_BIN] [OUT_DIR]
# About 50 minutes on 2 cores.
set -euo pipefail
TRAIN=${1:-build/engine/train/infoflow-train}
OUT=${2:-models/infoflow-tiny}
COMMON=(--data synthetic --split-digits --tie-embeddings --tokenizer-docs 300 --vocab 1024
  --layers 4 --hidden 128 --heads 4 --kv-heads 2 --ffn 384 --rope-theta 10000
  --steps 6200 --lr 5e-3 --warmup 50 --min-lr-ratio 0.1 --answer-weight 20 --context-weight 0.1
  --threads 2 --workers 2 --seed 1 --eval-docs 32 --log-every 50 --out "$OUT")
"$TRAIN" "${COMMON[@]}" --until 1500 --tasks needle --chunks 3 --min-chunks 2 \
  --chunk-words 8 --seq-len 256 --batch 16 --eval-every 500 --save-every 500
"$TRAIN" "${COMMON[@]}" --resume --until 5500 --tasks needle,needle,coref,multihop,mixed \
  --chunks 8 --min-chunks 2 --chunk-words 10 --max-chunk-words 60 --seq-len 1024 --batch 16 \
  --position-span 4096 --gap-fraction 0.5 --eval-every 500 --save-every 500
"$TRAIN" "${COMMON[@]}" --resume --tasks needle,needle,coref,multihop \
  --chunks 16 --min-chunks 4 --chunk-words 60 --max-chunk-words 200 --seq-len 4200 --batch 4 \
  --position-span 4400 --gap-fraction 0.3 --eval-every 350 --save-every 350
