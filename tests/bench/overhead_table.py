#!/usr/bin/env python3
"""Markdown table of serve_bench's service overhead, warm and after idle.

Reads one or more ttft_summary.csv files written by serve_bench (section 1)
and prints, per context and method: server TTFT, ratio to FULL, client TTFT
through gRPC, the in-process engine's TTFT on the same chunk KVs, and the
client / in-process ratio for a warm query and for one sent after the server
was idle longer than its trim period, plus fetch + reposition.

    tests/bench/overhead_table.py bench_out/run/ttft_summary.csv [...]
"""
import csv
import sys


def main(paths):
    print("| context | method | TTFT ms | vs FULL | gRPC client ms | in-process ms | "
          "warm / in-proc | idle / in-proc | fetch + repos ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                inproc = float(row["inprocess_ttft_ms_median"])
                warm = float(row["client_ttft_ms_median"])
                idle = row.get("idle_client_ttft_ms_median", "nan")
                idle_ratio = float(idle) / inproc if idle not in ("", "nan") else float("nan")
                fr = float(row["fetch_ms"]) + float(row["reposition_ms"])
                print(f"| {row['context_tokens']} | {row['method']} | "
                      f"{float(row['ttft_ms_median']):.1f} | {float(row['ratio_to_full']):.3f} | "
                      f"{warm:.1f} | {inproc:.1f} | {warm / inproc:.3f} | {idle_ratio:.3f} | "
                      f"{fr:.1f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
