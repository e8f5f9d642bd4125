#!/usr/bin/env python3
"""Quality at equal TTFT from `infoflow-eval --pareto` CSVs.

Usage: engine/tools/pareto_table.py [--at 0.15,0.3,0.5] [--metric em] SET.csv...

For every CSV and method, the points (ttft_ratio_median, metric) are sorted by
TTFT and the metric is interpolated linearly between the two points around each
target TTFT ("interpolated along the method's curve"). A target below the
method's cheapest point or above its dearest is printed as "-" (the method
does not reach that cost; its range is in the last column). FULL and NONE are
single points. Prints one Markdown table per CSV.
"""
import argparse
import csv
import os
import sys


def curve(rows, metric):
    pts = sorted((float(r["ttft_ratio_median"]), float(r[metric])) for r in rows)
    return pts


def interp(pts, x):
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[0][1]  # single point exactly at x


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--at", default="0.15,0.3,0.5")
    ap.add_argument("--metric", default="em", choices=["em", "f1", "kl", "top1"])
    ap.add_argument("csvs", nargs="+")
    a = ap.parse_args()
    targets = [float(t) for t in a.at.split(",")]
    for path in a.csvs:
        with open(path) as f:
            rows = list(csv.DictReader(f))
        methods = []
        for r in rows:
            if r["method"] not in methods:
                methods.append(r["method"])
        n = rows[0]["n"] if rows else "0"
        print(f"\n**{os.path.basename(path)}** ({n} examples; {a.metric} at TTFT = x FULL, "
              "interpolated along each method's curve; - = outside the method's TTFT range)\n")
        print("| method | " + " | ".join(f"{t:g} x FULL" for t in targets) + " | TTFT range (points) |")
        print("|---|" + "---|" * (len(targets) + 1))
        for m in methods:
            pts = curve([r for r in rows if r["method"] == m], a.metric)
            cells = []
            for t in targets:
                v = interp(pts, t)
                cells.append("-" if v is None else f"{v:.3f}")
            if m in ("FULL", "NONE"):
                cells = [f"{pts[0][1]:.3f} (at {pts[0][0]:.2f})"] + [""] * (len(targets) - 1)
            rng = f"{pts[0][0]:.2f}-{pts[-1][0]:.2f} ({len(pts)})"
            print(f"| {m} | " + " | ".join(cells) + f" | {rng} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
