#!/usr/bin/python3
"""A/B of two running infoflow-servers on one gRPC stream: alternating which
goes first, each round sends both the same METHOD_NONE query that must
generate --tokens tokens (min_new_tokens = max_new_tokens), and prints per
server the median first-token time and whole-stream time as the client sees
them (round 0, the warm-up, left out). For flags or builds that should not
change speed, e.g. --metrics-listen '' against the default (the request
counter's interceptor, docs/DESIGN.md section 11):

  build/server/infoflow-server --model models/infoflow-tiny --listen 127.0.0.1:50101 \\
      --metrics-listen 127.0.0.1:19501 --data-dir /tmp/ab/a --threads 1 &
  build/server/infoflow-server --model models/infoflow-tiny --listen 127.0.0.1:50102 \\
      --metrics-listen '' --data-dir /tmp/ab/b --threads 1 &
  /usr/bin/python3 tests/bench/grpc_stream_ab.py 50101 50102 --rounds 21

Needs Debian's python3-grpcio and python3-grpc-tools (the stubs come from
client/python/example_client.py's load_stubs).
"""
import argparse
import os
import statistics
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client",
                                "python"))
from example_client import load_stubs  # noqa: E402 (compiles the stubs into a temp dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("port_a", type=int)
    ap.add_argument("port_b", type=int)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    pb, pbg = load_stubs()
    stubs = [pbg.QueryStub(grpc.insecure_channel(f"127.0.0.1:{p}"))
             for p in (args.port_a, args.port_b)]

    def run(stub):
        req = pb.QueryRequest(question=b"hi", max_new_tokens=args.tokens,
                              min_new_tokens=args.tokens, method=pb.METHOD_NONE)
        req.chunks.add(text=b"Arthur Tanaka lives in Paris.")
        t0 = time.perf_counter()
        first, n = None, 0
        for msg in stub.Query(req):
            if msg.HasField("token"):
                n += 1
                if first is None:
                    first = time.perf_counter() - t0
        return first * 1000, (time.perf_counter() - t0) * 1000, n

    got = ([], [])
    for r in range(args.rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            got[i].append(run(stubs[i]))
    for i, port in enumerate((args.port_a, args.port_b)):
        first = statistics.median(x[0] for x in got[i][1:])
        whole = statistics.median(x[1] for x in got[i][1:])
        print(f"port {port}: {got[i][-1][2]} tokens; first token median {first:.2f} ms, "
              f"whole stream median {whole:.1f} ms ({args.rounds - 1} rounds)")


if __name__ == "__main__":
    main()
