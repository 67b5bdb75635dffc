#!/usr/bin/env python3
"""Reference logits, expert ids and indexer picks from HF transformers for a deepseek4
(DeepSeek-V4-Flash) GGUF file, as a JSON golden.

Reads the GGUF with the `gguf` package (F32/I32 tensors, as make_deepseek4_tiny.py writes them),
builds a transformers 5.24.0 `DeepseekV4ForCausalLM` from the file's keys, puts every tensor in under
its transformers name, runs each token sequence as one batch on the CPU in f32 (eager attention, no
cache: the compressors run stateless over the whole sequence) and writes
  {reference, file_sha256, compress_ratios, hash_layers, positions,
   sequences: [{tokens, logits, argmax, experts, indexer, min_gap}]}
  logits:   at `positions` (all positions unless --positions), argmax at every position;
  experts:  per layer ("IL"), per position, the 6 chosen experts, sorted (hash layers: the
            ffn_gate_tid2eid row of the token);
  indexer:  per ratio-4 layer ("IL"), per position, the picked compressed rows, sorted, the invalid
            picks (-1: rows not yet visible) dropped;
  min_gap:  the smallest router gap (6th minus 7th biased score) over the non-hash layers and the
            smallest indexer gap (k-th minus (k+1)-th score over the visible rows, relative to the
            query's largest |score|, positions with more visible rows than top_k); a sequence with
            either below 1e-4 is refused (a near tie the two engines may break differently).

=== GGUF -> transformers (no permutation anywhere) =====================================================
llama.cpp b11434's converter (conversion/deepseek.py DeepseekV4Model._map_dsv4_tensor_name) renames the
official checkpoint's tensors one to one and reshapes nothing: the official layout and transformers'
agree on every axis (both keep rope on the TRAILING 64 dims of a head as interleaved pairs, llama.cpp
rope type NORM; both keep the ratio-4 compressor's two series as [Ca | Cb], Ca = first half = the part
the next window reads). So each GGUF tensor, read as numpy (ne reversed), is the transformers parameter:
  token_embd -> model.embed_tokens.weight         output -> lm_head.weight
  output_norm -> model.norm.weight                output_hc_{fn,base,scale} -> model.hc_head.hc_{fn,base,scale}
  blk.i.: attn_norm -> input_layernorm, ffn_norm -> post_attention_layernorm,
  hc_attn_{fn,base,scale} -> attn_hc.{fn,base,scale}, hc_ffn_* -> ffn_hc.*,
  attn_q_a -> self_attn.q_a_proj, attn_q_a_norm -> q_a_norm, attn_q_b -> q_b_proj,
  attn_kv -> kv_proj, attn_kv_a_norm -> kv_norm, attn_output_a -> o_a_proj ({H d / g, g r}: group j
  is rows j r .. (j+1) r of the [g r, H d / g] matrix), attn_output_b -> o_b_proj, attn_sinks -> sinks,
  attn_compressor_{kv,gate,ape,norm} -> self_attn.compressor.{kv_proj,gate_proj,position_bias,kv_norm},
  indexer_compressor_{kv,gate,ape,norm} -> compressor.indexer.{kv_proj,gate_proj,position_bias,kv_norm},
  indexer.attn_q_b -> compressor.indexer.q_b_proj, indexer.proj -> compressor.indexer.scorer.weights_proj,
  ffn_gate_inp -> mlp.gate.weight, exp_probs_b.bias -> mlp.gate.e_score_correction_bias,
  ffn_gate_tid2eid (I32 {6, V}) -> mlp.gate.tid2eid ([V, 6], long),
  ffn_gate_exps ++ ffn_up_exps (along ff) -> mlp.experts.gate_up_proj, ffn_down_exps -> down_proj,
  ffn_{gate,up,down}_shexp -> mlp.shared_experts.{gate,up,down}_proj.
Config: layer_types from compress_ratios (0 sliding, 4 CSA, 128 HCA), mlp_layer_types from
hash_layer_count, partial_rotary_factor = rope.dimension_count / key_length, rope_parameters
{yarn, factor = rope.scaling.factor, original_max_position_embeddings, beta_fast 32, beta_slow 1} (the
config applies them to the compressed layers only, with attention_factor 1: llama.cpp's
dsv4_rope_attn_factor cancels ggml's YaRN magnitude scaling the same way), swiglu_limit =
swiglu_clamp_exp[0] (one value in transformers; the file repeats it per layer, for shexp too: both
engines clamp the shared expert as well).

=== Facts found while building the tiny file (llama.cpp b11434, not transformers) =====================
- The indexer's Hadamard rotation (llama-kv-cache.cpp: always on for deepseek4 indexers, n_rot_k = 64
  doubled while it divides the head) needs attention.indexer.key_length to be a multiple of 64: with
  32, graph_reserve aborts in llama_mul_mat_hadamard's ggml_reshape_2d.
- key_length == indexer key_length crashes context creation (SIGFPE): that equality turns the rotation
  on for every sub-cache, and for one with no layers (n_embd_head_k_all 0) the doubling loop never
  stops (n_rot_k overflows to 0, then % 0). V4-Flash has 512 vs 128; the tiny file 128 vs 64.

usage: hf_deepseek4.py MODEL.gguf OUT.json [--positions P,P,...] SEQ [SEQ...]   (SEQ: comma-separated ids)
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

torch.set_num_threads(1)
ARCH = "deepseek4"
TIE_BAND = 1e-4


def load(path):
    r = gguf.GGUFReader(path)

    def key(name):
        return r.fields[f"{ARCH}.{name}"].contents()

    tensors = {t.name: np.array(t.data) for t in r.tensors}
    for t in r.tensors:
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.I32):
            raise SystemExit(f"{t.name}: {t.tensor_type.name} not supported (F32/I32 only)")
    return key, tensors


def config(key):
    ratios = key("attention.compress_ratios")
    types = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    n_hash = key("hash_layer_count")
    n_layer = key("block_count")
    if key("expert_gating_func") != 4:
        raise SystemExit("expert_gating_func is not sqrtsoftplus (4)")
    if key("rope.scaling.type") != "yarn":
        raise SystemExit("rope.scaling.type is not yarn")
    limits = set(key("swiglu_clamp_exp")) | set(key("swiglu_clamp_shexp"))
    if len(limits) != 1:
        raise SystemExit(f"transformers has one swiglu_limit; the file has {sorted(limits)}")
    head_dim = key("attention.key_length")
    return transformers.DeepseekV4Config(
        vocab_size=key("vocab_size"), hidden_size=key("embedding_length"),
        moe_intermediate_size=key("expert_feed_forward_length"), num_hidden_layers=n_layer,
        num_attention_heads=key("attention.head_count"), num_key_value_heads=1, head_dim=head_dim,
        q_lora_rank=key("attention.q_lora_rank"), num_experts_per_tok=key("expert_used_count"),
        n_routed_experts=key("expert_count"), n_shared_experts=key("expert_shared_count"),
        scoring_func="sqrtsoftplus", norm_topk_prob=bool(key("expert_weights_norm")),
        routed_scaling_factor=key("expert_weights_scale"), max_position_embeddings=key("context_length"),
        rope_theta=key("rope.freq_base"), layer_types=[types[r] for r in ratios[:n_layer]],
        compress_rope_theta=key("attention.compress_rope_freq_base"), hc_mult=key("hyper_connection.count"),
        hc_sinkhorn_iters=key("hyper_connection.sinkhorn_iterations"), hc_eps=key("hyper_connection.epsilon"),
        mlp_layer_types=["hash_moe" if i < n_hash else "moe" for i in range(n_layer)],
        swiglu_limit=limits.pop(), sliding_window=key("attention.sliding_window"),
        o_groups=key("attention.output_group_count"), o_lora_rank=key("attention.output_lora_rank"),
        index_n_heads=key("attention.indexer.head_count"), index_head_dim=key("attention.indexer.key_length"),
        index_topk=key("attention.indexer.top_k"), rms_norm_eps=key("attention.layer_norm_rms_epsilon"),
        partial_rotary_factor=key("rope.dimension_count") / head_dim, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "factor": key("rope.scaling.factor"),
                         "original_max_position_embeddings": key("rope.scaling.original_context_length"),
                         "beta_fast": 32.0, "beta_slow": 1.0},
    )


def state_dict(t, c):
    """transformers' state dict from the GGUF tensors; refuses a GGUF tensor it does not place."""
    used = {"token_embd.weight", "output.weight", "output_norm.weight"}
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "lm_head.weight": t["output.weight"],
          "model.norm.weight": t["output_norm.weight"]}
    for k in ("fn", "base", "scale"):
        sd[f"model.hc_head.hc_{k}"] = t[f"output_hc_{k}.weight"]
        used.add(f"output_hc_{k}.weight")
    names = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
             "attn_q_a": "self_attn.q_a_proj.weight", "attn_q_a_norm": "self_attn.q_a_norm.weight",
             "attn_q_b": "self_attn.q_b_proj.weight", "attn_kv": "self_attn.kv_proj.weight",
             "attn_kv_a_norm": "self_attn.kv_norm.weight", "attn_output_a": "self_attn.o_a_proj.weight",
             "attn_output_b": "self_attn.o_b_proj.weight", "attn_sinks": "self_attn.sinks",
             "attn_compressor_kv": "self_attn.compressor.kv_proj.weight",
             "attn_compressor_gate": "self_attn.compressor.gate_proj.weight",
             "attn_compressor_ape": "self_attn.compressor.position_bias",
             "attn_compressor_norm": "self_attn.compressor.kv_norm.weight",
             "indexer_compressor_kv": "self_attn.compressor.indexer.kv_proj.weight",
             "indexer_compressor_gate": "self_attn.compressor.indexer.gate_proj.weight",
             "indexer_compressor_ape": "self_attn.compressor.indexer.position_bias",
             "indexer_compressor_norm": "self_attn.compressor.indexer.kv_norm.weight",
             "indexer.attn_q_b": "self_attn.compressor.indexer.q_b_proj.weight",
             "indexer.proj": "self_attn.compressor.indexer.scorer.weights_proj.weight",
             "ffn_gate_inp": "mlp.gate.weight", "ffn_gate_shexp": "mlp.shared_experts.gate_proj.weight",
             "ffn_up_shexp": "mlp.shared_experts.up_proj.weight",
             "ffn_down_shexp": "mlp.shared_experts.down_proj.weight",
             "ffn_down_exps": "mlp.experts.down_proj"}
    for hc in ("attn", "ffn"):
        for k in ("fn", "base", "scale"):
            names[f"hc_{hc}_{k}"] = f"{hc}_hc.{k}"
    for i in range(c.num_hidden_layers):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        for g, h in names.items():
            if b + g + ".weight" in t:
                sd[p + h] = t[b + g + ".weight"]
                used.add(b + g + ".weight")
        sd[p + "mlp.experts.gate_up_proj"] = np.concatenate(
            [t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]], axis=1)
        used |= {b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight"}
        if b + "exp_probs_b.bias" in t:
            sd[p + "mlp.gate.e_score_correction_bias"] = t[b + "exp_probs_b.bias"]
            used.add(b + "exp_probs_b.bias")
        if b + "ffn_gate_tid2eid.weight" in t:
            sd[p + "mlp.gate.tid2eid"] = t[b + "ffn_gate_tid2eid.weight"].astype(np.int64)
            used.add(b + "ffn_gate_tid2eid.weight")
    if set(t) - used:
        raise SystemExit(f"GGUF tensors with no transformers place: {sorted(set(t) - used)}")
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}


def build(path):
    key, t = load(path)
    c = config(key)
    c._attn_implementation = "eager"
    torch.manual_seed(0)
    m = transformers.DeepseekV4ForCausalLM(c).float().eval()
    sd = state_dict(t, c)
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [n for n in missing if "rotary_emb" not in n]
    if missing or unexpected:
        raise SystemExit(f"missing {missing}, unexpected {unexpected}")
    return m, key


def run(m, tokens):
    c = m.config
    k = c.index_topk
    experts, indexer, scores_seen = {}, {}, {}
    gaps = {"router": float("inf"), "indexer": float("inf")}
    handles = []
    for i, layer in enumerate(m.model.layers):
        gate = layer.mlp.gate

        def route(mod, inp, out, i=i):
            experts[str(i)] = sorted_rows(out[2])
            if not layer_is_hash(c, i):
                logits = torch.nn.functional.linear(inp[0].reshape(-1, c.hidden_size), mod.weight)
                s = mod.score_fn(logits) + mod.e_score_correction_bias
                top = s.sort(dim=-1, descending=True).values
                gaps["router"] = min(gaps["router"], float((top[:, c.num_experts_per_tok - 1]
                                                            - top[:, c.num_experts_per_tok]).min()))

        handles.append(gate.register_forward_hook(route))
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            def picks(mod, inp, out, i=i):
                indexer[str(i)] = [sorted(x for x in row if x >= 0) for row in out[0].tolist()]

            def scores(mod, inp, out, i=i):
                scores_seen[i] = out[0].detach()

            handles.append(comp.indexer.register_forward_hook(picks))
            handles.append(comp.indexer.scorer.register_forward_hook(scores))

        def mask_check(mod, args, kwargs):
            if not isinstance(kwargs.get("attention_mask"), torch.Tensor):
                raise SystemExit("attention mask is not a tensor: the compressed rows would be unmasked")

        handles.append(layer.self_attn.register_forward_pre_hook(mask_check, with_kwargs=True))
    with torch.no_grad():
        logits = m(torch.tensor([tokens]), use_cache=False).logits[0]
    for h in handles:
        h.remove()
    for i, s in scores_seen.items():
        for p in range(s.shape[0]):
            visible = (p + 1) // c.compress_rates["compressed_sparse_attention"]
            if visible <= k:
                continue
            v = s[p, :visible].sort(descending=True).values
            gaps["indexer"] = min(gaps["indexer"], float((v[k - 1] - v[k]) / v.abs().max()))
    return logits, experts, indexer, gaps


def layer_is_hash(c, i):
    return c.mlp_layer_types[i] == "hash_moe"


def sorted_rows(idx):
    return [sorted(r) for r in idx.reshape(-1, idx.shape[-1]).tolist()]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    args = sys.argv[1:]
    path, out_path, args = args[0], args[1], args[2:]
    positions = None
    if args and args[0] == "--positions":
        positions, args = [int(x) for x in args[1].split(",")], args[2:]
    m, key = build(path)
    result = {"reference": f"transformers {transformers.__version__} DeepseekV4ForCausalLM, f32 CPU, eager, "
                           "tests/oracle/hf_deepseek4.py",
              "file_sha256": sha256(path), "compress_ratios": key("attention.compress_ratios"),
              "hash_layers": key("hash_layer_count"), "positions": positions, "sequences": []}
    bad = False
    for s in args:
        tokens = [int(x) for x in s.split(",")]
        logits, experts, indexer, gaps = run(m, tokens)
        keep = positions if positions is not None else range(len(tokens))
        result["sequences"].append({
            "tokens": tokens, "logits": [[float(f"{v:.8g}") for v in logits[p].tolist()] for p in keep],
            "argmax": logits.argmax(-1).tolist(), "experts": experts, "indexer": indexer, "min_gap": gaps})
        print(f"{len(tokens)} tokens: router gap {gaps['router']:.2e}, indexer gap {gaps['indexer']:.2e}",
              file=sys.stderr)
        bad |= min(gaps.values()) < TIE_BAND
    with open(out_path, "w") as f:
        json.dump(result, f)
    if bad:
        raise SystemExit(f"a sequence has a choice within the {TIE_BAND} tie band")


if __name__ == "__main__":
    main()
