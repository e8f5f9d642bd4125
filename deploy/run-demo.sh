#!/usr/bin/env bash
# The main job, end to end on one machine: build, start infoflow-server on its
# defaults (RocksDB in ./data/kv) with the model that ships in
# models/infoflow-tiny (trained in-project, see its MODEL_CARD.md), ingest the
# sample documents (five chunks of deploy/demo/docs), ask for the secret code
# stated in the fourth chunk, stream the answer and the report (the server's
# default method, INFOFLOW_BLEND at r = 0.05; INFOFLOW at r = 0.15; and FULL
# for comparison), then stop the server.
# The server's own output goes to data/demo-server.log (LOG=FILE to change it),
# so the terminal shows only the client output; on a failure the script prints
# the log's last lines.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target infoflow-server infoflow

ADDR=127.0.0.1:50051
MODEL=${MODEL:-models/infoflow-tiny}
LOG=${LOG:-data/demo-server.log}
[[ $LOG == /* ]] || LOG=$PWD/$LOG
mkdir -p "$(dirname "$LOG")"
SERVER=
on_exit() {
  local rc=$?
  if [[ -n $SERVER ]]; then
    kill -TERM "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  if [[ $rc -ne 0 && -f $LOG ]]; then
    echo >&2
    echo "demo failed (exit $rc); last 40 lines of the server log $LOG:" >&2
    tail -n 40 "$LOG" >&2
  fi
  exit "$rc"
}
trap on_exit EXIT

echo "server log: $LOG"
build/server/infoflow-server --model "$MODEL" --listen "$ADDR" --metrics-listen 127.0.0.1:9464 \
  > "$LOG" 2>&1 &
SERVER=$!
ready=0
for _ in $(seq 1 120); do
  if build/client/infoflow stats --server "$ADDR" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$SERVER" 2>/dev/null || { echo "infoflow-server exited during start" >&2; exit 1; }
  sleep 1
done
[[ $ready -eq 1 ]] || { echo "infoflow-server did not answer on $ADDR within 120 s" >&2; exit 1; }

# Runs a client command; its stderr (progress, summary, report) is printed after
# its stdout (streamed answer, chunk keys), so the two never interleave.
client() {
  local err rc=0
  err=$(mktemp)
  build/client/infoflow "$@" 2> "$err" || rc=$?
  if [[ $rc -eq 0 ]]; then cat "$err"; else cat "$err" >&2; fi
  rm -f "$err"
  return "$rc"
}

echo; echo "== ingest deploy/demo/docs =="
client ingest --server "$ADDR" deploy/demo/docs
Q="What is the secret code of Arthur Tanaka?"
# The prompt format infoflow-tiny was trained on.
TEMPLATE=$'\nQuestion: {question}\nAnswer:'

CHUNKS=()
for f in deploy/demo/docs/*.txt; do CHUNKS+=(--chunk-file "$f"); done
# The answer streams to stdout as it is generated; the report (--report: method,
# r, TTFT, recomputed tokens, stage times) follows it.
ask() {
  echo; echo "== $1 =="; shift
  echo "Q: $Q"
  printf 'A:'
  client query --server "$ADDR" --question "$Q" \
    --template "$TEMPLATE" "${CHUNKS[@]}" --max-new-tokens 8 --report "$@"
}
ask "server default: INFOFLOW_BLEND (r = 0.05)"
ask "INFOFLOW (r = 0.15)" --method infoflow --ratio 0.15
ask "FULL prefill" --method full
echo; echo "server log: $LOG"
