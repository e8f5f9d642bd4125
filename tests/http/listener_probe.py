#!/usr/bin/env python3
"""Probes an infoflow-server HTTP listener the way a hostile or bursty client
would (docs/DESIGN.md §14, "Connections"). Not a test: it prints what it saw.

  listener_probe.py PORT slowloris N HOLD_S   N clients trickle a header line
                                              every 2 s; /health is timed
                                              every 1.5 s meanwhile
  listener_probe.py PORT burst N              N /health requests at once
  listener_probe.py PORT headers SECONDS      one client streams 8 KiB header
                                              lines; prints the server's RSS
  listener_probe.py PORT chunked MB           one chunked body of MB MiB

`headers` and `chunked` read the server's RSS from /proc, so pass
--pid PID (the server's) for them.
"""
import argparse
import socket
import subprocess
import threading
import time


def rss(pid):
    if not pid:
        return "?"
    with open(f"/proc/{pid}/status") as f:
        return next(l.split(None, 1)[1].strip() for l in f if l.startswith("VmRSS"))


def health_ms(port):
    t = time.time()
    r = subprocess.run(["curl", "-s", "-m", "20", "-o", "/dev/null", "-w", "%{http_code}",
                        f"http://127.0.0.1:{port}/health"], capture_output=True, text=True)
    return r.stdout, (time.time() - t) * 1000


def slowloris(port, n, hold):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    stop = threading.Event()

    def trickle():
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            time.sleep(2)

    threading.Thread(target=trickle, daemon=True).start()
    t0 = time.time()
    while time.time() - t0 < hold:
        code, ms = health_ms(port)
        print(f"t={time.time() - t0:.1f}s /health {code or 'no answer'} in {ms:.0f} ms", flush=True)
        time.sleep(1.5)
    stop.set()


def burst(port, n):
    lat, errors = [], []
    go = threading.Event()

    def one():
        go.wait()
        t = time.time()
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while s.recv(4096):
                pass
            lat.append(time.time() - t)
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    go.set()
    for t in threads:
        t.join()
    lat.sort()
    if lat:
        print(f"n={n} served {len(lat)} p50 {lat[len(lat) // 2]:.3f} s "
              f"p90 {lat[int(len(lat) * 0.9)]:.3f} s max {lat[-1]:.3f} s; errors {len(errors)}")
    else:
        print(f"n={n} served 0; errors {len(errors)}")


def headers(port, seconds, pid):
    print("RSS before", rss(pid))
    s = socket.create_connection(("127.0.0.1", port))
    s.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    blob = (b"X-" + b"a" * 4000 + b": " + b"b" * 4000 + b"\r\n") * 1000
    t, sent = time.time(), 0
    try:
        while time.time() - t < seconds:
            s.sendall(blob)
            sent += len(blob)
    except OSError as e:
        print("send failed:", e)
    print(f"sent {sent / 1e6:.1f} MB; RSS after", rss(pid))


def chunked(port, mb, pid):
    print("RSS before", rss(pid))
    s = socket.create_connection(("127.0.0.1", port))
    s.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"Content-Type: application/json\r\n\r\n")
    chunk = b"a" * (1 << 20)
    piece = (b"%x\r\n" % len(chunk)) + chunk + b"\r\n"
    sent = 0
    try:
        while sent < mb << 20:
            s.sendall(piece)
            sent += len(chunk)
        s.sendall(b"0\r\n\r\n")
    except OSError as e:
        print("send failed:", e)
    s.settimeout(10)
    try:
        print("answer:", s.recv(120))
    except OSError as e:
        print("no answer:", e)
    print(f"sent {sent / 1e6:.1f} MB; RSS after", rss(pid))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("port", type=int)
    p.add_argument("probe", choices=["slowloris", "burst", "headers", "chunked"])
    p.add_argument("args", type=float, nargs="*")
    p.add_argument("--pid", type=int, default=0, help="the server's pid, for RSS")
    a = p.parse_args()
    if a.probe == "slowloris":
        slowloris(a.port, int(a.args[0]), a.args[1])
    elif a.probe == "burst":
        burst(a.port, int(a.args[0]))
    elif a.probe == "headers":
        headers(a.port, a.args[0], a.pid)
    else:
        chunked(a.port, int(a.args[0]), a.pid)


if __name__ == "__main__":
    main()
