#!/usr/bin/env bash
# Session-33 benchmark batch on the idle 2-core VM, one after another.
set -u
cd /work/main
O=bench_out/final
log() { echo "== $(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a $O/progress.txt; }
log start
log serve_bench ttft
build/tests/bench/serve_bench --out $O/ttft --contexts 2048,8192,16384 --reps 5 --threads 2 --sections ttft \
  --methods FULL,NONE,INFOFLOW,INFOFLOW_BLEND,CACHEBLEND,EPIC > $O/ttft.txt 2>&1
log peer_bench
build/tests/bench/peer_bench --contexts 2048,8192,16384 --reps 3 --threads 2 --out $O/peer > $O/peer.txt 2>&1
log engine_bench prefill
for n in 8192 16384; do
  build/tests/bench/engine_bench --threads 2 --sections prefill --tokens $n --reps 3 --attention blocked > $O/prefill_$n.txt 2>&1
done
log sp_bench
build/tests/bench/sp_bench --contexts 8192,16384 --world 2 --threads 1 --ratio 0.15 --reps 3 > $O/sp_bench.txt 2>&1
log serve_bench bound
build/tests/bench/serve_bench --out $O/bound --contexts 1024 --threads 2 --sections bound --streams 1,4,16 --seconds 10 > $O/bound.txt 2>&1
log serve_bench rss
build/tests/bench/serve_bench --out $O/rss --contexts 8192 --threads 2 --sections rss --rss-queries 200 --rss-context 8192 > $O/rss.txt 2>&1
log remote_bench
build/tests/bench/remote_bench --reps 3 --queries 40 --context 4096 > $O/remote.txt 2>&1
log done
