//! Typed hyperparameters of a `deepseek4` file (DeepSeek-V4-Flash), parsed once from its
//! metadata: every key llama.cpp b11434 reads for the architecture (`load_hparams` in
//! `src/llama-model.cpp` and `load_arch_hparams` in `src/models/deepseek4.cpp`), each checked
//! against the tensor that carries it. The per-layer compress ratios and the rotary settings
//! have their own module ([`crate::layers`]). A `deepseek41` file (DeepSeek-V4.1-Flash) holds the
//! same keys under its own prefix, ratios 0, 2 and 1, an indexer whose keys come from
//! `indexer.attn_k`, and the Engram keys ([`crate::v41`], [`crate::engram`]).

use bloomery_plugin_api::hparams::{vocab_rows, ArchKeys, AttentionShape, Experts, LmHParams};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::mhc::{swiglu_clamps, HyperConnections};
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::op::{Gating, RouterParams};
use bloomery_plugin_api::PluginError;

use crate::engram;
use crate::layers::{self, Ratio, Ropes};
use crate::v41::{self, V41};

/// llama.cpp's architecture string.
pub const ARCH: &str = "deepseek4";

/// DeepSeek-V4.1-Flash's architecture string (the seed's; no engine here reads it).
pub const ARCH41: &str = "deepseek41";

/// Keys every file must hold (besides `general.architecture`): those llama.cpp reads without a
/// default, and those it defaults but the file always holds, where the default would silently
/// change the model (`attention.head_count`, `attention.key_length` (else `n_embd / n_head`),
/// `rope.dimension_count` (else the whole head), `rope.freq_base`, the expert counts).
const REQUIRED: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.q_lora_rank",
    "attention.sliding_window",
    "attention.output_group_count",
    "attention.output_lora_rank",
    "attention.compress_ratios",
    "attention.compress_rope_freq_base",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
    "attention.indexer.top_k",
    "rope.dimension_count",
    "rope.freq_base",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_count",
    "expert_weights_scale",
    "expert_weights_norm",
    "expert_gating_func",
    "swiglu_clamp_exp",
    "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations",
    "hyper_connection.epsilon",
    "hash_layer_count",
];

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS`, the only scoring its loader takes.
const GATING_SQRT_SOFTPLUS: u32 = 4;

/// llama.cpp's floor under the sum of the chosen expert weights before they are renormalised
/// (the smallest normal f16).
const NORM_MIN: f32 = 6.103_515_6e-5;

/// The indexer's head width must be a multiple of this: llama.cpp b11434 rotates the indexer's
/// queries and keys by a Walsh-Hadamard matrix of 64-wide blocks and aborts otherwise.
const INDEXER_BLOCK: u32 = 64;

/// The latent attention: one cached row per position serving as key and value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attention {
    /// Query heads (`attention.head_count`).
    pub n_head: u32,
    /// Head width, and the width of the latent row (`attention.key_length` =
    /// `attention.value_length`).
    pub head_dim: u32,
    /// Query low-rank width (`attention.q_lora_rank`).
    pub q_lora: u32,
    /// Positions of the window ring (`attention.sliding_window`), the current one included.
    pub window: u32,
    /// Groups of the grouped output projection (`attention.output_group_count`; they divide the
    /// `n_head·head_dim` output).
    pub out_groups: u32,
    /// Rank of each group (`attention.output_lora_rank`).
    pub out_rank: u32,
}

impl Attention {
    /// Width of all heads: `n_head·head_dim`.
    pub fn q_width(&self) -> u64 {
        u64::from(self.n_head) * u64::from(self.head_dim)
    }
}

/// The indexer of the ratio-4 layers: it scores the compressed rows and keeps the best.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Indexer {
    /// Heads (`attention.indexer.head_count`).
    pub n_head: u32,
    /// Head width (`attention.indexer.key_length`; a multiple of 64, not the attention head).
    pub head_dim: u32,
    /// Compressed rows kept per query (`attention.indexer.top_k`).
    pub top_k: u32,
}

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Layers, widths, vocabulary; `attn` summarises the latent attention (one KV head).
    pub lm: LmHParams,
    /// The latent attention.
    pub attn: Attention,
    /// Each layer's compress ratio (`attention.compress_ratios`).
    pub ratios: Vec<Ratio>,
    /// The rotary embeddings of the window-only and the compressed layers.
    pub rope: Ropes,
    /// The indexer.
    pub indexer: Indexer,
    /// The hyper-connections.
    pub hc: HyperConnections,
    /// The routed experts.
    pub experts: Experts,
    /// The router of the layers that are not hash-routed.
    pub route: RouterParams,
    /// Leading layers routed by the token's row of `ffn_gate_tid2eid` (`hash_layer_count`).
    pub n_hash: u32,
    /// Shared expert width (`expert_shared_count` × the expert width).
    pub n_ff_shexp: u32,
    /// SwiGLU clamp of the routed experts per layer (`swiglu_clamp_exp`; 0 = none).
    pub clamp_exp: Vec<f32>,
    /// SwiGLU clamp of the shared expert per layer (`swiglu_clamp_shexp`, default
    /// `swiglu_clamp_exp`).
    pub clamp_shexp: Vec<f32>,
    /// The V4.1 sources and Engram (`None` for a `deepseek4` file).
    pub v41: Option<V41>,
}

impl HParams {
    /// Reads and checks every key of a `deepseek4` or `deepseek41` file.
    pub fn from_view(view: &ModelFileView) -> Result<Self, PluginError> {
        let arch = match view.architecture()? {
            ARCH41 => ARCH41,
            _ => ARCH,
        };
        let is41 = arch == ARCH41;
        let keys = ArchKeys::new(view, arch);
        for k in REQUIRED {
            keys.get(k).ok_or_else(|| keys.bad(k, "missing"))?;
        }
        let n_layer = n_layer(&keys)?;
        let attn = attention(&keys)?;
        let lm = trunk(&keys, n_layer, &attn)?;
        let indexer = match is41 {
            false => indexer(&keys, attn.head_dim)?,
            true => indexer41(&keys)?,
        };
        let ratios = layers::ratios(&keys, n_layer, is41)?;
        let v41 = match is41 {
            false => None,
            true => Some(v41::read(
                &keys,
                &ratios,
                engram::read(&keys, n_layer, lm.n_vocab)?,
            )?),
        };
        let rope = layers::ropes(&keys, attn.head_dim, indexer.head_dim)?;
        let experts = Experts::read(&keys)?;
        let n_shared = keys.positive("expert_shared_count")?;
        let n_ff_shexp = experts.n_ff_exp.checked_mul(n_shared).ok_or_else(|| {
            keys.bad(
                "expert_shared_count",
                format!("{n_shared} shared experts of {} overflow", experts.n_ff_exp),
            )
        })?;
        let t = view.first_layer_tensor("ffn_down_shexp.weight");
        let w = u64::from(n_ff_shexp);
        keys.agrees("expert_shared_count", u64::from(n_shared), Some(w), t, 0)?;
        let n = n_layer as usize;
        let clamp_exp = swiglu_clamps(&keys, "swiglu_clamp_exp", n, None)?;
        let clamp_shexp = swiglu_clamps(&keys, "swiglu_clamp_shexp", n, Some(&clamp_exp))?;
        Ok(HParams {
            hc: hyper_connections(&keys, lm.n_embd)?,
            route: router(&keys, &experts)?,
            n_hash: keys.u32("hash_layer_count")?,
            lm,
            attn,
            ratios,
            rope,
            indexer,
            experts,
            n_ff_shexp,
            clamp_exp,
            clamp_shexp,
            v41,
        })
    }

    /// The file's architecture string.
    pub fn arch(&self) -> &'static str {
        match self.v41 {
            Some(_) => ARCH41,
            None => ARCH,
        }
    }

    /// Layer `il`'s compress ratio.
    pub fn ratio(&self, il: u32) -> Option<Ratio> {
        self.ratios.get(il as usize).copied()
    }

    /// Whether layer `il` routes by the token's `ffn_gate_tid2eid` row (else by its router).
    pub fn hashed(&self, il: u32) -> bool {
        il < self.n_hash
    }

    /// Width of the hyper-connection residual: `n_stream·n_embd`.
    pub fn hc_width(&self) -> u64 {
        u64::from(self.hc.n_stream) * u64::from(self.lm.n_embd)
    }

    /// The summary the host shows and plans with.
    pub fn summary(&self) -> Summary {
        self.lm.moe_summary(&self.experts)
    }
}

/// The layers: `block_count`, at most the layers the file's tensors name. MTP blocks
/// (`nextn_predict_layers` with the first one's `nextn.eh_proj` in the file; llama.cpp ignores
/// the count without it) are refused by name: they are not declared yet.
fn n_layer(keys: &ArchKeys<'_>) -> Result<u32, PluginError> {
    let n_all = keys.positive("block_count")?;
    let n_mtp = keys.u32_or("nextn_predict_layers", 0)?;
    keys.check(n_mtp < n_all, "nextn_predict_layers", || {
        format!("{n_mtp} MTP blocks of {n_all} layers (the main graph needs one)")
    })?;
    let probe = format!("blk.{}.nextn.eh_proj.weight", n_all - n_mtp);
    keys.check(
        n_mtp == 0 || keys.view().tensor(&probe).is_none(),
        "nextn_predict_layers",
        || {
            format!(
                "{n_mtp} MTP blocks: {} MTP blocks are not supported yet",
                keys.key("").trim_end_matches('.')
            )
        },
    )?;
    let named = keys.view().layers_named();
    keys.check(u64::from(n_all) <= named, "block_count", || {
        format!("{n_all} layers, but the file's tensors name {named}")
    })?;
    Ok(n_all)
}

/// The latent attention: one KV head whose row is `key_length` = `value_length` wide, queries
/// through the `q_lora` bottleneck, the grouped output projection.
fn attention(keys: &ArchKeys<'_>) -> Result<Attention, PluginError> {
    let n_head = keys.carried_by(
        "attention.head_count",
        keys.positive("attention.head_count")?,
        "attn_sinks.weight",
        0,
    )?;
    let kv = keys.u32("attention.head_count_kv")?;
    keys.check(kv == 1, "attention.head_count_kv", || {
        format!("{kv} (DeepSeek-V4 caches one latent row: 1)")
    })?;
    let head_dim = keys.width("attention.key_length", "attn_kv_a_norm.weight", 0)?;
    let v_dim = keys.u32("attention.value_length")?;
    keys.check(v_dim == head_dim, "attention.value_length", || {
        format!(
            "{v_dim}: the latent row serves as key and value, so it equals key_length {head_dim}"
        )
    })?;
    let q_lora = keys.width("attention.q_lora_rank", "attn_q_a_norm.weight", 0)?;
    let q_width = u64::from(n_head) * u64::from(head_dim);
    let t = keys.view().first_layer_tensor("attn_q_b.weight");
    keys.agrees(
        "attention.head_count",
        u64::from(n_head),
        Some(q_width),
        t,
        1,
    )?;
    let window = keys.positive("attention.sliding_window")?;
    let out_groups = keys.positive("attention.output_group_count")?;
    keys.check(
        q_width.is_multiple_of(u64::from(out_groups)),
        "attention.output_group_count",
        || format!("{out_groups} groups do not divide the {q_width}-wide attention output"),
    )?;
    let out_rank = keys.positive("attention.output_lora_rank")?;
    let t = keys.view().first_layer_tensor("attn_output_b.weight");
    let implied = u64::from(out_groups) * u64::from(out_rank);
    keys.agrees(
        "attention.output_lora_rank",
        u64::from(out_rank),
        Some(implied),
        t,
        0,
    )?;
    Ok(Attention {
        n_head,
        head_dim,
        q_lora,
        window,
        out_groups,
        out_rank,
    })
}

/// Widths, context and vocabulary (`vocab_size`, when present, must match the embedding).
fn trunk(keys: &ArchKeys<'_>, n_layer: u32, attn: &Attention) -> Result<LmHParams, PluginError> {
    let n_embd = keys.positive("embedding_length")?;
    let e = u64::from(n_embd);
    let embd = keys.view().tensor("token_embd.weight");
    keys.agrees("embedding_length", e, Some(e), embd, 0)?;
    let n_vocab = vocab_rows(keys.view())?;
    if keys.get("vocab_size").is_some() {
        let v = keys.u32("vocab_size")?;
        keys.check(v == n_vocab, "vocab_size", || {
            format!("{v}, but token_embd has {n_vocab} rows")
        })?;
    }
    Ok(LmHParams {
        n_layer,
        n_embd,
        n_ctx_train: keys.positive("context_length")?,
        n_vocab,
        eps: keys.f32("attention.layer_norm_rms_epsilon")?,
        attn: AttentionShape {
            n_head: attn.n_head,
            n_head_kv: 1,
            head_dim: attn.head_dim,
        },
    })
}

/// The indexer: positive sizes; a head width that is a multiple of 64 and differs from the
/// attention head (llama.cpp b11434 aborts on the first and divides by zero on the second,
/// `tests/oracle/hf_deepseek4.py`'s docstring); head count and width carried by `indexer.proj`
/// and `indexer_compressor_norm`.
fn indexer(keys: &ArchKeys<'_>, attn_dim: u32) -> Result<Indexer, PluginError> {
    let n_head = keys.width("attention.indexer.head_count", "indexer.proj.weight", 1)?;
    let head_dim = keys.width(
        "attention.indexer.key_length",
        "indexer_compressor_norm.weight",
        0,
    )?;
    keys.check(
        head_dim.is_multiple_of(INDEXER_BLOCK),
        "attention.indexer.key_length",
        || {
            format!(
                "{head_dim}: not a multiple of {INDEXER_BLOCK} (llama.cpp b11434's Hadamard \
                 rotation of the indexer aborts on it)"
            )
        },
    )?;
    keys.check(head_dim != attn_dim, "attention.indexer.key_length", || {
        format!(
            "{head_dim}, equal to attention.key_length (llama.cpp b11434 crashes with SIGFPE \
             creating a context for it)"
        )
    })?;
    Ok(Indexer {
        n_head,
        head_dim,
        top_k: keys.positive("attention.indexer.top_k")?,
    })
}

/// The V4.1 indexer: positive sizes, the head count carried by `indexer.proj` and the head
/// width by the index keys' projection `indexer.attn_k` (of a compressed row, on the compressor
/// sources; llama.cpp's limits do not apply: it does not read `deepseek41`).
fn indexer41(keys: &ArchKeys<'_>) -> Result<Indexer, PluginError> {
    Ok(Indexer {
        n_head: keys.width("attention.indexer.head_count", "indexer.proj.weight", 1)?,
        head_dim: keys.width("attention.indexer.key_length", "indexer.attn_k.weight", 1)?,
        top_k: keys.positive("attention.indexer.top_k")?,
    })
}

/// The hyper-connections ([`HyperConnections::read`]); `embedding_length_out`, when present, is
/// their width `n_stream·n_embd` (llama.cpp recomputes it; a file that says otherwise is refused).
fn hyper_connections(keys: &ArchKeys<'_>, n_embd: u32) -> Result<HyperConnections, PluginError> {
    let hc = HyperConnections::read(keys, n_embd)?;
    let implied = u64::from(n_embd) * u64::from(hc.n_stream);
    if keys.get("embedding_length_out").is_some() {
        let out = keys.u32("embedding_length_out")?;
        keys.check(u64::from(out) == implied, "embedding_length_out", || {
            format!(
                "{out}, but {} streams of {n_embd} make {implied}",
                hc.n_stream
            )
        })?;
    }
    Ok(hc)
}

/// The router: √softplus scores (`expert_gating_func` 4, the only one llama.cpp's loader takes),
/// the selection-only bias `exp_probs_b`, renormalised when `expert_weights_norm` says so, times
/// `expert_weights_scale`; no expert groups.
fn router(keys: &ArchKeys<'_>, e: &Experts) -> Result<RouterParams, PluginError> {
    let func = keys.u32("expert_gating_func")?;
    keys.check(func == GATING_SQRT_SOFTPLUS, "expert_gating_func", || {
        format!("{func} (DeepSeek-V4 routes with sqrtsoftplus scores, {GATING_SQRT_SOFTPLUS})")
    })?;
    let groups = keys.u32_or("expert_group_count", 0)?;
    keys.check(groups <= 1, "expert_group_count", || {
        format!("{groups} expert groups (DeepSeek-V4 routes without groups)")
    })?;
    let norm = keys
        .view()
        .bool_or(&keys.key("expert_weights_norm"), false)?;
    let scale = keys.f32("expert_weights_scale")?;
    keys.check(
        scale.is_finite() && scale > 0.0,
        "expert_weights_scale",
        || format!("{scale} (a positive factor)"),
    )?;
    Ok(RouterParams {
        gating: Gating::SqrtSoftplus,
        n_expert: e.n_expert,
        k: e.n_expert_used,
        n_group: 1,
        topk_group: 1,
        bias: true,
        norm,
        norm_min: NORM_MIN,
        scale,
    })
}
