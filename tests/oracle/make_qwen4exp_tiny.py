#!/usr/bin/env python3
"""A tiny random Qwen3.8-Flash-Next checkpoint (transformers 5.24.0 `Qwen4ExpForCausalLM`) with an MTP
block, laid out as the official checkpoint is, for llama.cpp b11434's converter and the oracles
(tests/oracle/hf_qwen4exp.py, numpy_qwen4exp_mtp.py).

Shape (issue 47's "Golden"): 8 layers, GDN everywhere but layers 3 and 7 (QSA gated GQA), hidden 128,
vocab 272; GQA 4 / 2 heads x 256 with partial rotary 0.25 (64 dims, mrope_section [11, 11, 10]),
theta 1e7; GDN 2 k / 4 v heads x 128 (so the converter's V-head reordering is exercised), conv 4,
output gate "sigmoid" (the class defaults to hidden_act, SiLU; llama.cpp hard-codes sigmoid); QSA
4 heads x 128, budget 16, ratio 4; hyper-connections 4 streams, rank 32; 8 experts top-2, ff 32,
shared expert ff 32; PLE on layer 1 (HF `ple_layer_ids` [2], 1-based), ple_embed_dim = hidden,
ngram 3 x 8 heads (16 heads of 8), ngram_vocab_size_base 1000 (16 primes 1009..), 4 shards; a
scalar eos_token_id 270 (the PLE end id).

Weights: transformers' own init with initializer_range 0.1, then everything that init leaves at a
constant is made random so each formula is exercised: every zero-centred RMSNorm gamma
(hc_norm, q/k_norm, indexer q/k_layernorm, PLE norm_key/query/conv) gets 0.1 N(0,1) (so the
converter's +1 matters), the GDN output norm 1 + 0.1 N, dt_bias 1 + 0.1 N, the PLE dilated conv
(zero at init) 0.2 N, the experts (torch.empty at init) 0.1 N. Three changes make near ties rarer
(a golden refuses a sequence with a router probability gap or QSA block score gap below 1e-4): the
routers (trunk and MTP) get 0.5 N (five times transformers' 0.1: logit std ~0.5 before), every token embedding
gets one shared random vector 0.1 N added, and each indexer's key rows are the mean of its query heads'
rows plus 0.02 N (with independent rows every head's dot product with a block is often negative, a
block score of exactly 0 that ties with others). With these, 4 of 24 random 68-token sequences passed
both the trunk's and the MTP block's bands (without them, 0 of 12 passed the trunk's).

The MTP block (transformers has none: `_keys_to_ignore_on_load_unexpected = [r"^mtp.*"]`) is written
under the names llama.cpp b11434's converter reads (conversion/qwen4exp.py `_MTP_EXTRA` and
conversion/qwen.py `_QwenMtpMixin.filter_tensors`): mtp.layers.0.* (one decoder layer of kind
indexed_attention: QSA attention, MoE, both hyper-connections, no PLE; experts one by one),
mtp.fc_embedding.weight and mtp.fc_hidden.weight [hidden, hidden] (the converter joins them into
eh_proj [e | h]), mtp.pre_fc_norm_embedding.weight [hidden] (enorm), mtp.pre_fc_norm_hidden.weight
[hc * hidden] (hnorm, one gamma per stream), mtp.hyper_connection_mixer.{hc_norm,
input_mix_weight_down, input_mix_weight_up}.weight (the block's own output mixer); all gammas
zero-centred like the trunk's (the converter adds 1 to every name ending in norm.weight).

config.json is then patched the way the official checkpoint reads: layer_types says
"full_attention" (transformers >= 5.2x renames it to "indexed_attention" on save and load) and
mtp_num_hidden_layers 1.

usage: make_qwen4exp_tiny.py OUT_DIR [SEED]
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

TEXT = dict(
    vocab_size=272, hidden_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
    head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_conv_kernel_dim=4, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2, hc_count=4, hc_lowrank=32,
    ple_layer_ids=[2], ngram_size=3, heads_per_ngram=8, ple_conv_kernel_size=4, ngram_vocab_size_base=1000,
    split_ngram_parts=4, indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=128, indexer_budget=16,
    indexer_compress_ratio=4, output_gate_type="sigmoid", eos_token_id=270, initializer_range=0.1,
    rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
)
ZERO_CENTRED = ("hc_norm.weight", "q_norm.weight", "k_norm.weight", "q_layernorm.weight", "k_layernorm.weight",
                "norm_key.weight", "norm_query.weight", "norm_conv.weight")


def randomize(named, g):
    """Replaces the values transformers' init leaves constant (see the module docstring)."""
    with torch.no_grad():
        for name, p in named:
            if name.endswith(ZERO_CENTRED):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("ple.conv1d.weight"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight"):
                p.add_(0.1 * torch.randn(p.shape[1:], generator=g))
            if name.endswith("indexer.index_qk_proj.weight"):
                tie_indexer_key(p, g)


def tie_indexer_key(w, g):
    """The indexer's key rows := the mean of its query heads' rows + noise (fewer zero block scores)."""
    n_q = TEXT["indexer_n_heads"] * TEXT["indexer_head_dim"]
    q = w[:n_q].reshape(TEXT["indexer_n_heads"], TEXT["indexer_head_dim"], -1)
    w[n_q:] = q.mean(0) + 0.02 * torch.randn(w[n_q:].shape, generator=g)


def mtp_tensors(cfg, g):
    """The MTP block's tensors under the official checkpoint's names, random like the trunk's."""
    one = transformers.Qwen4ExpTextConfig(**{**TEXT, "num_hidden_layers": 1, "layer_types": ["indexed_attention"],
                                             "ple_layer_ids": []})
    layer = transformers.models.qwen4_exp.modeling_qwen4_exp.Qwen4ExpTextDecoderLayer(one, 0).float()
    n, hc = cfg.hidden_size, cfg.hc_count
    out = {}
    with torch.no_grad():
        for name, p in layer.named_parameters():
            # Every gamma here is zero-centred (no GDN norm in a QSA layer): one rule for all.
            v = (0.5 if name == "mlp.gate.weight" else 0.1) * torch.randn(p.shape, generator=g)
            if name.endswith("indexer.index_qk_proj.weight"):
                tie_indexer_key(v, g)
            if name == "mlp.experts.gate_up_proj":
                ff = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = v[e, :ff].contiguous()
                    out[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = v[e, ff:].contiguous()
            elif name == "mlp.experts.down_proj":
                for e in range(v.shape[0]):
                    out[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = v[e].contiguous()
            else:
                out["mtp.layers.0." + name] = v
        out["mtp.fc_embedding.weight"] = 0.1 * torch.randn((n, n), generator=g)
        out["mtp.fc_hidden.weight"] = 0.1 * torch.randn((n, n), generator=g)
        out["mtp.pre_fc_norm_embedding.weight"] = 0.1 * torch.randn((n,), generator=g)
        out["mtp.pre_fc_norm_hidden.weight"] = 0.1 * torch.randn((hc * n,), generator=g)
        out["mtp.hyper_connection_mixer.hc_norm.weight"] = 0.1 * torch.randn((hc * n,), generator=g)
        out["mtp.hyper_connection_mixer.input_mix_weight_down.weight"] = 0.1 * torch.randn(
            (cfg.hc_lowrank, hc * n), generator=g)
        out["mtp.hyper_connection_mixer.input_mix_weight_up.weight"] = 0.1 * torch.randn(
            (hc * n, cfg.hc_lowrank), generator=g)
    return out


def main():
    out = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    cfg = transformers.Qwen4ExpTextConfig(**TEXT)
    m = transformers.Qwen4ExpForCausalLM(cfg).float().eval()
    randomize(m.named_parameters(), g)
    m.save_pretrained(out)
    st = os.path.join(out, "model.safetensors")
    sd = load_file(st)
    sd.update(mtp_tensors(cfg, g))
    save_file(sd, st, metadata={"format": "pt"})
    cp = os.path.join(out, "config.json")
    c = json.load(open(cp))
    c["layer_types"] = ["full_attention" if x == "indexed_attention" else x for x in c["layer_types"]]
    c["mtp_num_hidden_layers"] = 1
    json.dump(c, open(cp, "w"), indent=2)
    print(f"{out}: {sum(v.numel() for v in sd.values())} parameters in {len(sd)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
