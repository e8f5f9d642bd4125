#!/usr/bin/env python3
"""How long queries wait while a large ingest batch runs (docs/DESIGN.md §12:
an ingest batch takes the prefill thread one chunk per turn). Not a test: it
prints what it measured.

  ingest_interleave_probe.py GRPC_PORT HTTP_PORT MODEL DIR [--batch 64]
                             [--infoflow build/client/infoflow]

Times one small /v1/completions query (METHOD_NONE, one token) alone, then
runs `infoflow ingest --batch N DIR` against GRPC_PORT and sends the same
query every 0.5 s until the ingest ends; prints the ingest's time and the
queries' median and maximum latency. DIR should hold chunks the server has not
stored yet (stored ones are skipped quickly).
"""
import argparse
import http.client
import json
import subprocess
import time


def query_ms(port, model):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": model, "prompt": " # # the cat sat on the mat # # \nQuestion: x\nAnswer:",
            "max_tokens": 1, "infoflow": {"method": "NONE"}}
    t0 = time.time()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    conn.getresponse().read()
    return (time.time() - t0) * 1000


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("grpc_port", type=int)
    p.add_argument("http_port", type=int)
    p.add_argument("model", help="the served model's name (GET /v1/models)")
    p.add_argument("dir", help="files to ingest")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--infoflow", default="build/client/infoflow")
    args = p.parse_args()
    print(f"query alone: {query_ms(args.http_port, args.model):.0f} ms")
    ingest = subprocess.Popen([args.infoflow, "ingest", "--server", f"127.0.0.1:{args.grpc_port}",
                               "--batch", str(args.batch), args.dir],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    t0 = time.time()
    waits = []
    while ingest.poll() is None:
        time.sleep(0.5)
        if ingest.poll() is None:
            waits.append(query_ms(args.http_port, args.model))
    print(f"ingest: {time.time() - t0:.1f} s (exit {ingest.returncode})")
    if waits:
        waits.sort()
        print(f"queries during it: {len(waits)}, median {waits[len(waits) // 2]:.0f} ms, "
              f"max {waits[-1]:.0f} ms")


if __name__ == "__main__":
    main()
