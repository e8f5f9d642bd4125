#!/usr/bin/env bash
# Runs tests/http/openai_client_test.mjs (the official `openai` npm package,
# pinned below) against a real infoflow-server with --http-listen on
# 127.0.0.1 and an auth token. Needs node, npm and the npm registry: without
# them the test FAILS (never passes silently); it carries the ctest label
# `network` so an offline run can exclude it with `ctest -LE network`.
# usage: openai_client_test.sh SERVER_BIN CLI_BIN SOURCE_DIR
set -euo pipefail
OPENAI_VERSION=4.104.0
server_bin=$1 cli_bin=$2 src=$3
tmp=$(mktemp -d /tmp/infoflow_openai_test.XXXXXX)
server_pid=
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (this test needs node + npm)"; exit 1; }
done
mkdir -p "$tmp/npm"
cp "$src/tests/http/openai_client_test.mjs" "$tmp/npm/"
echo '{"name": "infoflow-openai-test", "private": true, "type": "module"}' > "$tmp/npm/package.json"
if ! (cd "$tmp/npm" && timeout 300 npm install --no-audit --no-fund --loglevel=error \
        "openai@$OPENAI_VERSION" > "$tmp/npm.log" 2>&1); then
  cat "$tmp/npm.log"
  echo "FAIL: npm install openai@$OPENAI_VERSION failed (no access to the npm registry?)."
  echo "      This test needs the network; exclude it offline with: ctest -LE network"
  exit 1
fi

echo "test-token-$$" > "$tmp/token"
"$server_bin" --model "$src/models/infoflow-tiny" --data-dir "$tmp/kv" --listen 127.0.0.1:0 \
  --metrics-listen= --http-listen 127.0.0.1:0 --auth-token-file "$tmp/token" --threads 2 \
  --store-sync false > "$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 300); do
  grep -q '^http on ' "$tmp/server.log" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.log"; echo "FAIL: server exited"; exit 1; }
  sleep 0.1
done
http_port=$(sed -n 's|^http on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/server.log")
grpc_port=$(sed -n 's|^listening on 127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/server.log")
[[ -n "$http_port" && -n "$grpc_port" ]] || { cat "$tmp/server.log"; echo "FAIL: no ports"; exit 1; }
echo "server: gRPC 127.0.0.1:$grpc_port, HTTP 127.0.0.1:$http_port; openai@$OPENAI_VERSION"

rc=0
(cd "$tmp/npm" && BASE_URL="http://127.0.0.1:$http_port" API_KEY="$(cat "$tmp/token")" \
  MODEL=infoflow-tiny CLI="$cli_bin" GRPC_ADDR="127.0.0.1:$grpc_port" TOKEN_FILE="$tmp/token" \
  node openai_client_test.mjs) || rc=$?
kill -0 "$server_pid" 2>/dev/null || { echo "FAIL: the server died"; rc=1; }
if [[ $rc -ne 0 ]]; then echo "--- server log"; tail -40 "$tmp/server.log"; fi
exit $rc
