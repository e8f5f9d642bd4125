#!/usr/bin/env bash
# The main job, end to end on one machine: build, start infoflow-server on its
# defaults (RocksDB in ./data/kv) with the model that ships in
# models/infoflow-tiny (trained in-project, see its MODEL_CARD.md), ingest the
# sample documents (five chunks of deploy/demo/docs), ask for the secret code
# stated in the fourth chunk, stream the answer and the report (the server's
# default method, INFOFLOW_BLEND at r = 0.05; INFOFLOW at r = 0.15; and FULL
# for comparison), then stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target infoflow-server infoflow

ADDR=127.0.0.1:50051
MODEL=${MODEL:-models/infoflow-tiny}
build/server/infoflow-server --model "$MODEL" --listen "$ADDR" --metrics-listen 127.0.0.1:9464 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  build/client/infoflow stats --server "$ADDR" >/dev/null 2>&1 && break
  sleep 1
done

build/client/infoflow ingest --server "$ADDR" deploy/demo/docs
Q="What is the secret code of Arthur Tanaka?"
# The prompt format infoflow-tiny was trained on.
TEMPLATE=$'\nQuestion: {question}\nAnswer:'

CHUNKS=()
for f in deploy/demo/docs/*.txt; do CHUNKS+=(--chunk-file "$f"); done
echo; echo "== server default: INFOFLOW_BLEND (r = 0.05) =="
build/client/infoflow query --server "$ADDR" --question "$Q" \
  --template "$TEMPLATE" "${CHUNKS[@]}" --max-new-tokens 8 --report
echo; echo "== INFOFLOW (r = 0.15) =="
build/client/infoflow query --server "$ADDR" --question "$Q" --method infoflow --ratio 0.15 \
  --template "$TEMPLATE" "${CHUNKS[@]}" --max-new-tokens 8 --report
echo; echo "== FULL prefill =="
build/client/infoflow query --server "$ADDR" --question "$Q" --method full \
  --template "$TEMPLATE" "${CHUNKS[@]}" --max-new-tokens 8 --report
