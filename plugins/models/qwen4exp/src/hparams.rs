//! Typed hyperparameters of a `qwen4exp` file (Qwen3.8-Flash-Next), parsed once from its
//! metadata: every key llama.cpp b11434 reads for the architecture (`load_arch_hparams` of
//! `src/models/qwen4exp.cpp`, and the common keys), each checked against the tensors that carry
//! it. The PLE keys ([`crate::ple`]) and the layer pattern ([`crate::layers`]) have their own
//! modules.

use bloomery_plugin_api::hparams::RopeConfig;
use bloomery_plugin_api::hparams::{vocab_rows, ArchKeys, AttentionShape, Experts, LmHParams};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::op::{RopeMode, RopeParams};
use bloomery_plugin_api::PluginError;

use crate::layers::{self, LayerKind};
use crate::ple::{self, Ple};

/// llama.cpp's architecture string.
pub const ARCH: &str = "qwen4exp";

/// Keys every file must hold (besides `general.architecture`): those llama.cpp reads without a
/// default, and those it defaults but the b11434 converter always writes, where the default
/// would silently change the model: `context_length`, the head widths, `rope.dimension_count`
/// (else the whole head), `rope.freq_base`, the shared expert width, and
/// `attention.compress_ratios` (absent, llama.cpp runs every attention layer dense: the trap).
const REQUIRED: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "rope.dimension_sections",
    "rope.freq_base",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
    "ssm.conv_kernel",
    "ssm.inner_size",
    "ssm.state_size",
    "ssm.time_step_rank",
    "ssm.group_count",
    "hyper_connection.count",
    "hyper_connection.low_rank",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
    "attention.indexer.top_k",
    "attention.compress_ratios",
];

/// The Gated DeltaNet layers' sizes (key and value heads share `ssm.state_size`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gdn {
    /// Convolution taps (`ssm.conv_kernel`, at least 2).
    pub taps: u32,
    /// Key heads (`ssm.group_count`).
    pub n_head_k: u32,
    /// Value heads (`ssm.time_step_rank`, a multiple of the key heads; tiled in the file:
    /// value head `j` reads key head `j % n_head_k`).
    pub n_head_v: u32,
    /// Key and value head width (`ssm.state_size`).
    pub head_dim: u32,
}

impl Gdn {
    /// Channels of the convolution: queries, keys and values side by side.
    pub fn conv_channels(&self) -> u64 {
        2 * self.key_width() + self.value_width()
    }

    /// Width of the keys (and of the queries).
    pub fn key_width(&self) -> u64 {
        u64::from(self.n_head_k) * u64::from(self.head_dim)
    }

    /// Width of the values (and of the output gate): `ssm.inner_size`.
    pub fn value_width(&self) -> u64 {
        u64::from(self.n_head_v) * u64::from(self.head_dim)
    }

    /// The shared Gated DeltaNet block's widths (keys and values `head_dim` wide).
    pub fn dims(&self) -> bloomery_plugin_api::qwen_blocks::GdnDims {
        bloomery_plugin_api::qwen_blocks::GdnDims {
            taps: self.taps,
            n_head_k: self.n_head_k,
            n_head_v: self.n_head_v,
            dk: self.head_dim,
            dv: self.head_dim,
        }
    }
}

/// The QSA indexer of the attention layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Qsa {
    /// Query heads (`attention.indexer.head_count`; one key head).
    pub n_head: u32,
    /// Head width (`attention.indexer.key_length`; its first `rope.dimension_count` dims roped).
    pub head_dim: u32,
    /// The budget in positions (`attention.indexer.top_k`, a multiple of `ratio`).
    pub top_k: u32,
    /// Positions per pooled block (`attention.compress_ratios` on the attention layers, one
    /// value for the model, at least 2).
    pub ratio: u32,
}

impl Qsa {
    /// Blocks kept per query: `top_k / ratio`.
    pub fn n_blocks(&self) -> u32 {
        self.top_k / self.ratio
    }

    /// The most visible positions at which the selection is still every position
    /// (`top_k + ratio − 1`).
    pub fn dense_up_to(&self) -> u32 {
        self.top_k + self.ratio - 1
    }
}

/// The gated hyper-connections (no Sinkhorn): `n_stream` residual streams of `n_embd`, rank
/// `low_rank` mixers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperConnections {
    /// Residual streams (`hyper_connection.count`, at least 2).
    pub n_stream: u32,
    /// The mixers' low rank (`hyper_connection.low_rank`).
    pub low_rank: u32,
}

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Trunk layers (`block_count` less the MTP block), widths, vocabulary, the gated GQA heads.
    pub lm: LmHParams,
    /// MTP blocks stored after the trunk (`nextn_predict_layers`: 0 or 1).
    pub n_mtp: u32,
    /// The file holds the MTP block without the trunk ([`mtp_only`]).
    pub mtp_only: bool,
    /// Each layer's kind, trunk then MTP block.
    pub kinds: Vec<LayerKind>,
    /// The rotary embedding of the attention queries and keys and of the QSA indexer (IMROPE).
    pub rope: RopeParams,
    /// The Gated DeltaNet layers.
    pub gdn: Gdn,
    /// The QSA indexer.
    pub qsa: Qsa,
    /// The hyper-connections.
    pub hc: HyperConnections,
    /// The routed experts (softmax, top-k, renormalised; unscaled).
    pub experts: Experts,
    /// Shared expert width (`expert_shared_feed_forward_length`).
    pub n_ff_shexp: u32,
    /// The n-gram table layer (absent from an MTP file, and from a file without `ple.layers`).
    pub ple: Option<Ple>,
}

impl HParams {
    /// Reads and checks every key of a `qwen4exp` file.
    pub fn from_view(view: &ModelFileView) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, ARCH);
        for k in REQUIRED {
            keys.get(k).ok_or_else(|| keys.bad(k, "missing"))?;
        }
        let n_all = keys.positive("block_count")?;
        let n_mtp = keys.u32_or("nextn_predict_layers", 0)?;
        keys.check(n_mtp <= 1 && n_mtp < n_all, "nextn_predict_layers", || {
            format!("{n_mtp} MTP blocks of {n_all} (0 or 1, after at least one trunk layer)")
        })?;
        let lm = trunk(&keys, n_all - n_mtp, n_mtp)?;
        let qsa_ratio = layers::ratio(&keys, n_all)?;
        let kinds = layers::read(&keys, lm.n_layer, n_mtp)?;
        let gdn = gdn(&keys)?;
        let qsa = qsa(&keys, qsa_ratio, lm.n_ctx_train)?;
        let rope = rope(&keys, &lm.attn, qsa.head_dim)?;
        let hc = hyper_connections(&keys, lm.n_embd)?;
        let experts = Experts::read(&keys)?;
        let n_ff_shexp = keys.width(
            "expert_shared_feed_forward_length",
            "ffn_down_shexp.weight",
            0,
        )?;
        let ple = ple::read(&keys, &lm, &kinds, hc.n_stream)?;
        Ok(HParams {
            lm,
            n_mtp,
            mtp_only: mtp_only(view, n_mtp),
            kinds,
            rope,
            gdn,
            qsa,
            hc,
            experts,
            n_ff_shexp,
            ple,
        })
    }

    /// Layer `il`'s kind (trunk or MTP block).
    pub fn kind(&self, il: u32) -> Option<LayerKind> {
        self.kinds.get(il as usize).copied()
    }

    /// Width of the hyper-connection residual: `n_stream · n_embd`.
    pub fn hc_width(&self) -> u64 {
        u64::from(self.hc.n_stream) * u64::from(self.lm.n_embd)
    }

    /// The summary the host shows and plans with.
    pub fn summary(&self) -> Summary {
        self.lm.moe_summary(&self.experts)
    }
}

/// The trunk's layers, widths, vocabulary and gated GQA heads. A file's tensors must name the
/// trunk's layers, except an MTP-only file ([`mtp_only`]).
fn trunk(keys: &ArchKeys<'_>, n_layer: u32, n_mtp: u32) -> Result<LmHParams, PluginError> {
    let view = keys.view();
    let named = view.layers_named();
    let mtp_only = mtp_only(view, n_mtp);
    keys.check(
        mtp_only || u64::from(n_layer) <= named,
        "block_count",
        || format!("{n_layer} trunk layers, but the file's tensors name {named}"),
    )?;
    // An MTP-only file names its MTP block, layer `n_layer`, alone.
    let highest = highest_layer(view);
    keys.check(
        !mtp_only || highest == Some(u64::from(n_layer)),
        "block_count",
        || format!("an MTP block at layer {n_layer}, but the file's highest layer is {highest:?}"),
    )?;
    let n_embd = keys.positive("embedding_length")?;
    let e = u64::from(n_embd);
    keys.agrees(
        "embedding_length",
        e,
        Some(e),
        view.tensor("token_embd.weight"),
        0,
    )?;
    let attn = AttentionShape::read(keys, n_embd)?;
    // `attn_q` holds each head's query and output gate.
    let q = view.first_layer_tensor("attn_q.weight");
    let nh = u64::from(attn.n_head);
    keys.agrees(
        "attention.head_count",
        nh,
        attn.q_width().checked_mul(2),
        q,
        1,
    )?;
    Ok(LmHParams {
        n_layer,
        n_embd,
        n_ctx_train: keys.positive("context_length")?,
        n_vocab: vocab_rows(view)?,
        eps: keys.f32("attention.layer_norm_rms_epsilon")?,
        attn,
    })
}

/// Whether the file is an MTP-only file (the b11434 converter's `--mtp`: the MTP block, the
/// embeddings and the head, no trunk), told apart as llama.cpp does: an MTP block is declared
/// and layer 0 has no `hc_attn_norm`.
pub fn mtp_only(view: &ModelFileView, n_mtp: u32) -> bool {
    n_mtp > 0 && view.tensor("blk.0.hc_attn_norm.weight").is_none()
}

/// The highest `N` of the file's `blk.N.…` tensors.
fn highest_layer(view: &ModelFileView) -> Option<u64> {
    view.tensors
        .iter()
        .filter_map(|t| {
            let (n, _) = t.name.as_str().strip_prefix("blk.")?.split_once('.')?;
            n.parse::<u64>().ok()
        })
        .max()
}

/// The Gated DeltaNet sizes: every count positive (llama.cpp refuses zeros by name), the value
/// heads a multiple of the key heads, `ssm.inner_size` = value heads × head width.
fn gdn(keys: &ArchKeys<'_>) -> Result<Gdn, PluginError> {
    let taps = keys.u32("ssm.conv_kernel")?;
    keys.check(taps >= 2, "ssm.conv_kernel", || {
        format!("{taps} taps (at least 2)")
    })?;
    keys.carried_by("ssm.conv_kernel", taps, "ssm_conv1d.weight", 0)?;
    let head_dim = keys.positive("ssm.state_size")?;
    keys.carried_by("ssm.state_size", head_dim, "ssm_norm.weight", 0)?;
    let n_head_k = keys.positive("ssm.group_count")?;
    let n_head_v = keys.positive("ssm.time_step_rank")?;
    keys.check(n_head_v.is_multiple_of(n_head_k), "ssm.group_count", || {
        format!("{n_head_k} key heads do not divide {n_head_v} value heads")
    })?;
    keys.carried_by("ssm.time_step_rank", n_head_v, "ssm_a", 0)?;
    let inner = keys.positive("ssm.inner_size")?;
    keys.check(
        n_head_v.checked_mul(head_dim) == Some(inner),
        "ssm.inner_size",
        || format!("{inner} is not {n_head_v} value heads × {head_dim}"),
    )?;
    let g = Gdn {
        taps,
        n_head_k,
        n_head_v,
        head_dim,
    };
    let t = keys.view().first_layer_tensor("attn_qkv.weight");
    let k = u64::from(n_head_k);
    keys.agrees("ssm.group_count", k, Some(g.conv_channels()), t, 1)?;
    Ok(g)
}

/// The QSA indexer: positive sizes, a budget that is a multiple of the ratio and at most the
/// training context; its query projection carries the head count.
fn qsa(keys: &ArchKeys<'_>, ratio: u32, n_ctx: u32) -> Result<Qsa, PluginError> {
    let head_dim = keys.width("attention.indexer.key_length", "indexer.q_norm.weight", 0)?;
    keys.carried_by(
        "attention.indexer.key_length",
        head_dim,
        "indexer.k_proj.weight",
        1,
    )?;
    let n_head = keys.positive("attention.indexer.head_count")?;
    let t = keys.view().first_layer_tensor("indexer.q_proj.weight");
    let implied = u64::from(n_head).checked_mul(u64::from(head_dim));
    keys.agrees(
        "attention.indexer.head_count",
        u64::from(n_head),
        implied,
        t,
        1,
    )?;
    let top_k = keys.positive("attention.indexer.top_k")?;
    keys.check(
        top_k.is_multiple_of(ratio) && top_k <= n_ctx,
        "attention.indexer.top_k",
        || {
            format!(
                "{top_k}: a multiple of the compress ratio {ratio}, at most the context {n_ctx}"
            )
        },
    )?;
    Ok(Qsa {
        n_head,
        head_dim,
        top_k,
        ratio,
    })
}

/// The rotary embedding: IMROPE on the first `rope.dimension_count` dims (even, at most both the
/// attention head and the indexer head), sections of dim pairs that fill them; no scaling.
fn rope(
    keys: &ArchKeys<'_>,
    attn: &AttentionShape,
    indexer_dim: u32,
) -> Result<RopeParams, PluginError> {
    let mut rope = RopeConfig::read(keys, RopeMode::Imrope, attn.head_dim)?.params;
    let n_dims = rope.n_dims;
    keys.check(
        n_dims > 0 && n_dims <= indexer_dim,
        "rope.dimension_count",
        || format!("{n_dims} rotated dims: positive, at most the indexer head {indexer_dim}"),
    )?;
    keys.check(
        rope.freq_scale == 1.0 && rope.freq_base.is_finite() && rope.freq_base > 1.0,
        "rope.freq_base",
        || {
            format!(
                "θ {} with scale {} (θ > 1, no scaling)",
                rope.freq_base, rope.freq_scale
            )
        },
    )?;
    let sections = keys.u32_array_or_empty("rope.dimension_sections")?;
    let pairs: u64 = sections.iter().map(|&s| u64::from(s)).sum();
    keys.check(
        sections.len() == 4 && 2 * pairs == u64::from(n_dims),
        "rope.dimension_sections",
        || format!("{sections:?}: four sections of dim pairs that fill {n_dims} rotated dims"),
    )?;
    rope.sections.copy_from_slice(&sections);
    Ok(rope)
}

/// The hyper-connections: at least 2 streams (llama.cpp and transformers refuse 1), a positive
/// low rank carried by `hc_attn_down`, whose input is all `n_stream · n_embd` stream values.
fn hyper_connections(keys: &ArchKeys<'_>, n_embd: u32) -> Result<HyperConnections, PluginError> {
    let n_stream = keys.u32("hyper_connection.count")?;
    keys.check(n_stream >= 2, "hyper_connection.count", || {
        format!("{n_stream} streams (at least 2: one has nothing to mix)")
    })?;
    let t = keys.view().first_layer_tensor("hc_attn_inject.weight");
    keys.carried_by(
        "hyper_connection.count",
        n_stream,
        "hc_attn_inject.weight",
        1,
    )?;
    let implied = u64::from(n_embd).checked_mul(u64::from(n_stream));
    keys.agrees("hyper_connection.count", u64::from(n_stream), implied, t, 0)?;
    let low_rank = keys.width("hyper_connection.low_rank", "hc_attn_down.weight", 1)?;
    Ok(HyperConnections { n_stream, low_rank })
}
