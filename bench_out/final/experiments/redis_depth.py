#!/usr/bin/env python3
"""GET throughput of 6 MiB values from one redis-server by pipeline depth.

A plain-socket client (no hiredis, no cluster): shows that the slowdown of
large values in flight (DESIGN section 13, "flow-controlled") is Redis's, not
our client's. Usage (starts and stops its own redis-server on port 7399):

    python3 bench_out/final/experiments/redis_depth.py
"""
import os
import socket
import subprocess
import time

PORT = 7399
N = 6 << 20  # bytes per value
KEYS = 8


def cmd(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def main():
    srv = subprocess.Popen(["redis-server", "--port", str(PORT), "--save", "", "--appendonly", "no"],
                           stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                s = socket.create_connection(("127.0.0.1", PORT))
                break
            except OSError:
                time.sleep(0.05)
        buf = bytearray(N + 64)
        mv = memoryview(buf)

        def read_reply():
            head = b""
            while not head.endswith(b"\r\n"):
                head += s.recv(1)
            if head[:1] != b"$":
                return
            n = int(head[1:-2]) + 2
            got = 0
            while got < n:
                got += s.recv_into(mv[got:n])

        val = os.urandom(N)
        for i in range(KEYS):
            s.sendall(cmd("SET", "k%d" % i, val))
            read_reply()
        for depth in (1, 2, 4, 8):
            times = []
            for _ in range(7):
                t0 = time.time()
                for j in range(0, KEYS, depth):
                    s.sendall(b"".join(cmd("GET", "k%d" % i) for i in range(j, j + depth)))
                    for _ in range(depth):
                        read_reply()
                times.append(time.time() - t0)
            times.sort()
            print("depth %d: %.2f GB/s (median of 7, %d x %d MiB)" %
                  (depth, KEYS * N / times[3] / 1e9, KEYS, N >> 20))
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
