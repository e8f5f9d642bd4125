#!/usr/bin/env python3
"""Decode-bound batching through the OpenAI HTTP API (issue #27 item 6, as an
outside load generator would drive it; serve_bench's `bound` section does the
same over gRPC). Not a test: it prints what it measured.

  decode_bound_probe.py HTTP_PORT METRICS_PORT MODEL [--streams 1,16,1,16]
                        [--seconds 15] [--tokens 128]

Each of N streams loops /v1/completions (stream: true, temperature 1,
"infoflow": {"method": "NONE"}) over one short chunk and a question. Tokens/s
and the mean decode batch come from the server's own counters
(infoflow_generated_tokens_total, infoflow_batch_size) over --seconds, after a
3 s ramp, so the client's parsing speed does not enter them.
"""
import argparse
import http.client
import json
import re
import threading
import time
import urllib.request

CHUNK = ("the river runs past the old mill where the baker keeps his bread and the cat "
         "sleeps in the sun while the farmer counts his sheep near the red barn by the "
         "hill and the children play with a ball under the tall oak tree beside the "
         "quiet road")


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def level(args, n):
    prompt = " # # " + CHUNK + " # # \nQuestion: What is the color of the barn?\nAnswer:"
    stop = threading.Event()
    errors = [0]

    def stream(s):
        conn = http.client.HTTPConnection("127.0.0.1", args.http_port, timeout=300)
        k = 0
        while not stop.is_set():
            k += 1
            body = json.dumps({"model": args.model, "prompt": prompt, "max_tokens": args.tokens,
                               "temperature": 1, "seed": s * 100000 + k, "stream": True,
                               "infoflow": {"method": "NONE"}})
            try:
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                while True:
                    line = r.readline()
                    if not line or line.startswith(b"data: [DONE]"):
                        break
                r.read()
            except (OSError, http.client.HTTPException):
                errors[0] += 1
                conn = http.client.HTTPConnection("127.0.0.1", args.http_port, timeout=300)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(3)
    names = ["infoflow_generated_tokens_total", "infoflow_batch_size_count",
             "infoflow_batch_size_sum"]
    before = [metric(args.metrics_port, x) for x in names]
    t0 = time.time()
    time.sleep(args.seconds)
    after = [metric(args.metrics_port, x) for x in names]
    secs = time.time() - t0
    stop.set()
    for t in threads:
        t.join()
    tokens, steps, rows = (a - b for a, b in zip(after, before))
    return tokens / secs, rows / max(steps, 1), errors[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("http_port", type=int)
    p.add_argument("metrics_port", type=int)
    p.add_argument("model", help="the served model's name (GET /v1/models)")
    p.add_argument("--streams", default="1,16,1,16")
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args()
    for n in (int(x) for x in args.streams.split(",")):
        tps, batch, errors = level(args, n)
        print(f"streams {n:3d}: {tps:8.1f} tokens/s, mean decode batch {batch:5.2f}, "
              f"errors {errors}", flush=True)


if __name__ == "__main__":
    main()
