#!/usr/bin/env python3
"""Pins overhead_table.py --pool arithmetic on two hand-made runs.

Run 1 has warm ratios 1.10 and 1.00 at 2048, run 2 has 0.90 and 1.00: the
pooled geometric mean is (1.1 * 0.9)^(1/4) = 0.99499, one cell is over 1.05,
and the per-run geometric means are sqrt(1.1) and sqrt(0.9). Per cell, M0's
warm ratio over the two runs is sqrt(1.1 * 0.9) = 0.99499 (range 0.90-1.10).
"""
import contextlib
import csv
import io
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead_table  # noqa: E402

FIELDS = ["context_target", "context_tokens", "method", "ttft_ms_median", "ratio_to_full",
          "client_ttft_ms_median", "inprocess_ttft_ms_median", "idle_client_ttft_ms_median",
          "idle_inprocess_ttft_ms_median", "paired_grpc_overhead", "fetch_ms", "reposition_ms"]


def write_run(path, warm_ratios):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for i, r in enumerate(warm_ratios):
            w.writerow({"context_target": 2048, "context_tokens": 2565, "method": f"M{i}",
                        "ttft_ms_median": 100 * r, "ratio_to_full": 1,
                        "client_ttft_ms_median": 100 * r, "inprocess_ttft_ms_median": 100,
                        "idle_client_ttft_ms_median": 100, "idle_inprocess_ttft_ms_median": 100,
                        "paired_grpc_overhead": r - 1, "fetch_ms": 0, "reposition_ms": 0})


def main():
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "a.csv"), os.path.join(d, "b.csv")
        write_run(a, [1.10, 1.00])
        write_run(b, [0.90, 1.00])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            overhead_table.main(["--pool", a, b])
    lines = [l for l in out.getvalue().splitlines() if l.startswith("| 2048 | warm / in-process |")]
    assert len(lines) == 1, out.getvalue()
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cols[2] == "4", cols
    assert cols[3] == f"{(1.1 * 0.9) ** 0.25:.3f}", cols
    assert cols[6] == "1", cols  # cells over 1.05
    assert cols[7] == f"{math.sqrt(1.1):.3f} {math.sqrt(0.9):.3f}", cols
    low, high = (float(x) for x in cols[4].strip("[]").split(","))
    assert low < 0.995 < high, cols
    # after idle / in-process is 1.000 in every cell: a zero-width interval.
    idle = [l for l in out.getvalue().splitlines()
            if l.startswith("| 2048 | after idle / in-process |")]
    assert "| 1.000 | [1.000, 1.000] |" in idle[0], idle
    # The per-cell table: M0 is 1.10 in run 1 and 0.90 in run 2.
    m0 = [l for l in out.getvalue().splitlines() if l.startswith("| 2048 | M0 |")]
    assert len(m0) == 1, out.getvalue()
    assert f"| 2 | {math.sqrt(1.1 * 0.9):.3f} (0.900-1.100) |" in m0[0], m0
    print("overhead_table --pool: ok")


if __name__ == "__main__":
    main()
