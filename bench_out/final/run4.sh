#!/usr/bin/env bash
set -u
cd /work/main
O=bench_out/final
log() { echo "== $(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg)) commit $(git rev-parse --short HEAD)" | tee -a $O/progress4.txt; }
log start
log remote_bench
build/tests/bench/remote_bench --reps 3 --queries 40 --context 4096 > $O/remote4.txt 2>&1
log serve_bench rss default flags
build/tests/bench/serve_bench --out $O/rss4 --contexts 8192 --threads 2 --sections rss --rss-queries 200 --rss-context 8192 > $O/rss4.txt 2>&1
log serve_bench rss pool release 5 s
build/tests/bench/serve_bench --out $O/rss4_release --contexts 8192 --threads 2 --sections rss --rss-queries 200 --rss-context 8192 \
  --rss-idle-ms 8000 --server-arg --pool-idle-release-s=5 > $O/rss4_release.txt 2>&1
log serve_bench ttft
build/tests/bench/serve_bench --out $O/ttft4 --contexts 2048,8192,16384 --reps 5 --threads 2 --sections ttft \
  --methods FULL,NONE,INFOFLOW,INFOFLOW_BLEND,CACHEBLEND,EPIC > $O/ttft4.txt 2>&1
log done
