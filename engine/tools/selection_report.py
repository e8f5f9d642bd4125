#!/usr/bin/env python3
"""Where each blending method spends its recompute budget.

Reads the JSON that `infoflow-eval ... --out-json F --record-selected` writes
and prints, per method: EM; the share of its selected tokens by offset inside
their chunk; how much of the chunk heads (the first HEAD tokens of every chunk
but the first, where a chunk prefilled alone differs most from FULL) it
recomputed; how much of the answer's own tokens (answer_tokens) it recomputed;
and EM split by whether it recomputed the answer's whole chunk head, i.e. every
token from its chunk's start through the answer (the cut continuation
" is <n>" of the split task).

  engine/tools/selection_report.py eval.json [--head 6]
"""
import argparse
import bisect
import collections
import json
import sys

BINS = [(0, 6, "0-5"), (6, 20, "6-19"), (20, 100, "20-99"), (100, 1 << 62, "100+")]


def first_line(text):
    return text.strip().split("\n")[0].strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--head", type=int, default=6, help="chunk-head length in tokens (default 6)")
    args = ap.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    examples = data["per_example"]
    if not examples or "selected" not in examples[0]:
        sys.exit("no per-example 'selected': run infoflow-eval with --out-json and --record-selected")

    stats = collections.defaultdict(collections.Counter)
    order = []
    for ex in examples:
        offsets = ex["chunk_offsets"] + [ex["context_tokens"]]
        heads = set()
        for start, end in zip(offsets[1:-1], offsets[2:]):
            heads.update(range(start, min(end, start + args.head)))
        answer = ex.get("answer_tokens")
        answers = {a.strip().lower() for a in ex["answers"]}
        answer_window = set()
        if answer:
            chunk = bisect.bisect_right(offsets, answer[0]) - 1
            answer_window = set(range(max(offsets[chunk], answer[0] - 1), answer[1]))
        for method, selected in ex["selected"].items():
            if method not in order:
                order.append(method)
            s = stats[method]
            sel = set(selected)
            s["n"] += 1
            em = first_line(ex["generated"][method]).lower() in answers
            s["em"] += em
            s["selected"] += len(sel)
            for t in sel:
                rel = t - offsets[bisect.bisect_right(offsets, t) - 1]
                s[next(name for lo, hi, name in BINS if lo <= rel < hi)] += 1
            s["heads_hit"] += len(sel & heads)
            s["heads"] += len(heads)
            if answer:
                s["answered_examples"] += 1
                s["answer_hit"] += len(sel & set(range(answer[0], answer[1])))
                s["answer_tokens"] += answer[1] - answer[0]
                covered = answer_window <= sel
                s["covered"] += covered
                s["em_covered" if covered else "em_partial"] += em

    def frac(a, b):
        return f"{a / b:.2f}" if b else "-"

    cols = ["method", "EM"] + [f"sel@{name}" for _, _, name in BINS] + [
        "heads_rc", "answer_rc", "answer+1_rc'd", "EM|rc'd", "EM|not"]
    print(" ".join(f"{c:>16s}" if i == 0 else f"{c:>12s}" for i, c in enumerate(cols)))
    for method in order:
        s = stats[method]
        row = [method, frac(s["em"], s["n"])]
        row += [frac(s[name], s["selected"]) for _, _, name in BINS]
        row += [frac(s["heads_hit"], s["heads"]), frac(s["answer_hit"], s["answer_tokens"]),
                f"{s['covered']}/{s['answered_examples']}",
                frac(s["em_covered"], s["covered"]),
                frac(s["em_partial"], s["answered_examples"] - s["covered"])]
        print(" ".join(f"{c:>16s}" if i == 0 else f"{c:>12s}" for i, c in enumerate(row)))


if __name__ == "__main__":
    main()
