#!/usr/bin/env python3
"""Reference logits of a glm5-next file's NextN (MTP) layer, in float64 numpy, as a JSON golden.

Neither transformers 5.24 (it drops layer 45 on load) nor llama.cpp b11434 ("GLM5-Next NextN graph
not implemented yet") runs GLM-5.3's NextN layer, so this is written from the form of llama.cpp
b11434's `src/models/glm4-moe.cpp` MTP graph (facts only; issue 46) with glm5-next's layer kinds:
for the trunk's hidden row h_i at position i (the unweighted mean of the four mHC streams after the
last trunk layer, as tests/oracle/hf_glm5_next.py --hidden writes it) and the token n_i fed with
it (the trunk's next token),

  * h = output_norm(h_i), e = embedding(n_i) (nextn.embed_tokens if the file has it, else
    token_embd); x = eh_proj [enorm(e); hnorm(h)] (e first: ggml_concat(e_norm, h_norm) along ne0);
  * the block, pre-norm with plain residuals (no hc_*): x += MLA(attn_norm(x)), then
    x += MoE(ffn_norm(x)) + shared expert;
  * logits = head(shared_head_norm(x)), head = nextn.shared_head_head if present, else output
    (shared_head_norm likewise falls back to output_norm).

The block's MLA is glm5-next's NoPE latent attention with a full DSA indexer, over the NextN
layer's own cache of positions 0..i (causal): c = kv_a_norm(attn_kv_a_mqa x) (the 512-wide latent),
qr = q_a_norm(attn_q_a x), q_h = (attn_q_b qr)_h; key_h = attn_k_b_h c, value_h = attn_v_b_h c;
score = q_h . key_h / sqrt(key_length_mla). The indexer: iq = indexer.attn_q_b qr (heads x
key_length), ik = LayerNorm(indexer.attn_k x; k_norm weight and bias, eps
attention.layer_norm_epsilon), gate = indexer_compressor_gate x; positions 0.. in pools of
`kpool`, a pool's key per dimension d the softmax over its members of (gate_d + ape[member, d])
weighting ik_d; a complete pool whose last position is <= i is a candidate, score
sum_h w_h relu(iq_h . pooled), w = indexer.proj x / sqrt(key_length * heads); the top
top_k / kpool candidates are kept with their members, plus the positions after the last complete
pool up to i (the tail). The MoE: sigmoid router, top-k of scores + exp_probs_b (selection only),
weights = chosen scores / (their sum + 1e-20) * expert_weights_scale; experts and the shared expert
are SwiGLU with the gate clamped above at L and up to [-L, L] (swiglu_clamp_exp / _shexp of the
layer). RMSNorm eps attention.layer_norm_rms_epsilon.

Writes {reference, file_sha256, layer, sequences: [{tokens, next_tokens, logits, router_ids,
dsa_picks}]} (router_ids and dsa_picks of the NextN layer, per position, sorted).

usage: numpy_glm5_nextn.py MODEL.gguf OUT.json HIDDEN.npy:TOKENS:NEXT [HIDDEN.npy:TOKENS:NEXT ...]
  HIDDEN.npy: f32 [T, n_embd]; TOKENS: the trunk's T tokens; NEXT: the T tokens fed with the rows
"""
import hashlib
import json
import sys

import numpy as np
from gguf import GGUFReader

ARCH = "glm5-next"
# The tie bands of hf_glm5_next.py: router gap (absolute) and DSA gap (relative to the row's best).
TIE_ROUTER = 1e-4
TIE_DSA = 1e-4


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def swiglu(x, gate, up, down, limit):
    g = np.minimum(x @ gate.T, limit) if limit > 0 else x @ gate.T
    u = np.clip(x @ up.T, -limit, limit) if limit > 0 else x @ up.T
    return (g * sigmoid(g) * u) @ down.T


def per_layer(v, il):
    return v[il] if isinstance(v, list) else v


class File:
    def __init__(self, path):
        r = GGUFReader(path)
        assert field(r, "general.architecture") == ARCH, field(r, "general.architecture")
        self.k = lambda name, d=None: field(r, f"{ARCH}.{name}", d)  # noqa: E731
        self.t = {x.name: np.array(x.data, dtype=np.float64).reshape([int(n) for n in reversed(x.shape)])
                  for x in r.tensors}
        n_next = self.k("nextn_predict_layers", 0)
        assert n_next == 1, "the file has no NextN layer (nextn_predict_layers)"
        self.il = self.k("block_count") - 1
        assert self.k("attention.head_count_kv")[self.il] != 0, "the NextN layer is MLA"
        self.eps = self.k("attention.layer_norm_rms_epsilon")

    def w(self, name):
        return self.t[f"blk.{self.il}.{name}"]

    def opt(self, name, fallback):
        full = f"blk.{self.il}.{name}"
        return self.t[full] if full in self.t else self.t[fallback]


def indexer(f, x, qr):
    """The key positions each query keeps: selected complete pools plus the tail, sorted."""
    k = f.k
    n_ih, d = k("attention.indexer.head_count"), k("attention.indexer.key_length")
    kpool, top_k = k("attention.indexer.kpool"), k("attention.indexer.top_k")
    assert k("attention.indexer.kpool_select_tail", True)
    T = x.shape[0]
    iq = (qr @ f.w("indexer.attn_q_b.weight").T).reshape(T, n_ih, d)
    ik = layer_norm(x @ f.w("indexer.attn_k.weight").T, f.w("indexer.k_norm.weight"),
                    f.w("indexer.k_norm.bias"), k("attention.layer_norm_epsilon"))
    gate = x @ f.w("indexer_compressor_gate.weight").T
    ape = f.w("indexer_compressor_ape.weight")  # [kpool, d]
    n_pool = T // kpool
    pooled = np.stack([(softmax(gate[p * kpool:(p + 1) * kpool] + ape, axis=0) * ik[p * kpool:(p + 1) * kpool]).sum(0)
                       for p in range(n_pool)]) if n_pool else np.zeros((0, d))
    wts = (x @ f.w("indexer.proj.weight").T) / np.sqrt(d * n_ih)
    picks, gaps = [], []
    for i in range(T):
        live = (i + 1) // kpool  # complete pools whose last position is <= i
        score = (wts[i][:, None] * np.maximum(iq[i] @ pooled[:live].T, 0.0)).sum(0)
        keep = min(live, top_k // kpool)
        order = np.argsort(-score, kind="stable")
        if live > keep:
            gaps.append((score[order[keep - 1]] - score[order[keep]]) / max(abs(score[order[0]]), 1e-30))
        chosen = [int(p) * kpool + j for p in order[:keep] for j in range(kpool)]
        chosen += list(range(live * kpool, i + 1))
        picks.append(sorted(chosen))
    return picks, min(gaps) if gaps else 1.0


def mla(f, x):
    k = f.k
    n_head = k("attention.head_count")
    kv_lora, nope, nv = k("attention.kv_lora_rank"), k("attention.key_length_mla"), k("attention.value_length_mla")
    assert k("rope.dimension_count", 0) == 0
    T = x.shape[0]
    qr = rms(x @ f.w("attn_q_a.weight").T, f.w("attn_q_a_norm.weight"), f.eps)
    q = (qr @ f.w("attn_q_b.weight").T).reshape(T, n_head, nope)
    c = rms(x @ f.w("attn_kv_a_mqa.weight").T, f.w("attn_kv_a_norm.weight"), f.eps)  # [T, kv_lora]
    kb = f.w("attn_k_b.weight")  # [n_head, kv_lora, nope]
    vb = f.w("attn_v_b.weight")  # [n_head, nv, kv_lora]
    assert kb.shape == (n_head, kv_lora, nope) and vb.shape == (n_head, nv, kv_lora)
    key = np.einsum("hln,tl->thn", kb, c)
    val = np.einsum("hvl,tl->thv", vb, c)
    picks, gap = indexer(f, x, qr)
    out = np.zeros((T, n_head, nv))
    for i in range(T):
        sel = picks[i]
        s = np.einsum("hn,shn->hs", q[i], key[sel]) / np.sqrt(nope)
        out[i] = np.einsum("hs,shv->hv", softmax(s, -1), val[sel])
    return out.reshape(T, -1) @ f.w("attn_output.weight").T, picks, gap


def moe(f, x):
    k = f.k
    n_used = k("expert_used_count")
    scale = k("expert_weights_scale")
    lim = float(per_layer(k("swiglu_clamp_exp", 0.0), f.il))
    lim_sh = float(per_layer(k("swiglu_clamp_shexp", k("swiglu_clamp_exp", 0.0)), f.il))
    scores = sigmoid(x @ f.w("ffn_gate_inp.weight").T)
    choice = scores + f.w("exp_probs_b.bias")
    gate, up, down = f.w("ffn_gate_exps.weight"), f.w("ffn_up_exps.weight"), f.w("ffn_down_exps.weight")
    out = swiglu(x, f.w("ffn_gate_shexp.weight"), f.w("ffn_up_shexp.weight"), f.w("ffn_down_shexp.weight"), lim_sh)
    routes, gaps = [], []
    for i in range(x.shape[0]):
        order = np.argsort(-choice[i], kind="stable")
        top = order[:n_used]
        gaps.append(choice[i][order[n_used - 1]] - choice[i][order[n_used]])
        wts = scores[i][top] / (scores[i][top].sum() + 1e-20) * scale
        for e, wt in zip(top, wts):
            out[i] += wt * swiglu(x[i:i + 1], gate[e], up[e], down[e], lim)[0]
        routes.append(sorted(int(e) for e in top))
    return out, routes, min(gaps)


def nextn(f, hidden, next_tokens):
    h = rms(hidden.astype(np.float64), f.t["output_norm.weight"], f.eps)
    emb = f.opt("nextn.embed_tokens.weight", "token_embd.weight")[next_tokens]
    cat = np.concatenate([rms(emb, f.w("nextn.enorm.weight"), f.eps), rms(h, f.w("nextn.hnorm.weight"), f.eps)], -1)
    x = cat @ f.w("nextn.eh_proj.weight").T
    a, picks, dsa_gap = mla(f, rms(x, f.w("attn_norm.weight"), f.eps))
    x = x + a
    m, routes, router_gap = moe(f, rms(x, f.w("ffn_norm.weight"), f.eps))
    x = x + m
    x = rms(x, f.opt("nextn.shared_head_norm.weight", "output_norm.weight"), f.eps)
    logits = x @ f.opt("nextn.shared_head_head.weight", "output.weight").T
    return logits, routes, picks, {"router": router_gap, "dsa": dsa_gap}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    path, out, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    f = File(path)
    seqs = []
    for spec in specs:
        hidden_path, tokens, nxt = spec.split(":")
        hidden = np.load(hidden_path)
        tokens = [int(x) for x in tokens.split(",")]
        nxt = [int(x) for x in nxt.split(",")]
        assert hidden.shape[0] == len(tokens) == len(nxt), (hidden.shape, len(tokens), len(nxt))
        logits, routes, picks, gap = nextn(f, hidden, nxt)
        # A near tie would let two correct implementations pick differently: refuse the sequence.
        if gap["router"] < TIE_ROUTER or gap["dsa"] < TIE_DSA:
            sys.exit(f"{spec}: a selection within the tie band ({gap}); choose another sequence")
        rounded = [[float(f"{v:.8g}") for v in row] for row in logits.tolist()]
        seqs.append({"tokens": tokens, "next_tokens": nxt, "logits": rounded, "router_ids": routes,
                     "dsa_picks": picks, "min_gap": {k: float(f"{v:.3g}") for k, v in gap.items()}})
    json.dump({"reference": "float64 numpy, llama.cpp b11434 glm4-moe.cpp MTP graph form with glm5-next's "
               "MLA + DSA block (tests/oracle/numpy_glm5_nextn.py)",
               "file_sha256": sha256(path), "layer": f.il, "sequences": seqs}, open(out, "w"))


if __name__ == "__main__":
    main()
