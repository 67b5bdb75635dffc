#!/usr/bin/env python3
"""Reference logits of a qwen4exp MTP file's block (Qwen3.8-Flash-Next's multi-token prediction head), in
float64 numpy, as a JSON golden.

transformers 5.24 has no MTP module (`_keys_to_ignore_on_load_unexpected = [r"^mtp.*"]`), so this is
written from llama.cpp b11434's `src/models/qwen4exp.cpp` (`graph_mtp`, `build_hc_mix`,
`build_hc_combine`, `build_layer_attn`, `build_qsa_sel`, `build_layer_ffn`; facts only, issue 47). The
file is what the sdist's converter writes with `--mtp` (an MTP-only file: token_embd, output and the
block blk.N, N = block_count - 1, no trunk, no PLE). For the trunk's residual row h_i at position i
(hc streams x n_embd, after the last trunk layer and before the final output_hc mixer, as
tests/oracle/hf_qwen4exp.py --hidden writes it) and the token n_i fed with it (the trunk's next token):

  * per stream s: x_s = eh_proj [enorm(e); hnorm_s(h_s)], e = token_embd[n_i]: enorm is one RMSNorm
    gamma [n_embd] repeated over the streams, hnorm one gamma per stream ([n_embd, hc]); e first
    (ggml_concat(e_norm, h_norm) along ne0); eh_proj ne {2 n_embd, n_embd};
  * the block with the trunk layer's hyper-connections: mix = hc_mix(x; hc_attn_*), x_s += 2
    sigmoid(inject_s / hc) * QSA(mix); mix = hc_mix(x; hc_ffn_*), x_s += 2 sigmoid(inject_s / hc) *
    MoE(mix), where hc_mix(x) normalises each stream (RMSNorm, gamma [n_embd, hc]) into xn (flattened
    hc * n_embd), g = sigmoid(up silu(down xn / hc)), mix = mean_s (xn * g)_s, inject = inject_w xn;
  * x (hc * n_embd) is the h of the next draft step; logits = output hc_mix(x; nextn.hc_head_*).

QSA on the MTP layer's own cache of positions 0..i: q, gate per head from attn_q (per head [q | gate]),
q and k RMSNorm'd per head (attn_q_norm / attn_k_norm), NEOX rope on the first rope.dimension_count
dims (IMROPE with text positions), theta rope.freq_base; the indexer: iq = RMSNorm(indexer.q_proj x)
per head (indexer.q_norm) roped at i; raw keys indexer.k_proj x, complete blocks of `ratio` positions
(compress_ratios of the layer) averaged, RMSNorm'd (indexer.k_norm), roped at the block's first
position; block score sum_h relu(iq_h . key_b) / sqrt(key_length); the top top_k / ratio blocks and
every position after the last complete block are kept; softmax(q.k / sqrt(head_dim)) over them (GQA: head
h reads kv head h // (n_head / n_head_kv)); output * sigmoid(gate) -> attn_output. MoE: softmax over
ffn_gate_inp, top expert_used_count, renormalised; SwiGLU experts; shared expert SwiGLU times
sigmoid(ffn_gate_inp_shexp . mix). RMSNorm eps attention.layer_norm_rms_epsilon everywhere.

Rows and positions: row i pairs h_i with n_i and sits at position i; the block attends to rows 0..i
(vLLM's and the training convention). llama.cpp's drafting driver (common/speculative.cpp,
common_speculative_impl_draft_mtp::process) pairs h_p with x_{p+1} at position p + 1 and, for the first
token, a row of zeros as h at position 0, which the block then attends to as well: on the tiny file that
row moves the logits 0.27 relative (argmax 62/67); the position shift alone changes nothing (rope is
relative). llama.cpp's graph itself, fed this script's rows (tests/oracle/llamacpp_mtp_logits.cpp),
agrees with it within 1.5e-7 relative (check_qwen4exp_tiny.sh).

Writes {reference, file_sha256, layer, sequences: [{tokens, next_tokens, logits, router_ids,
qsa_blocks, min_gap}]} (router ids and selected complete-block indices of the MTP layer, per position,
sorted).

With --chain N each sequence also gets the block's greedy draft chain of N tokens after its rows,
`chain: {drafts, logits, router_ids, qsa_blocks, min_argmax_lead}`: d_1 is the argmax of the last
row; step k appends the row (the block's own residual x of the previous row as h, d_k) at the next
position and d_(k+1) is its argmax (the chain llama.cpp's draft-mtp runs, the block's residual feeding
the next step); logits etc. are those N - 1 appended rows'. A draft whose lead over the runner-up is
under 1e-4 of the row's largest |logit| refuses the sequence.

With --check-hf the same glue is run around transformers' own modules (Qwen4ExpTextDecoderLayer of kind
indexed_attention loaded with the block's weights through hf_qwen4exp.py's mapping,
Qwen4ExpTextGatedResidual for nextn.hc_head, Qwen4ExpTextRMSNorm for enorm / hnorm) in f32 and the
logits must agree within 1e-5 relative, with the same router ids and QSA blocks (tiny checkpoint of
check_qwen4exp_tiny.sh: 4.6e-7 and 4.8e-7 on its two sequences; a numpy reference with [h; e] in place
of [e; h], hnorm's stream-0 gamma on every stream, the pooled key roped at the block's last position,
or the hc combine without its factor 2 is 1.3, 0.11, 0.15-0.17 and 0.21-0.24 off).

usage: numpy_qwen4exp_mtp.py MTP.gguf OUT.json [--check-hf] [--chain N] HIDDEN.npy:TOKENS:NEXT [...]
  HIDDEN.npy: f32 [T, hc * n_embd]; TOKENS: the trunk's T tokens; NEXT: the T tokens fed with the rows
"""
import hashlib
import json
import os
import sys

import numpy as np
from gguf import GGUFReader

ARCH = "qwen4exp"
# The tie bands of hf_qwen4exp.py: router probability gap (absolute), QSA gap (relative to the best).
TIE_ROUTER = 1e-4
TIE_QSA = 1e-4
# A drafted token's lead over the runner-up (relative to the row's largest |logit|) below this is a tie.
TIE_ARGMAX = 1e-4


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class File:
    def __init__(self, path):
        r = GGUFReader(path)
        assert field(r, "general.architecture") == ARCH, field(r, "general.architecture")
        self.k = lambda name, d=None: field(r, f"{ARCH}.{name}", d)  # noqa: E731
        self.t = {x.name: np.array(x.data, dtype=np.float64).reshape([int(n) for n in reversed(x.shape)])
                  for x in r.tensors}
        assert self.k("nextn_predict_layers", 0) == 1, "not an MTP file (nextn_predict_layers != 1)"
        self.il = self.k("block_count") - 1
        assert f"blk.{self.il}.nextn.eh_proj.weight" in self.t, f"blk.{self.il}.nextn.eh_proj.weight is missing"
        self.eps = self.k("attention.layer_norm_rms_epsilon")
        self.hc = self.k("hyper_connection.count")
        self.n = self.k("embedding_length")
        ratios = self.k("attention.compress_ratios")
        self.ratio = ratios[self.il] if isinstance(ratios, list) else ratios
        assert self.ratio > 1, f"compress_ratios[{self.il}] = {self.ratio}: the MTP block is a QSA layer"

    def w(self, name):
        return self.t[f"blk.{self.il}.{name}"]


def hc_mix(f, x, prefix, with_inject):
    """x [T, hc, n] -> the mixed [T, n] (and the [T, hc] inject logits)."""
    T = x.shape[0]
    xn = rms(x, f.w(prefix + "_norm.weight").reshape(f.hc, f.n), f.eps).reshape(T, -1)
    lo = silu((xn @ f.w(prefix + "_down.weight").T) / f.hc)
    g = sigmoid(lo @ f.w(prefix + "_up.weight").T)
    mixed = (xn * g).reshape(T, f.hc, f.n).mean(1)
    return (mixed, xn @ f.w(prefix + "_inject.weight").T) if with_inject else mixed


def combine(f, x, out, inject):
    return x + out[:, None, :] * (2 * sigmoid(inject / f.hc))[:, :, None]


def rope(x, pos, n_rot, theta):
    """NEOX rotation of the first n_rot dims of x [..., d] at positions pos (broadcast on axis 0)."""
    half = n_rot // 2
    ang = np.asarray(pos, dtype=np.float64)[:, None] * theta ** (-np.arange(half) * 2.0 / n_rot)
    shape = (len(ang),) + (1,) * (x.ndim - 2) + (half,)
    c, s = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    a, b = x[..., :half], x[..., half:n_rot]
    return np.concatenate([a * c - b * s, b * c + a * s, x[..., n_rot:]], -1)


def qsa_select(f, x):
    """Per position: the selected complete blocks (sorted) and the smallest selection gap."""
    k = f.k
    n_ih, d = k("attention.indexer.head_count"), k("attention.indexer.key_length")
    n_rot, theta, r = k("rope.dimension_count"), k("rope.freq_base"), f.ratio
    T = x.shape[0]
    iq = rms((x @ f.w("indexer.q_proj.weight").T).reshape(T, n_ih, d), f.w("indexer.q_norm.weight"), f.eps)
    iq = rope(iq, np.arange(T), n_rot, theta)
    raw = x @ f.w("indexer.k_proj.weight").T
    n_blk = T // r
    pooled = rms(raw[:n_blk * r].reshape(n_blk, r, d).mean(1), f.w("indexer.k_norm.weight"), f.eps)
    pooled = rope(pooled, np.arange(n_blk) * r, n_rot, theta)
    top = k("attention.indexer.top_k") // r
    blocks, gaps = [], []
    for i in range(T):
        live = (i + 1) // r
        score = np.maximum(iq[i] @ pooled[:live].T, 0.0).sum(0) / np.sqrt(d)
        order = np.argsort(-score, kind="stable")
        keep = min(live, top)
        if live > keep:
            gaps.append((score[order[keep - 1]] - score[order[keep]]) / max(abs(score[order[0]]), 1e-30))
        blocks.append(sorted(int(b) for b in order[:keep]))
    return blocks, min(gaps) if gaps else 1.0


def qsa(f, x):
    k = f.k
    n_head, n_kv, hd = k("attention.head_count"), k("attention.head_count_kv"), k("attention.key_length")
    n_rot, theta, r = k("rope.dimension_count"), k("rope.freq_base"), f.ratio
    T = x.shape[0]
    qg = (x @ f.w("attn_q.weight").T).reshape(T, n_head, 2 * hd)
    q = rope(rms(qg[..., :hd], f.w("attn_q_norm.weight"), f.eps), np.arange(T), n_rot, theta)
    gate = qg[..., hd:].reshape(T, -1)
    key = rope(rms((x @ f.w("attn_k.weight").T).reshape(T, n_kv, hd), f.w("attn_k_norm.weight"), f.eps),
               np.arange(T), n_rot, theta)
    val = (x @ f.w("attn_v.weight").T).reshape(T, n_kv, hd)
    blocks, gap = qsa_select(f, x)
    out = np.zeros((T, n_head, hd))
    rep = n_head // n_kv
    for i in range(T):
        live = (i + 1) // r
        sel = [b * r + j for b in blocks[i] for j in range(r)] + list(range(live * r, i + 1))
        for h in range(n_head):
            s = key[sel, h // rep] @ q[i, h] / np.sqrt(hd)
            out[i, h] = softmax(s) @ val[sel, h // rep]
    return (out.reshape(T, -1) * sigmoid(gate)) @ f.w("attn_output.weight").T, blocks, gap


def swiglu(x, gate, up, down):
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T


def moe(f, x):
    n_used = f.k("expert_used_count")
    probs = softmax(x @ f.w("ffn_gate_inp.weight").T)
    if f"blk.{f.il}.ffn_gate_up_exps.weight" in f.t:
        gu = f.w("ffn_gate_up_exps.weight")
        ff = gu.shape[1] // 2
        gate, up = gu[:, :ff], gu[:, ff:]
    else:
        gate, up = f.w("ffn_gate_exps.weight"), f.w("ffn_up_exps.weight")
    down = f.w("ffn_down_exps.weight")
    shared = swiglu(x, f.w("ffn_gate_shexp.weight"), f.w("ffn_up_shexp.weight"), f.w("ffn_down_shexp.weight"))
    out = shared * sigmoid(x @ f.w("ffn_gate_inp_shexp.weight").reshape(-1))[:, None]
    routes, gaps = [], []
    for i in range(x.shape[0]):
        order = np.argsort(-probs[i], kind="stable")
        top = order[:n_used]
        gaps.append(probs[i][order[n_used - 1]] - probs[i][order[n_used]])
        wts = probs[i][top] / probs[i][top].sum()
        for e, wt in zip(top, wts):
            out[i] += wt * swiglu(x[i:i + 1], gate[e], up[e], down[e])[0]
        routes.append(sorted(int(e) for e in top))
    return out, routes, min(gaps)


def mtp_input(f, hidden, next_tokens):
    """x [T, hc, n]: eh_proj [enorm(e); hnorm_s(h_s)] per stream."""
    T = hidden.shape[0]
    h = rms(hidden.reshape(T, f.hc, f.n), f.w("nextn.hnorm.weight").reshape(f.hc, f.n), f.eps)
    e = rms(f.t["token_embd.weight"][next_tokens], f.w("nextn.enorm.weight"), f.eps)
    cat = np.concatenate([np.broadcast_to(e[:, None, :], h.shape), h], -1)
    return cat @ f.w("nextn.eh_proj.weight").T


def mtp(f, hidden, next_tokens):
    x = mtp_input(f, hidden.astype(np.float64), next_tokens)
    mix, inject = hc_mix(f, x, "hc_attn", True)
    a, blocks, qsa_gap = qsa(f, mix)
    x = combine(f, x, a, inject)
    mix, inject = hc_mix(f, x, "hc_ffn", True)
    m, routes, router_gap = moe(f, mix)
    x = combine(f, x, m, inject)
    logits = hc_mix(f, x, "nextn.hc_head", False) @ f.t["output.weight"].T
    return logits, routes, blocks, {"router": router_gap, "qsa": qsa_gap}, x.reshape(x.shape[0], -1)


def argmax_gap(row):
    """The greedy token of a logits row and its lead over the runner-up, relative to the largest |logit|."""
    order = np.argsort(-row, kind="stable")
    return int(order[0]), float((row[order[0]] - row[order[1]]) / np.abs(row).max())


def chain(f, hidden, nxt, n):
    """The block's greedy draft chain of n tokens after the rows (hidden, nxt): d_1 from the last
    row; then each step k adds the row (x of the previous row, d_k) at the next position (the block's
    own residual as h, as llama.cpp's draft-mtp chains it) and drafts d_(k+1) from it. Returns the last
    run over every row (causal: its first T rows are the rows' own results), the drafts and their
    smallest argmax lead."""
    h, toks = hidden.astype(np.float64), list(nxt)
    logits, routes, blocks, gap, x = mtp(f, h, toks)
    d, lead = argmax_gap(logits[-1])
    drafts, leads = [d], [lead]
    for _ in range(n - 1):
        h = np.vstack([h, x[-1:]])
        toks.append(drafts[-1])
        logits, routes, blocks, gap, x = mtp(f, h, toks)
        d, lead = argmax_gap(logits[-1])
        drafts.append(d)
        leads.append(lead)
    return logits, routes, blocks, gap, drafts, min(leads)


def hf_glue(path, hidden, next_tokens):
    """The same glue around transformers' own modules, f32: logits, router ids, QSA blocks."""
    import torch
    from transformers.models.qwen4_exp import modeling_qwen4_exp as mq

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hf_qwen4exp

    f = File(path)
    k = f.k
    t = {name: v.astype(np.float32) for name, v in f.t.items()}
    s = dict(recr=[], n_k=1, n_v=1, d_state=1, ratio=f.ratio)
    cfg = mq.Qwen4ExpTextConfig(
        vocab_size=t["token_embd.weight"].shape[0], hidden_size=f.n, num_hidden_layers=1,
        num_attention_heads=k("attention.head_count"), num_key_value_heads=k("attention.head_count_kv"),
        head_dim=k("attention.key_length"), rms_norm_eps=f.eps, layer_types=["indexed_attention"], ple_layer_ids=[],
        rope_parameters={"rope_type": "default", "rope_theta": k("rope.freq_base"),
                         "partial_rotary_factor": k("rope.dimension_count") / k("attention.key_length"),
                         "mrope_section": list(k("rope.dimension_sections"))[:3], "mrope_interleaved": True},
        num_experts=k("expert_count"), num_experts_per_tok=k("expert_used_count"),
        moe_intermediate_size=k("expert_feed_forward_length"),
        shared_expert_intermediate_size=k("expert_shared_feed_forward_length"),
        hc_count=f.hc, hc_lowrank=k("hyper_connection.low_rank"), indexer_n_heads=k("attention.indexer.head_count"),
        indexer_kv_heads=1, indexer_head_dim=k("attention.indexer.key_length"),
        indexer_budget=k("attention.indexer.top_k"), indexer_compress_ratio=f.ratio)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the plain per-expert loop
    layer = mq.Qwen4ExpTextDecoderLayer(cfg, 0).float().eval()
    sd = {}
    # the block's tensors carry layer index f.il; hf_qwen4exp.layer maps blk.{il}.* (QSA kind)
    hf_qwen4exp.layer(t, s, f.il, "", sd)
    il = f"blk.{f.il}."
    for ours, theirs in (("hc_attn", "attn_hyper_connection."), ("hc_ffn", "mlp_hyper_connection.")):
        sd[theirs + "hc_norm.weight"] = t[il + ours + "_norm.weight"].reshape(-1) - 1
        sd[theirs + "input_mix_weight_down.weight"] = t[il + ours + "_down.weight"]
        sd[theirs + "input_mix_weight_up.weight"] = t[il + ours + "_up.weight"]
        sd[theirs + "block_inject_weight.weight"] = t[il + ours + "_inject.weight"]
    layer.load_state_dict({name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in sd.items()})
    head = mq.Qwen4ExpTextGatedResidual(cfg, use_combine=False).float()
    head.load_state_dict({"hc_norm.weight": torch.from_numpy(t[il + "nextn.hc_head_norm.weight"].reshape(-1) - 1),
                          "input_mix_weight_down.weight": torch.from_numpy(t[il + "nextn.hc_head_down.weight"]),
                          "input_mix_weight_up.weight": torch.from_numpy(t[il + "nextn.hc_head_up.weight"])})
    enorm = mq.Qwen4ExpTextRMSNorm(f.n, eps=f.eps)
    enorm.weight.data = torch.from_numpy(t[il + "nextn.enorm.weight"] - 1)
    hnorm = mq.Qwen4ExpTextRMSNorm(f.hc * f.n, group_size=f.n, eps=f.eps)
    hnorm.weight.data = torch.from_numpy(t[il + "nextn.hnorm.weight"].reshape(-1) - 1)
    rot = mq.Qwen4ExpTextRotaryEmbedding(cfg)
    routes, masks = [], []
    layer.mlp.gate.register_forward_hook(lambda mod, inp, out: routes.append(out[2].tolist()))
    layer.self_attn.indexer.register_forward_hook(lambda mod, inp, out: masks.append(out[0, 0].numpy()))
    T = hidden.shape[0]
    with torch.no_grad():
        e = enorm(torch.from_numpy(t["token_embd.weight"][next_tokens]))
        h = hnorm(torch.from_numpy(hidden.astype(np.float32))).reshape(T, f.hc, f.n)
        w = torch.from_numpy(t[il + "nextn.eh_proj.weight"])
        x = torch.cat([e[:, None, :].expand(T, f.hc, f.n), h], -1) @ w.T  # [T, hc, n]
        pos = torch.arange(T).view(1, 1, T).expand(3, 1, T)
        cos_sin = rot(x, pos)
        mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1).view(1, 1, T, T)
        y = layer(x.reshape(1, T, -1), position_embeddings=cos_sin, attention_mask=mask)
        logits = head(y) @ torch.from_numpy(t["output.weight"]).T
    r = f.ratio
    blocks = [sorted({int(p) // r for p in np.nonzero(row)[0] if p < ((q + 1) // r) * r})
              for q, row in enumerate(masks[0])]
    return logits[0].numpy(), [sorted(x) for x in routes[0]], blocks


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    args = sys.argv[1:]
    path, out, specs = args[0], args[1], args[2:]
    check = bool(specs) and specs[0] == "--check-hf"
    specs = specs[1:] if check else specs
    n_chain = 0
    if specs and specs[0] == "--chain":
        n_chain, specs = int(specs[1]), specs[2:]
    f = File(path)
    seqs = []
    for spec in specs:
        hidden_path, tokens, nxt = spec.split(":")
        hidden = np.load(hidden_path)
        tokens = [int(x) for x in tokens.split(",")]
        nxt = [int(x) for x in nxt.split(",")]
        assert hidden.shape == (len(tokens), f.hc * f.n) and len(nxt) == len(tokens), (hidden.shape, len(tokens))
        T = len(tokens)
        if n_chain:
            logits, routes, blocks, gap, drafts, lead = chain(f, hidden, nxt, n_chain)
            if lead < TIE_ARGMAX:
                sys.exit(f"{spec[:40]}...: a draft within the argmax tie band ({lead:.2e}); choose another")
        else:
            logits, routes, blocks, gap, _ = mtp(f, hidden, nxt)
        # A near tie would let two correct implementations pick differently: refuse the sequence.
        if gap["router"] < TIE_ROUTER or gap["qsa"] < TIE_QSA:
            sys.exit(f"{spec[:40]}...: a selection within the tie band ({gap}); choose another sequence")
        if check:
            hl, hr, hb = hf_glue(path, hidden, nxt)
            rel = float(np.abs(hl - logits[:T]).max() / np.abs(logits[:T]).max())
            same_r, same_b = hr == routes[:T], hb == blocks[:T]
            print(f"check-hf: {T} rows: logits rel {rel:.2e}, router ids equal {same_r}, "
                  f"QSA blocks equal {same_b}", file=sys.stderr)
            assert rel < 1e-5 and same_r and same_b, "numpy and transformers' modules disagree"
        rounded = [[float(f"{v:.8g}") for v in row] for row in logits.tolist()]
        seq = {"tokens": tokens, "next_tokens": nxt, "logits": rounded[:T], "router_ids": routes[:T],
               "qsa_blocks": blocks[:T], "min_gap": {k: float(f"{v:.3g}") for k, v in gap.items()}}
        if n_chain:
            seq["chain"] = {"drafts": drafts, "logits": rounded[T:], "router_ids": routes[T:],
                            "qsa_blocks": blocks[T:], "min_argmax_lead": float(f"{lead:.3g}")}
        seqs.append(seq)
    json.dump({"reference": "float64 numpy, llama.cpp b11434 qwen4exp.cpp graph_mtp form "
               "(tests/oracle/numpy_qwen4exp_mtp.py)",
               "file_sha256": sha256(path), "layer": f.il, "sequences": seqs}, open(out, "w"))


if __name__ == "__main__":
    main()
