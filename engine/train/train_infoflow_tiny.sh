#!/usr/bin/env bash
# Trains models/infoflow-tiny from scratch: the exact command behind its model
# card. Six phases joined by --resume/--until (the optimizer state carries
# over; each phase's --steps sets the cosine schedule it continues on):
#   1. single needles, 2-3 short chunks (~60 tokens): the find-and-copy circuit
#      forms;
#   2. single needles, 2-8 chunks of 10-60 words (up to ~1K tokens), half of
#      them with positional skips up to 4400 (PoSE-style), so long distances
#      are seen;
#   3. single needles, 4-16 chunks of 60-200 words (up to ~4K tokens), 600
#      steps: the real eval lengths. Needle-only training copies *a* code, not
#      the asked one (at chance on the split task), but without this phase the
#      later phases do not reach 0.9 at 4K (a pilot that skipped it: needle 4K
#      0.70, split 0.34);
#   4. needle + split (one secret code among decoy numbers, every fact cut at
#      a chunk boundary after the name; trained on FULL's contiguous text),
#      3-8 chunks of 10-60 words: 4a on the 9000-step schedule, 4b re-raised
#      on a 14000-step schedule, where key-conditioned copying appears
#      (held-out exact 0.50 -> 0.83 between steps 7750 and 8250);
#   5. needle + split at 4-16 chunks of 40-160 words (up to 2.6K tokens);
#   6. the same at 4-16 chunks of 60-200 words (up to 4.2K tokens), 500 steps.
# Wall time 58.6 minutes on the 2-core dev VM (train_log.txt).
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
"$TRAIN" "${COMMON[@]}" --steps 4800 --resume --until 4100 --chunks 16 --min-chunks 4 \
  --chunk-words 60 --max-chunk-words 200 --seq-len 4200 --batch 4 --position-span 4400 --gap-fraction 0.3 \
  --eval-every 250 --save-every 250
SPLIT=(--tasks needle,split,split --eval-docs 48)
"$TRAIN" "${COMMON[@]}" "${SPLIT[@]}" --steps 9000 --resume --until 6100 --chunks 8 --min-chunks 3 \
  --chunk-words 10 --max-chunk-words 60 --seq-len 1100 --batch 8 --eval-every 250 --save-every 500
"$TRAIN" "${COMMON[@]}" "${SPLIT[@]}" --steps 14000 --resume --until 8800 --chunks 8 --min-chunks 3 \
  --chunk-words 10 --max-chunk-words 60 --seq-len 1100 --batch 8 --eval-every 250 --save-every 500
"$TRAIN" "${COMMON[@]}" "${SPLIT[@]}" --steps 12000 --resume --until 9600 --chunks 16 --min-chunks 4 \
  --chunk-words 40 --max-chunk-words 160 --seq-len 2600 --batch 4 --eval-every 200 --save-every 200
"$TRAIN" "${COMMON[@]}" "${SPLIT[@]}" --steps 12000 --resume --until 10100 --chunks 16 --min-chunks 4 \
  --chunk-words 60 --max-chunk-words 200 --seq-len 4200 --batch 4 --eval-every 100 --save-every 100
