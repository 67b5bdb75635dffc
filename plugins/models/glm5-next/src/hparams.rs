//! Typed hyperparameters of a `glm5-next` file (GLM-5.3), parsed once from its metadata: every
//! key llama.cpp b11434 reads for the architecture (`load_arch_hparams`), each checked against
//! the tensor that carries it. The layer kinds come from `attention.head_count_kv` (0: KDA, 1:
//! MLA), the indexer's sharing from `attention.indexer.types` ([`crate::layers`]).

use bloomery_plugin_api::hparams::{vocab_rows, ArchKeys, AttentionShape, Experts, LmHParams};
use bloomery_plugin_api::kda::KdaShape;
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::mhc::{swiglu_clamps, HyperConnections};
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::op::{Gating, KPoolMode, KPoolParams, RouterParams};
use bloomery_plugin_api::PluginError;

use crate::layers::{self, LayerKind};

/// llama.cpp's architecture string.
pub const ARCH: &str = "glm5-next";
/// ik_llama.cpp's spelling of the same architecture.
pub const ARCH_IK: &str = "glm5next";

/// Keys every file must hold (besides `general.architecture`): those llama.cpp reads without a
/// default, and `attention.layer_norm_epsilon` (the indexer's LayerNorm ε, which llama.cpp would
/// leave at 0 and the converter always writes).
const REQUIRED: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "attention.key_length_mla",
    "attention.value_length_mla",
    "attention.q_lora_rank",
    "attention.kv_lora_rank",
    "ssm.conv_kernel",
    "kda.head_dim",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_count",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
    "attention.indexer.top_k",
    "attention.indexer.kpool",
    "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations",
    "hyper_connection.epsilon",
];

/// llama.cpp's floor under the sum of the chosen expert weights before they are renormalised
/// (the smallest normal f16).
const NORM_MIN: f32 = 6.103_515_6e-5;

/// The NoPE latent attention (MLA) layers' sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mla {
    /// Query heads (`attention.head_count`, as the KDA layers).
    pub n_head: u32,
    /// Query low-rank width (`attention.q_lora_rank`).
    pub q_lora: u32,
    /// Latent width (`attention.kv_lora_rank`): one cached row per position, keys and values.
    pub kv_lora: u32,
    /// Query head width before absorption (`attention.key_length_mla`); the logits are scaled by
    /// its inverse square root.
    pub key_length: u32,
    /// Value head width after `attn_v_b` (`attention.value_length_mla`).
    pub value_length: u32,
}

/// The k-pool DSA indexer's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Indexer {
    /// Heads (`attention.indexer.head_count`).
    pub n_head: u32,
    /// Head width (`attention.indexer.key_length`).
    pub head_dim: u32,
    /// Positions selected (`attention.indexer.top_k`, a multiple of `kpool`).
    pub top_k: u32,
    /// Positions per pool (`attention.indexer.kpool`, at least 2).
    pub kpool: u32,
    /// The positions after the last complete pool are selected too
    /// (`attention.indexer.kpool_select_tail`, default false as in llama.cpp).
    pub tail: bool,
    /// ε of the keys' LayerNorm (`attention.layer_norm_epsilon`).
    pub eps: f32,
}

impl Indexer {
    /// The parameters of [`bloomery_plugin_api::op::Op::KPoolSelect`].
    pub fn params(&self) -> KPoolParams {
        KPoolParams {
            n_head: self.n_head,
            head_dim: self.head_dim,
            kpool: self.kpool,
            n_top: self.top_k / self.kpool,
            tail: self.tail,
            mode: KPoolMode::SoftmaxGate,
        }
    }

    /// Positions listed per row: `kpool·n_top`, plus `kpool − 1` with the tail.
    pub fn n_sel(&self) -> u32 {
        let p = self.params();
        p.kpool * p.n_top + if p.tail { p.kpool - 1 } else { 0 }
    }
}

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// `general.architecture` as the file spells it.
    pub arch: &'static str,
    /// Trunk layers (`block_count` less the NextN layers), widths, vocabulary; `attn` summarises
    /// the MLA layers (one latent head of `kv_lora`).
    pub lm: LmHParams,
    /// NextN layers stored after the trunk (`nextn_predict_layers`: 0 or 1).
    pub n_mtp: u32,
    /// Each layer's kind, trunk then NextN.
    pub kinds: Vec<LayerKind>,
    /// The KDA layers.
    pub kda: KdaShape,
    /// The MLA layers.
    pub mla: Mla,
    /// The indexer.
    pub indexer: Indexer,
    /// The hyper-connections.
    pub hc: HyperConnections,
    /// The routed experts.
    pub experts: Experts,
    /// The router.
    pub route: RouterParams,
    /// Shared expert width (`expert_shared_count` × the expert width; 0: none).
    pub n_ff_shexp: u32,
    /// Leading layers with a dense SwiGLU FFN (`leading_dense_block_count`).
    pub n_dense_lead: u32,
    /// Their width (`feed_forward_length`; 0 without dense layers).
    pub n_ff: u32,
    /// SwiGLU clamp of the routed experts per layer (`swiglu_clamp_exp`; 0 = none).
    pub clamp_exp: Vec<f32>,
    /// SwiGLU clamp of the shared expert and of the dense FFNs per layer (`swiglu_clamp_shexp`,
    /// default `swiglu_clamp_exp`), as llama.cpp's `build_ffn` applies it.
    pub clamp_shexp: Vec<f32>,
}

impl HParams {
    /// Reads and checks every key of a file whose architecture is `arch`.
    pub fn from_view(view: &ModelFileView, arch: &'static str) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, arch);
        for k in REQUIRED {
            keys.get(k).ok_or_else(|| keys.bad(k, "missing"))?;
        }
        let n_all = keys.positive("block_count")?;
        let n_mtp = keys.u32_or("nextn_predict_layers", 0)?;
        keys.check(n_mtp <= 1 && n_mtp < n_all, "nextn_predict_layers", || {
            format!("{n_mtp} NextN layers of {n_all} (0 or 1, after at least one trunk layer)")
        })?;
        let lm = trunk(&keys, n_all - n_mtp)?;
        let n_head = lm.attn.n_head;
        let kinds = layers::read(&keys, lm.n_layer, n_mtp)?;
        let kda = KdaShape::read(&keys, n_head, lm.eps, 1.0)?;
        let mla = mla(&keys, n_head)?;
        let experts = Experts::read(&keys)?;
        let n_dense_lead = keys.u32_or("leading_dense_block_count", 0)?;
        keys.check(
            n_dense_lead <= lm.n_layer,
            "leading_dense_block_count",
            || format!("{n_dense_lead} dense layers of {}", lm.n_layer),
        )?;
        let n_ff = match n_dense_lead {
            0 => keys.u32_or("feed_forward_length", 0)?,
            _ => keys.width("feed_forward_length", "ffn_down.weight", 0)?,
        };
        let n_shared = keys.u32("expert_shared_count")?;
        let n_ff_shexp = experts.n_ff_exp.checked_mul(n_shared).ok_or_else(|| {
            keys.bad(
                "expert_shared_count",
                format!("{n_shared} shared experts of {} overflow", experts.n_ff_exp),
            )
        })?;
        if n_shared > 0 {
            let t = view.first_layer_tensor("ffn_down_shexp.weight");
            let w = u64::from(n_ff_shexp);
            keys.agrees("expert_shared_count", u64::from(n_shared), Some(w), t, 0)?;
        }
        let n_all = n_all as usize;
        let clamp_exp = swiglu_clamps(&keys, "swiglu_clamp_exp", n_all, None)?;
        let clamp_shexp = swiglu_clamps(&keys, "swiglu_clamp_shexp", n_all, Some(&clamp_exp))?;
        Ok(HParams {
            arch,
            indexer: indexer(&keys, lm.n_ctx_train)?,
            hc: HyperConnections::read(&keys, lm.n_embd)?,
            route: router(&keys, &experts)?,
            lm,
            n_mtp,
            kinds,
            kda,
            mla,
            experts,
            n_ff_shexp,
            n_dense_lead,
            n_ff,
            clamp_exp,
            clamp_shexp,
        })
    }

    /// Layer `il`'s kind (trunk or NextN).
    pub fn kind(&self, il: u32) -> Option<LayerKind> {
        self.kinds.get(il as usize).copied()
    }

    /// Whether layer `il` has the dense FFN (else routed experts).
    pub fn dense(&self, il: u32) -> bool {
        il < self.n_dense_lead
    }

    /// The summary the host shows and plans with.
    pub fn summary(&self) -> Summary {
        Summary {
            n_ff: self.n_ff,
            ..self.lm.moe_summary(&self.experts)
        }
    }
}

/// The trunk's layers, widths and vocabulary. `attention.head_count_kv` is per layer here, so
/// [`LmHParams::read_trunk`] (one KV head count for all) does not apply.
fn trunk(keys: &ArchKeys<'_>, n_layer: u32) -> Result<LmHParams, PluginError> {
    let named = keys.view().layers_named();
    keys.check(u64::from(n_layer) <= named, "block_count", || {
        format!("{n_layer} trunk layers, but the file's tensors name {named}")
    })?;
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
    let n_head = keys.positive("attention.head_count")?;
    let kv_lora = keys.positive("attention.kv_lora_rank")?;
    Ok(LmHParams {
        n_layer,
        n_embd,
        n_ctx_train: keys.positive("context_length")?,
        n_vocab,
        eps: keys.f32("attention.layer_norm_rms_epsilon")?,
        attn: AttentionShape {
            n_head,
            n_head_kv: 1,
            head_dim: kv_lora,
        },
    })
}

/// The MLA layers: NoPE only (`rope.dimension_count` 0), the latent as wide as the cached keys
/// and values (`attention.key_length`/`value_length`, when present, equal `kv_lora_rank`).
fn mla(keys: &ArchKeys<'_>, n_head: u32) -> Result<Mla, PluginError> {
    let q_lora = keys.width("attention.q_lora_rank", "attn_q_a.weight", 1)?;
    let kv_lora = keys.width("attention.kv_lora_rank", "attn_kv_a_mqa.weight", 1)?;
    let key_length = keys.width("attention.key_length_mla", "attn_k_b.weight", 0)?;
    let value_length = keys.width("attention.value_length_mla", "attn_v_b.weight", 1)?;
    keys.carried_by("attention.head_count", n_head, "attn_k_b.weight", 2)?;
    let rot = keys.u32_or("rope.dimension_count", 0)?;
    keys.check(rot == 0, "rope.dimension_count", || {
        format!("{rot} rotated dims: GLM-5.3's latent attention is NoPE")
    })?;
    for name in ["attention.key_length", "attention.value_length"] {
        let v = keys.u32_or(name, kv_lora)?;
        keys.check(v == kv_lora, name, || {
            format!("{v}, but the latent row is {kv_lora} wide (attention.kv_lora_rank)")
        })?;
    }
    Ok(Mla {
        n_head,
        q_lora,
        kv_lora,
        key_length,
        value_length,
    })
}

/// The indexer: `top_k` a multiple of `kpool` (≥ 2), at most the training context.
fn indexer(keys: &ArchKeys<'_>, n_ctx: u32) -> Result<Indexer, PluginError> {
    let n_head = keys.width("attention.indexer.head_count", "indexer.proj.weight", 1)?;
    let head_dim = keys.width("attention.indexer.key_length", "indexer.attn_k.weight", 1)?;
    let kpool = keys.u32("attention.indexer.kpool")?;
    keys.check(kpool >= 2, "attention.indexer.kpool", || {
        format!("{kpool} positions per pool (at least 2)")
    })?;
    keys.carried_by(
        "attention.indexer.kpool",
        kpool,
        "indexer_compressor_ape.weight",
        1,
    )?;
    let top_k = keys.positive("attention.indexer.top_k")?;
    keys.check(
        top_k.is_multiple_of(kpool) && top_k <= n_ctx,
        "attention.indexer.top_k",
        || format!("{top_k}: a multiple of kpool {kpool}, at most the context {n_ctx}"),
    )?;
    let tail = keys
        .view()
        .bool_or(&keys.key("attention.indexer.kpool_select_tail"), false)?;
    let eps = keys.f32("attention.layer_norm_epsilon")?;
    Ok(Indexer {
        n_head,
        head_dim,
        top_k,
        kpool,
        tail,
        eps,
    })
}

/// The router: sigmoid scores (`expert_gating_func` absent, 0 or 2), the selection bias
/// `exp_probs_b`, renormalised when `expert_weights_norm` says so (default false, as in
/// llama.cpp), times `expert_weights_scale`; expert groups are not built.
fn router(keys: &ArchKeys<'_>, e: &Experts) -> Result<RouterParams, PluginError> {
    let func = keys.u32_or("expert_gating_func", 0)?;
    keys.check(matches!(func, 0 | 2), "expert_gating_func", || {
        format!("{func} (GLM-5.3 routes with sigmoid scores, 2)")
    })?;
    let groups = keys.u32_or("expert_group_count", 1)?;
    keys.check(groups <= 1, "expert_group_count", || {
        format!("{groups} expert groups (GLM-5.3 routes without groups)")
    })?;
    let norm = keys
        .view()
        .bool_or(&keys.key("expert_weights_norm"), false)?;
    Ok(RouterParams {
        gating: Gating::Sigmoid,
        n_expert: e.n_expert,
        k: e.n_expert_used,
        n_group: 1,
        topk_group: 1,
        bias: true,
        norm,
        norm_min: NORM_MIN,
        scale: e.weights_scale,
    })
}
