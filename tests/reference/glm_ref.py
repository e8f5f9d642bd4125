#!/usr/bin/python3
"""Independent numpy reference for GLM / GLM-4 causal LMs (HF model_type "glm", "glm4").

Written from the Hugging Face transformers definitions of GlmForCausalLM and
Glm4ForCausalLM (models/glm/modular_glm.py, models/glm4/modular_glm4.py) and
their configs; it shares no code with the C++ engine or with llama_ref.py.
Python 3 + numpy only; float64 by default (--dtype f32 for float32).

The architecture, as implemented here:
  x = embed_tokens[ids]
  per layer:
    h = rmsnorm(x, input_layernorm)
    q, k, v = h @ W.T + b            (q/k/v biases when attention_bias, default true)
    q, k: per head [T, head_dim]; the first rotary_dim = int(head_dim *
          partial_rotary_factor) dims are rotated, the rest pass through.
          inv_freq[i] = 1 / rope_theta ** (2i / rotary_dim), i < rotary_dim/2
          pair i is dims (2i, 2i+1) (interleaved):
            out[2i]   = x[2i] cos(p f_i) - x[2i+1] sin(p f_i)
            out[2i+1] = x[2i+1] cos(p f_i) + x[2i] sin(p f_i)
    a = softmax(q k^T / sqrt(head_dim), causal) v  (GQA: q head j uses kv head j // group)
    a = a @ o_proj.T                 (no bias)
    glm4: a = rmsnorm(a, post_self_attn_layernorm)
    x = x + a
    h = rmsnorm(x, post_attention_layernorm)
    gate, up = split(h @ gate_up_proj.T, 2)   (gate = the first half)
    m = (silu(gate) * up) @ down_proj.T
    glm4: m = rmsnorm(m, post_mlp_layernorm)
    x = x + m
  logits = rmsnorm(x, norm) @ lm_head.T      (lm_head = embed_tokens when tied)
  rmsnorm(x, w) = w * x / sqrt(mean(x^2) + rms_norm_eps)

Config defaults when a field is absent are GlmConfig's: head_dim 128,
num_key_value_heads 2, partial_rotary_factor 0.5, rope_theta 10000,
rms_norm_eps 1.5625e-7, attention_bias true.

The rotation is written here as an explicit per-pair 2x2 rotation (not with
HF's rotate_half / repeat_interleave formulation), so that a mistake in one
formulation does not hide in both.

  /usr/bin/python3 tests/reference/glm_ref.py logits --model DIR --ids 1,2,3 --json
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    """{name: float32 array} of one .safetensors file."""
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        raw = data[lo:hi]
        kind = meta["dtype"]
        if kind == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif kind == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif kind == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            raise ValueError("%s: dtype %s not handled" % (name, kind))
        tensors[name] = arr.reshape(meta["shape"]).astype(np.float32)
    return tensors


def read_checkpoint(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(os.path.join(model_dir, shard)))
    for name in weight_map:
        if name not in tensors:
            raise ValueError("index names %s but no shard holds it" % name)
    return tensors


class Glm:
    def __init__(self, model_dir, dtype):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.kind = cfg["model_type"]
        if self.kind not in ("glm", "glm4"):
            raise ValueError("model_type %r is not glm or glm4" % self.kind)
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError("hidden_act %r not handled" % cfg["hidden_act"])
        if cfg.get("rope_scaling") not in (None, {}):
            raise ValueError("rope_scaling not handled by this reference")
        self.dt = np.float64 if dtype == "f64" else np.float32
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", 2)
        self.head_dim = cfg.get("head_dim", 128)
        self.eps = cfg.get("rms_norm_eps", 1.5625e-7)
        factor = cfg.get("partial_rotary_factor", 0.5)
        self.rotary_dim = int(self.head_dim * factor)
        theta = cfg.get("rope_theta", 10000.0)
        self.freqs = np.array([theta ** (-(2.0 * i) / self.rotary_dim)
                               for i in range(self.rotary_dim // 2)], dtype=np.float64)
        self.bias = cfg.get("attention_bias", True)
        self.vocab = cfg["vocab_size"]

        t = read_checkpoint(model_dir)
        w = lambda name: t[name].astype(self.dt)
        self.embed = w("model.embed_tokens.weight")
        self.final_norm = w("model.norm.weight")
        if cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in t:
            self.lm_head = self.embed
        else:
            self.lm_head = w("lm_head.weight")
        self.layers = []
        for n in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % n
            layer = {
                "in_norm": w(p + "input_layernorm.weight"),
                "mlp_norm": w(p + "post_attention_layernorm.weight"),
                "gate_up": w(p + "mlp.gate_up_proj.weight"),
                "down": w(p + "mlp.down_proj.weight"),
                "o": w(p + "self_attn.o_proj.weight"),
            }
            for proj in ("q", "k", "v"):
                layer[proj] = w(p + "self_attn.%s_proj.weight" % proj)
                layer[proj + "_b"] = w(p + "self_attn.%s_proj.bias" % proj) if self.bias else None
            if self.kind == "glm4":
                layer["post_attn_norm"] = w(p + "post_self_attn_layernorm.weight")
                layer["post_mlp_norm"] = w(p + "post_mlp_layernorm.weight")
            self.layers.append(layer)

    def rmsnorm(self, x, weight):
        ms = (x * x).mean(axis=-1, keepdims=True)
        return weight * (x / np.sqrt(ms + self.eps))

    def rotate(self, x, positions):
        """x [heads, T, head_dim]: pair (2i, 2i+1) of the first rotary_dim dims
        turned by angle position * freqs[i]."""
        out = x.copy()
        angle = positions[:, None].astype(np.float64) * self.freqs[None, :]  # [T, rd/2]
        c = np.cos(angle).astype(self.dt)[None]
        s = np.sin(angle).astype(self.dt)[None]
        even = x[..., 0:self.rotary_dim:2]
        odd = x[..., 1:self.rotary_dim:2]
        out[..., 0:self.rotary_dim:2] = even * c - odd * s
        out[..., 1:self.rotary_dim:2] = odd * c + even * s
        return out

    def logits(self, ids):
        ids = np.asarray(ids)
        n = len(ids)
        positions = np.arange(n)
        group = self.heads // self.kv_heads
        causal = np.triu(np.ones((n, n), dtype=bool), k=1)
        x = self.embed[ids]
        for L in self.layers:
            h = self.rmsnorm(x, L["in_norm"])
            proj = {}
            for name, count in (("q", self.heads), ("k", self.kv_heads), ("v", self.kv_heads)):
                y = h @ L[name].T
                if L[name + "_b"] is not None:
                    y = y + L[name + "_b"]
                proj[name] = y.reshape(n, count, self.head_dim).transpose(1, 0, 2)
            q = self.rotate(proj["q"], positions)
            k = self.rotate(proj["k"], positions)
            v = proj["v"]
            heads_out = []
            for j in range(self.heads):
                kv = j // group
                scores = q[j] @ k[kv].T / np.sqrt(self.head_dim)
                scores[causal] = -np.inf
                scores = np.exp(scores - scores.max(axis=1, keepdims=True))
                heads_out.append((scores / scores.sum(axis=1, keepdims=True)) @ v[kv])
            a = np.concatenate(heads_out, axis=1) @ L["o"].T  # [T, heads * head_dim] -> [T, d]
            if self.kind == "glm4":
                a = self.rmsnorm(a, L["post_attn_norm"])
            x = x + a
            h = self.rmsnorm(x, L["mlp_norm"])
            gu = h @ L["gate_up"].T
            half = gu.shape[1] // 2
            gate, up = gu[:, :half], gu[:, half:]
            m = (gate / (1.0 + np.exp(-gate)) * up) @ L["down"].T
            if self.kind == "glm4":
                m = self.rmsnorm(m, L["post_mlp_norm"])
            x = x + m
        return self.rmsnorm(x, self.final_norm) @ self.lm_head.T


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent numpy GLM / GLM-4 reference.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits", help="[T, vocab] logits of ids at positions 0..T-1")
    lg.add_argument("--model", required=True)
    lg.add_argument("--ids", required=True, help="comma-separated token ids")
    lg.add_argument("--dtype", choices=["f64", "f32"], default="f64")
    lg.add_argument("--json", action="store_true", help='print {"logits": [[...], ...]}')
    args = ap.parse_args(argv)
    model = Glm(args.model, args.dtype)
    ids = [int(s) for s in args.ids.split(",") if s.strip()]
    if not ids or any(not 0 <= i < model.vocab for i in ids):
        ap.error("--ids must be non-empty ids in [0, vocab)")
    out = model.logits(ids)
    if args.json:
        json.dump({"logits": out.tolist()}, sys.stdout)
        sys.stdout.write("\n")
    else:
        for row in out:
            print(" ".join(repr(float(v)) for v in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
