#!/usr/bin/env python3
"""Golden cases of the ops Qwen3.8-Flash-Next's layers add to the ABI (issue 47), computed by
transformers 5.24's own `qwen4_exp` modules (nothing re-derived here), as a JSON golden for
bloomery's StreamMix (per-element weights), StreamUpdate (identity comb), GroupDotGate and
ConvCausal (dilated) kernels.

One `Qwen4ExpTextDecoderLayer` with the n-gram table layer (PLE) on it, every weight random (the
zero-centred RMSNorm gammas too), its n-gram embedding replaced by a stub returning fixed random
rows `emb`, its delta-rule block by a stub returning a fixed random block output `y` and its MoE by
a zero stub. Its own forward on random streams `x` [rows, hc * n] (one sequence from position 0)
then gives, through forward hooks:
  * PLE: `kn` (norm_key's output), `qn` (norm_query's), `value` (value_proj's), `gated` (the
    input of norm_conv: sigmoid(gate) * value per stream), `gated_normed` (norm_conv's output),
    `conv` (conv1d's output before the SiLU, moved back to [rows, channels]: the dilated conv over
    gated_normed from zeros) and
    `ple_out` (the PLE layer's output, gated + silu(conv));
  * the attention mixer (`attn_hyper_connection`, on x + ple_out): `xn` (hc_norm's output), `g`
    (input_mix_weight_up's output, before the sigmoid), `mixed` (the block input, the gated mean
    over streams), `inject` (its injection weights, 2 sigmoid(.) / hc) and `combined` (the input of
    `mlp_hyper_connection`: streams + inject * y).
Also `conv_w` (conv1d's weight as [hc * n, taps], which is bloomery's [taps, ch] with the tap
fastest) and the dilation and taps.

Tensors are written flat in torch's memory order, which is ggml's (`[rows, hc, n]` is bloomery's
`[n, hc, rows]`). Floats are written with 9 significant digits (they read back as the same f32).

usage: hf_qwen4exp_ops.py OUT.json
"""
import json
import sys

import torch

from transformers.models.qwen4_exp import modeling_qwen4_exp as m
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig


def flat(t):
    return [float(f"{v:.9g}") for v in t.detach().to(torch.float32).reshape(-1).tolist()]


class Fixed(torch.nn.Module):
    """Stands in for a block: returns `y` whatever it is given."""

    def __init__(self, y):
        super().__init__()
        self.y = y

    def forward(self, *args, **kwargs):
        return self.y


class Zero(torch.nn.Module):
    """Stands in for the MoE: zeros of its input's shape."""

    def forward(self, x):
        return torch.zeros_like(x)


def case(name, rows, n, seed):
    g = torch.Generator().manual_seed(seed)
    cfg = Qwen4ExpTextConfig(
        vocab_size=272, hidden_size=n, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_conv_kernel_dim=4,
        moe_intermediate_size=8, shared_expert_intermediate_size=8, num_experts=4,
        num_experts_per_tok=2, hc_count=4, hc_lowrank=16, ple_layer_ids=[1], ngram_size=3,
        heads_per_ngram=8, ple_conv_kernel_size=4, ngram_vocab_size_base=1000, split_ngram_parts=4,
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=64, indexer_budget=16,
        indexer_compress_ratio=4, output_gate_type="sigmoid", eos_token_id=270, rms_norm_eps=1e-6,
        layer_types=["linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10]})
    layer = m.Qwen4ExpTextDecoderLayer(cfg, 0).float().eval()
    hc = cfg.hc_count
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    x = torch.randn((1, rows, hc * n), generator=g)
    emb = torch.randn((1, rows, cfg.ple_embed_dim), generator=g)
    y = torch.randn((1, rows, n), generator=g)
    layer.ple.ple_embedding = Fixed(emb)
    layer.linear_attn = Fixed(y)
    layer.mlp = Zero()

    got = {}

    def keep(key, what="out"):
        def hook(mod, args, out):
            got[key] = args[0] if what == "in" else out
        return hook

    ple, mix = layer.ple, layer.attn_hyper_connection
    ple.norm_key.register_forward_hook(keep("kn"))
    ple.norm_query.register_forward_hook(keep("qn"))
    ple.value_proj.register_forward_hook(keep("value"))
    ple.norm_conv.register_forward_hook(keep("gated", "in"))
    ple.norm_conv.register_forward_hook(keep("gated_normed"))
    ple.conv1d.register_forward_hook(keep("conv"))
    ple.register_forward_hook(keep("ple_out"))
    mix.hc_norm.register_forward_hook(keep("xn"))
    mix.input_mix_weight_up.register_forward_hook(keep("g"))
    mix.register_forward_hook(keep("mix"))
    layer.mlp_hyper_connection.register_forward_pre_hook(lambda mod, args: got.__setitem__("combined", args[0]))
    with torch.no_grad():
        layer(x, position_embeddings=None, cache=None, ple_input_ids=torch.zeros((1, rows), dtype=torch.long))
    mixed, streams, inject = got.pop("mix")
    got["conv"] = got["conv"].transpose(1, 2)  # conv1d runs on [batch, channels, time]
    assert torch.equal(streams, x + got["ple_out"])
    out = {"name": name, "rows": rows, "n_embd": n, "n_streams": hc,
           "taps": cfg.ple_conv_kernel_size, "dilation": cfg.ngram_size,
           "x": flat(x), "emb": flat(emb), "y": flat(y), "conv_w": flat(ple.conv1d.weight),
           "mixed": flat(mixed), "streams": flat(streams), "inject": flat(inject)}
    out.update({k: flat(v) for k, v in got.items()})
    return out


def main():
    cases = [case("13 rows of 4 streams of 32", 13, 32, 1), case("1 row of 4 streams of 16", 1, 16, 2)]
    json.dump({"reference": "transformers 5.24.0 qwen4_exp (Qwen4ExpTextDecoderLayer with the PLE layer)",
               "cases": cases}, open(sys.argv[1], "w"))


if __name__ == "__main__":
    main()
