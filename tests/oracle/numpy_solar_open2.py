#!/usr/bin/env python3
"""Reference logits for a solar-open2 GGUF file, in float64 numpy, as a JSON golden.

Solar-Open2 is in no transformers release, so this is written from the semantics of transformers
main's `models/solar_open2/modular_solar_open2.py` as issue 45 and shared/reference/models.md §2.4
state them (no code of it was available here): for the normed input x of each layer,

  * layers whose attention.head_count_kv is non-zero (il % 4 == 0 in the real model): GQA without
    rotary embedding and without QK-norm, query head h reading KV head h // (n_head / n_head_kv),
    scale 1/sqrt(head_dim), causal softmax; the output times sigmoid(g_proj x + bias) over its full
    width (attn_gate, its bias optional), then o_proj;
  * the other layers, Kimi Delta Attention: q, k, v projections, each through a causal depthwise
    conv of `ssm.conv_kernel` taps (the last tap weighs the current token) and SiLU; q and k
    L2-normalised per head as x / sqrt(sum x^2 + 1e-6); per (head, dim) log decay
    g = -exp(A_log) * softplus(f_b(f_a x) + dt_bias) (no lower bound; the GGUF's ssm_a holds
    -exp(A_log)); beta = 2 * sigmoid(b_proj x) (negative eigenvalues allowed); per head, with S the
    [dk, dv] state: S = exp(g) * S (row i by exp(g_i)); delta = beta (v - S^T k); S += k delta^T;
    o = S^T q / sqrt(dk); then RMSNorm(o) * ssm_norm * sigmoid(g_b(g_a x)) per head, then o_proj;
  * every layer's FFN: sigmoid router scores, top-k of scores + exp_probs_b (selection only),
    weights = chosen scores / (their sum + 1e-20) * expert_weights_scale, SwiGLU experts, plus the
    shared expert;
  * RMSNorm eps attention.layer_norm_rms_epsilon everywhere else, pre-norm residual layers, final
    norm and output head.

Writes {reference, file_sha256, sequences: [{tokens, logits, router_ids}]}, router_ids per layer
and position (sorted expert ids).

usage: numpy_solar_open2.py MODEL.gguf OUT.json [--beta-scale S] SEQ [SEQ...]
"""
import hashlib
import json
import sys

import numpy as np
from gguf import GGUFReader

ARCH = "solar-open2"


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def silu(x):
    return x * sigmoid(x)


class Model:
    def __init__(self, path, beta_scale):
        r = GGUFReader(path)
        assert field(r, "general.architecture") == ARCH
        self.k = lambda name, d=None: field(r, f"{ARCH}.{name}", d)
        self.t = {x.name: np.array(x.data, dtype=np.float64).reshape([int(n) for n in reversed(x.shape)])
                  for x in r.tensors}
        self.beta_scale = beta_scale

    def w(self, name):
        return self.t[name]

    def gqa(self, b, x, n_kv):
        n, hd, nh = len(x), self.k("attention.key_length"), self.k("attention.head_count")
        q = (x @ self.w(b + "attn_q.weight").T).reshape(n, nh, hd)
        k = (x @ self.w(b + "attn_k.weight").T).reshape(n, n_kv, hd)
        v = (x @ self.w(b + "attn_v.weight").T).reshape(n, n_kv, hd)
        o = np.zeros((n, nh, hd))
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for h in range(nh):
            kh = h // (nh // n_kv)
            s = q[:, h] @ k[:, kh].T / np.sqrt(hd) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            o[:, h] = p @ v[:, kh]
        gate = x @ self.w(b + "attn_gate.weight").T
        if b + "attn_gate.bias" in self.t:
            gate = gate + self.w(b + "attn_gate.bias")
        o = o.reshape(n, nh * hd) * sigmoid(gate)
        return o @ self.w(b + "attn_output.weight").T

    def kda(self, b, x, eps):
        n = len(x)
        hd, nh, taps = self.k("kda.head_dim"), self.k("attention.head_count"), self.k("ssm.conv_kernel")
        branches = []
        for name in "qkv":
            y = x @ self.w(b + f"attn_{name}.weight").T
            cw = self.w(b + f"ssm_conv1d_{name}.weight").reshape(-1, taps)  # [d, taps]
            pad = np.concatenate([np.zeros((taps - 1, y.shape[1])), y])
            c = sum(pad[j:j + n] * cw[:, j] for j in range(taps))
            branches.append(silu(c).reshape(n, nh, hd))
        q, k, v = branches
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        f = (x @ self.w(b + "ssm_f_a.weight").T) @ self.w(b + "ssm_f_b.weight").T + self.w(b + "ssm_dt.bias")
        decay_rate = -self.w(b + "ssm_a").reshape(nh)
        g = -decay_rate[None, :, None] * softplus(f.reshape(n, nh, hd))
        beta = self.beta_scale * sigmoid(x @ self.w(b + "ssm_beta.weight").T)
        o = np.zeros((n, nh, hd))
        for h in range(nh):
            s = np.zeros((hd, hd))
            for t in range(n):
                s = np.exp(g[t, h])[:, None] * s
                d = beta[t, h] * (v[t, h] - s.T @ k[t, h])
                s = s + np.outer(k[t, h], d)
                o[t, h] = s.T @ q[t, h] / np.sqrt(hd)
        o = rms(o, self.w(b + "ssm_norm.weight"), eps)
        gate = (x @ self.w(b + "ssm_g_a.weight").T) @ self.w(b + "ssm_g_b.weight").T
        o = (o * sigmoid(gate.reshape(n, nh, hd))).reshape(n, nh * hd)
        return o @ self.w(b + "attn_output.weight").T

    def moe(self, b, x):
        n_used = self.k("expert_used_count")
        scale = self.k("expert_weights_scale")
        scores = sigmoid(x @ self.w(b + "ffn_gate_inp.weight").T)
        choice = scores + self.w(b + "exp_probs_b.bias")
        gate, up, down = (self.w(b + f"ffn_{p}_exps.weight") for p in ("gate", "up", "down"))
        out = np.zeros_like(x)
        ids = []
        for t in range(len(x)):
            top = np.argsort(-choice[t], kind="stable")[:n_used]
            wts = scores[t, top] / (scores[t, top].sum() + 1e-20) * scale
            for e, wt in zip(top, wts):
                out[t] += wt * (down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])))
            ids.append(sorted(int(e) for e in top))
        sh = silu(x @ self.w(b + "ffn_gate_shexp.weight").T) * (x @ self.w(b + "ffn_up_shexp.weight").T)
        return out + sh @ self.w(b + "ffn_down_shexp.weight").T, ids

    def forward(self, tokens):
        eps = self.k("attention.layer_norm_rms_epsilon")
        kv = self.k("attention.head_count_kv")
        x = self.w("token_embd.weight")[tokens]
        router = []
        for il in range(self.k("block_count")):
            b = f"blk.{il}."
            h = rms(x, self.w(b + "attn_norm.weight"), eps)
            h = self.gqa(b, h, kv[il]) if kv[il] else self.kda(b, h, eps)
            x = x + h
            h = rms(x, self.w(b + "ffn_norm.weight"), eps)
            h, ids = self.moe(b, h)
            router.append(ids)
            x = x + h
        x = rms(x, self.w("output_norm.weight"), eps)
        return x @ self.w("output.weight").T, router


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    args = sys.argv[1:]
    path, out, rest = args[0], args[1], args[2:]
    beta_scale = 2.0
    if rest and rest[0] == "--beta-scale":
        beta_scale, rest = float(rest[1]), rest[2:]
    m = Model(path, beta_scale)
    seqs = []
    for s in rest:
        tokens = [int(x) for x in s.split(",")]
        logits, router = m.forward(tokens)
        # 8 significant digits keep the file small and are far inside the 1e-4 band.
        rounded = [[float(f"{v:.8g}") for v in row] for row in logits.tolist()]
        seqs.append({"tokens": tokens, "logits": rounded, "router_ids": router})
    json.dump({"reference": "numpy float64, Solar-Open2 semantics of issue 45 (tests/oracle/numpy_solar_open2.py)",
               "file_sha256": sha256(path), "sequences": seqs}, open(out, "w"))


if __name__ == "__main__":
    main()
