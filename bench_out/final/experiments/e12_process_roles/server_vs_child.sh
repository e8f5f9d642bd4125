#!/bin/bash
# e12 part 4: the server's whole FULL prefill against a plain engine process, both children of
# this shell (no compute in the parent), alternating who goes first.
#
#   bash bench_out/final/experiments/e12_process_roles/server_vs_child.sh REPS [WORDS_PER_CHUNK]
#
# Starts infoflow-server as serve_bench does (--threads 2, the generated bench model, RAM tier
# 2 GiB), ingests 33 chunks of random words, and starts `engine_bench --prefill-child true` with
# as many tokens as the query's context. Each rep sends one FULL query (max_new_tokens 1) and
# asks the child for one prefill. Prints per rep: the server's recompute stage (its whole
# prefill), the child's prefill, and their ratio; then the geometric mean.
set -euo pipefail
reps=${1:-10}
words=${2:-400}
root=$(cd "$(dirname "$0")/../../../.." && pwd)
bin=$root/build
model=/tmp/infoflow-bench-model   # engine_bench writes it when missing
[ -f $model/model.safetensors ] || $bin/tests/bench/engine_bench --sections none >/dev/null
work=$(mktemp -d)
cleanup() {
  exec 3>&- 4<&- 2>/dev/null || true   # EOF: the child engine returns
  kill "$srv_pid" 2>/dev/null || true
  wait 2>/dev/null || true              # the server and the child, before their files go
  rm -rf "$work"
}
trap cleanup EXIT
port=50917
$bin/server/infoflow-server --model $model --data-dir $work/kv --listen 127.0.0.1:$port \
  --metrics-listen '' --threads=2 --ram-bytes=$((2 << 30)) --max-chunks=1024 \
  --max-context-tokens=20000 --max-new-tokens=512 --store-sync=false >$work/server.log 2>&1 &
srv_pid=$!
for _ in $(seq 300); do
  $bin/client/infoflow stats --server 127.0.0.1:$port >/dev/null 2>&1 && break
  sleep 1
done
python3 - "$work/chunks.jsonl" "$words" <<'EOF'
import json, random, sys
random.seed(7)
vocab = [''.join(random.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(random.randint(2, 8)))
         for _ in range(3000)]
with open(sys.argv[1], 'w') as f:
    for i in range(33):
        f.write(json.dumps({'text': ' '.join(random.choice(vocab) for _ in range(int(sys.argv[2])))}) + '\n')
EOF
$bin/client/infoflow ingest --server 127.0.0.1:$port --batch 4 $work/chunks.jsonl >$work/ingest.txt
mapfile -t texts < <(python3 -c "import json,sys; [print(json.loads(l)['text']) for l in open(sys.argv[1])]" $work/chunks.jsonl)
args=()
for t in "${texts[@]}"; do args+=(--chunk-text "$t"); done
query() {
  $bin/client/infoflow query --server 127.0.0.1:$port --method full --max-new-tokens 1 --report \
    --question "what is the first word" "${args[@]}" 2>&1 >/dev/null | tr '\n' ' '
}
first=$(query)
ctx=$(sed -E 's/.*context ([0-9]+) tokens.*/\1/' <<<"$first")
echo "context $ctx tokens; server pid $srv_pid"
mkfifo $work/to $work/from
$bin/tests/bench/engine_bench --threads 2 --tokens $ctx --model $model --prefill-child true \
  <$work/to >$work/from 2>/dev/null &
exec 3>$work/to 4<$work/from
child() {
  echo go >&3
  local line
  while read -r line <&4; do
    case $line in "ms "*) echo "${line#ms }"; return ;; esac
  done
}
child >/dev/null   # warm-up
query >/dev/null
logsum=0
for r in $(seq 0 $((reps - 1))); do
  if ((r % 2 == 0)); then s=$(query); c=$(child); else c=$(child); s=$(query); fi
  rec=$(sed -E 's/.*recompute ([0-9.]+).*/\1/' <<<"$s")
  ttft=$(sed -E 's/.*ttft ([0-9.]+) ms.*/\1/' <<<"$s")
  ratio=$(python3 -c "print('%.3f' % ($rec / $c))")
  logsum=$(python3 -c "import math; print($logsum + math.log($rec / $c))")
  echo "run $r: server recompute $rec ms (ttft $ttft), child prefill $c ms, server / child $ratio"
done
python3 -c "import math; print('geometric mean server / child over $reps runs: %.3f' % math.exp($logsum / $reps))"
