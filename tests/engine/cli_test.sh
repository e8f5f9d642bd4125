#!/usr/bin/env bash
# CLI checks: `infoflow generate` reproduces the reference greedy ids of the
# real stories260K checkpoint (docs/DESIGN.md, tests/data/stories260K-hf/README.md), and
# `infoflow tokenize` encodes/decodes a JSON batch with a generated model.
# usage: cli_test.sh INFOFLOW_BIN MAKE_TEST_MODEL_BIN SOURCE_DIR WORK_DIR
set -euo pipefail
bin=$1 make_model=$2 src=$3 work=$4
mkdir -p "$work"

want=$(tr -s ' \n' ' ' < "$src/tests/reference/stories260K_greedy_bos_400.txt" | sed 's/ *$//')
got=$("$bin" generate --model "$src/tests/data/stories260K-hf" --prompt-ids 1 \
      --max-new-tokens 400 --temperature 0 --print-ids --threads 1 2>/dev/null | tr -s ' \n' ' ' | sed 's/ *$//')
if [ "$got" != "$want" ]; then
  echo "generate: ids differ from tests/reference/stories260K_greedy_bos_400.txt"
  echo "got:  ${got:0:200}"; echo "want: ${want:0:200}"; exit 1
fi
echo "generate: 400 greedy ids match the reference"

"$make_model" --out "$work/model" --seed 3 >/dev/null
ids=$(echo '["Alice lives in Paris.", "héllo 🙂"]' | "$bin" tokenize --tokenizer "$work/model/tokenizer.json" --json)
back=$(echo "$ids" | "$bin" tokenize --tokenizer "$work/model/tokenizer.json" --decode)
python3 - "$back" <<'PY'
import json, sys
got = json.loads(sys.argv[1])
assert got == ["Alice lives in Paris.", "héllo 🙂"], got
PY
echo "tokenize: JSON batch round-trips"
"$bin" generate --help >/dev/null
if "$bin" generate --model "$work/model" --bogus 2>/dev/null; then echo "unknown flag accepted"; exit 1; fi
echo "3 passed, 0 failed"
