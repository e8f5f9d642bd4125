#!/usr/bin/env bash
# The shipped model reproduces its model card: for every check in
# MODEL_DIR/eval_check.json, `infoflow-eval --methods FULL` on that fixed,
# seeded eval subset gives the recorded FULL exact-match within 2 points.
#
#   shipped_model_test.sh INFOFLOW_EVAL MODEL_DIR WORK_DIR
#
# eval_check.json: {"checks": [{"name": ..., "args": [infoflow-eval flags],
#                               "full_em": 0.95}, ...]}
set -euo pipefail
EVAL=$1
MODEL=$2
WORK=$3
mkdir -p "$WORK"
CHECKS=$MODEL/eval_check.json
[[ -f $CHECKS ]] || { echo "missing $CHECKS" >&2; exit 1; }
n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["checks"]))' "$CHECKS")
[[ $n -gt 0 ]] || { echo "$CHECKS has no checks" >&2; exit 1; }
status=0
for ((i = 0; i < n; i++)); do
  mapfile -t args < <(python3 -c 'import json,sys; [print(a) for a in json.load(open(sys.argv[1]))["checks"][int(sys.argv[2])]["args"]]' "$CHECKS" "$i")
  name=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["checks"][int(sys.argv[2])]["name"])' "$CHECKS" "$i")
  want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["checks"][int(sys.argv[2])]["full_em"])' "$CHECKS" "$i")
  out=$WORK/check$i.json
  "$EVAL" --model "$MODEL" --methods FULL --threads 1 --device cpu "${args[@]}" --out-json "$out" \
    >"$WORK/check$i.log" 2>&1 || { tail -20 "$WORK/check$i.log"; exit 1; }
  got=$(python3 -c 'import json,sys; r=[x for x in json.load(open(sys.argv[1]))["results"] if x["method"]=="FULL"]; print(r[0]["em"])' "$out")
  if python3 -c 'import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) <= 0.02 + 1e-9 else 1)' "$got" "$want"; then
    echo "ok   $name: FULL EM $got (model card $want)"
  else
    echo "FAIL $name: FULL EM $got, model card says $want (tolerance 0.02); log $WORK/check$i.log"
    status=1
  fi
done
exit $status
