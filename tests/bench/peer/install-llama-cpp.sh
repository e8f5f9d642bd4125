#!/usr/bin/env bash
# Installs the prebuilt llama.cpp that tests/bench/peer_bench and the GGUF
# round-trip test drive: the npm package node-llama-cpp and its CPU binary
# package @node-llama-cpp/linux-x64 (with --cuda also the CUDA ones,
# @node-llama-cpp/linux-x64-cuda and its -cuda-ext companion, which load only
# where the CUDA runtime libraries, libcudart/libcublas, are on the library
# path), pinned below, into DIR/node_modules.
# Nothing is installed globally, and nothing is built or downloaded from
# GitHub: NODE_LLAMA_CPP_SKIP_DOWNLOAD makes the package's postinstall skip
# its source download/build, optional platform packages are left out unless
# named, and llama_peer.mjs loads with build: "never".
# usage: install-llama-cpp.sh DIR [--cuda]
set -euo pipefail
NODE_LLAMA_CPP_VERSION=3.22.1   # bundles llama.cpp release v0.5.0 (llama/llama.cpp.info.json)
dir=${1:?usage: install-llama-cpp.sh DIR [--cuda]}
cuda=${2:-}
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (needs node >= 20 + npm)"; exit 1; }
done
pkgs=("node-llama-cpp@$NODE_LLAMA_CPP_VERSION" "@node-llama-cpp/linux-x64@$NODE_LLAMA_CPP_VERSION")
[[ "$cuda" == --cuda ]] && pkgs+=("@node-llama-cpp/linux-x64-cuda@$NODE_LLAMA_CPP_VERSION"
                                  "@node-llama-cpp/linux-x64-cuda-ext@$NODE_LLAMA_CPP_VERSION")
mkdir -p "$dir"
[[ -f "$dir/package.json" ]] || \
  echo '{"name": "infoflow-llama-cpp-peer", "private": true, "type": "module"}' > "$dir/package.json"
if ! (cd "$dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true timeout 900 npm install --no-audit --no-fund \
        --loglevel=error --omit=optional "${pkgs[@]}" > "$dir/npm.log" 2>&1); then
  cat "$dir/npm.log"
  echo "FAIL: npm install ${pkgs[*]} failed (no access to the npm registry?)"
  exit 1
fi
echo "installed ${pkgs[*]} into $dir"
