//! Typed hyperparameters of a `solar-open2` or `kimi-linear` file, parsed once from its metadata.
//! `attention.head_count_kv` is one value per layer: 0 marks a KDA layer, anything else an
//! attention layer (Solar-Open2's gated NoPE GQA; Kimi-Linear's MLA, which is refused by name).

use bloomery_plugin_api::hparams::{vocab_rows, ArchKeys, AttentionShape, Experts, LmHParams};
use bloomery_plugin_api::kda::KdaShape;
use bloomery_plugin_api::meta::{MetaValue, ModelFileView};
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::op::{Gating, RouterParams};
use bloomery_plugin_api::PluginError;

/// Solar-Open2's architecture string.
pub const ARCH_SOLAR: &str = "solar-open2";
/// Kimi-Linear's architecture string.
pub const ARCH_KIMI: &str = "kimi-linear";

/// Keys every `solar-open2` file must hold (besides `general.architecture`), after the
/// reference converter's list; a missing one is a named error even where a default would do.
const SOLAR_KEYS: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "vocab_size",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_count",
    "leading_dense_block_count",
    "ssm.conv_kernel",
    "kda.head_dim",
    "expert_gating_func",
    "attention.layer_norm_rms_epsilon",
    "expert_weights_scale",
    "expert_weights_norm",
    "rope.freq_base",
];

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// `general.architecture`.
    pub arch: &'static str,
    /// Layers, widths, vocabulary; `attn` holds the attention layers' heads (Solar-Open2) or the
    /// KDA heads (a Kimi-Linear file has no attention layer).
    pub lm: LmHParams,
    /// Key/value heads of each layer: 0 for a KDA layer.
    pub n_head_kv: Vec<u32>,
    /// The KDA layers' sizes.
    pub kda: KdaShape,
    /// The routed experts.
    pub experts: Experts,
    /// The router.
    pub route: RouterParams,
    /// Shared expert FFN width (0: none).
    pub n_ff_shexp: u32,
    /// Leading layers with a dense FFN instead of experts.
    pub n_dense_lead: u32,
    /// Dense FFN width (0 when no layer is dense).
    pub n_ff: u32,
}

impl HParams {
    /// Reads and checks every key of a file whose architecture is `arch`.
    pub fn from_view(view: &ModelFileView, arch: &'static str) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, arch);
        if arch == ARCH_SOLAR {
            for k in SOLAR_KEYS {
                keys.get(k).ok_or_else(|| keys.bad(k, "missing"))?;
            }
        }
        refuse_variants(&keys)?;
        let n_layer = keys.u32("block_count")?;
        let named = view.layers_named();
        keys.check(u64::from(n_layer) <= named, "block_count", || {
            format!("{n_layer} layers, but the file's tensors name {named}")
        })?;
        let n_embd = keys.positive("embedding_length")?;
        let n_vocab = vocab_rows(view)?;
        if keys.get("vocab_size").is_some() {
            let v = keys.u32("vocab_size")?;
            keys.check(v == n_vocab, "vocab_size", || {
                format!("{v}, but token_embd has {n_vocab} rows")
            })?;
        }
        let eps = keys.f32("attention.layer_norm_rms_epsilon")?;
        let n_head = keys.positive("attention.head_count")?;
        let n_head_kv = per_layer(&keys, "attention.head_count_kv", n_layer)?;
        let beta_scale = if arch == ARCH_SOLAR { 2.0 } else { 1.0 };
        let kda = KdaShape::read(&keys, n_head, eps, beta_scale)?;
        let attn = attention(&keys, arch, n_head, &n_head_kv, &kda)?;
        let experts = Experts::read(&keys)?;
        let route = router(&keys, arch, &experts)?;
        let n_shared = keys.u32("expert_shared_count")?;
        keys.check(n_shared <= 1, "expert_shared_count", || {
            format!("{n_shared} shared experts (0 or 1 are built)")
        })?;
        let n_ff_shexp = n_shared * experts.n_ff_exp;
        if n_shared > 0 {
            keys.carried_by(
                "expert_feed_forward_length",
                n_ff_shexp,
                "ffn_down_shexp.weight",
                0,
            )?;
        }
        let n_dense_lead = keys.u32_or("leading_dense_block_count", 0)?;
        keys.check(n_dense_lead <= n_layer, "leading_dense_block_count", || {
            format!("{n_dense_lead} of {n_layer} layers")
        })?;
        let n_ff = if n_dense_lead > 0 {
            keys.width("feed_forward_length", "ffn_down.weight", 0)?
        } else {
            keys.u32_or("feed_forward_length", 0)?
        };
        Ok(HParams {
            arch,
            lm: LmHParams {
                n_layer,
                n_embd,
                n_ctx_train: keys.u32_or("context_length", 0)?,
                n_vocab,
                eps,
                attn,
            },
            n_head_kv,
            kda,
            experts,
            route,
            n_ff_shexp,
            n_dense_lead,
            n_ff,
        })
    }

    /// Whether layer `il` is a KDA layer.
    pub fn is_kda(&self, il: u32) -> bool {
        self.n_head_kv.get(il as usize) == Some(&0)
    }

    /// The summary the host shows and plans with.
    pub fn summary(&self) -> Summary {
        self.lm.moe_summary(&self.experts)
    }
}

/// Refuses by name a full-rank KDA projection (`kda_use_full_proj`, written as a flag); the
/// other variant not built, fewer KDA key heads than value heads, is refused from the tensors'
/// shapes ([`crate::weights`]).
fn refuse_variants(keys: &ArchKeys<'_>) -> Result<(), PluginError> {
    for name in ["kda.use_full_proj", "kda_use_full_proj"] {
        if let Some(v) = keys.get(name) {
            if !matches!(v, MetaValue::Bool(false)) && v.as_u64() != Some(0) {
                return Err(PluginError::unsupported(
                    format!(
                        "`{}` (kda_use_full_proj: full-rank KDA projections)",
                        keys.key(name)
                    ),
                    &["low-rank ssm_f_a/ssm_f_b and ssm_g_a/ssm_g_b"],
                ));
            }
        }
    }
    Ok(())
}

/// A per-layer `u32` key: an array of one value per layer, or one value for every layer.
fn per_layer(keys: &ArchKeys<'_>, name: &str, n_layer: u32) -> Result<Vec<u32>, PluginError> {
    match keys.get(name) {
        Some(MetaValue::Array(_)) => {
            let v = keys.u32_array_or_empty(name)?;
            keys.check(v.len() == n_layer as usize, name, || {
                format!("{} values for {n_layer} layers", v.len())
            })?;
            Ok(v)
        }
        _ => Ok(vec![keys.u32(name)?; n_layer as usize]),
    }
}

/// The attention layers' heads: Solar-Open2's GQA (`attention.key_length` =
/// `attention.value_length`, NoPE, every non-zero `head_count_kv` dividing the heads); a
/// Kimi-Linear file's attention layers are MLA, refused.
fn attention(
    keys: &ArchKeys<'_>,
    arch: &str,
    n_head: u32,
    n_head_kv: &[u32],
    kda: &KdaShape,
) -> Result<AttentionShape, PluginError> {
    let first = n_head_kv.iter().position(|&n| n > 0);
    if arch == ARCH_KIMI {
        if let Some(il) = first {
            return Err(PluginError::unsupported(
                format!(
                    "kimi-linear layer {il}: an MLA attention layer (attention.head_count_kv {})",
                    n_head_kv[il]
                ),
                &["kimi-linear files whose layers are all KDA (attention.head_count_kv 0)"],
            ));
        }
        return Ok(AttentionShape {
            n_head,
            n_head_kv: n_head,
            head_dim: kda.head_dim,
        });
    }
    let head_dim = keys.positive("attention.key_length")?;
    let v = keys.u32("attention.value_length")?;
    keys.check(v == head_dim, "attention.value_length", || {
        format!("value length {v} must equal key length {head_dim}")
    })?;
    for (il, &n) in n_head_kv.iter().enumerate() {
        keys.check(
            n == 0 || n_head.is_multiple_of(n),
            "attention.head_count_kv",
            || format!("layer {il}: {n} KV heads do not divide {n_head} heads"),
        )?;
    }
    let rot = keys.u32_or("rope.dimension_count", 0)?;
    keys.check(rot == 0, "rope.dimension_count", || {
        format!("{rot} rotated dims: Solar-Open2's attention is NoPE (use_rope true is not built)")
    })?;
    keys.f32("rope.freq_base")?;
    let n_kv = first.map_or(n_head, |il| n_head_kv[il]);
    Ok(AttentionShape {
        n_head,
        n_head_kv: n_kv,
        head_dim,
    })
}

/// The router: sigmoid scores (`expert_gating_func` 2), a selection bias, renormalised
/// (`expert_weights_norm`, default on), times `expert_weights_scale`; groups from
/// `expert_group_count` / `expert_group_used_count` (default 1).
fn router(keys: &ArchKeys<'_>, arch: &str, e: &Experts) -> Result<RouterParams, PluginError> {
    let func = keys.u32("expert_gating_func")?;
    keys.check(func == 2, "expert_gating_func", || {
        format!("{func} (this family routes with sigmoid scores, 2)")
    })?;
    let norm = match keys.get("expert_weights_norm") {
        None => true,
        Some(MetaValue::Bool(b)) => *b,
        Some(v) => {
            v.as_u64()
                .ok_or_else(|| keys.bad("expert_weights_norm", "not a flag"))?
                != 0
        }
    };
    let n_group = keys.positive_or("expert_group_count", 1)?;
    let topk_group = keys.positive_or("expert_group_used_count", 1)?;
    keys.check(
        e.n_expert.is_multiple_of(n_group) && topk_group <= n_group,
        "expert_group_used_count",
        || format!("{topk_group} of {n_group} groups of {} experts", e.n_expert),
    )?;
    Ok(RouterParams {
        gating: Gating::Sigmoid,
        n_expert: e.n_expert,
        k: e.n_expert_used,
        n_group,
        topk_group,
        bias: true,
        norm,
        // Solar-Open2 divides by the sum + 1e-20; llama.cpp's kimi-linear clamps the sum to f16's
        // smallest normal.
        norm_min: if arch == ARCH_SOLAR {
            1e-20
        } else {
            6.103_515_6e-5
        },
        scale: e.weights_scale,
    })
}
