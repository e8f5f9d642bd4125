#!/usr/bin/env python3
"""Mixed OpenAI-API traffic against a running infoflow-server, the way an
outside load generator would send it (docs/DESIGN.md section 14). Not a test:
it prints what it saw. Each of THREADS clients loops for SECONDS over:
completions (30%), streamed completions with usage (20%), streams cut after
their first bytes (12%), chats with 0-3 turns of history, half streamed
(18%), bad bodies (10%: wrong types, truncated JSON, max_tokens -1, an
unknown model, a 300 KB prompt, a malformed chunk key) and GET /v1/models or
/health (10%). The prompts use the blend separator over a pool of six chunks,
30% with one new chunk (ingested on the fly). It samples the server's RSS
every 2 s and ends with the status counts per kind, latency percentiles, any
unexpected status (only 200 and 429 are expected of good requests; 4xx of bad
ones, never 5xx) and the scheduler gauges from /metrics, which must be back
at 0.

  build/server/infoflow-server --model models/infoflow-tiny --http-listen 127.0.0.1:8000 \
      --metrics-listen 127.0.0.1:9464 &
  tests/http/mixed_load_probe.py 8000 $! 60 16 9464
"""
import http.client, json, random, socket, sys, threading, time, collections

if len(sys.argv) < 5:
    sys.exit("usage: mixed_load_probe.py HTTP_PORT SERVER_PID SECONDS THREADS [METRICS_PORT]")
port = int(sys.argv[1]); pid = int(sys.argv[2]); seconds = float(sys.argv[3]); threads = int(sys.argv[4])
mport = int(sys.argv[5]) if len(sys.argv) > 5 else 9464
SEP = " # # "
NAMES = ["Arthur Tanaka", "Maria Lopez", "Wei Chen", "Olga Ivanova", "Samir Haddad", "Lena Berg"]
pool = [f"{n} lives in city {i}. The secret code of {n} is {1000 + 37 * i}." for i, n in enumerate(NAMES)]
counts = collections.Counter(); errors = []; lat = collections.defaultdict(list)
lock = threading.Lock()

def rss():
    with open(f"/proc/{pid}/status") as f:
        return int(next(l.split()[1] for l in f if l.startswith("VmRSS")))

def post(path, body, timeout=60, raw=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else json.dumps(body)
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    return c, r

def prompt(rng, new_chunk):
    chunks = rng.sample(pool, rng.randint(1, 4))
    if new_chunk:
        chunks.append(f"Note {rng.random()}: the weather in city {rng.randint(0, 99)} is mild.")
    n = rng.choice(NAMES)
    return SEP + SEP.join(chunks) + SEP + f"\nQuestion: What is the secret code of {n}?\nAnswer:"

def op(rng):
    k = rng.random()
    body = {"model": "infoflow-tiny", "max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 1]),
            "prompt": prompt(rng, rng.random() < 0.3)}
    if rng.random() < 0.3:
        body["infoflow"] = {"method": rng.choice(["FULL", "NONE", "INFOFLOW", "CACHEBLEND", "EPIC", "RANDOM"]),
                            "report": True}
    if k < 0.30:
        c, r = post("/v1/completions", body); d = r.read(); c.close()
        if r.status == 200:
            json.loads(d)["choices"][0]["text"]  # a malformed answer raises: counted as an error
        return "completion", r.status, d
    if k < 0.50:
        body["stream"] = True; body["stream_options"] = {"include_usage": True}
        c, r = post("/v1/completions", body); d = r.read(); c.close()
        if r.status == 200 and not d.rstrip().endswith(b"data: [DONE]"):
            return "stream", -1, d[-300:]
        return "stream", r.status, d
    if k < 0.62:  # disconnect after the first bytes of a stream
        body["stream"] = True; body["max_tokens"] = 64; body["ignore_eos"] = True
        c, r = post("/v1/completions", body); r.read(20); c.sock.shutdown(socket.SHUT_RDWR); c.close()
        return "stream_cut", r.status, b""
    if k < 0.80:
        hist = []
        for t in range(rng.randint(0, 3)):
            hist += [{"role": "user", "content": f"turn {t} of chat {rng.randint(0, 5)}"},
                     {"role": "assistant", "content": f"answer {t}"}]
        msgs = hist + [{"role": "user", "content": body["prompt"]}]
        b = {"model": "infoflow-tiny", "max_tokens": body["max_tokens"], "messages": msgs,
             "stream": rng.random() < 0.5}
        c, r = post("/v1/chat/completions", b); d = r.read(); c.close()
        return "chat", r.status, d
    if k < 0.90:  # bad bodies
        raw = rng.choice(['{"model": "infoflow-tiny", "prompt": 5}', '{', '[]',
                          '{"model":"infoflow-tiny","prompt":"x","max_tokens":-1}',
                          '{"model":"nope","prompt":"x"}',
                          json.dumps({"model": "infoflow-tiny", "prompt": "a" * 300000}),
                          json.dumps({"model": "infoflow-tiny", "prompt": SEP + "x" * 100 + SEP + "q",
                                      "infoflow": {"chunks": [{"key": "zz"}]}})])
        c, r = post("/v1/completions", None, raw=raw); d = r.read(); c.close()
        return "bad", r.status, d
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", rng.choice(["/v1/models", "/health"])); r = c.getresponse(); d = r.read(); c.close()
    return "get", r.status, d

def worker(i):
    rng = random.Random(i)
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.time()
        try:
            kind, status, d = op(rng)
            with lock:
                counts[(kind, status)] += 1; lat[kind].append(time.time() - t0)
                if kind != "bad" and status not in (200, 429) and kind != "stream_cut":
                    errors.append((kind, status, d[:300]))
                if kind == "bad" and status >= 500:
                    errors.append((kind, status, d[:300]))
        except Exception as e:
            with lock:
                counts[("exception", type(e).__name__)] += 1; errors.append(("exc", repr(e)))

rss0 = rss()
ths = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
for t in ths: t.start()
samples = []
while any(t.is_alive() for t in ths):
    time.sleep(2); samples.append(rss())
for t in ths: t.join()
time.sleep(1.5)
print("rss start", rss0, "kB; samples", samples[::max(1, len(samples) // 10)], "end", rss())
for k, v in sorted(counts.items(), key=str): print(k, v)
for k, v in lat.items():
    v.sort(); print(k, "n", len(v), "p50 %.3f p99 %.3f max %.3f" % (v[len(v) // 2], v[int(len(v) * .99)], v[-1]))
print("errors", len(errors))
for e in errors[:15]: print(e)
c = http.client.HTTPConnection("127.0.0.1", mport, timeout=10); c.request("GET", "/metrics")
m = c.getresponse().read().decode()
for l in m.splitlines():
    if l.startswith(("infoflow_inflight", "infoflow_queue", "infoflow_running",
                     "infoflow_http_requests_dropped", "infoflow_http_responses_total")):
        print(l)
