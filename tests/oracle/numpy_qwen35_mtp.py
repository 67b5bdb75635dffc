#!/usr/bin/env python3
"""Reference logits of a qwen35moe / qwen35 file's MTP (nextn) block, in float64 numpy, as a JSON golden.

transformers 5.24 has no module for Qwen3.5's MTP head (it drops `mtp.*` on load), so this is written
from llama.cpp b11434's `src/models/qwen35moe.cpp` / `qwen35.cpp` `graph_mtp` (facts only; issue 48).
Rows are paired as llama.cpp's draft-mtp feeds the block a prompt (common/speculative.cpp,
common_speculative_impl_draft_mtp::process): the block's row at position p holds token x_p and the
trunk's final-norm row of position p-1 (output_norm of the last layer's output, llama.cpp's
`h_nextn`), position 0 a zero row (its `pending_h` of a new sequence). For a row (h, x):

  * e = embedding(x) (nextn.embed_tokens if the file has it, else token_embd);
    x = eh_proj [enorm(e); hnorm(h)] (e first: ggml_concat(e_norm, h_norm) along ne0);
  * the block, a full-attention Qwen3.5 decoder layer: x += attn(attn_norm(x)), then
    x += ffn(post_attention_norm(x));
    attn: per head, attn_q gives [query (head_dim), gate (head_dim)]; q = RMS(query) * attn_q_norm,
    k = RMS(attn_k x) * attn_k_norm, v = attn_v x; q and k rotated (IMROPE with all sections at the
    text position: the NEOX rotation of the first rope.dimension_count dims, base rope.freq_base);
    causal over the block's own cache of positions 0..p, scale 1/sqrt(head_dim), GQA;
    out = attn_output (o * sigmoid(gate));
    ffn (qwen35moe): softmax router over ffn_gate_inp, top-k, renormalised, SwiGLU experts, plus the
    SwiGLU shared expert times sigmoid(ffn_gate_inp_shexp . y); (qwen35): one SwiGLU FFN;
  * logits = head(RMS(x) * shared_head_norm), head = nextn.shared_head_head if present, else output
    (shared_head_norm likewise falls back to output_norm).
RMSNorm eps attention.layer_norm_rms_epsilon. GGUF norm weights are used as stored (the converter
stores HF's 1 + w).

The trunk's rows come from transformers (tests/oracle/hf_qwen35.py's model of the same file; a hook
on its final norm). With --check-hf the block is also run through transformers' own decoder layer
class (Qwen3_5MoeDecoderLayer / Qwen3_5DecoderLayer, full attention) loaded with the MTP block's
weights, on numpy's eh_proj rows, and must agree within 1e-5 relative with numpy's block output.

Writes {reference, file_sha256, layer, sequences: [{tokens, logits, router_ids}]} (router_ids of the
MTP block per position, sorted; qwen35moe only).

usage: numpy_qwen35_mtp.py MODEL.gguf OUT.json [--check-hf] SEQ [SEQ ...]   (SEQ = comma-separated ids)
"""
import hashlib
import json
import os
import sys

import numpy as np
from gguf import GGUFReader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The router tie band (absolute gap of the k-th and (k+1)-th router logits).
TIE_ROUTER = 1e-4


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def swiglu(x, gate, up, down):
    g = x @ gate.T
    return (g * sigmoid(g) * (x @ up.T)) @ down.T


class File:
    def __init__(self, path):
        r = GGUFReader(path)
        self.arch = field(r, "general.architecture")
        assert self.arch in ("qwen35moe", "qwen35"), self.arch
        a = self.arch
        self.k = lambda name, d=None: field(r, f"{a}.{name}", d)  # noqa: E731
        for x in r.tensors:
            assert x.tensor_type.name in ("F32", "F16"), f"{x.name}: {x.tensor_type.name} (f32/f16 files only)"
        self.t = {x.name: np.array(x.data, dtype=np.float64).reshape([int(n) for n in reversed(x.shape)])
                  for x in r.tensors}
        assert self.k("nextn_predict_layers", 0) == 1, "the file has no MTP block (nextn_predict_layers)"
        self.il = self.k("block_count") - 1
        assert self.k("attention.recurrent_layers") is None, "recurrent_layers is not read here"
        self.eps = self.k("attention.layer_norm_rms_epsilon")
        assert not self.k("attention.scale", 0.0), "attention.scale is not mapped"

    def w(self, name):
        return self.t[f"blk.{self.il}.{name}"]

    def opt(self, name, fallback):
        full = f"blk.{self.il}.{name}"
        return self.t[full] if full in self.t else self.t[fallback]


def rope(x, n_rot, base):
    """NEOX rotation of the first n_rot dims of x [T, heads, head_dim] at positions 0..T-1."""
    T = x.shape[0]
    half = n_rot // 2
    theta = np.arange(T)[:, None] * base ** (-np.arange(half) * 2.0 / n_rot)[None, :]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., :half], x[..., half:n_rot]
    out = x.copy()
    out[..., :half] = a * c - b * s
    out[..., half:n_rot] = b * c + a * s
    return out


def attention(f, x):
    k = f.k
    n_head, n_kv, hd = k("attention.head_count"), k("attention.head_count_kv"), k("attention.key_length")
    n_head = n_head[f.il] if isinstance(n_head, list) else n_head
    n_kv = n_kv[f.il] if isinstance(n_kv, list) else n_kv
    assert k("attention.value_length", hd) == hd
    n_rot = k("rope.dimension_count", hd)
    sections = list(k("rope.dimension_sections", [11, 11, 10, 0]))
    assert 2 * sum(sections) <= n_rot, sections  # text positions: every section rotates alike
    T = x.shape[0]
    qg = (x @ f.w("attn_q.weight").T).reshape(T, n_head, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, n_head * hd)
    q = rms(q, f.w("attn_q_norm.weight"), f.eps)
    kk = rms((x @ f.w("attn_k.weight").T).reshape(T, n_kv, hd), f.w("attn_k_norm.weight"), f.eps)
    v = (x @ f.w("attn_v.weight").T).reshape(T, n_kv, hd)
    base = k("rope.freq_base")
    q, kk = rope(q, n_rot, base), rope(kk, n_rot, base)
    group = n_head // n_kv
    out = np.zeros((T, n_head, hd))
    for i in range(T):
        for h in range(n_head):
            s = kk[:i + 1, h // group] @ q[i, h] / np.sqrt(hd)
            out[i, h] = softmax(s) @ v[:i + 1, h // group]
    return (out.reshape(T, -1) * sigmoid(gate)) @ f.w("attn_output.weight").T


def ffn(f, y):
    if f.arch == "qwen35":
        return swiglu(y, f.w("ffn_gate.weight"), f.w("ffn_up.weight"), f.w("ffn_down.weight")), None, 1.0
    n_used = f.k("expert_used_count")
    assert f.k("expert_weights_scale", 0.0) in (0.0, 1.0), "expert_weights_scale is not mapped"
    assert f.k("expert_gating_func", 1) == 1, "qwen35moe's graph uses softmax gating"
    logits = y @ f.w("ffn_gate_inp.weight").T
    probs = softmax(logits)
    gate, up, down = f.w("ffn_gate_exps.weight"), f.w("ffn_up_exps.weight"), f.w("ffn_down_exps.weight")
    shared = swiglu(y, f.w("ffn_gate_shexp.weight"), f.w("ffn_up_shexp.weight"), f.w("ffn_down_shexp.weight"))
    out = shared * sigmoid(y @ f.w("ffn_gate_inp_shexp.weight"))[:, None]
    routes, gaps = [], []
    for i in range(y.shape[0]):
        order = np.argsort(-logits[i], kind="stable")
        top = order[:n_used]
        gaps.append(logits[i][order[n_used - 1]] - logits[i][order[n_used]])
        wts = probs[i][top] / probs[i][top].sum()
        for e, wt in zip(top, wts):
            out[i] += wt * swiglu(y[i:i + 1], gate[e], up[e], down[e])[0]
        routes.append(sorted(int(e) for e in top))
    return out, routes, min(gaps)


def block(f, x):
    x = x + attention(f, rms(x, f.w("attn_norm.weight"), f.eps))
    m, routes, gap = ffn(f, rms(x, f.w("post_attention_norm.weight"), f.eps))
    return x + m, routes, gap


def mtp(f, h, tokens):
    emb = f.opt("nextn.embed_tokens.weight", "token_embd.weight")[tokens]
    cat = np.concatenate([rms(emb, f.w("nextn.enorm.weight"), f.eps), rms(h, f.w("nextn.hnorm.weight"), f.eps)], -1)
    x0 = cat @ f.w("nextn.eh_proj.weight").T
    x, routes, gap = block(f, x0)
    out = rms(x, f.opt("nextn.shared_head_norm.weight", "output_norm.weight"), f.eps)
    logits = out @ f.opt("nextn.shared_head_head.weight", "output.weight").T
    return logits, routes, gap, x0, x


def trunk_rows(model, tokens):
    """transformers' final-norm rows [T, n_embd] for `tokens`."""
    import torch
    rows = []
    hook = model.model.norm.register_forward_hook(lambda _m, _i, o: rows.append(o[0].double().numpy()))
    with torch.no_grad():
        model(torch.tensor([tokens]), use_cache=False)
    hook.remove()
    return rows[0]


def hf_block(f, model, x0):
    """The block through transformers' own decoder layer class, loaded with the MTP weights."""
    import copy
    import torch
    import transformers.models.qwen3_5.modeling_qwen3_5 as dense
    import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as moe
    cfg = copy.deepcopy(model.config)
    cfg.layer_types = list(cfg.layer_types) + ["full_attention"]
    cfg.num_hidden_layers += 1
    cls = moe.Qwen3_5MoeDecoderLayer if f.arch == "qwen35moe" else dense.Qwen3_5DecoderLayer
    layer = cls(cfg, f.il).float().eval()
    if f.arch == "qwen35moe":
        layer.mlp.experts.config._experts_implementation = "eager"
    w = f.w
    sd = {
        "input_layernorm.weight": w("attn_norm.weight") - 1,
        "post_attention_layernorm.weight": w("post_attention_norm.weight") - 1,
        "self_attn.q_proj.weight": w("attn_q.weight"),
        "self_attn.k_proj.weight": w("attn_k.weight"),
        "self_attn.v_proj.weight": w("attn_v.weight"),
        "self_attn.o_proj.weight": w("attn_output.weight"),
        "self_attn.q_norm.weight": w("attn_q_norm.weight") - 1,
        "self_attn.k_norm.weight": w("attn_k_norm.weight") - 1,
    }
    if f.arch == "qwen35moe":
        sd.update({
            "mlp.gate.weight": w("ffn_gate_inp.weight"),
            "mlp.experts.gate_up_proj": np.concatenate([w("ffn_gate_exps.weight"), w("ffn_up_exps.weight")], 1),
            "mlp.experts.down_proj": w("ffn_down_exps.weight"),
            "mlp.shared_expert.gate_proj.weight": w("ffn_gate_shexp.weight"),
            "mlp.shared_expert.up_proj.weight": w("ffn_up_shexp.weight"),
            "mlp.shared_expert.down_proj.weight": w("ffn_down_shexp.weight"),
            "mlp.shared_expert_gate.weight": w("ffn_gate_inp_shexp.weight").reshape(1, -1),
        })
    else:
        sd.update({"mlp.gate_proj.weight": w("ffn_gate.weight"), "mlp.up_proj.weight": w("ffn_up.weight"),
                   "mlp.down_proj.weight": w("ffn_down.weight")})
    own = layer.state_dict()
    assert set(own) == set(sd), (set(own) ^ set(sd))
    layer.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()})
    T = x0.shape[0]
    x = torch.from_numpy(x0.astype(np.float32))[None]
    pos = torch.arange(T).view(1, 1, -1).expand(3, 1, -1)
    pe = model.model.rotary_emb(x, pos)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out = layer(x, position_embeddings=pe, attention_mask=mask, position_ids=pos)
    return out[0].double().numpy()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    args = sys.argv[1:]
    if len(args) < 3:
        sys.exit(__doc__)
    path, out, rest = args[0], args[1], args[2:]
    check_hf = rest[0] == "--check-hf"
    rest = rest[1:] if check_hf else rest
    import torch
    import hf_qwen35
    torch.manual_seed(0)
    model = hf_qwen35.build(path)
    f = File(path)
    seqs = []
    for spec in rest:
        tokens = [int(x) for x in spec.split(",")]
        h = trunk_rows(model, tokens)
        shifted = np.concatenate([np.zeros((1, h.shape[1])), h[:-1]])
        logits, routes, gap, x0, x = mtp(f, shifted, tokens)
        if check_hf:
            theirs = hf_block(f, model, x0)
            rel = np.abs(theirs - x).max() / np.abs(x).max()
            print(f"{spec[:20]}...: the block, transformers' decoder layer vs numpy: max rel {rel:.2e}")
            assert rel < 1e-5, rel
        # A near tie would let two correct implementations pick differently: refuse the sequence.
        if gap < TIE_ROUTER:
            sys.exit(f"{spec}: a router choice within the tie band ({gap}); choose another sequence")
        rounded = [[float(f"{v:.8g}") for v in row] for row in logits.tolist()]
        seq = {"tokens": tokens, "logits": rounded}
        if routes is not None:
            seq.update(router_ids=routes, min_gap=float(f"{gap:.3g}"))
        seqs.append(seq)
    json.dump({"reference": "float64 numpy, llama.cpp b11434 qwen35moe.cpp/qwen35.cpp graph_mtp form, on "
               "transformers' trunk rows shifted by one as draft-mtp pairs them (tests/oracle/numpy_qwen35_mtp.py)",
               "file_sha256": sha256(path), "layer": f.il, "sequences": seqs}, open(out, "w"))


if __name__ == "__main__":
    main()
