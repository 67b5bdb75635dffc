//! Typed hyperparameters of a `qwen35moe` or `qwen35` file, parsed once from its metadata.

use bloomery_plugin_api::decision::HeadHParams;
use bloomery_plugin_api::hparams::{periodic_flags, ArchKeys, Experts, LmHParams};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::PluginError;

/// The mixture-of-experts architecture string (Qwen3.5/3.6-MoE).
pub const ARCH_MOE: &str = "qwen35moe";
/// The dense architecture string (Qwen3.5 dense, Clef's backbone).
pub const ARCH_DENSE: &str = "qwen35";
/// The decision model: the dense backbone plus a joint schema head in the same file (Clef).
pub const ARCH_CLEF: &str = "clef";

/// The feed-forward half of the family.
#[derive(Clone, Debug, PartialEq)]
pub enum Ffn {
    /// Routed experts (softmax router, top-k, renormalised) plus a sigmoid-gated shared expert.
    Moe {
        /// The routed experts.
        experts: Experts,
        /// Shared expert FFN width.
        n_ff_shexp: u32,
    },
    /// One SwiGLU FFN per layer.
    Dense {
        /// FFN width.
        n_ff: u32,
    },
}

/// The Gated DeltaNet (linear attention) layers' sizes.
pub type Gdn = bloomery_plugin_api::qwen_blocks::GdnDims;

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// `general.architecture`.
    pub arch: &'static str,
    /// Layers run by the main graph (without MTP layers), widths, attention heads, vocabulary.
    pub lm: LmHParams,
    /// MTP layers stored after them (`nextn_predict_layers`: 0 or 1), run by the draft graph.
    pub n_mtp: u32,
    /// Whether each layer is a Gated DeltaNet layer (else gated attention).
    pub recurrent: Vec<bool>,
    /// The Gated DeltaNet sizes.
    pub gdn: Gdn,
    /// The FFN.
    pub ffn: Ffn,
    /// The decision head (`clef` files).
    pub head: Option<HeadHParams>,
}

impl HParams {
    /// Reads the keys of a file whose architecture is `arch`; a missing or inconsistent key, or
    /// one the tensors that carry it contradict, is a named error.
    pub fn from_view(view: &ModelFileView, arch: &'static str) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, arch);
        let mut lm = LmHParams::read(&keys)?;
        let n_mtp = keys.u32_or("nextn_predict_layers", 0)?;
        keys.check(
            n_mtp <= 1 && n_mtp < lm.n_layer,
            "nextn_predict_layers",
            || {
                format!(
                    "{n_mtp} MTP layers of {} (0 or 1, after at least one trunk layer)",
                    lm.n_layer
                )
            },
        )?;
        lm.n_layer -= n_mtp;
        let interval = keys.positive_or("full_attention_interval", 4)?;
        let recurrent = periodic_flags(lm.n_layer, interval);
        let n_head_v = keys.u32("ssm.time_step_rank")?;
        let n_head_k = keys.u32("ssm.group_count")?;
        let d_state = keys.u32("ssm.state_size")?;
        let d_inner = keys.u32("ssm.inner_size")?;
        keys.check(
            n_head_k > 0 && n_head_v > 0 && n_head_v.is_multiple_of(n_head_k),
            "ssm.group_count",
            || format!("{n_head_k} key heads do not divide {n_head_v} value heads"),
        )?;
        keys.check(
            n_head_v.checked_mul(d_state) == Some(d_inner),
            "ssm.inner_size",
            || format!("{d_inner} is not {n_head_v} value heads × {d_state}"),
        )?;
        keys.carried_by("ssm.time_step_rank", n_head_v, "ssm_a", 0)?;
        keys.carried_by("ssm.state_size", d_state, "ssm_norm.weight", 0)?;
        let taps = keys.u32("ssm.conv_kernel")?;
        keys.check(taps >= 2, "ssm.conv_kernel", || format!("{taps} taps"))?;
        keys.carried_by("ssm.conv_kernel", taps, "ssm_conv1d.weight", 0)?;
        let gdn = Gdn {
            taps,
            n_head_k,
            n_head_v,
            dk: d_state,
            dv: d_state,
        };
        let ffn = if arch == ARCH_MOE {
            let experts = Experts::read(&keys)?;
            let shexp = "expert_shared_feed_forward_length";
            let n_ff_shexp = keys.u32_or(shexp, experts.n_ff_exp)?;
            Ffn::Moe {
                n_ff_shexp: keys.carried_by(shexp, n_ff_shexp, "ffn_down_shexp.weight", 0)?,
                experts,
            }
        } else {
            Ffn::Dense {
                n_ff: keys.width("feed_forward_length", "ffn_down.weight", 0)?,
            }
        };
        let head = HeadHParams::read(&keys, lm.n_embd)?;
        if arch == ARCH_CLEF && head.is_none() {
            return Err(keys.bad("decision.type", "a `clef` file needs its decision head"));
        }
        Ok(HParams {
            arch,
            lm,
            n_mtp,
            recurrent,
            gdn,
            ffn,
            head,
        })
    }

    /// The summary the host shows and plans with.
    pub fn summary(&self) -> Summary {
        match &self.ffn {
            Ffn::Moe { experts, .. } => self.lm.moe_summary(experts),
            Ffn::Dense { n_ff } => self.lm.dense_summary(*n_ff),
        }
    }
}
