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

    tests/bench/overhead_table.py bench_out/run/ttft_summary.csv [...]
"""
import csv
import sys


def num(row, key):
    v = row.get(key, "nan")
    return float(v) if v not in ("", None) else float("nan")


def main(paths):
    print("| context | method | TTFT ms | vs FULL | gRPC client ms | in-process ms | "
          "warm / in-proc | idle / in-proc | idle / in-proc after idle | "
          "page faults warm / idle | fetch + repos ms | median per-run warm / in-proc |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                inproc = num(row, "inprocess_ttft_ms_median")
                warm = num(row, "client_ttft_ms_median")
                idle = num(row, "idle_client_ttft_ms_median")
                idle_in = num(row, "idle_inprocess_ttft_ms_median")
                faults = (f"{num(row, 'warm_page_faults'):.0f} / {num(row, 'idle_page_faults'):.0f}"
                          if "warm_page_faults" in row else "")
                fr = num(row, "fetch_ms") + num(row, "reposition_ms")
                print(f"| {row['context_tokens']} | {row['method']} | "
                      f"{num(row, 'ttft_ms_median'):.1f} | {num(row, 'ratio_to_full'):.3f} | "
                      f"{warm:.1f} | {inproc:.1f} | {warm / inproc:.3f} | {idle / inproc:.3f} | "
                      f"{idle / idle_in:.3f} | {faults} | {fr:.1f} | "
                      f"{1 + num(row, 'paired_grpc_overhead'):.3f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
