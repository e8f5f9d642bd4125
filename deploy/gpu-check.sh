#!/usr/bin/env bash
# GPU check on a machine with an NVIDIA GPU and a CUDA libtorch:
#   Torch_DIR=$(python -c 'import torch;print(torch.utils.cmake_prefix_path)')/Torch \
#     bash deploy/gpu-check.sh /path/to/hf-checkpoint [contexts]
# (contexts default "8192 16384 32768"; the checkpoint's max_position_embeddings
#  must cover them; Debian packages from deploy/install-deps.sh must be present.)
#
#  1. configures build-cuda/ with -DINFOFLOW_CUDA=ON against $Torch_DIR and builds
#     the server, the CLI, infoflow-eval, engine_tests and engine_bench;
#  2. runs engine_tests (they pin device cpu: this checks the CUDA build's CPU
#     path and that nothing regressed by linking CUDA libtorch);
#  3. runs infoflow-eval --device cuda on the checkpoint (synthetic set);
#  4. prints TTFT of FULL vs INFOFLOW (r = 0.15) at each context length on the
#     GPU: infoflow-server --device cuda --model DIR, chunks ingested first, then
#     one query per method with --report (ttft from the server's report);
#  5. with GPU_CHECK_CPU_BENCH=1 also engine_bench --model DIR --context N
#     (engine_bench has no --device flag and runs on cpu);
#  6. when nvidia-smi sees a GPU: tests/bench/peer_bench --gpu, the engine on
#     CUDA beside llama.cpp's CUDA prebuilt (npm @node-llama-cpp/linux-x64-cuda)
#     on the GGUF export of the generated bench model, contexts PEER_CONTEXTS
#     (default 2048,8192,16384). llama.cpp comes from PEER_LLAMA_DIR (default
#     $BUILD/peer-llama-cpp); where this machine has no npm registry, fill it
#     beforehand: bash tests/bench/peer/install-llama-cpp.sh DIR --cuda.
#     PEER_BENCH=0 skips it.
#  7. when nvidia-smi sees 2 GPUs or more: tests/bench/sp_bench --device cuda
#     --backend nccl --world 2 (rank r on cuda:r, ProcessGroupNCCL): the paper's
#     ring-attention FULL vs sequence-parallel INFOFLOW at SP_CONTEXTS (default
#     16384,32768) beside one GPU. SP_BENCH=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: gpu-check.sh MODEL_DIR [\"8192 16384 32768\"]}
CONTEXTS=${2:-"8192 16384 32768"}
: "${Torch_DIR:?set Torch_DIR to a CUDA libtorch (python -c 'import torch;print(torch.utils.cmake_prefix_path)')/Torch}"
BUILD=${BUILD_DIR:-build-cuda}
JOBS=${JOBS:-$(nproc)}
CHUNKS=${CHUNKS:-8}
DEVICE=${DEVICE:-cuda}        # DEVICE=cpu SKIP_BUILD=1 [SKIP_EVAL=1]: dry run on a CPU box
[ -f "$MODEL/config.json" ] || { echo "gpu-check: $MODEL/config.json not found" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "== 1. build (INFOFLOW_CUDA=ON, Torch_DIR=$Torch_DIR)"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFOFLOW_CUDA=ON -DTorch_DIR="$Torch_DIR" >/dev/null
  cmake --build "$BUILD" -j"$JOBS" --target infoflow-server infoflow infoflow-eval engine_tests engine_bench \
    peer_bench sp_bench

  echo "== 2. engine_tests"
  "$BUILD"/tests/engine/engine_tests --gtest_brief=1
fi

if [ "${SKIP_EVAL:-0}" != 1 ]; then
  echo "== 3. infoflow-eval --device $DEVICE"
  "$BUILD"/engine/tools/infoflow-eval --model "$MODEL" --device "$DEVICE" --synthetic 8 --chunks 6 \
    --ratios 0.05,0.15,0.3
fi

echo "== 4. TTFT FULL vs INFOFLOW on $DEVICE ($CHUNKS chunks per query)"
WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
MAXCTX=0
for n in $CONTEXTS; do if [ "$n" -gt "$MAXCTX" ]; then MAXCTX=$n; fi; done
"$BUILD"/server/infoflow-server --model "$MODEL" --device "$DEVICE" --data-dir "$WORK/kv" \
  --listen 127.0.0.1:0 --metrics-listen '' --store-sync false \
  --max-context-tokens $((MAXCTX + 1024)) --max-chunk-tokens $((MAXCTX / CHUNKS + 512)) \
  --workers 1 2>"$WORK/server.log" &
SERVER_PID=$!
PORT=
for _ in $(seq 1 600); do
  PORT=$(sed -n 's/^listening on .*:\([0-9][0-9]*\).*/\1/p' "$WORK/server.log" | head -1)
  [ -n "$PORT" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; exit 1; }
  sleep 0.5
done
[ -n "$PORT" ] || { echo "gpu-check: server did not start" >&2; cat "$WORK/server.log" >&2; exit 1; }
ADDR=127.0.0.1:$PORT
grep -m1 '^model ' "$WORK/server.log"

# Chunk texts of about N/CHUNKS tokens each, sized with the model's own tokenizer.
make_chunks() {  # $1 = context tokens, $2 = out dir
  mkdir -p "$2"
  python3 - "$1" "$CHUNKS" "$2" "$MODEL/tokenizer.json" "$BUILD/client/infoflow" <<'PY'
import json, random, subprocess, sys
n, k, out, tok, cli = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
words = ("the river city market north report engineer budget station garden winter "
         "library council harbor signal museum bridge forest journal orbit").split()
def text(seed, count):
    r = random.Random(seed)
    return " ".join(r.choice(words) + (str(r.randrange(100)) if r.random() < 0.2 else "")
                    for _ in range(count))
sample = text(0, 2000)
ids = json.loads(subprocess.run([cli, "tokenize", "--tokenizer", tok, "--json"], input=json.dumps([sample]),
                                capture_output=True, text=True, check=True).stdout)[0]
per_word = len(ids) / 2000.0
for c in range(k):
    with open(f"{out}/chunk{c:02d}.txt", "w") as f:
        f.write(f"Section {c} of {n}. " + text(1000 * n + c, int(n / k / per_word * 0.97)) + "\n")
PY
}
printf '\n%-9s %-10s %10s %10s %12s\n' context method ttft_ms vs_full recomputed
for n in $CONTEXTS; do
  make_chunks "$n" "$WORK/c$n"
  "$BUILD"/client/infoflow ingest --server "$ADDR" "$WORK/c$n" >"$WORK/ingest.log" 2>&1 \
    || { cat "$WORK/ingest.log" >&2; exit 1; }
  ARGS=()
  for f in "$WORK/c$n"/*.txt; do ARGS+=(--chunk-file "$f"); done
  for pass in warm measure; do   # the warm pass loads kernels and fills the RAM tier
    full=
    for m in full infoflow; do
      "$BUILD"/client/infoflow query --server "$ADDR" --question "Which section mentions the harbor?" \
        --method "$m" --ratio 0.15 "${ARGS[@]}" --max-new-tokens 1 --report >/dev/null 2>"$WORK/report"
      ttft=$(sed -n 's/.*ttft \([0-9.]*\) ms.*/\1/p' "$WORK/report" | head -1)
      ctx=$(sed -n 's/.*context \([0-9]*\) tokens.*/\1/p' "$WORK/report" | head -1)
      rec=$(sed -n 's/.*recomputed \([0-9]*\).*/\1/p' "$WORK/report" | head -1)
      [ -n "$ttft" ] || { cat "$WORK/report" >&2; exit 1; }
      if [ "$m" = full ]; then full=$ttft; fi
      if [ "$pass" = measure ]; then
        printf '%-9s %-10s %10s %10s %12s\n' "$ctx" "$m" "$ttft" \
          "$(awk -v a="$ttft" -v b="$full" 'BEGIN{printf "%.3f", a/b}')" "$rec"
      fi
    done
  done
done

if [ "${GPU_CHECK_CPU_BENCH:-0}" = 1 ]; then
  echo "== 5. engine_bench (cpu) on the checkpoint"
  for n in $CONTEXTS; do
    "$BUILD"/tests/bench/engine_bench --model "$MODEL" --context "$n" --chunks "$CHUNKS" --reps 1
  done
fi
if [ "${PEER_BENCH:-1}" = 1 ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "== 6. peer_bench --gpu: ours (CUDA) beside llama.cpp (CUDA prebuilt)"
  # llama.cpp's CUDA prebuilt needs libcudart/libcublas: take them from the
  # PyTorch wheel's nvidia-* packages when the system has none.
  NV_LIBS=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null || true)
  LD_LIBRARY_PATH="${NV_LIBS:+$NV_LIBS:}${LD_LIBRARY_PATH:-}" "$BUILD"/tests/bench/peer_bench --gpu \
    --contexts "${PEER_CONTEXTS:-2048,8192,16384}" --reps 3 --threads "${PEER_THREADS:-2}" \
    --llama-dir "${PEER_LLAMA_DIR:-$BUILD/peer-llama-cpp}" --out "$BUILD/peer-gpu"
fi
if [ "${SP_BENCH:-1}" = 1 ] && command -v nvidia-smi >/dev/null &&
   [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  echo "== 7. sp_bench --device cuda: ring-attention FULL vs sequence-parallel INFOFLOW, 2 GPUs (NCCL)"
  "$BUILD"/tests/bench/sp_bench --device cuda --backend nccl --world 2 \
    --contexts "${SP_CONTEXTS:-16384,32768}" --ratio 0.15 --reps 3
fi
echo "gpu-check: done"
