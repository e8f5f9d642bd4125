#!/usr/bin/env bash
# Runs the curl examples of README.md ("Calling it over HTTP", between the
# http-examples markers) against a real infoflow-server on an ephemeral port
# (127.0.0.1:8000 in the README is replaced by it), and checks each answered.
# usage: readme_curl_test.sh SERVER_BIN SOURCE_DIR
set -euo pipefail
server_bin=$1 src=$2
tmp=$(mktemp -d /tmp/infoflow_readme_curl.XXXXXX)
server_pid=
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# The indented lines between the markers, without the server start (done here).
sed -n '/<!-- http-examples: begin/,/<!-- http-examples: end/p' "$src/README.md" |
  sed -n 's/^    //p' | grep -v '^build/server/infoflow-server' > "$tmp/examples.sh"
n_curl=$(grep -c '^curl ' "$tmp/examples.sh" || true)
[[ "$n_curl" -ge 4 ]] || { echo "FAIL: found $n_curl curl examples in README.md"; exit 1; }

"$server_bin" --model "$src/models/infoflow-tiny" --data-dir "$tmp/kv" --listen 127.0.0.1:0 \
  --metrics-listen= --http-listen 127.0.0.1:0 --threads 2 --store-sync false > "$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 300); do
  grep -q '^http on ' "$tmp/server.log" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.log"; echo "FAIL: server exited"; exit 1; }
  sleep 0.1
done
port=$(sed -n 's|^http on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/server.log")
sed -i "s/127\.0\.0\.1:8000/127.0.0.1:$port/g" "$tmp/examples.sh"

# -e: a curl -f that gets an HTTP error fails the test.
if ! bash -e "$tmp/examples.sh" > "$tmp/out.txt" 2>&1; then
  cat "$tmp/out.txt"; tail -20 "$tmp/server.log"; echo "FAIL: a README example failed"; exit 1
fi
cat "$tmp/out.txt"
echo
fail=0
for want in '"status":"ok"' '"object":"list"' '"object":"text_completion"' '"recomputed_tokens"' \
            'data: [DONE]' '"cached_tokens"' '"object":"chat.completion"'; do
  grep -qF "$want" "$tmp/out.txt" || { echo "FAIL: no $want in the examples' output"; fail=1; }
done
[[ $fail -eq 0 ]] && echo "PASS: $n_curl README curl examples"
exit $fail
