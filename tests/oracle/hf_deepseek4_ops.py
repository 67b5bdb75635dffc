#!/usr/bin/env python3
"""Golden cases of the ops DeepSeek-V4's forward pass adds to the ABI (issue 49), computed by
transformers 5.24's own `deepseek_v4` modules (nothing re-derived here), as a JSON golden for
bloomery's Rope (dimension offset, inverse), GetRows of an i32 table, Compress, CompSelect and
Attention with compressed rows.

The widths are the tiny file's (`make_deepseek4_tiny.py`): hidden 64, heads of 128 with a 16-dim
rope tail, indexer 16 heads of 64, q_lora 32, θ 1e4 (main) and 1.6e5 with YaRN ×16 from 65,536
(compress), rms eps 1e-6. Every module's weights are random (norm gammas too).

* `rope`: `DeepseekV4RotaryEmbedding` + `apply_rotary_pos_emb` on random heads `x` [rows, H, d]
  at positions `pos`, for the "main" and "compress" rope types, forward (`cos, sin`) and inverse
  (`cos, -sin`, as `DeepseekV4Attention` undoes the rope on its output).
* `hash`: `DeepseekV4HashRouter` (a random `tid2eid` [vocab, k]) on random tokens: its indices.
* `compress`: `DeepseekV4CSACompressor` (ratio 4, two series) and `DeepseekV4HCACompressor`
  (ratio 128) called without a cache on hidden states `x` [rows, n] (one sequence from position
  0): the compressed rows (normed, roped at j·ratio), and the `kv_proj` / `gate_proj` outputs and
  `position_bias` that bloomery's op takes as inputs. The CSA case also gives its indexer's
  compressed keys, roped queries `q_I` (inputs), weights `weights_proj(x)` (input, before the
  scaling), the scores of `DeepseekV4IndexerScorer` and the top-k ids the indexer returns.
  Then the HCA compressor at DeepSeek-V4.1's ratios 2 (37 rows) and 1 (20 rows), through
  `compress_rates` (V4.1's compressor as issue 49 describes it: a softmax-gated sum of `ratio`
  tokens, then the norm; one series, `docs/deepseek41-plan.md`).
* `v41_keys`: DeepSeek-V4.1's index keys at ratios 2 and 1 (`v41_keys_case`): the compressor's
  normed rows before the rope, and keys made from them through `wk`, the key norm and the rope.
* `attention`: `DeepseekV4Attention` (eager) of a CSA layer (150 rows) and an HCA layer (300 rows)
  called as `DeepseekV4Model` calls it (its rotary embedding and sliding-window mask, no cache):
  the roped queries, the window rows and compressed rows, the sinks, the compressed rows' mask
  and the output, as `eager_attention_forward` receives and returns them (before the inverse
  rope), kept for some query rows only.

Tensors are written flat in torch's memory order, which is ggml's (`[rows, H, d]` is bloomery's
`[d, H, rows]`). Floats are written with 9 significant digits (they read back as the same f32).

usage: hf_deepseek4_ops.py OUT.json
"""
import json
import sys

import torch

import transformers
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

N, H, D, R, QL = 64, 8, 128, 16, 32
IH, ID, TOPK = 16, 64, 8
EPS = 1e-6


def flat(t):
    return [float(f"{v:.9g}") for v in t.detach().to(torch.float32).reshape(-1).tolist()]


def ints(t):
    return [int(v) for v in t.reshape(-1).tolist()]


def config(n_layer_types, compress_rates=None):
    return transformers.DeepseekV4Config(
        compress_rates=compress_rates,
        vocab_size=320, hidden_size=N, moe_intermediate_size=32, num_hidden_layers=len(n_layer_types),
        num_attention_heads=H, num_key_value_heads=1, head_dim=D, q_lora_rank=QL,
        num_experts_per_tok=6, n_routed_experts=16, n_shared_experts=1, scoring_func="sqrtsoftplus",
        norm_topk_prob=True, routed_scaling_factor=1.5, max_position_embeddings=4096,
        rope_theta=1e4, layer_types=n_layer_types, compress_rope_theta=160000.0,
        mlp_layer_types=["hash_moe"] * len(n_layer_types), sliding_window=128, o_groups=4,
        o_lora_rank=16, index_n_heads=IH, index_head_dim=ID, index_topk=TOPK, rms_norm_eps=EPS,
        partial_rotary_factor=R / D, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32.0, "beta_slow": 1.0},
    )


def randomize(module, g, scale):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g))


def rope_cases(cfg, g):
    emb = m.DeepseekV4RotaryEmbedding(cfg)
    out = []
    for kind, rows in (("main", 9), ("compress", 7)):
        pos = torch.randint(0, 600, (1, rows), generator=g)
        pos[0, 0] = 0
        x = torch.randn((1, rows, H, D), generator=g)
        cos, sin = emb(x, position_ids=pos, layer_type=kind)
        fwd = m.apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=2)
        inv = m.apply_rotary_pos_emb(x, cos, -sin, unsqueeze_dim=2)
        out.append({"kind": kind, "rows": rows, "pos": ints(pos), "x": flat(x), "fwd": flat(fwd),
                    "inv": flat(inv)})
    return out


def hash_case(cfg, g):
    router = m.DeepseekV4HashRouter(cfg)
    randomize(router, g, 0.3)
    with torch.no_grad():
        router.tid2eid.copy_(torch.randint(0, cfg.n_routed_experts, router.tid2eid.shape, generator=g))
    tokens = torch.randint(0, cfg.vocab_size, (1, 11), generator=g)
    x = torch.randn((1, 11, N), generator=g)
    with torch.no_grad():
        _, _, ids = router(x.reshape(-1, N), tokens)
    return {"vocab": cfg.vocab_size, "k": cfg.num_experts_per_tok, "table": ints(router.tid2eid),
            "tokens": ints(tokens), "ids": ints(ids)}


def hooked(module, name, store):
    def hook(_m, _args, output):
        store[name] = output.detach().clone()
    return module.register_forward_hook(hook)


def compress_case(layer_type, rows, g, compress_rates=None):
    cfg = config([layer_type], compress_rates)
    cls = m.COMPRESSOR_CLASSES[layer_type]
    comp = cls(cfg).float().eval()
    randomize(comp, g, 0.3)
    x = torch.randn((1, rows, N), generator=g)
    q_residual = torch.randn((1, rows, QL), generator=g)
    pos = torch.arange(rows).unsqueeze(0)
    store = {}
    hooks = [hooked(comp.kv_proj, "kv", store), hooked(comp.gate_proj, "score", store)]
    case = {"layer_type": layer_type, "rows": rows, "ratio": comp.compress_rate}
    if layer_type == "compressed_sparse_attention":
        idx = comp.indexer
        hooks += [hooked(idx.kv_proj, "i_kv", store), hooked(idx.gate_proj, "i_score", store),
                  hooked(idx.scorer.weights_proj, "i_w", store), hooked(idx.scorer, "i_scores", store)]
        # The roped queries and the compressed index keys are the scorer's first two inputs.
        hooks.append(idx.scorer.register_forward_pre_hook(
            lambda _m, args: store.update(i_q=args[0].detach().clone(), i_keys=args[1].detach().clone())))
    with torch.no_grad():
        compressed, _ = comp(x, q_residual, pos, None, 0)
        if layer_type == "compressed_sparse_attention":
            store["i_ids"] = comp.indexer(x, q_residual, pos, None, 0)
    for h in hooks:
        h.remove()
    case.update(kv=flat(store["kv"]), score=flat(store["score"]), ape=flat(comp.position_bias),
                norm=flat(comp.kv_norm.weight), compressed=flat(compressed),
                n_compressed=int(compressed.shape[2]))
    if layer_type == "compressed_sparse_attention":
        idx = comp.indexer
        case.update(i_kv=flat(store["i_kv"]), i_score=flat(store["i_score"]),
                    i_ape=flat(idx.position_bias), i_norm=flat(idx.kv_norm.weight),
                    i_keys=flat(store["i_keys"]), i_q=flat(store["i_q"]), i_w=flat(store["i_w"]),
                    i_scale=idx.scorer.softmax_scale * idx.scorer.weights_scaling,
                    i_scores=flat(store["i_scores"]), i_ids=ints(store["i_ids"]))
        margin = ranking_margin(store["i_scores"], comp.compress_rate, idx.index_topk)
        print(f"{layer_type}: least relative gap between ranked index scores {margin:.2e}")
        if margin < 1e-4:
            raise SystemExit(f"index scores {margin:.1e} apart: a near tie, pick another seed")
    return case


def attention_case(layer_type, rows, kept, g):
    """`DeepseekV4Attention` (eager) of a compressed layer on random hidden states, called as
    `DeepseekV4Model` calls it (its rope and sliding-window mask): what the core attention
    receives and returns (recorded around `eager_attention_forward`), and the compressed rows'
    visibility (the block bias, −inf or 0 per query row and compressed row), for the query rows
    at positions `kept` only (the golden's size)."""
    from transformers.masking_utils import create_sliding_window_causal_mask
    cfg = config([layer_type])
    cfg._attn_implementation = "eager"
    attn = m.DeepseekV4Attention(cfg, 0).float().eval()
    randomize(attn, g, 0.3)
    emb = m.DeepseekV4RotaryEmbedding(cfg)
    x = torch.randn((1, rows, N), generator=g)
    pos = torch.arange(rows).unsqueeze(0)
    mask = create_sliding_window_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None,
                                             cache=None, position_ids=pos)
    pe = {k: emb(x, position_ids=pos, layer_type=k) for k in ("main", "compress")}
    seen = {}
    eager = m.eager_attention_forward

    def record(module, query, key, value, attention_mask, **kwargs):
        out, w = eager(module, query, key, value, attention_mask, **kwargs)
        seen.update(q=query, k=key, mask=attention_mask, out=out)
        return out, w

    m.eager_attention_forward = record
    try:
        with torch.no_grad():
            attn(x, pe, pos, mask, None)
    finally:
        m.eager_attention_forward = eager
    k = seen["k"][0, 0]  # [rows + T, d]: the window rows (all rows, no cache) then the compressed
    n_comp = k.shape[0] - rows
    comp_mask = seen["mask"][0, 0, kept, rows:]  # [kept, T]
    return {"layer_type": layer_type, "rows": rows, "window": cfg.sliding_window, "kept": kept,
            "n_compressed": n_comp, "q": flat(seen["q"].transpose(1, 2)[0, kept]),
            "kv": flat(k[:rows]), "compressed": flat(k[rows:]), "sinks": flat(attn.sinks),
            "comp_visible": ints((comp_mask == 0).to(torch.int32)),
            "out": flat(seen["out"][0, kept]), "scale": attn.scaling}


def ranking_margin(scores, ratio, top_k):
    """The least gap, relative to the row's best score, between neighbours among each row's
    `top_k + 1` best visible rows: the ids are compared exactly, so near ties are refused."""
    least = float("inf")
    for p, row in enumerate(scores[0]):
        visible = (p + 1) // ratio
        v = row[:visible].sort(descending=True).values[: top_k + 1]
        if len(v) > 1:
            least = min(least, float(((v[:-1] - v[1:]) / v[0].abs()).min()))
    return least


def v41_keys_case(ratio, rows, g):
    """DeepSeek-V4.1's index keys (docs/deepseek41-plan.md, S6): the HCA compressor at V4.1's
    `ratio`, its normed rows before the rope (the output of its `kv_norm`, hooked), then a random
    `wk` [head_dim -> index_dim], transformers' `DeepseekV4RMSNorm` with a random `k_norm` and
    the compressor's own "compress" rope at j·ratio (`apply_rotary_pos_emb`), as the compressor
    ropes its rows. Inputs kv, score, norm (no position bias: zeros), wk; outputs plain, keys."""
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": ratio}
    cfg = config(["heavily_compressed_attention"], rates)
    comp = m.DeepseekV4HCACompressor(cfg).float().eval()
    randomize(comp, g, 0.3)
    with torch.no_grad():
        comp.position_bias.zero_()
    wk = torch.nn.Linear(D, ID, bias=False)
    k_norm = m.DeepseekV4RMSNorm(ID, eps=cfg.rms_norm_eps).float()
    randomize(wk, g, 0.3)
    randomize(k_norm, g, 0.3)
    x = torch.randn((1, rows, N), generator=g)
    q_residual = torch.randn((1, rows, QL), generator=g)
    pos = torch.arange(rows).unsqueeze(0)
    store = {}
    hooks = [hooked(comp.kv_proj, "kv", store), hooked(comp.gate_proj, "score", store),
             hooked(comp.kv_norm, "plain", store)]
    with torch.no_grad():
        compressed, _ = comp(x, q_residual, pos, None, 0)
        plain = store["plain"]
        n_out = plain.shape[1]
        keys = k_norm(wk(plain))
        at = (torch.arange(n_out) * ratio).unsqueeze(0)
        cos, sin = comp.rotary_emb(keys, position_ids=at, layer_type="compress")
        keys = apply_rope(keys, cos, sin)
    for h in hooks:
        h.remove()
    return {"ratio": ratio, "rows": rows, "n_compressed": n_out, "kv": flat(store["kv"]),
            "score": flat(store["score"]), "norm": flat(comp.kv_norm.weight),
            "compressed": flat(compressed), "plain": flat(plain), "wk": flat(wk.weight),
            "k_norm": flat(k_norm.weight), "keys": flat(keys)}


def apply_rope(x, cos, sin):
    """transformers' `apply_rotary_pos_emb` on rows `x` [1, n, d] (one head)."""
    return m.apply_rotary_pos_emb(x.unsqueeze(1), cos, sin).squeeze(1)


def main():
    g = torch.Generator().manual_seed(49)
    cfg = config(["sliding_attention"])
    golden = {
        "reference": f"transformers {transformers.__version__} deepseek_v4 modules",
        "n_embd": N, "n_head": H, "head_dim": D, "rope_dims": R, "index_heads": IH, "index_dim": ID,
        "top_k": TOPK, "eps": EPS, "rope_theta": 1e4, "compress_theta": 160000.0, "yarn_factor": 16.0,
        "yarn_orig_ctx": 65536,
        "rope": rope_cases(cfg, g),
        "hash": hash_case(cfg, g),
        "compress": [compress_case("compressed_sparse_attention", 37, g),
                     compress_case("heavily_compressed_attention", 300, g)],
        "attention": [attention_case("compressed_sparse_attention", 150,
                                     [0, 1, 3, 4, 7, 8, 35, 36, 100, 127, 128, 129, 149], g),
                      attention_case("heavily_compressed_attention", 300,
                                     [0, 126, 127, 128, 129, 200, 254, 255, 256, 299], g)],
    }
    # DeepSeek-V4.1's ratios (2 on layers 2-19, 1 on 20-39; docs/deepseek41-plan.md) through V4's
    # single-series compressor, drawn after every V4 case so those stay as they were.
    for ratio, rows in ((2, 37), (1, 20)):
        rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": ratio}
        golden["compress"].append(compress_case("heavily_compressed_attention", rows, g, rates))
    golden["v41_keys"] = [v41_keys_case(ratio, rows, g) for ratio, rows in ((2, 37), (1, 20))]
    with open(sys.argv[1], "w") as f:
        json.dump(golden, f)


if __name__ == "__main__":
    main()
