#!/usr/bin/env python3
"""The shipped model reproduces its model card.

For every check in MODEL_DIR/eval_check.json, `infoflow-eval --methods FULL` on
that fixed, seeded eval set gives the recorded FULL exact match within 2 points.

    shipped_model_test.py INFOFLOW_EVAL MODEL_DIR WORK_DIR

eval_check.json: {"checks": [{"name": ..., "args": [infoflow-eval flags],
                              "full_em": 0.95}, ...]}
"""
import json
import os
import subprocess
import sys

TOLERANCE = 0.02


def main(eval_bin, model, work):
    os.makedirs(work, exist_ok=True)
    checks = json.load(open(os.path.join(model, "eval_check.json")))["checks"]
    if not checks:
        sys.exit("eval_check.json has no checks")
    failed = 0
    for i, check in enumerate(checks):
        out = os.path.join(work, f"check{i}.json")
        log = os.path.join(work, f"check{i}.log")
        with open(log, "w") as f:
            rc = subprocess.call([eval_bin, "--model", model, "--methods", "FULL", "--threads", "1",
                                  "--device", "cpu", *check["args"], "--out-json", out],
                                 stdout=f, stderr=subprocess.STDOUT)
        if rc != 0:
            print(open(log).read()[-4000:])
            sys.exit(f"infoflow-eval exited {rc} on {check['name']}")
        got = next(r["em"] for r in json.load(open(out))["results"] if r["method"] == "FULL")
        want = check["full_em"]
        if abs(got - want) <= TOLERANCE + 1e-9:
            print(f"ok   {check['name']}: FULL EM {got:.4f} (model card {want})")
        else:
            print(f"FAIL {check['name']}: FULL EM {got:.4f}, model card says {want} "
                  f"(tolerance {TOLERANCE}); log {log}")
            failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
