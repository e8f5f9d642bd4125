#!/usr/bin/python3
"""Independent numpy reference for LLaMA-family causal LMs (Llama, Qwen2, Qwen3).

Written from the Hugging Face transformers model definitions (LlamaForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM) only; it shares no code with the C++ engine.
Depends on Python 3 + numpy only.  Computes in float64 by default (--dtype f32
for a float32 run).

Examples:
  /usr/bin/python3 tests/reference/llama_ref.py logits --model DIR --ids 1,2,3 --json
  /usr/bin/python3 tests/reference/llama_ref.py logits --model DIR --ids 1,2,3 --out l.npy
  /usr/bin/python3 tests/reference/llama_ref.py generate --model DIR --ids 1 --max-new-tokens 400
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


# --------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------

def _read_safetensors(path):
    """Return {name: np.ndarray(float32)} for one .safetensors file."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen).decode("utf-8"))
    base = 8 + hlen
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        buf = raw[base + begin: base + end]
        if dtype == "F32":
            arr = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        elif dtype == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dtype == "BF16":
            u16 = np.frombuffer(buf, dtype="<u2").astype(np.uint32)
            arr = (u16 << np.uint32(16)).view(np.float32).copy()
        elif dtype == "F64":
            arr = np.frombuffer(buf, dtype="<f8").astype(np.float32)
        else:
            raise ValueError("unsupported safetensors dtype %s for %s" % (dtype, name))
        n = int(np.prod(shape)) if shape else 1
        if arr.size != n:
            raise ValueError("size mismatch for %s: %d vs %s" % (name, arr.size, shape))
        out[name] = arr.reshape(shape)
    return out


def load_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return _read_safetensors(single)
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        weights = {}
        for fname in sorted(set(wm.values())):
            weights.update(_read_safetensors(os.path.join(model_dir, fname)))
        missing = [k for k in wm if k not in weights]
        if missing:
            raise ValueError("tensors missing from shards: %s" % missing[:5])
        return weights
    raise FileNotFoundError("no model.safetensors or model.safetensors.index.json in %s" % model_dir)


# --------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------

def compute_inv_freq(cfg, head_dim, dt):
    base = float(cfg.get("rope_theta", 10000.0))
    # HF: 1 / base ** (arange(0, dim, 2).float() / dim)
    exps = np.arange(0, head_dim, 2, dtype=np.int64).astype(dt) / dt(head_dim)
    inv = (dt(1.0) / (dt(base) ** exps)).astype(dt)
    rs = cfg.get("rope_scaling")
    if rs:
        rtype = rs.get("rope_type", rs.get("type", "default"))
        if rtype == "default":
            pass
        elif rtype == "linear":
            inv = (inv / dt(rs["factor"])).astype(dt)
        elif rtype == "llama3":
            factor = float(rs["factor"])
            low = float(rs.get("low_freq_factor", 1.0))
            high = float(rs.get("high_freq_factor", 4.0))
            orig = float(rs["original_max_position_embeddings"])
            low_wl = orig / low
            high_wl = orig / high
            wavelen = dt(2 * math.pi) / inv
            inv_l = np.where(wavelen > low_wl, inv / dt(factor), inv)
            smooth = (orig / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
            is_medium = (~(wavelen < high_wl)) & (~(wavelen > low_wl))
            inv = np.where(is_medium, smoothed, inv_l).astype(dt)
        else:
            raise ValueError("unsupported rope_scaling type %r" % rtype)
    return inv


class Model:
    def __init__(self, model_dir, dtype="f64"):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.cfg = cfg
        self.dt = np.float64 if dtype == "f64" else np.float32
        dt = self.dt
        self.model_type = cfg.get("model_type", "llama")
        self.hidden = cfg["hidden_size"]
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.n_heads
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.vocab = cfg["vocab_size"]
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError("unsupported hidden_act %r" % act)
        self.inv_freq = compute_inv_freq(cfg, self.head_dim, dt)

        W = load_weights(model_dir)
        g = lambda n: W[n].astype(dt)
        gopt = lambda n: W[n].astype(dt) if n in W else None
        self.embed = g("model.embed_tokens.weight")
        self.norm = g("model.norm.weight")
        tie = cfg.get("tie_word_embeddings", False)
        if tie or "lm_head.weight" not in W:
            self.lm_head = self.embed
        else:
            self.lm_head = g("lm_head.weight")
        qwen2_bias = self.model_type == "qwen2"
        # HF Qwen2 always biases q/k/v and never o_proj, whatever
        # "attention_bias" says; Llama's attention_bias biases all four.
        attn_bias = bool(cfg.get("attention_bias", False)) and not qwen2_bias
        self.layers = []
        for i in range(self.n_layers):
            p = "model.layers.%d." % i
            L = {}
            L["in_norm"] = g(p + "input_layernorm.weight")
            L["post_norm"] = g(p + "post_attention_layernorm.weight")
            for nm in ("q_proj", "k_proj", "v_proj", "o_proj"):
                L[nm] = g(p + "self_attn.%s.weight" % nm)
                b = gopt(p + "self_attn.%s.bias" % nm)
                if b is None and (attn_bias or (qwen2_bias and nm != "o_proj")):
                    raise ValueError("expected bias %s missing" % (p + "self_attn." + nm + ".bias"))
                L[nm + "_b"] = b
            for nm in ("gate_proj", "up_proj", "down_proj"):
                L[nm] = g(p + "mlp.%s.weight" % nm)
                L[nm + "_b"] = gopt(p + "mlp.%s.bias" % nm)
            if self.model_type == "qwen3":
                L["q_norm"] = g(p + "self_attn.q_norm.weight")
                L["k_norm"] = g(p + "self_attn.k_norm.weight")
            self.layers.append(L)

    # ---- primitives ----
    def rmsnorm(self, x, w):
        dt = self.dt
        var = np.mean(x * x, axis=-1, keepdims=True)
        return (x * (dt(1.0) / np.sqrt(var + dt(self.eps)))).astype(dt) * w

    @staticmethod
    def linear(x, w, b):
        y = x @ w.T
        if b is not None:
            y = y + b
        return y

    def rope(self, x, positions):
        # x: [H, T, D]; positions: [T]
        dt = self.dt
        freqs = positions.astype(dt)[:, None] * self.inv_freq[None, :]  # [T, D/2]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos = np.cos(emb).astype(dt)[None]
        sin = np.sin(emb).astype(dt)[None]
        half = self.head_dim // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    # ---- forward ----
    def new_cache(self):
        return [{"k": np.zeros((self.n_kv, 0, self.head_dim), self.dt),
                 "v": np.zeros((self.n_kv, 0, self.head_dim), self.dt)}
                for _ in range(self.n_layers)]

    def forward(self, ids, start_pos=0, cache=None):
        """ids: list of T token ids at positions start_pos..start_pos+T-1.
        cache: list from new_cache() (updated in place) or None.  Returns [T, vocab]."""
        dt = self.dt
        ids = np.asarray(ids, dtype=np.int64)
        T = ids.shape[0]
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        group = H // KV
        positions = np.arange(start_pos, start_pos + T)
        x = self.embed[ids]  # [T, hidden]
        scale = dt(1.0 / math.sqrt(D))
        for li, L in enumerate(self.layers):
            h = self.rmsnorm(x, L["in_norm"])
            q = self.linear(h, L["q_proj"], L["q_proj_b"]).reshape(T, H, D).transpose(1, 0, 2)
            k = self.linear(h, L["k_proj"], L["k_proj_b"]).reshape(T, KV, D).transpose(1, 0, 2)
            v = self.linear(h, L["v_proj"], L["v_proj_b"]).reshape(T, KV, D).transpose(1, 0, 2)
            if self.model_type == "qwen3":
                q = self.rmsnorm(q, L["q_norm"])
                k = self.rmsnorm(k, L["k_norm"])
            q = self.rope(q, positions)
            k = self.rope(k, positions)
            if cache is not None:
                c = cache[li]
                if c["k"].shape[1] != start_pos:
                    raise ValueError("cache length %d != start_pos %d" % (c["k"].shape[1], start_pos))
                c["k"] = np.concatenate([c["k"], k], axis=1)
                c["v"] = np.concatenate([c["v"], v], axis=1)
                k_all, v_all = c["k"], c["v"]
            else:
                if start_pos != 0:
                    raise ValueError("start_pos > 0 requires a cache")
                k_all, v_all = k, v
            S = k_all.shape[1]
            # GQA: query head hh uses kv head hh // group
            k_rep = np.repeat(k_all, group, axis=0)  # [H, S, D]
            v_rep = np.repeat(v_all, group, axis=0)
            scores = (q @ k_rep.transpose(0, 2, 1)) * scale  # [H, T, S]
            key_pos = np.arange(S)
            mask = key_pos[None, :] > positions[:, None]  # [T, S]
            scores = np.where(mask[None], -np.inf, scores)
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p = p / p.sum(axis=-1, keepdims=True)
            attn = (p.astype(dt) @ v_rep).transpose(1, 0, 2).reshape(T, H * D)
            x = x + self.linear(attn, L["o_proj"], L["o_proj_b"])
            h = self.rmsnorm(x, L["post_norm"])
            gte = self.linear(h, L["gate_proj"], L["gate_proj_b"])
            up = self.linear(h, L["up_proj"], L["up_proj_b"])
            silu = gte / (dt(1.0) + np.exp(-gte))
            x = x + self.linear(silu * up, L["down_proj"], L["down_proj_b"])
        x = self.rmsnorm(x, self.norm)
        return (x @ self.lm_head.T).astype(dt)

    def generate(self, prompt, max_new_tokens, trace=None):
        cache = self.new_cache()
        logits = self.forward(prompt, 0, cache)[-1]
        pos = len(prompt)
        out = []
        for _ in range(max_new_tokens):
            nxt = int(np.argmax(logits))  # first max -> lowest id on ties
            if trace is not None:
                trace.append(logits.copy())
            out.append(nxt)
            if len(out) == max_new_tokens:
                break
            logits = self.forward([nxt], pos, cache)[-1]
            pos += 1
        return out


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def parse_ids(s):
    return [int(t) for t in s.replace(" ", ",").split(",") if t != ""]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Independent numpy LLaMA/Qwen2/Qwen3 reference (float64 by default).")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--model", required=True, help="HF model directory (config.json + safetensors)")
        sp.add_argument("--ids", required=True, help="comma-separated prompt token ids, e.g. 1,2,3")
        sp.add_argument("--dtype", choices=["f64", "f32"], default="f64",
                        help="compute dtype (default f64)")

    sl = sub.add_parser("logits", help="full-sequence forward; print/write [T, vocab] logits")
    common(sl)
    sl.add_argument("--out", help="write logits to this .npy file")
    sl.add_argument("--json", action="store_true", help='print {"logits": [[...], ...]} to stdout')

    sg = sub.add_parser("generate", help="greedy decoding (argmax, ties -> lowest id, ignores eos)")
    common(sg)
    sg.add_argument("--max-new-tokens", type=int, required=True)

    args = ap.parse_args(argv)
    model = Model(args.model, args.dtype)
    ids = parse_ids(args.ids)
    if not ids:
        ap.error("--ids must contain at least one id")
    for t in ids:
        if not 0 <= t < model.vocab:
            ap.error("token id %d out of range [0, %d)" % (t, model.vocab))

    if args.cmd == "logits":
        logits = model.forward(ids, 0, None)
        if args.out:
            np.save(args.out, logits)
        if args.json:
            json.dump({"logits": [[float(v) for v in row] for row in logits]}, sys.stdout)
            sys.stdout.write("\n")
        elif not args.out:
            np.set_printoptions(threshold=sys.maxsize, linewidth=200, precision=8)
            for row in logits:
                print(" ".join(repr(float(v)) for v in row))
    else:
        out = model.generate(ids, args.max_new_tokens)
        print(" ".join(str(t) for t in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
