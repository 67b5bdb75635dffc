#!/usr/bin/env python3
"""Reference logits from HF transformers for a qwen3moe GGUF file (f32 weights), as JSON goldens.

Reads the GGUF with the `gguf` package, puts its tensors into a `Qwen3MoeForCausalLM` built from the
file's hyperparameters (transformers does the math; this script only moves arrays by name), runs
the token sequences on the CPU in f32 and writes {reference, file_sha256, sequences: [{tokens,
logits}]}. If a llama.cpp golden for the same file is given, prints their agreement too.

usage: hf_qwen3moe.py MODEL.gguf OUT.json [--llamacpp GOLDEN.json] SEQ [SEQ...]
"""
import hashlib
import json
import sys

import numpy as np
import torch
import transformers
from gguf import GGUFReader
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def field(r, key):
    f = r.fields[key]
    return f.contents()


def main():
    args = sys.argv[1:]
    model_path, out_path = args[0], args[1]
    rest = args[2:]
    golden = None
    if rest and rest[0] == "--llamacpp":
        golden = json.load(open(rest[1]))
        rest = rest[2:]
    r = GGUFReader(model_path)
    a = "qwen3moe"
    t = {x.name: np.array(x.data) for x in r.tensors}
    vocab = t["token_embd.weight"].shape[0]
    cfg = Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=field(r, f"{a}.embedding_length"),
        intermediate_size=field(r, f"{a}.feed_forward_length"),
        moe_intermediate_size=field(r, f"{a}.expert_feed_forward_length"),
        num_hidden_layers=field(r, f"{a}.block_count"),
        num_attention_heads=field(r, f"{a}.attention.head_count"),
        num_key_value_heads=field(r, f"{a}.attention.head_count_kv"),
        head_dim=field(r, f"{a}.attention.key_length"),
        num_experts=field(r, f"{a}.expert_count"),
        num_experts_per_tok=field(r, f"{a}.expert_used_count"),
        norm_topk_prob=True,
        rms_norm_eps=field(r, f"{a}.attention.layer_norm_rms_epsilon"),
        rope_parameters={"rope_type": "default", "rope_theta": field(r, f"{a}.rope.freq_base")},
        max_position_embeddings=field(r, f"{a}.context_length"),
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=False,
    )
    model = Qwen3MoeForCausalLM(cfg).float().eval()
    sd = model.state_dict()
    new = {}
    new["model.embed_tokens.weight"] = t["token_embd.weight"]
    new["model.norm.weight"] = t["output_norm.weight"]
    new["lm_head.weight"] = t["output.weight"]
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        new[p + "input_layernorm.weight"] = t[b + "attn_norm.weight"]
        new[p + "post_attention_layernorm.weight"] = t[b + "ffn_norm.weight"]
        for hf, gg in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
            new[p + f"self_attn.{hf}.weight"] = t[b + gg + ".weight"]
        new[p + "self_attn.q_norm.weight"] = t[b + "attn_q_norm.weight"]
        new[p + "self_attn.k_norm.weight"] = t[b + "attn_k_norm.weight"]
        new[p + "mlp.gate.weight"] = t[b + "ffn_gate_inp.weight"]
        gate, up, down = t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"], t[b + "ffn_down_exps.weight"]
        if p + "mlp.experts.gate_up_proj" in sd:
            new[p + "mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
            new[p + "mlp.experts.down_proj"] = down
        else:
            for e in range(cfg.num_experts):
                new[p + f"mlp.experts.{e}.gate_proj.weight"] = gate[e]
                new[p + f"mlp.experts.{e}.up_proj.weight"] = up[e]
                new[p + f"mlp.experts.{e}.down_proj.weight"] = down[e]
    missing = [k for k in sd if k not in new]
    assert not missing, f"unmapped parameters: {missing[:5]}"
    for k, v in new.items():
        assert tuple(sd[k].shape) == v.shape, (k, sd[k].shape, v.shape)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in new.items()})
    h = hashlib.sha256(open(model_path, "rb").read()).hexdigest()
    out = {"reference": f"transformers {transformers.__version__}, torch {torch.__version__}, CPU f32",
           "file_sha256": h, "sequences": []}
    for s in rest:
        tokens = [int(x) for x in s.split(",")]
        with torch.no_grad():
            logits = model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
        out["sequences"].append({"tokens": tokens, "logits": logits.tolist()})
    json.dump(out, open(out_path, "w"))
    if golden:
        for mine, theirs in zip(out["sequences"], golden["sequences"]):
            a, b = np.array(mine["logits"]), np.array(theirs["logits"])
            rel = np.abs(a - b).max() / np.abs(b).max()
            same = (a.argmax(-1) == b.argmax(-1)).mean()
            print(f"transformers vs llama.cpp: rel {rel:.2e}, argmax agreement {same:.3f}")


if __name__ == "__main__":
    main()
