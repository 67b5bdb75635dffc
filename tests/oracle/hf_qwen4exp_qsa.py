#!/usr/bin/env python3
"""Golden cases of Qwen3.8-Flash-Next's QSA block selection (`Op::KPoolSelect` with the
`MeanNormRope` pooling), computed by transformers 5.24's own `Qwen4ExpTextQSAIndexer` (nothing
re-derived here), as a JSON golden for bloomery's KPoolSelect kernels.

Per case: one indexer with random weights (its q/k RMSNorm gammas random too; the key projection's
rows are the mean of the query heads' rows plus noise, as make_qwen4exp_tiny.py does, so that few
blocks score exactly zero), run by its own forward on random hidden states of one sequence from
position 0, with transformers' rotary embedding of the model (head_dim 256, partial rotary factor
0.25: the first 64 of the indexer's 128 dims, theta 1e7) and an eager causal mask. Recorded:
  * `q`: the indexer queries after their RMSNorm and rope (the first apply_rotary_pos_emb call),
    [rows, n_head, dh];
  * `raw_keys`: the key projection's output (what the cache stores), [rows, dh];
  * `k_norm`: the k RMSNorm's gamma as llama.cpp's converter stores it (1 + weight);
  * `selected`: per row, the positions the row's selection mask holds, ascending;
  * `min_gap`: the smallest gap between the last kept and the first dropped block score of any row
    that drops blocks, relative to that row's best score (scores recorded from the forward's
    torch.relu calls); a case below 1e-4 is refused (a tie band where orders may differ).
Floats are written with 9 significant digits (they read back as the same f32).

usage: hf_qwen4exp_qsa.py OUT.json
"""
import json
import math
import sys

import torch

from transformers.models.qwen4_exp import modeling_qwen4_exp as m
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

TIE = 1e-4


def flat(t):
    return [float(f"{v:.9g}") for v in t.detach().to(torch.float32).reshape(-1).tolist()]


def case(name, rows, budget, ratio, seed):
    g = torch.Generator().manual_seed(seed)
    cfg = Qwen4ExpTextConfig(
        vocab_size=272, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=256, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=1, linear_num_value_heads=2, moe_intermediate_size=8,
        shared_expert_intermediate_size=8, num_experts=4, num_experts_per_tok=2, hc_count=4,
        hc_lowrank=16, ple_layer_ids=[], indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=128,
        indexer_budget=budget, indexer_compress_ratio=ratio, eos_token_id=270, rms_norm_eps=1e-6,
        layer_types=["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10]})
    idx = m.Qwen4ExpTextQSAIndexer(cfg, 0).float().eval()
    nh, dh = cfg.indexer_n_heads, cfg.indexer_head_dim
    with torch.no_grad():
        w = 0.3 * torch.randn(idx.index_qk_proj.weight.shape, generator=g)
        q_rows = w[: nh * dh].reshape(nh, dh, -1)
        w[nh * dh:] = q_rows.mean(0) + 0.05 * torch.randn(w[nh * dh:].shape, generator=g)
        idx.index_qk_proj.weight.copy_(w)
        idx.q_layernorm.weight.copy_(0.2 * torch.randn(dh, generator=g))
        idx.k_layernorm.weight.copy_(0.2 * torch.randn(dh, generator=g))
    x = torch.randn((1, rows, cfg.hidden_size), generator=g)
    pos = torch.arange(rows).unsqueeze(0)
    rotary = m.Qwen4ExpTextRotaryEmbedding(cfg)
    cos, sin = rotary(x, pos)
    mask = torch.full((rows, rows), float("-inf")).triu(1).reshape(1, 1, rows, rows)

    got = {"rope": [], "relu": []}
    rope, relu = m.apply_rotary_pos_emb, torch.relu

    def rec_rope(*a, **k):
        out = rope(*a, **k)
        got["rope"].append(out)
        return out

    def rec_relu(t):
        out = relu(t)
        got["relu"].append(out)
        return out

    idx.index_qk_proj.register_forward_hook(lambda mod, a, out: got.__setitem__("qk", out))
    m.apply_rotary_pos_emb, torch.relu = rec_rope, rec_relu
    try:
        with torch.no_grad():
            sel = idx(x, (cos, sin), mask, None)
    finally:
        m.apply_rotary_pos_emb, torch.relu = rope, relu
    q = got["rope"][0]
    raw_keys = got["qk"][..., nh * dh:]
    selected = [torch.nonzero(sel[0, 0, r]).flatten().tolist() for r in range(rows)]
    # The rows that score blocks, in order, each relu output [blocks, heads].
    block_topk = budget // ratio
    gaps = []
    for r_out in got["relu"]:
        scores = r_out.sum(dim=-1) / math.sqrt(dh)
        if scores.numel() > block_topk:
            s = scores.sort(descending=True).values
            gaps.append(float((s[block_topk - 1] - s[block_topk]) / s[0]))
    min_gap = min(gaps) if gaps else 1.0
    assert min_gap >= TIE, f"{name}: a block score gap of {min_gap:.2e} is inside the tie band"
    return {"name": name, "rows": rows, "n_head": nh, "head_dim": dh, "budget": budget,
            "ratio": ratio, "rope_dims": cos.shape[-1], "rope_base": 1e7, "eps": cfg.rms_norm_eps,
            "q": flat(q), "raw_keys": flat(raw_keys), "k_norm": flat(1.0 + idx.k_layernorm.weight),
            "selected": selected, "min_gap": min_gap}


def main():
    cases = [case("37 rows, budget 16, ratio 4", 37, 16, 4, 3),
             case("22 rows, budget 8, ratio 2", 22, 8, 2, 4)]
    json.dump({"reference": "transformers 5.24.0 qwen4_exp Qwen4ExpTextQSAIndexer", "cases": cases},
              open(sys.argv[1], "w"))


if __name__ == "__main__":
    main()
