#!/usr/bin/env python3
"""Markdown table of serve_bench's service overhead, warm and after idle.

Reads one or more ttft_summary.csv files written by serve_bench (section 1)
and prints, per context and method: server TTFT, ratio to FULL, client TTFT
through gRPC, the in-process engine's TTFT on the same chunk KVs, and the
client / in-process ratio for a warm query and for one sent after the server
was idle longer than its trim period (over the warm in-process run, and over
the in-process run after the same pause), the server's page faults per warm
and after-idle query, plus fetch + reposition. Older CSVs lack the last
columns (printed as nan or empty).

With --pool, it prints instead two tables over several files (each one
serve_bench run). First, per context and ratio column, pooled over every
method: the geometric mean of the cells' ratios with a 95% interval, the
cells' spread, how many cells exceed 1.05, and each run's own geometric mean.
Second, per context and method, each ratio's geometric mean over the runs
with its range. Why: one cell's ratio of two 9-rep medians varies by about 5%
(sd) on the 2-core VM from run to run with the code unchanged, so a single
cell cannot resolve a 5% bound; means over runs can. The first table's
interval treats cells as independent, which they are not quite (one run's
cells share its two processes), so the per-run means are printed beside it,
and the interval over those (t with runs - 1 degrees of freedom) is the
conservative one. Methods differ (NONE and EPIC can sit below 1 while a long
recompute sits above it), so read the second table before concluding from
the first.

    tests/bench/overhead_table.py bench_out/run/ttft_summary.csv [...]
    tests/bench/overhead_table.py --pool bench_out/run1/ttft_summary.csv bench_out/run2/...
"""
import csv
import math
import statistics
import sys

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def num(row, key):
    v = row.get(key, "nan")
    return float(v) if v not in ("", None) else float("nan")


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# The four client / in-process ratio columns, in the per-row table's order.
COLUMNS = ("warm / in-process", "after idle / in-process",
           "after idle / in-process after idle", "median of per-run warm / in-process")


def ratios(row):
    """The four client / in-process ratios of one cell, by column name."""
    inproc = num(row, "inprocess_ttft_ms_median")
    idle = num(row, "idle_client_ttft_ms_median")
    return dict(zip(COLUMNS, (
        num(row, "client_ttft_ms_median") / inproc,
        idle / inproc,
        idle / num(row, "idle_inprocess_ttft_ms_median"),
        1 + num(row, "paired_grpc_overhead"),
    )))


def pooled_ratios(paths):
    """(run, context, method, column, ratio) for every finite ratio of every file."""
    for run, path in enumerate(paths):
        for row in read_rows(path):
            for column, value in ratios(row).items():
                if math.isfinite(value) and value > 0:
                    yield run, int(row["context_target"]), row["method"], column, value


def t975(df):
    return T975[df - 1] if 1 <= df <= len(T975) else 1.960


def interval(logs):
    """(geometric mean, low, high) of a 95% t interval on the logs' mean."""
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def print_rows(paths):
    print("| context | method | TTFT ms | vs FULL | gRPC client ms | in-process ms | "
          "warm / in-proc | idle / in-proc | idle / in-proc after idle | "
          "page faults warm / idle | fetch + repos ms | median per-run warm / in-proc |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        for row in read_rows(path):
            r = ratios(row)
            faults = (f"{num(row, 'warm_page_faults'):.0f} / {num(row, 'idle_page_faults'):.0f}"
                      if "warm_page_faults" in row else "")
            fr = num(row, "fetch_ms") + num(row, "reposition_ms")
            print(f"| {row['context_tokens']} | {row['method']} | "
                  f"{num(row, 'ttft_ms_median'):.1f} | {num(row, 'ratio_to_full'):.3f} | "
                  f"{num(row, 'client_ttft_ms_median'):.1f} | "
                  f"{num(row, 'inprocess_ttft_ms_median'):.1f} | "
                  f"{r['warm / in-process']:.3f} | {r['after idle / in-process']:.3f} | "
                  f"{r['after idle / in-process after idle']:.3f} | {faults} | {fr:.1f} | "
                  f"{r['median of per-run warm / in-process']:.3f} |")


def print_pooled(paths):
    # (context, column) -> run index -> log ratios of that run's cells
    cells = {}
    for run, context, _, column, value in pooled_ratios(paths):
        cells.setdefault((context, column), {}).setdefault(run, []).append(math.log(value))
    print(f"Pooled over {len(paths)} runs: " + ", ".join(paths))
    print()
    print("| context | ratio | cells | geometric mean | 95% interval (cells) | sd of a cell | "
          "cells > 1.05 | per-run geometric means | 95% interval (runs) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (context, column), by_run in sorted(cells.items(),
                                            key=lambda kv: (kv[0][0], COLUMNS.index(kv[0][1]))):
        logs = [x for run in sorted(by_run) for x in by_run[run]]
        mean, low, high = interval(logs)
        sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
        over = sum(x > math.log(1.05) for x in logs)
        run_means = [statistics.fmean(by_run[run]) for run in sorted(by_run)]
        _, run_low, run_high = interval(run_means)
        per_run = " ".join(f"{math.exp(m):.3f}" for m in run_means)
        print(f"| {context} | {column} | {len(logs)} | {mean:.3f} | [{low:.3f}, {high:.3f}] | "
              f"{sd:.3f} | {over} | {per_run} | [{run_low:.3f}, {run_high:.3f}] |")


def print_pooled_cells(paths):
    # (context, method) -> column -> ratios, one per run that has the cell
    cells = {}
    for _, context, method, column, value in pooled_ratios(paths):
        cells.setdefault((context, method), {}).setdefault(column, []).append(value)
    print()
    print("| context | method | runs | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for (context, method), by_column in cells.items():
        runs = max(len(v) for v in by_column.values())
        parts = []
        for column in COLUMNS:
            v = by_column.get(column, [])
            if not v:
                parts.append("")
                continue
            gm = math.exp(statistics.fmean(math.log(x) for x in v))
            parts.append(f"{gm:.3f} ({min(v):.3f}-{max(v):.3f})")
        print(f"| {context} | {method} | {runs} | " + " | ".join(parts) + " |")


def main(argv):
    pool = "--pool" in argv
    paths = [a for a in argv if a != "--pool"]
    if not paths:
        sys.exit(__doc__)
    if pool:
        print_pooled(paths)
        print_pooled_cells(paths)
    else:
        print_rows(paths)


if __name__ == "__main__":
    main(sys.argv[1:])
