#!/usr/bin/env python3
"""Golden cases of GLM-5.3's hyper-connection ops (mHC) and clamped SwiGLU, computed by
transformers 5.24's own `glm5_next` modules (nothing re-derived here), as a JSON golden for
bloomery's Sinkhorn, StreamMix, StreamUpdate and Glu kernels.

Per case (random inputs; n = hc_mult streams of n_embd values, `rows` tokens):
  * one `Glm5NextTextDecoderLayer` with random hyper-connection weights (`attn_hc.fn`, `base`,
    `scale`), its norms replaced by identities, its attention by a stub that returns a fixed
    random block output `y` and its feed-forward by a zero stub. The layer's own forward then
    computes, from the input streams:
      - the Sinkhorn input: the argument of the `torch.softmax` call inside
        `Glm5NextTextHyperConnection.forward` (recorded by wrapping torch.softmax for that call),
        i.e. `comb_w * comb_scale + comb_b`, [rows, n, n];
      - `pre` (the first `torch.sigmoid` output there, plus hc_eps as that code adds it) and
        `collapsed`, the block input: StreamMix(streams, pre);
      - `post` and `comb` (the Sinkhorn result), as `attn_hc` returns them;
      - the attention half's updated streams, the input of `ffn_hc` (a forward pre-hook):
        StreamUpdate(streams, comb, post, y).
  * `Glm5NextTextHyperHead` (the final stream mean) of the input streams.
  * `Glm5NextTextExperts._apply_gate` (clamped SwiGLU, swiglu_limit) of random gate | up values.

Tensors are written flat in torch's memory order, which is ggml's: comb [rows, n(src), n(dst)]
with dst contiguous is bloomery's `[n, n, rows]` with element (i = dst, j = src) at i + n*j.
Floats are written with 9 significant digits (they read back as the same f32).

usage: hf_hyper.py OUT.json
"""
import json
import sys

import torch

from transformers.models.glm5_next import modeling_glm5_next as m
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig


def flat(t):
    return [float(f"{v:.9g}") for v in t.detach().to(torch.float32).reshape(-1).tolist()]


class Block(torch.nn.Module):
    """Stands in for the attention block: returns `y` whatever it is given."""

    def __init__(self, y):
        super().__init__()
        self.y = y

    def forward(self, hidden_states=None, **kwargs):
        return self.y


class Zero(torch.nn.Module):
    """Stands in for the feed-forward block: zeros of its input's shape."""

    def forward(self, x):
        return torch.zeros_like(x)


def layer_case(name, rows, n_embd, iters, eps, seed):
    g = torch.Generator().manual_seed(seed)
    n = 4
    cfg = Glm5NextTextConfig(
        hidden_size=n_embd,
        intermediate_size=32,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        kv_lora_rank=16,
        q_lora_rank=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        index_topk=16,
        index_head_dim=16,
        index_n_heads=2,
        index_kpool=4,
        linear_head_dim=16,
        linear_num_heads=2,
        hc_mult=n,
        hc_eps=eps,
        hc_sinkhorn_iters=iters,
        rms_norm_eps=1e-6,
        layer_types=["linear_attention"],
        mlp_layer_types=["dense"],
    )
    layer = m.Glm5NextTextDecoderLayer(cfg, 0).eval()
    hc = layer.attn_hc
    mix = (2 + n) * n
    with torch.no_grad():
        # Spread wide enough that the softmax and the normalisations all matter.
        hc.fn.copy_(torch.randn(mix, n * n_embd, generator=g) * 0.15)
        hc.base.copy_(torch.randn(mix, generator=g))
        hc.scale.copy_(torch.rand(3, generator=g) * 1.5 + 0.5)
    y = torch.randn(1, rows, n_embd, generator=g)
    streams = torch.randn(1, rows, n, n_embd, generator=g)
    layer.self_attn = Block(y)
    layer.input_layernorm = torch.nn.Identity()
    layer.post_attention_layernorm = torch.nn.Identity()
    layer.mlp = Zero()

    seen = {"softmax": [], "sigmoid": [], "ffn_in": None, "attn": None}
    softmax, sigmoid = torch.softmax, torch.sigmoid

    def rec_softmax(x, *a, **k):
        seen["softmax"].append(x.clone())
        return softmax(x, *a, **k)

    def rec_sigmoid(x, *a, **k):
        out = sigmoid(x, *a, **k)
        seen["sigmoid"].append(out.clone())
        return out

    def attn_out(_mod, _inp, out):
        seen["attn"] = out

    def ffn_in(_mod, args):
        seen["ffn_in"] = args[0].clone()

    h1 = hc.register_forward_hook(attn_out)
    h2 = layer.ffn_hc.register_forward_pre_hook(ffn_in)
    torch.softmax, torch.sigmoid = rec_softmax, rec_sigmoid
    try:
        with torch.no_grad():
            layer(streams)
    finally:
        torch.softmax, torch.sigmoid = softmax, sigmoid
        h1.remove()
        h2.remove()
    post, comb, collapsed = seen["attn"]
    # attn_hc's calls come first: its softmax, then its sigmoids (pre, then post).
    logits = seen["softmax"][0]
    pre = seen["sigmoid"][0] + eps
    with torch.no_grad():
        mean = m.Glm5NextTextHyperHead()(streams)
    assert logits.shape == (1, rows, n, n) and pre.shape == (1, rows, n)
    return {
        "name": name,
        "rows": rows,
        "n_streams": n,
        "n_embd": n_embd,
        "iters": iters,
        "eps": eps,
        "sinkhorn_in": flat(logits),
        "sinkhorn_out": flat(comb),
        "streams": flat(streams),
        "pre": flat(pre),
        "mix_out": flat(collapsed),
        "post": flat(post),
        "y": flat(y),
        "update_out": flat(seen["ffn_in"]),
        "mean_out": flat(mean),
    }


def swiglu_case(limit, rows, n_ff, seed):
    g = torch.Generator().manual_seed(seed)
    cfg = Glm5NextTextConfig(
        hidden_size=16, moe_intermediate_size=n_ff, n_routed_experts=2, swiglu_limit=limit
    )
    experts = m.Glm5NextTextExperts(cfg)
    # Values on both sides of ±limit.
    gate_up = torch.randn(rows, 2 * n_ff, generator=g) * limit
    with torch.no_grad():
        out = experts._apply_gate(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return {"limit": limit, "rows": rows, "n_ff": n_ff, "gate": flat(gate), "up": flat(up),
            "out": flat(out)}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    import transformers

    golden = {
        "reference": f"transformers {transformers.__version__} glm5_next, torch {torch.__version__}, CPU f32",
        "hyper": [
            layer_case("iters 20", 5, 64, 20, 1e-6, 1),
            layer_case("iters 1", 3, 64, 1, 1e-6, 2),
            layer_case("iters 3", 3, 64, 3, 1e-6, 3),
        ],
        "swiglu_clamp": [swiglu_case(7.0, 4, 48, 4)],
    }
    with open(sys.argv[1], "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
