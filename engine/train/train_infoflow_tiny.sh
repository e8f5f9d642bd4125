#!/usr/bin/env bash
# Trains models/infoflow-tiny from scratch: the exact command behind its model
# card. Three phases of single-needle documents joined by --resume/--until,
# growing the context:
#   1. 2-3 short chunks (~60 tokens): the find-and-copy circuit forms;
#   2. 2-8 chunks of 10-60 words (up to ~1K tokens), half of them with
#      positional skips up to 4400 (PoSE-style), so long distances are seen;
#   3. 4-16 chunks of 60-200 words (up to ~4K tokens): the real eval lengths.
# Phases 1-2 follow a cosine LR schedule over 6000 steps; phase 3 (1.5 s a
# step, 4x the tokens) resumes at step 3500 on a schedule of 4800 steps, which
# lowers the LR from 1.2e-3 to 6.4e-4 and anneals it to the floor by step 4800:
# the whole run took 35.6 minutes on 2 cores (train_log.txt). Phase 3 is what
# lifts 4K: after phase 2 FULL exact match on the model card's needle sets was
# 0.94 at 2K and 0.83 at 4K tokens; after phase 3, 0.99 and 0.97.
# Tied embeddings and the answer-heavy loss (answer 20 : context 0.1) are what
# made retrieval learnable at this size; see MODEL_CARD.md.
#
#   engine/train/train_infoflow_tiny.sh [TRAIN_BIN] [OUT_DIR]
set -euo pipefail
TRAIN=${1:-build/engine/train/infoflow-train}
OUT=${2:-models/infoflow-tiny}
COMMON=(--data synthetic --tasks needle --digit-group 2 --tie-embeddings --tokenizer-docs 300
  --vocab 1024 --layers 4 --hidden 128 --heads 4 --kv-heads 2 --ffn 384 --rope-theta 10000
  --lr 3e-3 --warmup 50 --min-lr-ratio 0.05 --answer-weight 20 --context-weight 0.1
  --threads 2 --workers 2 --seed 1 --eval-docs 32 --log-every 50 --out "$OUT")
"$TRAIN" "${COMMON[@]}" --steps 6000 --until 2000 --chunks 3 --min-chunks 2 --chunk-words 8 --seq-len 256 \
  --batch 16 --eval-every 500 --save-every 500
"$TRAIN" "${COMMON[@]}" --steps 6000 --resume --until 3500 --chunks 8 --min-chunks 2 --chunk-words 10 \
  --max-chunk-words 60 --seq-len 1100 --batch 8 --position-span 4400 --gap-fraction 0.5 \
  --eval-every 500 --save-every 500
"$TRAIN" "${COMMON[@]}" --steps 4800 --resume --chunks 16 --min-chunks 4 --chunk-words 60 \
  --max-chunk-words 200 --seq-len 4200 --batch 4 --position-span 4400 --gap-fraction 0.3 \
  --eval-every 250 --save-every 250
