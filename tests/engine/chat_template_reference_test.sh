#!/usr/bin/env bash
# Renders tests/data/chat_templates/cases.json with @huggingface/jinja (pinned
# below; installed from npm into a temp dir) and checks that our renderer
# (chat_template_tests' RealTemplatesMatchHuggingFaceJinja) produces the same
# bytes for every case. Needs node, npm and the npm registry: without them
# the test FAILS and says so; it carries the ctest label `network`
# (exclude offline with `ctest -LE network`).
# usage: chat_template_reference_test.sh CHAT_TEMPLATE_TESTS_BIN SOURCE_DIR
set -euo pipefail
HF_JINJA_VERSION=0.5.11
bin=$1 src=$2
tmp=$(mktemp -d /tmp/infoflow_hf_jinja.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (this test needs node + npm)"; exit 1; }
done
echo '{"name": "infoflow-hf-jinja-test", "private": true, "type": "module"}' > "$tmp/package.json"
cp "$src/tests/engine/chat_template_reference.mjs" "$tmp/"
if ! (cd "$tmp" && timeout 300 npm install --no-audit --no-fund --loglevel=error \
        "@huggingface/jinja@$HF_JINJA_VERSION" > "$tmp/npm.log" 2>&1); then
  cat "$tmp/npm.log"
  echo "FAIL: npm install @huggingface/jinja@$HF_JINJA_VERSION failed (no access to the npm registry?)."
  echo "      This test needs the network; exclude it offline with: ctest -LE network"
  exit 1
fi
data=$src/tests/data/chat_templates
(cd "$tmp" && node chat_template_reference.mjs "$data/cases.json" "$data" "$tmp/reference.json")
# The committed expected.json must be what this reference renders, too.
if ! cmp -s "$tmp/reference.json" "$data/expected.json"; then
  diff <(python3 -m json.tool "$data/expected.json") <(python3 -m json.tool "$tmp/reference.json") | head -40 || true
  echo "FAIL: tests/data/chat_templates/expected.json differs from @huggingface/jinja@$HF_JINJA_VERSION's rendering"
  exit 1
fi
INFOFLOW_CHAT_TEMPLATE_REFERENCE="$tmp/reference.json" \
  "$bin" --gtest_filter='ChatTemplate.RealTemplatesMatchHuggingFaceJinja'
