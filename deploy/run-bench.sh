#!/usr/bin/env bash
# The benchmark, one command: builds the server and the benchmarks (Release),
# then runs tests/bench/serve_bench against a real infoflow-server on
# 127.0.0.1 (RocksDB in a temp dir) and writes into OUT (default bench_out/):
#   ttft_summary.csv / ttft_runs.csv  TTFT vs context for FULL, NONE, INFOFLOW
#       r=0.15 (+reorder), INFOFLOW_BLEND, CACHEBLEND, CACHEBLEND_PARTIAL r=0.15, EPIC k=4: median of REPS runs,
#       ratio to FULL from the same run, stage breakdown, and the in-process
#       engine's TTFT on the same inputs (gRPC overhead)
#   ingest.csv        gRPC ingest tokens/s vs in-process prefill
#   concurrency.csv   prefill-heavy (1 token) and decode-heavy (64 tokens) mixes:
#       QPS, generated tokens/s, p50/p95/p99 TTFT, inter-token p50/p99 at 1, 4, 16
#       streams (plot two runs with tests/bench/plot_concurrency.sh)
#   interference.csv  inter-token time of one stream, idle vs under 8K prefills
#   ttft.svg, ttft.png (gnuplot), engine_bench.txt (prefill GFLOP/s, in-process
#       per-method TTFT at 4K)
#
#   bash deploy/run-bench.sh [OUT]
# Environment: CONTEXTS (default 1024,2048,4096,8192; add 16384 if you have the
# time: FULL prefill is quadratic), REPS (default 5), THREADS (default: all
# cores), MODEL (a model dir; default the generated 6-layer 512-wide LLaMA).
# On a 2-core VM the default run takes about 20 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench_out}
CONTEXTS=${CONTEXTS:-1024,2048,4096,8192}
REPS=${REPS:-5}
THREADS=${THREADS:-$(nproc)}
bash deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFOFLOW_BUILD_TESTS=ON >/dev/null
cmake --build build -j2 --target infoflow-server serve_bench engine_bench
mkdir -p "$OUT"

model_args=()
[[ -n ${MODEL:-} ]] && model_args=(--model "$MODEL")
build/tests/bench/serve_bench --out "$OUT" --contexts "$CONTEXTS" --reps "$REPS" \
  --threads "$THREADS" "${model_args[@]}" | tee "$OUT/serve_bench.txt"
build/tests/bench/engine_bench --reps "$REPS" --context 4096 | tee "$OUT/engine_bench.txt"

# PNG of TTFT vs context (one line per method) from ttft_summary.csv.
if command -v gnuplot >/dev/null; then
  methods=$(tail -n +2 "$OUT/ttft_summary.csv" | cut -d, -f3 | awk '!seen[$0]++')
  plot=""
  i=0
  while IFS= read -r m; do
    i=$((i + 1))
    awk -F, -v m="$m" 'NR > 1 && $3 == m { print $2, $5 }' "$OUT/ttft_summary.csv" \
      >"$OUT/.series$i.dat"
    plot+="${plot:+, }'$OUT/.series$i.dat' using 1:2 with linespoints lw 2 title '$m'"
  done <<<"$methods"
  gnuplot <<EOF
set terminal png size 900,560
set output '$OUT/ttft.png'
set title 'infoflow-server TTFT vs context (median of $REPS, gRPC)'
set xlabel 'context tokens'
set ylabel 'TTFT ms'
set logscale xy
set grid
set key left top
plot $plot
EOF
  rm -f "$OUT"/.series*.dat
  echo "wrote $OUT/ttft.png"
else
  echo "gnuplot not found: skipped ttft.png (ttft.svg is written by serve_bench)" >&2
fi
