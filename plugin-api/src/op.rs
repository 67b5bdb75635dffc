//! The op set: every operation a forward graph may contain, with its parameters.
//!
//! The set is versioned with [`crate::ABI_VERSION`] and covers the target architectures: GQA with
//! output gates and sinks, latent (MLA) attention with K = V rows, sliding windows, sparse selection,
//! delta-rule linear attention with recurrent and conv state, mixture-of-experts routing,
//! hyper-connection stream mixing, and the small dense heads of decision
//! models. A kernel plugin lists which `(op, dtype)` pairs it implements ([`OpSupport`]); the host
//! refuses at load time, by name, a graph that uses a pair no loaded plugin implements.
//!
//! Layout conventions (ggml order): `ne[0]` is the contiguous dimension. Activations are f32
//! `[n, rows]`; a weight matrix is `[k, n]` (k inputs, n outputs); heads are `[head_dim, n_head,
//! rows]`. "slots" is an i32 `[rows]` tensor of sequence slots, "positions" an i32 `[rows]` tensor
//! of token positions. Rows of one sequence are consecutive, with increasing positions.

use abi_stable::std_types::{RString, RVec};
use abi_stable::StableAbi;

use crate::DType;

/// The rotary embedding variant (llama.cpp's naming).
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs (GPT-J style): dims (2i, 2i+1) rotate together.
    Norm = 0,
    /// Halves (GPT-NeoX style): dims (i, i + n_dims/2) rotate together.
    Neox = 1,
    /// Interleaved multi-section rope (Qwen3.5/3.6/3.8): sections of the rotated dims take the
    /// position of their axis; text positions give every axis the same position.
    Imrope = 2,
}

/// Rotary embedding parameters (ggml's rope with YaRN extension).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Variant.
    pub mode: RopeMode,
    /// Rotated dims, from dim `offset` of each head (`offset + n_dims` ≤ head_dim; partial rotary
    /// when smaller).
    pub n_dims: u32,
    /// The first rotated dim: dims `offset .. offset + n_dims` rotate, pairs counted from it (0 for
    /// every model but DeepSeek-V4, which rotates the last 64 dims of a head, ggml's
    /// `rope_set_offset(n_embd_head − n_rot)`).
    pub offset: u32,
    /// IMROPE section sizes in dim pairs; zeros for the other modes.
    pub sections: [u32; 4],
    /// θ base.
    pub freq_base: f32,
    /// Frequency scale (1 / linear scaling factor).
    pub freq_scale: f32,
    /// YaRN extrapolation mix factor (0 disables YaRN).
    pub ext_factor: f32,
    /// YaRN magnitude scale.
    pub attn_factor: f32,
    /// YaRN low correction dim parameter.
    pub beta_fast: f32,
    /// YaRN high correction dim parameter.
    pub beta_slow: f32,
    /// Original training context for YaRN.
    pub n_ctx_orig: u32,
    /// Rotate by the negative angle (DeepSeek-V4's inverse rope on outputs).
    pub inverse: bool,
}

/// Attention over a host-owned cache.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub n_head: u32,
    /// Key/value heads (divides `n_head`; 1 for latent attention).
    pub n_head_kv: u32,
    /// Key dim per head.
    pub dk: u32,
    /// Value dim per head.
    pub dv: u32,
    /// Logit scale (usually 1/sqrt(dk)).
    pub scale: f32,
    /// Logit soft cap `c·tanh(x/c)`; 0 = none.
    pub softcap: f32,
    /// Sliding window in positions (a row at p sees p-window+1..=p); 0 = full causal.
    pub window: u32,
    /// Values are the first `dv` dims of the key rows (latent attention, K = V); the V source is
    /// then the key cache again.
    pub v_from_k: bool,
    /// A per-head sink logit (f32 `[n_head]`) joins the softmax denominator.
    pub sinks: bool,
    /// Sparse selection: an extra i32 `[n_sel, rows]` source lists the cache positions each row
    /// attends. The row then sees exactly those positions (−1 entries and positions after the
    /// row's own are skipped; a position listed twice counts once) plus, when `window` > 0, its
    /// sliding window; with `window` 0 it sees only the listed positions.
    pub selected: bool,
    /// With a quantized K cache, q is rotated by the orthonormal Walsh-Hadamard transform in
    /// chunks of this many values before it is scored, as the keys were before they were stored
    /// (the `rot` of their [`Op::CacheStore`]); 0 = none. Ignored for f32/f16 K caches.
    pub rot_k: u32,
    /// With a quantized V cache, each head's output is rotated back in chunks of this many
    /// values (the `rot` the values were stored with); 0 = none. Ignored for f32/f16 V caches.
    pub rot_v: u32,
    /// DeepSeek-V4's second key source: an extra f32 source, a compressed-row cache `[dk·n_head_kv,
    /// len, n_slots]` holding one row per `comp` positions (row `j` at `j`, written by
    /// [`Op::Compress`]); 0 = none. A row at position `p` also sees the compressed rows
    /// `j < (p + 1) div comp`, in the same softmax as the cache's positions (and the sink). Needs
    /// `v_from_k` (the values are the first `dv` dims of each compressed row).
    pub comp: u32,
    /// With `comp`: a last i32 `[n_list, rows]` source (as [`Op::CompSelect`] writes it) lists
    /// the compressed rows each row reads; −1 entries and rows not yet visible are skipped, a row
    /// listed twice counts once. (With `sinks` that makes 8 sources, the most a call carries,
    /// so it cannot join `selected`.)
    pub comp_selected: bool,
}

impl RopeParams {
    /// A rope of `mode` over the first `n_dims` dims with θ base `freq_base` and IMROPE
    /// `sections` (zeros for the other modes): no scaling, no YaRN, forwards.
    pub const fn unscaled(mode: RopeMode, n_dims: u32, sections: [u32; 4], freq_base: f32) -> Self {
        RopeParams {
            mode,
            n_dims,
            offset: 0,
            sections,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
            inverse: false,
        }
    }
}

/// The Walsh-Hadamard chunk llama.cpp rotates keys (and queries) by before a quantized K cache
/// of heads of `head_dim` values: the largest power of two from 64 up that divides it, or 0 when
/// 64 does not (llama.cpp b11434 `llama-kv-cache.cpp`, `n_rot_k`).
pub fn kv_rotation_k(head_dim: u32) -> u32 {
    if head_dim == 0 || !head_dim.is_multiple_of(64) {
        return 0;
    }
    let mut n = 64;
    while head_dim.is_multiple_of(2 * n) {
        n *= 2;
    }
    n
}

/// The Walsh-Hadamard chunk llama.cpp rotates values (and the attention output) by before a
/// quantized V cache of heads of `head_dim` values: 64, or 0 when 64 does not divide it
/// (`n_rot_v`).
pub fn kv_rotation_v(head_dim: u32) -> u32 {
    if head_dim != 0 && head_dim.is_multiple_of(64) {
        64
    } else {
        0
    }
}

impl AttentionParams {
    /// Plain causal GQA over the whole context: keys and values of `head_dim`, logits scaled by
    /// `1/sqrt(head_dim)`, no cap, window, sinks or selection (set those fields after), and
    /// llama.cpp's rotations for quantized caches of that head width.
    pub fn gqa(n_head: u32, n_head_kv: u32, head_dim: u32) -> AttentionParams {
        AttentionParams {
            n_head,
            n_head_kv,
            dk: head_dim,
            dv: head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: 0.0,
            window: 0,
            v_from_k: false,
            sinks: false,
            selected: false,
            rot_k: kv_rotation_k(head_dim),
            rot_v: kv_rotation_v(head_dim),
            comp: 0,
            comp_selected: false,
        }
    }
}

/// How router logits become scores.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts.
    Softmax = 1,
    /// Element-wise sigmoid.
    Sigmoid = 2,
    /// Softmax over the chosen experts' logits only.
    SoftmaxSelected = 3,
    /// `sqrt(softplus(x))`.
    SqrtSoftplus = 4,
}

/// Routed-expert selection (GGUF `expert_gating_func` and friends).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct RouterParams {
    /// Scoring function.
    pub gating: Gating,
    /// Experts.
    pub n_expert: u32,
    /// Experts chosen per row.
    pub k: u32,
    /// Expert groups (1 = no grouping).
    pub n_group: u32,
    /// Groups kept (ranked by the sum of each group's two best biased scores).
    pub topk_group: u32,
    /// A selection bias (f32 `[n_expert]`) is the second source; it only affects the choice.
    pub bias: bool,
    /// Divide the chosen weights by their sum.
    pub norm: bool,
    /// When `norm`, the sum is raised to at least this before dividing (llama.cpp clamps it to
    /// 6.103515625e-5, the smallest normal f16).
    pub norm_min: f32,
    /// Multiply the final weights (1 = none).
    pub scale: f32,
}

impl RouterParams {
    /// Softmax over all `n_expert` logits, the `k` best, renormalised with llama.cpp's clamp,
    /// times `scale` (Qwen3-MoE, Qwen3.5/3.6-MoE); no groups, no selection bias.
    pub fn softmax_renorm(n_expert: u32, k: u32, scale: f32) -> RouterParams {
        RouterParams {
            gating: Gating::Softmax,
            n_expert,
            k,
            n_group: 1,
            topk_group: 1,
            bias: false,
            norm: true,
            norm_min: 6.103_515_6e-5,
            scale,
        }
    }
}

/// Gated linear unit flavour.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluKind {
    /// `silu(gate)·up`.
    SwiGlu = 0,
    /// `gelu_tanh(gate)·up`.
    GeGlu = 1,
}

/// The routed-expert FFN of one layer.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct MoeParams {
    /// Experts in the stacks.
    pub n_expert: u32,
    /// Experts per row.
    pub k: u32,
    /// Expert FFN width.
    pub n_ff: u32,
    /// Activation.
    pub glu: GluKind,
    /// SwiGLU clamp limit (0 = none), as [`Op::Glu`].
    pub limit: f32,
    /// Gate and up are one stack `[n_embd, 2·n_ff, n_expert]` (gate first).
    pub fused_gate_up: bool,
    /// A last source i32 `[n_expert]` maps expert id → index in the stacks, -1 = skip (the tiering
    /// service computes the skipped experts elsewhere).
    pub expert_map: bool,
}

/// Delta-rule linear attention (Gated DeltaNet, Kimi Delta Attention).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct DeltaRuleParams {
    /// Key heads.
    pub n_head_k: u32,
    /// Value heads (a multiple of the key heads).
    pub n_head_v: u32,
    /// Key dim per head.
    pub dk: u32,
    /// Value dim per head.
    pub dv: u32,
    /// Multiplies the queries (usually `1/sqrt(dk)`).
    pub scale: f32,
    /// The decay is per (head, key dim) (KDA) instead of per head (GDN).
    pub per_dim_gate: bool,
    /// Multiplies β (2 for Solar-Open2's KDA, else 1).
    pub beta_scale: f32,
}

/// How [`Op::KPoolSelect`] pools a complete pool's keys and weighs the indexer heads.
#[repr(C, u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub enum KPoolMode {
    /// GLM-5.3's DSA: cache rows `[key | gate | pooled]` of `3·dh`; per dimension a softmax over
    /// the pool's positions of `gate + ape`, weighting the keys; heads weighted by the `w` source.
    SoftmaxGate,
    /// Qwen3.8-Flash-Next's QSA: cache rows `[raw key | pooled]` of `2·dh`; the pooled key is
    /// `rope(RmsNorm(mean of the pool's raw keys)·k_norm)`, roped at the pool's first position;
    /// every head weighs `scale` (`1/√dh` in the model).
    MeanNormRope {
        /// ε of the RMS norm.
        eps: f32,
        /// The rope of the pooled key (the model's: IMROPE on the first `n_dims` dims).
        rope: RopeParams,
        /// The weight of every head's `relu(q_h·pooled)`.
        scale: f32,
    },
}

/// The k-pool indexer of [`Op::KPoolSelect`].
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct KPoolParams {
    /// Indexer heads.
    pub n_head: u32,
    /// Indexer head width (`dh`).
    pub head_dim: u32,
    /// Positions per pool.
    pub kpool: u32,
    /// Pools kept per row (`indexer.top_k / kpool`).
    pub n_top: u32,
    /// The positions after the last complete pool are selected too.
    pub tail: bool,
    /// The pooling and head weights.
    pub mode: KPoolMode,
}

/// DeepSeek-V4's compressor ([`Op::Compress`]).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct CompressParams {
    /// Positions per compressed row (`R`: 4 or 128 in V4).
    pub ratio: u32,
    /// Two overlapped series (V4's R = 4): the inputs are `2·width` wide, and row `j` pools the
    /// first halves of window `j − 1` with the second halves of window `j`.
    pub overlap: bool,
    /// Width of a compressed row (`d`, or `d_I` for the indexer keys).
    pub width: u32,
    /// ε of the RMS norm.
    pub eps: f32,
    /// The rope of the compressed row, at position `j·ratio` (V4: NORM pairs on the last dims,
    /// so with a dimension offset, and the compressed θ with YaRN).
    pub rope: RopeParams,
    /// What the call makes (V4 uses [`CompressForm::Pool`] only).
    pub form: CompressForm,
}

/// The three forms of [`Op::Compress`]. DeepSeek-V4.1's index keys need the normed compressed
/// row before its rope (`Plain`), projected by the graph, then normed, roped and stored as a
/// compressed row of their own (`Store`); docs/deepseek41-plan.md.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressForm {
    /// Pools, norms and ropes each completed row into the compressed cache, and stores the
    /// call's `[kv | score]` rows in `raw` (the op's main description).
    Pool = 0,
    /// The rows `Pool` would write, normed but not roped, one per call row: srcs `[kv, score,
    /// ape, norm, raw, slots, positions]` → f32 `[width, rows]`, column `r` the row that row `r`
    /// completes, zeros for a row that completes none. Nothing is written in place: `raw` is
    /// read as `Pool` reads it, so the call goes before the `Pool` call storing these rows.
    Plain = 1,
    /// Each call row's `x` is its completed row, unpooled: srcs `[x [width, rows], norm [width],
    /// comp [width, len_comp, n_slots], slots, positions]` → dst = `comp` (in place). A row at
    /// position `p` with `(p + 1) mod R = 0` writes `RmsNorm(x_r, eps)·norm`, roped at `jR`, at
    /// row `j = p div R` of its slot; other rows write nothing. Needs `overlap` false.
    Store = 2,
}

/// DeepSeek-V4's indexer over compressed rows ([`Op::CompSelect`]).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct CompSelectParams {
    /// Indexer heads.
    pub n_head: u32,
    /// Indexer head width (`d_I`, the width of the index keys).
    pub head_dim: u32,
    /// Positions per compressed row: a row at position `p` sees rows `j < (p + 1) div ratio`.
    pub ratio: u32,
    /// Rows kept per query row.
    pub top_k: u32,
}

/// Unary element-wise functions.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryFn {
    /// `x·sigmoid(x)`.
    Silu = 0,
    /// GELU, tanh approximation.
    Gelu = 1,
    /// GELU, exact (erf).
    GeluErf = 2,
    /// `1/(1+e^-x)`.
    Sigmoid = 3,
    /// `ln(1+e^x)`.
    Softplus = 4,
    /// `tanh(x)`.
    Tanh = 5,
    /// `e^x`.
    Exp = 6,
    /// `max(x, 0)`.
    Relu = 7,
}

/// One operation with its parameters. Sources and destination are given per variant.
#[repr(C, u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Gather rows of a table: srcs `[table [n, r] any dtype, ids i32 [m]]` → f32 `[n, m]`; an i32
    /// table gives i32 rows instead, bit for bit (DeepSeek-V4's hash routing `tid2eid[token]`).
    GetRows,
    /// Copy or convert (f32 ↔ f16 ↔ bf16), strided source allowed: srcs `[x]` → dst.
    Copy,
    /// Concatenate along ne0: srcs `[a [n1, m], b [n2, m]]` → `[n1+n2, m]`.
    Concat,
    /// Matrix product: srcs `[w [k, n] weight dtype, x f32 [k, m]]` → f32 `[n, m]`, y = Wx. With
    /// a stack of `h` matrices `w [k, n, h]` and `x [k, h, m]` it is one product per head:
    /// `y[:, j, r] = W_j·x[:, j, r]` → `[n, h, m]` (latent attention's absorbed `attn_k_b`/`attn_v_b`).
    MatMul,
    /// `a + b`: srcs `[a [n, m], b]` → `[n, m]`; `b` has the same shape, or is one row `[n]`
    /// added to every row, or one value per row `[1, m]` added to every element of its row.
    Add,
    /// `a · b`, broadcasting as [`Op::Add`].
    Mul,
    /// `s · x`: srcs `[x]`.
    Scale {
        /// Factor.
        s: f32,
    },
    /// A unary function: srcs `[x]`.
    Unary {
        /// Which.
        f: UnaryFn,
    },
    /// Gated linear unit: srcs `[gate [n, m], up [n, m]]` → `[n, m]`. With `limit` > 0 (SwiGlu
    /// only) the gate is clamped before its activation and up on both sides:
    /// `silu(min(gate, limit))·clamp(up, −limit, limit)` (ggml's `swiglu_clamp`, which llama.cpp
    /// b11434 and transformers 5.24 apply to GLM-5.3's routed, shared and dense FFNs).
    Glu {
        /// Flavour.
        kind: GluKind,
        /// Clamp limit, 0 = none; a negative limit, or one with GeGlu, is refused.
        limit: f32,
    },
    /// RMS norm over ne0: srcs `[x, weight [n]?]`.
    RmsNorm {
        /// ε inside the square root.
        eps: f32,
    },
    /// Layer norm over ne0: srcs `[x, weight [n]?, bias [n]?]`.
    LayerNorm {
        /// ε inside the square root.
        eps: f32,
    },
    /// L2 normalisation over ne0: srcs `[x]`.
    L2Norm {
        /// ε added to the squared norm.
        eps: f32,
    },
    /// Softmax over ne0: srcs `[x, mask [n, m]?]`, `softmax(scale·x + mask)`.
    Softmax {
        /// Logit scale.
        scale: f32,
    },
    /// Rotary embedding: srcs `[x [head_dim, n_head, rows], positions]` → same shape.
    Rope(RopeParams),
    /// Write rows into a cache: srcs `[x [d, rows], cache [d, len, n_slots], slots, positions]`,
    /// dst = the cache (updated in place at row `position % len` of each row's slot). A
    /// quantized cache stores each row rotated by the orthonormal Walsh-Hadamard transform in
    /// chunks of `rot` values (0 = none; f32/f16 caches ignore it), as llama.cpp does: the
    /// Attention reading the cache names the same chunk (`rot_k`, `rot_v`).
    CacheStore {
        /// The rotation's chunk, a power of two dividing the head width ([`kv_rotation_k`],
        /// [`kv_rotation_v`]), or 0.
        rot: u32,
    },
    /// Causal attention over a cache: srcs `[q [dk, n_head, rows], k_cache, v_cache, slots,
    /// positions, sinks?, selected?, comp_cache?, comp_ids?]` → `[dv, n_head, rows]`.
    Attention(AttentionParams),
    /// Dense attention between graph tensors (decision heads, cross-attention): srcs `[q [dk,
    /// n_head, n_q], k [dk, n_head_kv, n_k], v [dv, n_head_kv, n_k]]` → `[dv, n_head, n_q]`.
    AttentionDense {
        /// Logit scale.
        scale: f32,
        /// Query i sees keys 0..=i only.
        causal: bool,
    },
    /// The `k` largest entries of each row: srcs `[x [n, m]]` → i32 `[k, m]` (ties: lower index).
    TopK {
        /// Entries kept.
        k: u32,
    },
    /// Expert choice: srcs `[logits [n_expert, rows], bias?]` → i32 `[k, rows]`.
    RouterTopK(RouterParams),
    /// Expert weights for chosen ids: srcs `[logits [n_expert, rows], ids i32 [k, rows]]` → f32
    /// `[k, rows]`.
    RouterWeights(RouterParams),
    /// Routed experts: srcs `[x [n_embd, rows], ids [k, rows], weights [k, rows], gate
    /// [n_embd, n_ff, n_expert], up, down [n_ff, n_embd, n_expert], map?]` (or `gate_up` in place of
    /// gate and up when fused) → `[n_embd, rows]`, the weighted sum of the chosen experts.
    MoeExperts(MoeParams),
    /// Causal depthwise conv over time with a per-sequence state, optionally dilated: srcs `[x
    /// [ch, rows], w [taps, ch], state [ch·(taps−1)·dilation, 1, n_slots], slots, positions]` →
    /// `[ch, rows]`, `y[t, c] = Σ_j w[j, c]·x[t − (taps−1−j)·dilation, c]` (the last tap weighs
    /// the current row; inputs before the sequence start are zero). The state holds the last
    /// `(taps−1)·dilation` inputs of each sequence, oldest first (element `(i, c)` at `i·ch + c`);
    /// a row at position 0 starts its sequence from zeros; the state is updated in place. An
    /// optional sixth source `row_states [ch·(taps−1)·dilation, rows]` (a verify pass's
    /// [`crate::graph::TensorSource::RowStates`]) receives in column `r` the state of row `r`'s
    /// sequence after row `r`, laid out as the state.
    /// Dilation 1 is the short convolution of the delta-rule layers; Qwen3.8-Flash-Next's n-gram
    /// table layer convolves with 4 taps at dilation `ngram_size` 3 (transformers 5.24
    /// `Qwen4ExpTextPLELayer.conv1d`, llama.cpp b11434 `qwen4exp.cpp` `build_ple`).
    ConvCausal {
        /// Kernel taps (at least 1).
        taps: u32,
        /// Rows between taps (at least 1).
        dilation: u32,
    },
    /// Delta-rule recurrence: srcs `[q [dk, hk, rows], k, v [dv, hv, rows], gate (log decay; [hv,
    /// rows] or [dk, hv, rows] per_dim), beta [hv, rows], state [dk·dv·hv, 1, n_slots], slots,
    /// positions]` → `[dv, hv, rows]`. Value head `h` reads key head `h mod hk` (tiled, as GGUF
    /// files order them). Per row and head, with `S` the `[dk, dv]` state (element `(i, j)` at
    /// `(h·dv + j)·dk + i`): `S ← exp(gate)·S; δ = beta_scale·beta·(v − Sᵀk); S ← S + k·δᵀ;
    /// out = scale·Sᵀq`. A row at position 0 starts its sequence from a zero state; the state is
    /// updated in place. An optional ninth source `row_states [dk·dv·hv, rows]` (a verify pass's
    /// [`crate::graph::TensorSource::RowStates`]) receives in column `r` the state of row `r`'s
    /// sequence after row `r`, laid out as the state and computed row by row, so that it is the
    /// state a pass of that row alone leaves.
    DeltaRule(DeltaRuleParams),
    /// Sinkhorn normalisation of `[n, n, m]` matrices (manifold hyper-connections): srcs `[x]` →
    /// `[n, n, m]`. Element `(i, j)` of matrix `r` is at `i + n·j + n²·r` (`i` the destination
    /// stream, `j` the source stream). Per matrix: `x ← softmax over i` (for each `j`), then
    /// `x ← x + eps`, then `x ← x / (Σ_j x + eps)` (for each `i`); then `iters − 1` times
    /// `x ← x / (Σ_i x + eps)` followed by `x ← x / (Σ_j x + eps)` (llama.cpp b11434
    /// `glm5-next.cpp` `build_hc_sinkhorn`; transformers 5.24 `glm5_next` counts the same 20).
    Sinkhorn {
        /// Iterations.
        iters: u32,
        /// ε.
        eps: f32,
    },
    /// Weighted sum of residual streams: srcs `[streams [n, s, rows], w]` → `[n, rows]`. With `w`
    /// `[s, rows]` (one weight per stream and row) `out[:, r] = Σ_j w[j, r]·streams[:, j, r]`;
    /// with `w` `[n, s, rows]` (one weight per element, the gated mean of Qwen3.8-Flash-Next's
    /// mixers, whose graph passes `σ(g)/s`) `out[i, r] = Σ_j w[i, j, r]·streams[i, j, r]`. The
    /// products are added in order of `j`. (For `n` = 1 the two forms are the same.)
    StreamMix,
    /// Residual stream update: srcs `[streams [n, s, rows], comb [s, s, rows], post [s, rows],
    /// y [n, rows]]` → `[n, s, rows]`, `out[:, i, r] = post[i, r]·y[:, r] + Σ_j comb[i, j, r]·
    /// streams[:, j, r]` with `comb[i, j, r]` at `i + s·j + s²·r` (as [`Op::Sinkhorn`] lays it),
    /// the products added in order of `j` after the block output's. With three sources
    /// `[streams, post, y]` the comb is the identity (Qwen3.8-Flash-Next's gated hyper-connections,
    /// llama.cpp b11434 `build_hc_combine`): `out[:, i, r] = streams[:, i, r] + post[i, r]·y[:, r]`.
    StreamUpdate,
    /// Mean of row spans: srcs `[x [n, rows], spans i32 [2, s]]` (start, end exclusive) → `[n, s]`.
    SpanMean,
    /// K-pool indexer selection (GLM-5.3's DSA): which cache positions each row's sparse attention
    /// reads ([`AttentionParams::selected`]). Srcs `[q [dh, n_head, rows], w [n_head, rows], cache
    /// [3·dh, len, n_slots], ape [dh, kpool], slots, positions]` → i32 `[n_sel, rows]`; q, w and
    /// ape f32, slots and positions i32 `[rows]`, the cache f32 or f16 (its type is the pair's).
    ///
    /// Each cache row (stored by [`Op::CacheStore`] at `position % len` of its slot) is `[key |
    /// gate | pooled]`, `dh` values each. Positions `g·kpool .. g·kpool + kpool` form pool `g`,
    /// complete once its last position is stored. Its pooled key is, per dimension `d`,
    /// `Σ_t softmax_t(gate[t, d] + ape[d, t])·key[t, d]` over the pool's `kpool` rows `t` (the
    /// softmax runs over the pool's positions, separately for each `d`). The op
    /// writes the pooled key of every pool that a row of this call completes into the pooled
    /// section of that pool's last row (the cache is updated in place) and reads earlier pools'
    /// from there. A row at position `p` scores each complete pool `g` (`g·kpool + kpool − 1 ≤ p`)
    /// as `Σ_h w[h]·relu(q_h·pooled_g)` (the graph scales `w` by `1/√(dh·n_head)` beforehand, as
    /// llama.cpp b11434 and transformers 5.24 `glm5_next` do), scores ranked as f32 values, and
    /// keeps the `min(n_top, complete pools)` best (ties: lower pool). Output entries
    /// `0 .. kpool·n_top` list their positions, pools in descending score order, each pool's
    /// positions ascending, then −1. With `tail`, entries `kpool·n_top .. n_sel` list the
    /// positions after the last complete pool up to `p` (`(p + 1) % kpool` of them, ascending),
    /// then −1. `n_sel = kpool·n_top + (tail ? kpool − 1 : 0)`. So with `tail` a row at
    /// `p < kpool·n_top + kpool − 1` sees every position `0..=p` (dense). Positions must be below
    /// `len` (pools are never wrapped).
    ///
    /// That is [`KPoolMode::SoftmaxGate`]. With [`KPoolMode::MeanNormRope`] (Qwen3.8-Flash-Next's
    /// QSA block selection: transformers 5.24 `Qwen4ExpTextQSAIndexer`, llama.cpp b11434
    /// `qwen4exp.cpp` `build_qsa_sel`) the srcs are `[q [dh, n_head, rows], k_norm [dh], cache
    /// [2·dh, len, n_slots], slots, positions]` (the cache still source 2, its type the pair's),
    /// each cache row `[raw key | pooled]` (the raw key as projected, stored by
    /// [`Op::CacheStore`] into the first `dh` values), the pooled key of pool `g` is
    /// `rope(RmsNorm(m)·k_norm)` with `m` the mean of its `kpool` raw keys, the RMS norm over the
    /// `dh` values with `eps`, roped with `rope` at position `g·kpool` (the pool's first), written
    /// into the pooled half of the pool's last row; a pool scores `scale·Σ_h relu(q_h·pooled_g)`.
    /// Pools, ranking, ties and the output are as above (`n_top` = `budget / kpool`, `tail` on:
    /// with up to `budget + kpool − 1` positions it is dense).
    KPoolSelect(KPoolParams),
    /// A sigmoid gate from each group's dot product (Qwen3.8-Flash-Next's n-gram table layer):
    /// srcs `[a [n, s, rows], b [n, s, rows]]` f32 → f32 `[s, rows]`. Per group `(j, r)`:
    /// `d = scale·Σ_i a[i, j, r]·b[i, j, r]` (the f32 products summed in f64 and rounded to f32,
    /// as ggml's `sum_rows`, then scaled in f32), and
    /// `out[j, r] = σ(sign(d)·√max(|d|, floor))` with `sign(0)` = 0 (so `d` = 0 gives ½).
    /// transformers 5.24 `Qwen4ExpTextPLELayer.forward` and llama.cpp b11434 `build_ple` use
    /// `scale` = `1/√n` and `floor` = 1e-6.
    GroupDotGate {
        /// Multiplies the group's sum.
        scale: f32,
        /// Least magnitude under the square root.
        floor: f32,
    },
    /// DeepSeek-V4's compressor (transformers 5.24 `DeepseekV4CSACompressor` /
    /// `DeepseekV4HCACompressor`, llama.cpp b11434 `deepseek4.cpp`): pools every `ratio`
    /// positions of a sequence into one compressed row. Srcs `[kv [c·w, rows], score [c·w, rows],
    /// ape [c·w, ratio], norm [w], raw [2·c·w, len_raw, n_slots], comp [w, len_comp, n_slots],
    /// slots, positions]` → dst = `comp` (updated in place), all f32, `w` = `width`, `c` = 2 with
    /// `overlap`, else 1.
    ///
    /// Row `j` of a sequence is complete at position `jR + R − 1` (`R` = `ratio`); the call
    /// writes every row that one of its rows completes, at row `j` of `comp` (`j < len_comp`).
    /// Its slots are position `q = jR + t` (`t < R`) with kv `kv_q[o .. o + w]` and score
    /// `score_q[o .. o + w] + ape[o .. o + w, t]`, `o` = `w` with `overlap` (the second series),
    /// else 0; with `overlap` also the positions `q = (j − 1)R + t` of the window before (none
    /// for `j` = 0) with `o` = 0 (the first series). Per dimension `d` the row is
    /// `Σ softmax(scores)[slot]·kv[slot]` over its slots, then `RmsNorm(·, eps)·norm`, then
    /// roped with `rope` at position `jR`. The kv and score of a position come from this call's
    /// rows, or, for positions of earlier calls, from `raw`, which holds each position's
    /// `[kv | score]` (without `ape`) at row `position % len_raw` of its slot; the call stores
    /// its own rows there. `len_raw` must cover the window(s) a row reads: `2R` with `overlap`,
    /// else `R` (plus the rollback the host allows). This is the [`CompressForm::Pool`] form;
    /// the others take other sources (see [`CompressForm`]).
    Compress(CompressParams),
    /// DeepSeek-V4's indexer over compressed rows: which rows of a compressed cache each row's
    /// attention reads. Srcs `[q [dh, n_head, rows], w [n_head, rows], keys [dh, len, n_slots],
    /// slots, positions]` → i32 `[top_k, rows]`, `dh` = `head_dim`, the keys written by
    /// [`Op::Compress`] (row `j` at `j`). A row at position `p` scores each visible row
    /// `j < (p + 1) div ratio` as `Σ_h w[h]·relu(q_h·key_j)` (the graph scales `w` by
    /// `1/√(dh·n_head)` beforehand, as transformers 5.24 `DeepseekV4IndexerScorer` does) and
    /// lists the `min(top_k, visible)` best by descending score (ties: lower row), then −1.
    CompSelect(CompSelectParams),
    /// DeepSeek-V4.1-Flash's Engram gated read (DeepSeek's Engram reference, `Engram.forward`
    /// with V4.1's fused key/value projection and no short convolution; `docs/deepseek41-plan.md`):
    /// each residual stream adds the table value scaled by its own gate. Srcs `[streams [n, s,
    /// rows], kv [n·(s+1), rows], q_norm [n, s], k_norm [n, s]]` f32 → f32 `[n, s, rows]`; `kv`
    /// is `engram_wkv` applied to the row's gathered table rows, laid out `[key_0 | … | key_{s−1}
    /// | value]`, `n` values each. Per row and stream `j`, with `rms(x) = x / √(mean(x²) + eps)`:
    /// `d = scale·Σ_i rms(h_j)[i]·q_norm[i, j]·k_norm[i, j]·rms(key_j)[i]` (the f32 products summed
    /// in f64 and rounded to f32, then scaled in f32), `g = σ(sign(d)·√max(|d|, floor))` with
    /// `sign(0)` = 0, and `out[:, j, r] = h_j + g·value`. The model uses `scale` = `1/√n` and
    /// `floor` = 1e-6.
    EngramGate {
        /// ε inside the RMS norms of the stream and of the key.
        eps: f32,
        /// Multiplies the stream's sum.
        scale: f32,
        /// Least magnitude under the square root.
        floor: f32,
    },
}

/// An op's name and identity without its parameters, for capability lists.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpKind(pub u32);

macro_rules! op_kinds {
    ($($name:ident = $id:literal),* $(,)?) => {
        impl OpKind {
            $(
                #[doc = concat!("[`Op::", stringify!($name), "`].")]
                #[allow(non_upper_case_globals)]
                pub const $name: OpKind = OpKind($id);
            )*
            /// Every op kind of this ABI version.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$name),*];

            /// The op's name, or `None` for an id this build does not know.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($id => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }

        impl Op {
            /// The op's kind.
            pub fn kind(&self) -> OpKind {
                match self {
                    $(Op::$name { .. } => OpKind::$name,)*
                }
            }
        }
    };
}

// Id 27 was `NgramHash` until ABI 13: the host computes n-gram row ids ([`crate::ngram`]).
op_kinds! {
    GetRows = 1, Copy = 2, Concat = 3, MatMul = 4, Add = 5, Mul = 6, Scale = 7, Unary = 8, Glu = 9,
    RmsNorm = 10, LayerNorm = 11, L2Norm = 12, Softmax = 13, Rope = 14, CacheStore = 15,
    Attention = 16, AttentionDense = 17, TopK = 18, RouterTopK = 19, RouterWeights = 20,
    MoeExperts = 21, ConvCausal = 22, DeltaRule = 23, Sinkhorn = 24, StreamMix = 25,
    StreamUpdate = 26, SpanMean = 28, KPoolSelect = 29, GroupDotGate = 30,
    Compress = 31, CompSelect = 32, EngramGate = 33,
}

impl Op {
    /// The source whose element type selects the kernel (the weight of a matmul, the table of a
    /// gather, the expert stacks, the cache of attention or of the k-pool indexer); `None` when
    /// every source is f32/i32.
    /// Capability lists are keyed by this source's dtype.
    pub fn typed_src(&self) -> Option<usize> {
        match self {
            Op::GetRows | Op::MatMul | Op::Copy => Some(0),
            Op::MoeExperts(_) => Some(3),
            Op::Attention(_) => Some(1),
            Op::CacheStore { .. } => Some(1),
            Op::KPoolSelect(_) => Some(2),
            _ => None,
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "op#{}", self.0),
        }
    }
}

/// One line of a kernel plugin's capabilities: an op and the dtypes of its typed source
/// ([`Op::typed_src`]) that the plugin implements; ops without a typed source list `F32`.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct OpSupport {
    /// The op.
    pub op: OpKind,
    /// Dtypes implemented.
    pub dtypes: RVec<DType>,
}

/// Renders a capability list as one line per op, e.g. `MatMul: F32 F16 Q4_K`.
pub fn describe_support(list: &[OpSupport]) -> Vec<RString> {
    list.iter()
        .map(|s| {
            let types: Vec<String> = s.dtypes.iter().map(|d| d.to_string()).collect();
            RString::from(format!("{}: {}", s.op, types.join(" ")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_unique_and_named() {
        let mut ids: Vec<u32> = OpKind::ALL.iter().map(|k| k.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), OpKind::ALL.len());
        assert_eq!(Op::Scale { s: 2.0 }.kind(), OpKind::Scale);
        assert_eq!(OpKind::MatMul.to_string(), "MatMul");
        assert_eq!(OpKind(999).to_string(), "op#999");
    }
}
