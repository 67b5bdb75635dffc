#!/usr/bin/env python3
"""Whole-model f64 numpy reference of a `deepseek41` GGUF file (DeepSeek-V4.1-Flash, issue 49),
as a JSON golden. No engine runs V4.1 (docs/deepseek41-plan.md), so this is written from the
published math: V4 as transformers 5.24 `deepseek_v4` encodes it (read in
`modeling_deepseek_v4.py`: RMS norms, the interleaved tail rope, the latent attention with sinks
and the grouped output projection, the mHC mixers with Sinkhorn, the sqrt-softplus router with a
selection-only bias, the clamped SwiGLU experts) with the V4.1 changes and Choices of
docs/deepseek41-plan.md:

* compressor sources (layers carrying `attn_compressor_kv`; the others of a ratio read the
  nearest source below): one series, a softmax-gated sum of `R` positions per dimension (no
  position bias; at ratio 1 without a gate the softmax over one position is 1), the RMS norm with
  `attn_compressor_norm`, the rope at j·R; the index keys from the normed row before its rope:
  `indexer.attn_k`, an RMS norm with `indexer.k_norm`, the rope at j·R;
* index layers (carrying `indexer.attn_q_b`) score their own roped queries (`indexer.attn_q_b` of
  the query low-rank output) with head weights `indexer.proj(x)·d_I^-1/2·H_I^-1/2` as
  sum_h w_h relu(q_h . k) over the visible (p+1) div R keys of their group's source, top
  `indexer.top_k` (ties: lower row); the compressed layers after one read its picks; a compressed
  layer's attention sees its window (128) and the picked rows in one softmax with the sink;
* Engram before the attention on its layers (row ids: `numpy_deepseek41_ids.py`'s hash; the gate
  of `numpy_engram.py`, ε the model's, floor 1e-6);
* the late mix: the first block's input mixed by (1, 0, ..., 0), each block's attention input by
  the previous block's FFN `pre`, its FFN input by its attention mixes' `pre`; the collapse by the
  last FFN `pre`;
* the queries get no per-head RMS norm (QUERY_HEAD_NORM, the plan's Choice after S6);
* MoE top-k ties go to the larger id.

The rope frequencies are transformers' own (`DeepseekV4RotaryEmbedding` built from the file's
keys as `hf_deepseek4.py` builds its config: θ `rope.freq_base` on window-only layers, YaRN on
compressed ones), then used in f64. Everything else is f64 numpy. No fp8/fp4 cache or weight
emulation: the caches are exact f64 (the published model's fp8 KV and fp4 indexer caches are
not modelled).

Outputs per sequence: the logits at the kept positions, the argmax at every position, each
layer's top-k experts and each index layer's picks (sorted) at every position, the Engram row
ids, the least relative gaps at the top-k boundaries, and per layer the positions whose boundary
lies in the tie band (TIE_BAND; rows tied at an indexer score of exactly 0 measured by how near a
head's dot is to turning positive).

usage: numpy_deepseek41.py MODEL.gguf OUT.json --positions P,P,... SEQ [SEQ...]
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from numpy_deepseek41_ids import site_ids  # noqa: E402

ARCH = "deepseek41"
QUERY_HEAD_NORM = False
FLOOR = 1e-6
# A top-k boundary closer than this (relative) is in the tie band: its ids are not compared.
TIE_BAND = 1e-5


def load(path):
    r = gguf.GGUFReader(path)

    def key(name):
        return r.fields[f"{ARCH}.{name}"].contents()

    for t in r.tensors:
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.I32):
            raise SystemExit(f"{t.name}: {t.tensor_type.name} not supported (F32 only)")
    tensors = {t.name: np.array(t.data, dtype=np.float64) for t in r.tensors}
    return key, tensors


def inv_freqs(key):
    """transformers 5.24's inverse frequencies for the "main" and "compress" ropes."""
    import transformers
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    head_dim = key("attention.key_length")
    cfg = transformers.DeepseekV4Config(
        hidden_size=key("embedding_length"), num_attention_heads=key("attention.head_count"),
        head_dim=head_dim, max_position_embeddings=key("context_length"),
        rope_theta=key("rope.freq_base"), compress_rope_theta=key("attention.compress_rope_freq_base"),
        partial_rotary_factor=key("rope.dimension_count") / head_dim,
        rope_parameters={"rope_type": "yarn", "factor": key("rope.scaling.factor"),
                         "original_max_position_embeddings": key("rope.scaling.original_context_length"),
                         "beta_fast": 32.0, "beta_slow": 1.0},
    )
    emb = m.DeepseekV4RotaryEmbedding(cfg)
    out = {}
    for kind in ("main", "compress"):
        if getattr(emb, f"{kind}_attention_scaling") != 1.0:
            raise SystemExit(f"{kind} rope: attention scaling is not 1")
        out[kind] = getattr(emb, f"{kind}_inv_freq").double().numpy()
    return out


def rope(x, pos, inv, inverse=False):
    """The interleaved rope on the trailing 2·len(inv) dims of x [..., n, w] at positions pos [n]."""
    rd = 2 * len(inv)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang) * (-1.0 if inverse else 1.0)
    shape = (1,) * (x.ndim - 2) + c.shape
    c, s = c.reshape(shape), s.reshape(shape)
    out = x.copy()
    x0, x1 = x[..., -rd::2], x[..., -rd + 1::2] if rd > 1 else None
    out[..., -rd::2] = x0 * c - x1 * s
    out[..., -rd + 1::2] = x1 * c + x0 * s
    return out


def rms(x, eps, w=None):
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def silu(x):
    return x * sigmoid(x)


class Model:
    def __init__(self, path):
        key, self.t = load(path)
        self.key = key
        self.n_layer = key("block_count")
        self.n = key("embedding_length")
        self.eps = key("attention.layer_norm_rms_epsilon")
        self.H, self.d = key("attention.head_count"), key("attention.key_length")
        self.window = key("attention.sliding_window")
        self.groups, self.rank = key("attention.output_group_count"), key("attention.output_lora_rank")
        self.ratios = list(key("attention.compress_ratios"))[: self.n_layer]
        self.HI, self.dI = key("attention.indexer.head_count"), key("attention.indexer.key_length")
        self.top_k = key("attention.indexer.top_k")
        self.hc, self.iters = key("hyper_connection.count"), key("hyper_connection.sinkhorn_iterations")
        self.hc_eps = key("hyper_connection.epsilon")
        self.k_exp, self.scale = key("expert_used_count"), key("expert_weights_scale")
        self.clamp = list(key("swiglu_clamp_exp"))
        self.clamp_sh = list(key("swiglu_clamp_shexp"))
        self.inv = inv_freqs(key)
        names = self.t.keys()
        self.comp_src = self.sources(lambda il: f"blk.{il}.attn_compressor_kv.weight" in names)
        self.index_src = self.sources(lambda il: f"blk.{il}.indexer.attn_q_b.weight" in names)
        self.sites = [il for il in range(self.n_layer) if f"blk.{il}.engram_embd.weight" in names]
        k = "engram."
        self.ngram, self.e_heads = key(k + "max_ngram_size"), key(k + "head_count")
        self.pad = key(k + "pad_id")
        self.token_map = np.array(list(key(k + "token_map")), dtype=np.int64)
        self.mult = [int(v) for v in key(k + "multipliers")]
        self.primes = [int(v) for v in key(k + "primes")]
        self.offsets = [int(v) for v in key(k + "offsets")]

    def sources(self, is_src):
        out, last = [], None
        for il, r in enumerate(self.ratios):
            if r == 0:
                out.append(None)
                continue
            if is_src(il):
                last = il
            out.append(last)
        return out

    def w(self, name):
        return self.t[name]

    def engram_ids(self, tokens, s):
        per = (self.ngram - 1) * self.e_heads
        return site_ids(tokens, self.token_map, self.pad, self.mult[s * self.ngram:(s + 1) * self.ngram],
                        self.primes[s * per:(s + 1) * per], self.offsets[s * per:(s + 1) * per],
                        self.ngram, self.e_heads)

    def engram(self, il, h, ids):
        b = f"blk.{il}."
        table, wkv = self.w(b + "engram_embd.weight"), self.w(b + "engram_wkv.weight")
        q_w, k_w = self.w(b + "engram_q.weight"), self.w(b + "engram_k.weight")
        emb = table[ids].reshape(ids.shape[0], -1)
        kv = emb @ wkv.T
        keys = kv[:, : self.hc * self.n].reshape(-1, self.hc, self.n)
        value = kv[:, self.hc * self.n:]
        d = (rms(h, self.eps) * (q_w * k_w)[None] * rms(keys, self.eps)).sum(axis=-1) / np.sqrt(self.n)
        gate = sigmoid(np.sign(d) * np.sqrt(np.maximum(np.abs(d), FLOOR)))
        return h + gate[..., None] * value[:, None, :]

    def mixes(self, h, prefix):
        """transformers' DeepseekV4HyperConnection weights of streams h [T, hc, n]: pre, post, comb."""
        hc = self.hc
        fn, base, scale = (self.w(f"{prefix}_{s}.weight") for s in ("fn", "base", "scale"))
        flat = rms(h.reshape(h.shape[0], -1), self.eps) @ fn.T
        pre = sigmoid(flat[:, :hc] * scale[0] + base[:hc]) + self.hc_eps
        post = 2 * sigmoid(flat[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
        c = flat[:, 2 * hc:].reshape(-1, hc, hc) * scale[2] + base[2 * hc:].reshape(hc, hc)
        c = np.exp(c - c.max(axis=-1, keepdims=True))
        comb = c / c.sum(axis=-1, keepdims=True) + self.hc_eps
        comb = comb / (comb.sum(axis=-2, keepdims=True) + self.hc_eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(axis=-1, keepdims=True) + self.hc_eps)
            comb = comb / (comb.sum(axis=-2, keepdims=True) + self.hc_eps)
        return pre, post, comb

    @staticmethod
    def update(h, post, comb, y):
        return post[..., None] * y[:, None, :] + np.einsum("tji,tjd->tid", comb, h)

    def source(self, il, a, T):
        """A compressor source's compressed rows (roped) and index keys from the normed input a."""
        b, R = f"blk.{il}.", self.ratios[il]
        kv = a @ self.w(b + "attn_compressor_kv.weight").T
        gate = self.t.get(b + "attn_compressor_gate.weight")
        score = a @ gate.T if gate is not None else kv
        if gate is None and R != 1:
            raise SystemExit(f"layer {il}: ratio {R} without a gate")
        n_out = T // R
        kvw = kv[: n_out * R].reshape(n_out, R, -1)
        sw = score[: n_out * R].reshape(n_out, R, -1)
        p = np.exp(sw - sw.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        u = rms((p * kvw).sum(axis=1), self.eps, self.w(b + "attn_compressor_norm.weight"))
        at = np.arange(n_out) * R
        rows = rope(u, at, self.inv["compress"])
        k = rms(u @ self.w(b + "indexer.attn_k.weight").T, self.eps, self.w(b + "indexer.k_norm.weight"))
        return rows, rope(k, at, self.inv["compress"])

    def pick(self, il, a, qr, keys, R, margins):
        b, T = f"blk.{il}.", a.shape[0]
        q = (qr @ self.w(b + "indexer.attn_q_b.weight").T).reshape(T, self.HI, self.dI)
        q = rope(q.transpose(1, 0, 2), np.arange(T), self.inv["compress"]).transpose(1, 0, 2)
        wt = (a @ self.w(b + "indexer.proj.weight").T) * self.dI ** -0.5 * self.HI ** -0.5
        picks, ties = [], []
        for p in range(T):
            vis = (p + 1) // R
            dots = q[p] @ keys[:vis].T  # [HI, vis]
            s = (wt[p][:, None] * np.maximum(dots, 0.0)).sum(axis=0)
            order = sorted(range(vis), key=lambda j: (-s[j], j))
            keep = order[: self.top_k]
            if len(order) > self.top_k:
                a, b = s[order[self.top_k - 1]], s[order[self.top_k]]
                gap = (a - b) / max(abs(s[order[0]]), 1e-300)
                if a == 0.0 and b == 0.0:
                    # Rows tied at exactly 0 (every head's dot <= 0) rank by row: how near a dot
                    # is to turning positive decides whether f32 keeps that order.
                    zero = [j for j in range(vis) if s[j] == 0.0]
                    gap = float(-dots[:, zero].max()) / max(float(np.abs(dots).max()), 1e-300)
                if gap < TIE_BAND:
                    ties.append(p)
                margins.append(gap)
            picks.append(keep)
        return picks, ties

    def attention(self, il, a, shared, margins):
        b, T, R = f"blk.{il}.", a.shape[0], self.ratios[il]
        inv = self.inv["main" if R == 0 else "compress"]
        pos = np.arange(T)
        qr = rms(a @ self.w(b + "attn_q_a.weight").T, self.eps, self.w(b + "attn_q_a_norm.weight"))
        q = (qr @ self.w(b + "attn_q_b.weight").T).reshape(T, self.H, self.d)
        if QUERY_HEAD_NORM:
            q = rms(q, self.eps)
        q = rope(q.transpose(1, 0, 2), pos, inv).transpose(1, 0, 2)
        kv = rope(rms(a @ self.w(b + "attn_kv.weight").T, self.eps, self.w(b + "attn_kv_a_norm.weight")), pos, inv)
        picks = None
        if R:
            if self.comp_src[il] == il:
                shared["comp"][il] = self.source(il, a, T)
            rows, keys = shared["comp"][self.comp_src[il]]
            if self.index_src[il] == il:
                shared["picks"][il], shared["ties"][il] = self.pick(il, a, qr, keys, R, margins)
            picks = shared["picks"][self.index_src[il]]
        sinks = self.w(b + "attn_sinks.weight")
        out = np.zeros((T, self.H, self.d))
        for p in range(T):
            ks = kv[max(0, p - self.window + 1): p + 1]
            if picks is not None:
                ks = np.concatenate([ks, rows[sorted(picks[p])]], axis=0)
            logit = (q[p] @ ks.T) * self.d ** -0.5  # [H, K]
            full = np.concatenate([logit, sinks[:, None]], axis=1)
            e = np.exp(full - full.max(axis=1, keepdims=True))
            prob = e[:, :-1] / e.sum(axis=1, keepdims=True)
            out[p] = prob @ ks
        out = rope(out.transpose(1, 0, 2), pos, inv, inverse=True).transpose(1, 0, 2)
        g, r = self.groups, self.rank
        o = out.reshape(T, g, -1)
        wa = self.w(b + "attn_output_a.weight")  # [g·r, H·d/g]
        oa = np.concatenate([o[:, j] @ wa[j * r:(j + 1) * r].T for j in range(g)], axis=1)
        return oa @ self.w(b + "attn_output_b.weight").T, picks

    def moe(self, il, f, margins):
        b = f"blk.{il}."
        logits = f @ self.w(b + "ffn_gate_inp.weight").T
        scores = np.sqrt(softplus(logits))
        sel = scores + self.w(b + "exp_probs_b.bias")
        gate, up, down = (self.w(b + f"ffn_{s}_exps.weight") for s in ("gate", "up", "down"))
        lim, lim_sh = self.clamp[il], self.clamp_sh[il]
        out, chosen, ties = np.zeros_like(f), [], []
        for t in range(f.shape[0]):
            order = sorted(range(len(sel[t])), key=lambda e: (-sel[t][e], -e))
            ids = order[: self.k_exp]
            gap = (sel[t][order[self.k_exp - 1]] - sel[t][order[self.k_exp]]) / abs(sel[t][order[0]])
            margins.append(gap)
            if gap < TIE_BAND:
                ties.append(t)
            wts = scores[t][ids]
            wts = wts / (wts.sum() + 1e-20) * self.scale
            for e, wt in zip(ids, wts):
                out[t] += wt * (down[e] @ self.swiglu(gate[e] @ f[t], up[e] @ f[t], lim))
            chosen.append(sorted(ids))
        sg, su, sd = (self.w(b + f"ffn_{s}_shexp.weight") for s in ("gate", "up", "down"))
        out += (self.swiglu(f @ sg.T, f @ su.T, lim_sh)) @ sd.T
        return out, chosen, ties

    @staticmethod
    def swiglu(g, u, lim):
        if lim > 0:
            g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
        return silu(g) * u

    def forward(self, tokens):
        T = len(tokens)
        x = self.w("token_embd.weight")[np.asarray(tokens)]
        h = np.repeat(x[:, None, :], self.hc, axis=1)
        pre = np.zeros((T, self.hc))
        pre[:, 0] = 1.0
        shared = {"comp": {}, "picks": {}, "ties": {}}
        margins = {"experts": [], "indexer": []}
        rec = {"experts": {}, "indexer": {}, "engram_ids": [], "ties": {"experts": {}, "indexer": {}}}
        ids = [self.engram_ids(tokens, s) for s in range(len(self.sites))]
        rec["engram_ids"] = np.concatenate(ids, axis=1).tolist() if ids else []
        for il in range(self.n_layer):
            b = f"blk.{il}."
            if il in self.sites:
                h = self.engram(il, h, ids[self.sites.index(il)])
            attn_in = np.einsum("tj,tjd->td", pre, h)
            pa, qa, ca = self.mixes(h, b + "hc_attn")
            a = rms(attn_in, self.eps, self.w(b + "attn_norm.weight"))
            y, picks = self.attention(il, a, shared, margins["indexer"])
            if self.index_src[il] == il:
                rec["indexer"][str(il)] = [sorted(p) for p in picks]
                rec["ties"]["indexer"][str(il)] = shared["ties"][il]
            h = self.update(h, qa, ca, y)
            ffn_in = np.einsum("tj,tjd->td", pa, h)
            pf, qf, cf = self.mixes(h, b + "hc_ffn")
            f = rms(ffn_in, self.eps, self.w(b + "ffn_norm.weight"))
            y, chosen, ties = self.moe(il, f, margins["experts"])
            rec["experts"][str(il)] = chosen
            rec["ties"]["experts"][str(il)] = ties
            h = self.update(h, qf, cf, y)
            pre = pf
        x = rms(np.einsum("tj,tjd->td", pre, h), self.eps, self.w("output_norm.weight"))
        logits = x @ self.w("output.weight").T
        return logits, rec, margins


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    args = sys.argv[1:]
    path, out = args[0], args[1]
    i = args.index("--positions")
    positions = [int(p) for p in args[i + 1].split(",")]
    seqs = [[int(t) for t in s.split(",")] for s in args[i + 2:]]
    m = Model(path)
    golden = {"reference": "tests/oracle/numpy_deepseek41.py (f64 numpy, no fp8/fp4 emulation)",
              "file_sha256": sha256(path), "positions": positions, "query_head_norm": QUERY_HEAD_NORM,
              "sequences": []}
    for tokens in seqs:
        logits, rec, margins = m.forward(tokens)
        least = {k: float(min(v)) if v else None for k, v in margins.items()}
        n_ties = {k: sum(len(v) for v in rec["ties"][k].values()) for k in rec["ties"]}
        print(f"{len(tokens)} tokens: least relative top-k gaps {least}; in the tie band {n_ties}")
        golden["sequences"].append({
            "tokens": tokens, "logits": [[float(v) for v in logits[p]] for p in positions],
            "argmax": [int(v) for v in logits.argmax(axis=1)], "experts": rec["experts"],
            "indexer": rec["indexer"], "engram_ids": rec["engram_ids"], "least_gap": least,
            "ties": rec["ties"]})
    with open(out, "w") as f:
        json.dump(golden, f)


if __name__ == "__main__":
    main()
