#!/usr/bin/env bash
# Engine-only GPU check: the engine, its GPU exactness tests and TTFT per method
# on a CUDA GPU, on a machine that has the PyTorch wheel (CUDA libtorch), nvcc,
# CMake and a C++ compiler but none of Debian 12's service packages (gRPC,
# RocksDB, ...) and no package registry. deploy/gpu-check.sh is the full check
# (server, peer bench, NCCL) for a machine that has those.
#
#   bash deploy/gpu-engine-check.sh --fetch-debs DIR   # on Debian 12, with apt:
#       downloads the few Debian packages the engine needs (absl, re2, xxhash,
#       nlohmann-json, OpenSSL, GoogleTest; ~7 MB) into DIR
#   DEBS=DIR bash deploy/gpu-engine-check.sh [OUT_DIR]  # on the GPU machine
#
# On the GPU machine it
#  1. unpacks DIR's packages under $PREFIX (dpkg -x; nothing is installed);
#  2. configures build-gpu/ with -DINFOFLOW_ENGINE_ONLY=ON -DINFOFLOW_CUDA=ON
#     against the wheel's libtorch and builds engine_tests, engine_bench,
#     infoflow-eval and infoflow-make-test-model;
#  3. runs the GPU tests (engine_tests --gtest_filter='Cuda*': every method at
#     ratio 1 equals FULL on the GPU; GPU vs CPU logits, selections, records);
#  4. engine_bench --device cuda, methods section, at CONTEXTS (default
#     8192,16384,32768): the generated 6-layer bench model in f32, then a
#     Llama-3.2-1B-shaped model (16 layers, d 2048, 32/8 heads, ff 8192;
#     random bf16 weights: speed does not depend on what a model knows) in bf16;
#  5. infoflow-eval on models/infoflow-tiny on the GPU and on the CPU (the
#     model card's split task, 40 examples of seed 0: quality must agree);
#  6. the whole engine_tests suite on the CPU path of this build (libtorch of
#     the wheel, not Debian's 1.13).
# Each step's output goes to OUT_DIR (default gpu-check-out/) as one file.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --fetch-debs ]; then
  dir=${2:?usage: gpu-engine-check.sh --fetch-debs DIR}
  mkdir -p "$dir" && cd "$dir" &&
    apt-get download libabsl-dev libabsl20220623 libre2-dev libre2-9 libxxhash-dev libxxhash0 \
      nlohmann-json3-dev libssl-dev libssl3 libgtest-dev libgmock-dev
  exit
fi

OUT=${1:-gpu-check-out}
DEBS=${DEBS:?set DEBS to the folder --fetch-debs filled}
PREFIX=${PREFIX:-/tmp/infoflow-deps}
BUILD=${BUILD_DIR:-build-gpu}
CONTEXTS=${CONTEXTS:-8192,16384,32768}
METHODS=${METHODS:-FULL,NONE,INFOFLOW,INFOFLOW_BLEND,CACHEBLEND,EPIC}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SECONDS=0
BUDGET=${BUDGET_SECONDS:-560}  # steps that would not finish inside it are skipped
step() { echo "== [$SECONDS s] $*"; }
# has_time N: at least N seconds of the budget are left (else says what is skipped).
has_time() {
  [ $((BUDGET - SECONDS)) -ge "$1" ] && return 0
  echo "== [$SECONDS s] skipped (needs ${1}s, budget ${BUDGET}s): $2"
  return 1
}

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
step "0. machine" | tee "$OUT/build.txt"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "cxx11 abi", torch.compiled_with_cxx11_abi())'
  nvcc --version | tail -1
  c++ --version | head -1
  cmake --version | head -1
  grep PRETTY_NAME /etc/os-release
} 2>&1 | tee -a "$OUT/build.txt"

step "1. unpack $DEBS into $PREFIX" | tee -a "$OUT/build.txt"
mkdir -p "$PREFIX"
for f in "$DEBS"/*.deb; do
  if command -v dpkg >/dev/null; then dpkg -x "$f" "$PREFIX" || exit 1
  else ar p "$f" data.tar.xz | tar -xJ -C "$PREFIX" || exit 1; fi
done

step "2. configure and build $BUILD" | tee -a "$OUT/build.txt"
Torch_DIR=${Torch_DIR:-$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')/Torch}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
if command -v ninja >/dev/null; then GEN=Ninja KEEP_GOING="-k 0"; else GEN="Unix Makefiles" KEEP_GOING=-k; fi
cmake -S . -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DINFOFLOW_ENGINE_ONLY=ON \
  -DINFOFLOW_CUDA="${INFOFLOW_CUDA:-ON}" -DTorch_DIR="$Torch_DIR" -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
  >>"$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
grep -E "INFOFLOW_TORCH_ALLOCATOR_V2|Found Torch|CUDA" "$OUT/build.txt" | tail -5
cmake --build "$BUILD" -j"$JOBS" --target engine_tests engine_bench infoflow-eval \
  infoflow-make-test-model -- $KEEP_GOING >>"$OUT/build.txt" 2>&1
build_rc=$?
grep -E "error|FAILED" "$OUT/build.txt" | head -20
[ -x "$BUILD/tests/engine/engine_tests" ] || { echo "engine_tests did not build"; }
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ -x "$BUILD/tests/engine/engine_tests" ]; then
  step "3. GPU tests" | tee "$OUT/gpu_tests.txt"
  timeout 300 "$BUILD/tests/engine/engine_tests" --gtest_filter='Cuda*' 2>&1 | tee -a "$OUT/gpu_tests.txt" | tail -8
fi

if [ -x "$BUILD/tests/bench/engine_bench" ]; then
  step "4a. engine_bench --device cuda, generated 6-layer bench model, f32" | tee "$OUT/bench_small.txt"
  for n in ${CONTEXTS//,/ }; do
    has_time 60 "6-layer bench at $n" | tee -a "$OUT/bench_small.txt" || continue
    timeout 300 "$BUILD/tests/bench/engine_bench" --device cuda --dtype f32 --context "$n" \
      --sections methods --methods "$METHODS" --reps 5 2>&1 | tee -a "$OUT/bench_small.txt"
  done
fi
if [ -x "$BUILD/tests/bench/engine_bench" ] && [ -x "$BUILD/engine/tools/infoflow-make-test-model" ] &&
   has_time 150 "1B-shaped model"; then
  step "4b. Llama-3.2-1B-shaped model, bf16" | tee "$OUT/bench_1b.txt"
  M1B=/tmp/infoflow-1b
  [ -f "$M1B/config.json" ] || "$BUILD/engine/tools/infoflow-make-test-model" --out "$M1B" \
    --layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 32000 \
    --max-positions 65536 --dtype bf16 2>&1 | tee -a "$OUT/bench_1b.txt"
  step "model written" | tee -a "$OUT/bench_1b.txt"
  for n in ${CONTEXTS//,/ }; do
    has_time 60 "1B bench at $n" | tee -a "$OUT/bench_1b.txt" || continue
    timeout 300 "$BUILD/tests/bench/engine_bench" --device cuda --dtype bf16 --model "$M1B" \
      --context "$n" --sections methods --methods "$METHODS" --reps 5 2>&1 |
      tee -a "$OUT/bench_1b.txt"
  done
fi

if [ -x "$BUILD/engine/tools/infoflow-eval" ]; then
  step "5. infoflow-eval on models/infoflow-tiny: cuda, then cpu" | tee "$OUT/eval.txt"
  for dev in cuda cpu; do
    has_time 40 "eval on $dev" | tee -a "$OUT/eval.txt" || continue
    timeout 120 "$BUILD/engine/tools/infoflow-eval" --model models/infoflow-tiny --device "$dev" \
      --synthetic 40 --task split --chunks 8 --chunk-words 220 --seed 0 \
      --methods FULL,NONE,INFOFLOW,INFOFLOW_BLEND,CACHEBLEND --ratios 0.05,0.15,1.0 2>&1 | tee -a "$OUT/eval.txt" | tail -25
  done
fi

if [ -x "$BUILD/tests/engine/engine_tests" ]; then
  step "6. engine_tests, CPU path of this build" | tee "$OUT/cpu_tests.txt"
  timeout $((BUDGET - SECONDS > 20 ? BUDGET - SECONDS : 20)) "$BUILD/tests/engine/engine_tests" --gtest_brief=1 \
    2>&1 | tee -a "$OUT/cpu_tests.txt" | tail -15
fi
step "done (build rc $build_rc)"
