#!/usr/bin/env bash
# The engine-only configuration (-DINFOFLOW_ENGINE_ONLY=ON, what
# deploy/gpu-engine-check.sh builds on a GPU machine) must stay valid: it
# configures in a scratch dir (seconds, no build), then checks that the engine
# targets are there and the service targets are not.
# usage: engine_only_configure.sh SOURCE_DIR SCRATCH_DIR
set -euo pipefail
src=$1 dir=$2
rm -rf "$dir"
cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFOFLOW_ENGINE_ONLY=ON \
  -DINFOFLOW_CI_FUZZ_SECONDS=0 >"$dir.log" 2>&1 || { tail -30 "$dir.log"; exit 1; }
targets=$(ninja -C "$dir" -t targets all | sed -n 's/^\([^:]*\): phony$/\1/p')
for want in engine_tests engine_bench infoflow-eval infoflow-make-test-model; do
  grep -qx "$want" <<<"$targets" || { echo "missing target $want"; exit 1; }
done
for unwanted in infoflow-server infoflow infoflow_store infoflow_dist serve_bench; do
  if grep -qx "$unwanted" <<<"$targets"; then echo "engine-only build has $unwanted"; exit 1; fi
done
echo "engine-only configure: ok"
