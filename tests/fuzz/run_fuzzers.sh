#!/usr/bin/env bash
# Builds the libFuzzer targets in their own clang build dir and runs each for
# SECONDS on the committed seeds in tests/fuzz/corpus/<target>/.
#
#   tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS [TARGET...]
#
# TARGET defaults to: safetensors tokenizer record openai_request chat_template. New corpus entries go to
# BUILD_DIR/fuzz-corpus/<target>/ (the source corpus is never written), crash
# reproducers to BUILD_DIR/fuzz-artifacts/<target>/, logs to
# BUILD_DIR/fuzz-logs/<target>.log. Exit status 1 if any target found a
# crash, leak, sanitizer report, timeout or OOM. Reproduce one with
#   BUILD_DIR/tests/fuzz/<target>_fuzz   BUILD_DIR/fuzz-artifacts/<target>/crash-...
# (record_fuzz lives in BUILD_DIR/cache_store/, openai_request_fuzz in
# BUILD_DIR/server/).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [safetensors|tokenizer|record|openai_request|chat_template ...]" >&2
  exit 2
fi
BUILD=$(realpath -m "$1")
SECONDS_PER=$2
shift 2
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(safetensors tokenizer record openai_request chat_template)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
JOBS=${JOBS:-2}

if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ -DINFOFLOW_FUZZ=ON -DINFOFLOW_BUILD_TESTS=OFF >/dev/null
fi
ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]/%/_fuzz}" >/dev/null

status=0
for t in "${TARGETS[@]}"; do
  bin=$BUILD/tests/fuzz/${t}_fuzz
  [[ $t == record ]] && bin=$BUILD/cache_store/record_fuzz
  [[ $t == openai_request ]] && bin=$BUILD/server/openai_request_fuzz
  corpus=$BUILD/fuzz-corpus/$t
  art=$BUILD/fuzz-artifacts/$t
  log=$BUILD/fuzz-logs/$t.log
  mkdir -p "$corpus" "$art" "$(dirname "$log")"
  start=$(date +%s)
  rc=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin" -max_total_time="$SECONDS_PER" -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$art/" "$corpus" "$SRC/tests/fuzz/corpus/$t" \
      >"$log" 2>&1 || rc=$?
  end=$(date +%s)
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [[ $rc -ne 0 ]]; then
    status=1
    echo "$t: FOUND A PROBLEM after $((end - start)) s (rc $rc) -- $log; artifacts in $art:"
    grep -m3 -E 'ERROR: |SUMMARY: |runtime error' "$log" || true
    ls "$art"
  else
    echo "$t: ok, $((end - start)) s, $runs runs, $cov, corpus $(ls "$corpus" | wc -l) new files"
  fi
done
exit $status
