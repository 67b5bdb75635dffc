#!/usr/bin/env python3
"""Reference scores of a Clef joint schema head, for host/tests/clef_head.rs.

Reads the decision head of a `clef` GGUF (bloomery's synthetic tiny clef file) with the `gguf`
package, makes one fixed request layout (prompt rows drawn from a seeded generator, three questions
of each type with their option spans), and computes every option's score twice:

  * in float64 numpy, written from the published math (llama.cpp b11434 src/models/clef.cpp,
    conversion/clef.py: LayerNorm eps 1e-5, six projections, type rows, routing blocks with
    pre-norm cross-attention over the LayerNorm'd memory and an erf-GELU FFN, the option summary,
    torch-style decoder layers, the residual scorer, logit = P*prior + g*(J*cos + r));
  * in float64 torch, with torch's own nn.MultiheadAttention (routing blocks) and
    nn.TransformerDecoderLayer(norm_first=True, activation="gelu") (decoder blocks) loaded from
    the head's tensors under the safetensors names (packed in_proj), the rest as plain tensor ops.

The two must agree within 1e-9 (else the script fails). Writes the golden JSON (inputs and numpy
scores) and, with --safetensors DIR, the head as joint_head.safetensors + joint_head_config.json
(torch names, raw scalars: the inverse of the converter's transform), the form bloomery's
--decision-head reads.

usage: clef_head.py CLEF.gguf OUT.json [--safetensors DIR]
"""

import argparse
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader

EPS = 1e-5
SEED = 44
N_ROWS = 24
# (type, question span, option spans): noul 0, choice 1, score 2
LAYOUT = [
    (1, (2, 5), [(5, 7), (7, 8), (8, 10)]),
    (0, (11, 13), [(13, 15), (15, 17)]),
    (2, (17, 18), [(18, 19), (19, 21), (21, 22), (22, 23)]),
]


def load_head(path):
    r = GGUFReader(path)
    t = {}
    for x in r.tensors:
        name = x.name
        if name.startswith("decision.") or name.startswith("dec.blk.") or name in (
            "token_types.weight",
            "output.weight",
            "token_embd.weight",
        ):
            shape = [int(d) for d in reversed(x.shape.tolist())]
            t[name] = np.array(x.data, dtype=np.float64).reshape(shape)
    kv = {f.name: f for f in r.fields.values()}

    def u32(key):
        f = kv[key]
        return int(f.parts[f.data[0]][0])

    hp = {
        "routing": u32("clef.decision.routing_block_count"),
        "joint": u32("clef.decision.block_count"),
        "heads": u32("clef.decision.head_count"),
    }
    return t, hp


def ln(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + EPS) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def l2n(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def numpy_head(t, hp, hidden, tokens):
    """Scores of every option, float64 numpy, from the published math."""
    heads = hp["heads"]
    n = lambda p, x: ln(x, t[p + ".weight"], t[p + ".bias"])
    lin = lambda p, x: x @ t[p + ".weight"].T + t[p + ".bias"]
    proj = lambda p, x: x @ t[f"decision.{p}.weight"].T

    def mha(p, q, kv):
        h = q.shape[-1]
        d = h // heads
        Q, K, V = lin(p + "q", q), lin(p + "k", kv), lin(p + "v", kv)
        out = np.zeros_like(Q)
        for i in range(heads):
            s = slice(i * d, (i + 1) * d)
            a = softmax(Q[:, s] @ K[:, s].T / math.sqrt(d))
            out[:, s] = a @ V[:, s]
        return lin(p + "o", out)

    def ffn(p, x):
        return lin(p + "ffn_down", gelu(lin(p + "ffn_up", n(p + "ffn_norm", x))))

    out_table = t.get("output.weight", t.get("token_embd.weight"))
    hn = n("decision.hidden_norm", hidden)
    memory = proj("proj_memory", hn)
    glob = hn[-1]
    question = np.stack([hn[s:e].mean(0) for _, (s, e), _ in LAYOUT])
    spans = [(qi, s, e) for qi, (_, _, opts) in enumerate(LAYOUT) for (s, e) in opts]
    owner = np.array([qi for qi, _, _ in spans])
    opt_ctx = np.stack([hn[s:e].mean(0) for _, s, e in spans])
    lexical = np.stack([out_table[tokens[s:e]].mean(0) for _, s, e in spans])
    options = (
        proj("proj_option_context", opt_ctx)
        + proj("proj_option_lexical", lexical)
        + proj("proj_option_question", question)[owner]
    )
    for i in range(hp["routing"]):
        p = f"dec.blk.{i}."
        options = options + mha(
            p + "cross_attn_", n(p + "cross_attn_norm", options), n(p + "cross_attn_norm_kv", memory)
        )
        options = options + ffn(p, options)
    width = options.shape[-1]
    fields = proj("proj_question", question)
    w = fields @ options.T / math.sqrt(width)
    w = np.where(owner[None, :] == np.arange(len(LAYOUT))[:, None], w, -np.inf)
    summary = softmax(w) @ options
    types = np.array([ty for ty, _, _ in LAYOUT])
    fields = (
        fields
        + n("decision.option_summary_norm", summary)
        + proj("proj_global", glob)
        + t["token_types.weight"][types]
    )
    for i in range(hp["routing"], hp["routing"] + hp["joint"]):
        p = f"dec.blk.{i}."
        x = n(p + "attn_norm", fields)
        fields = fields + mha(p + "attn_", x, x)
        fields = fields + mha(p + "cross_attn_", n(p + "cross_attn_norm", fields), memory)
        fields = fields + ffn(p, fields)
    fields = n("decision.field_norm", fields)
    anchor = l2n(question + glob)[owner]
    prior = (l2n(lexical) * anchor).sum(-1)
    opt = n("decision.option_norm", options)
    f = fields[owner]
    cos = (l2n(f) * l2n(opt)).sum(-1)
    feat = np.concatenate([f, opt, f * opt, np.abs(f - opt)], -1)
    r = lin("decision.scorer_out", gelu(lin("decision.scorer", feat)))[:, 0]
    P, J, g = t["decision.scales"]
    return P * prior + g * (J * cos + r)


def torch_state(t, hp):
    """The head's tensors under the safetensors names (torch layout), scalars raw."""
    R = hp["routing"]
    st = {}
    glob = {
        "hidden_norm": "decision.hidden_norm",
        "memory_projection": "decision.proj_memory",
        "question_projection": "decision.proj_question",
        "option_question_projection": "decision.proj_option_question",
        "global_projection": "decision.proj_global",
        "option_context_projection": "decision.proj_option_context",
        "option_lexical_projection": "decision.proj_option_lexical",
        "option_summary_norm": "decision.option_summary_norm",
        "field_norm": "decision.field_norm",
        "option_norm": "decision.option_norm",
        "residual_scorer.0": "decision.scorer",
        "residual_scorer.3": "decision.scorer_out",
        "type_embedding": "token_types",
    }
    for k, v in glob.items():
        for s in ("weight", "bias"):
            if f"{v}.{s}" in t:
                st[f"{k}.{s}"] = t[f"{v}.{s}"]

    def attn(dst, src):
        for s in ("weight", "bias"):
            st[f"{dst}.in_proj_{s}"] = np.concatenate([t[f"{src}{x}.{s}"] for x in "qkv"], 0)
            st[f"{dst}.out_proj.{s}"] = t[f"{src}o.{s}"]

    def copy(dst, src):
        for s in ("weight", "bias"):
            st[f"{dst}.{s}"] = t[f"{src}.{s}"]

    for i in range(R):
        p, d = f"dec.blk.{i}.", f"evidence_layers.{i}."
        copy(d + "query_norm", p + "cross_attn_norm")
        copy(d + "memory_norm", p + "cross_attn_norm_kv")
        attn(d + "attention", p + "cross_attn_")
        copy(d + "feedforward_norm", p + "ffn_norm")
        copy(d + "feedforward.0", p + "ffn_up")
        copy(d + "feedforward.3", p + "ffn_down")
    for j in range(hp["joint"]):
        p, d = f"dec.blk.{R + j}.", f"layers.{j}."
        copy(d + "norm1", p + "attn_norm")
        attn(d + "self_attn", p + "attn_")
        copy(d + "norm2", p + "cross_attn_norm")
        attn(d + "multihead_attn", p + "cross_attn_")
        copy(d + "norm3", p + "ffn_norm")
        copy(d + "linear1", p + "ffn_up")
        copy(d + "linear2", p + "ffn_down")
    P, J, g = t["decision.scales"]
    st["prior_logit_scale"] = np.array(math.log(P))
    st["joint_logit_scale"] = np.array(math.log(J))
    st["residual_gate"] = np.array(math.log(g / (1.0 - g)))
    return st


def torch_head(st, hp, out_table, hidden, tokens):
    """Scores of every option, float64 torch with torch's attention and decoder layers."""
    T = lambda x: torch.tensor(np.asarray(x), dtype=torch.float64)
    heads, R = hp["heads"], hp["routing"]
    width = st["memory_projection.weight"].shape[0]
    n_ff = st["layers.0.linear1.weight"].shape[0] if hp["joint"] else st["evidence_layers.0.feedforward.0.weight"].shape[0]

    def norm(p, x):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), T(st[p + ".weight"]), T(st[p + ".bias"]), EPS)

    def lin(p, x):
        return torch.nn.functional.linear(x, T(st[p + ".weight"]), T(st[p + ".bias"]) if p + ".bias" in st else None)

    def load(module, prefix):
        sd = {k[len(prefix):]: T(v) for k, v in st.items() if k.startswith(prefix)}
        module.load_state_dict(sd, strict=True)
        return module.double().eval()

    with torch.no_grad():
        H = T(hidden)
        hn = norm("hidden_norm", H)
        memory = lin("memory_projection", hn)
        glob = hn[-1]
        question = torch.stack([hn[s:e].mean(0) for _, (s, e), _ in LAYOUT])
        spans = [(qi, s, e) for qi, (_, _, opts) in enumerate(LAYOUT) for (s, e) in opts]
        owner = torch.tensor([qi for qi, _, _ in spans])
        opt_ctx = torch.stack([hn[s:e].mean(0) for _, s, e in spans])
        table = T(out_table)
        lexical = torch.stack([table[tokens[s:e]].mean(0) for _, s, e in spans])
        options = (
            lin("option_context_projection", opt_ctx)
            + lin("option_lexical_projection", lexical)
            + lin("option_question_projection", question)[owner]
        )
        for i in range(R):
            p = f"evidence_layers.{i}."
            mha = load(torch.nn.MultiheadAttention(width, heads, batch_first=True), p + "attention.")
            q = norm(p + "query_norm", options)[None]
            kv = norm(p + "memory_norm", memory)[None]
            options = options + mha(q, kv, kv, need_weights=False)[0][0]
            ff = norm(p + "feedforward_norm", options)
            ff = lin(p + "feedforward.3", torch.nn.functional.gelu(lin(p + "feedforward.0", ff)))
            options = options + ff
        fields = lin("question_projection", question)
        w = fields @ options.T / math.sqrt(width)
        mask = owner[None, :] == torch.arange(len(LAYOUT))[:, None]
        w = torch.where(mask, w, torch.tensor(-math.inf, dtype=torch.float64))
        summary = torch.softmax(w, -1) @ options
        types = torch.tensor([ty for ty, _, _ in LAYOUT])
        fields = fields + norm("option_summary_norm", summary) + lin("global_projection", glob) + T(st["type_embedding.weight"])[types]
        for j in range(hp["joint"]):
            layer = torch.nn.TransformerDecoderLayer(
                width, heads, dim_feedforward=n_ff, dropout=0.0, activation="gelu",
                layer_norm_eps=EPS, batch_first=True, norm_first=True,
            )
            layer = load(layer, f"layers.{j}.")
            fields = layer(fields[None], memory[None])[0]
        fields = norm("field_norm", fields)
        l2 = lambda x: torch.nn.functional.normalize(x, dim=-1, eps=1e-12)
        prior = (l2(lexical) * l2(question + glob)[owner]).sum(-1)
        opt = norm("option_norm", options)
        f = fields[owner]
        cos = (l2(f) * l2(opt)).sum(-1)
        feat = torch.cat([f, opt, f * opt, (f - opt).abs()], -1)
        r = lin("residual_scorer.3", torch.nn.functional.gelu(lin("residual_scorer.0", feat)))[:, 0]
        cap = lambda s: math.exp(min(float(s), math.log(100.0)))
        P, J = cap(st["prior_logit_scale"]), cap(st["joint_logit_scale"])
        g = 1.0 / (1.0 + math.exp(-float(st["residual_gate"])))
        return (P * prior + g * (J * cos + r)).numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--safetensors")
    a = ap.parse_args()
    t, hp = load_head(a.gguf)
    out_table = t.get("output.weight", t.get("token_embd.weight"))
    rng = np.random.default_rng(SEED)
    n_embd = t["decision.hidden_norm.weight"].shape[0]
    hidden = rng.standard_normal((N_ROWS, n_embd)).astype(np.float32).astype(np.float64)
    tokens = rng.integers(0, out_table.shape[0], N_ROWS)
    ours = numpy_head(t, hp, hidden, tokens)
    st = torch_state(t, hp)
    theirs = torch_head(st, hp, out_table, hidden, tokens)
    diff = np.abs(ours - theirs).max()
    print(f"numpy f64 vs torch f64 (MultiheadAttention, TransformerDecoderLayer): max |d| {diff:.2e}")
    assert diff < 1e-9, diff
    golden = {
        "file_sha256": hashlib.sha256(Path(a.gguf).read_bytes()).hexdigest(),
        "n_embd": n_embd,
        "tokens": tokens.tolist(),
        "hidden": hidden.astype(np.float32).reshape(-1).tolist(),
        "questions": [{"kind": ty, "start": s, "end": e} for ty, (s, e), _ in LAYOUT],
        "options": [
            {"question": qi, "start": s, "end": e}
            for qi, (_, _, opts) in enumerate(LAYOUT)
            for (s, e) in opts
        ],
        "scores": ours.tolist(),
        "scores_torch": theirs.tolist(),
    }
    Path(a.out).write_text(json.dumps(golden) + "\n")
    print(f"wrote {a.out}: {len(ours)} scores {np.round(ours, 4).tolist()}")
    if a.safetensors:
        from safetensors.numpy import save_file

        d = Path(a.safetensors)
        d.mkdir(parents=True, exist_ok=True)
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in st.items()}, d / "joint_head.safetensors")
        cfg = {"routing_layers": hp["routing"], "layers": hp["joint"], "heads": hp["heads"]}
        (d / "joint_head_config.json").write_text(json.dumps(cfg) + "\n")
        print(f"wrote {d}/joint_head.safetensors and joint_head_config.json")


if __name__ == "__main__":
    main()
