#!/usr/bin/env python3
"""The shipped model reproduces its model card.

For every check in MODEL_DIR/eval_check.json, infoflow-eval on that fixed,
seeded eval set gives the recorded exact match of every listed method within 2
points (FULL is always run; a check that lists NONE too pins the NONE -> FULL
gap the model card reports).

    shipped_model_test.py INFOFLOW_EVAL MODEL_DIR WORK_DIR

eval_check.json: {"checks": [{"name": ..., "args": [infoflow-eval flags],
                              "em": {"FULL": 0.95, "NONE": 0.1,
                                     "INFOFLOW_BLEND@0.15": 0.9}}, ...]}
A key "METHOD@R" pins METHOD at recompute ratio R (all such keys of a check
share one --ratios list); a plain "METHOD" is an r-independent method.
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
        want_em = check["em"]
        if not want_em:
            sys.exit(f"check {check['name']} lists no methods")
        methods, ratios = [], []
        for key in want_em:
            name, _, ratio = key.partition("@")
            if name not in methods:
                methods.append(name)
            if ratio and ratio not in ratios:
                ratios.append(ratio)
        extra = ["--ratios", ",".join(ratios)] if ratios else []
        with open(log, "w") as f:
            rc = subprocess.call([eval_bin, "--model", model, "--methods", ",".join(methods),
                                  "--threads", "1", "--device", "cpu", *check["args"], *extra,
                                  "--out-json", out],
                                 stdout=f, stderr=subprocess.STDOUT)
        if rc != 0:
            print(open(log).read()[-4000:])
            sys.exit(f"infoflow-eval exited {rc} on {check['name']}")
        results = {}
        for r in json.load(open(out))["results"]:
            key = r["method"] if r["ratio"] is None else f"{r['method']}@{r['ratio']:g}"
            results[key] = r["em"]
        for method, want in want_em.items():
            got = results[method]
            if abs(got - want) <= TOLERANCE + 1e-9:
                print(f"ok   {check['name']}: {method} EM {got:.4f} (model card {want})")
            else:
                print(f"FAIL {check['name']}: {method} EM {got:.4f}, model card says {want} "
                      f"(tolerance {TOLERANCE}); log {log}")
                failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
