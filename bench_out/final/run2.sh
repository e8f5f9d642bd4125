#!/usr/bin/env bash
set -u
cd /work/main
O=bench_out/final
log() { echo "== $(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg)) commit $(git rev-parse --short HEAD)" | tee -a $O/progress3.txt; }
log start
log serve_bench ttft
build/tests/bench/serve_bench --out $O/ttft3 --contexts 2048,8192,16384 --reps 5 --threads 2 --sections ttft \
  --methods FULL,NONE,INFOFLOW,INFOFLOW_BLEND,CACHEBLEND,EPIC > $O/ttft3.txt 2>&1
log serve_bench bound
build/tests/bench/serve_bench --out $O/bound2 --contexts 1024 --threads 2 --sections bound --streams 1,4,16 --seconds 10 > $O/bound2.txt 2>&1
log serve_bench rss
build/tests/bench/serve_bench --out $O/rss2 --contexts 8192 --threads 2 --sections rss --rss-queries 200 --rss-context 8192 > $O/rss2.txt 2>&1
log remote_bench
build/tests/bench/remote_bench --reps 3 --queries 40 --context 4096 > $O/remote2.txt 2>&1
log engine_bench 32K
build/tests/bench/engine_bench --threads 2 --sections methods --methods FULL,INFOFLOW --context 32768 --reps 1 > $O/methods_32k.txt 2>&1
log peer_bench
build/tests/bench/peer_bench --contexts 2048,8192,16384 --reps 3 --threads 2 --out $O/peer2 > $O/peer2.txt 2>&1
log done
