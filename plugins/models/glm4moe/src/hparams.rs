//! Typed hyperparameters of a `glm4moe` file (GLM-4.5/4.6/4.7, Solar-Open-100B), parsed once
//! from its metadata.

use bloomery_plugin_api::hparams::{ArchKeys, Experts, LmHParams};
use bloomery_plugin_api::kv_model::ArchHParams;
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{HParams as Summary, ModelCaps};
use bloomery_plugin_api::op::{Gating, RouterParams};
use bloomery_plugin_api::PluginError;

/// The architecture string.
pub const ARCH: &str = "glm4moe";

/// llama.cpp's floor under the sum of the chosen weights before they are renormalised (the
/// smallest normal f16).
const NORM_MIN: f32 = 6.103_515_6e-5;

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Layers the main graph runs (`block_count` less the MTP layers), widths, attention heads,
    /// vocabulary.
    pub lm: LmHParams,
    /// MTP draft layers stored after them (`nextn_predict_layers`), never run.
    pub n_mtp: u32,
    /// Leading layers with a dense SwiGLU FFN (`leading_dense_block_count`).
    pub n_dense_lead: u32,
    /// Width of those dense FFNs (`feed_forward_length`; 0 when there are none).
    pub n_ff: u32,
    /// The routed experts.
    pub experts: Experts,
    /// Width of the shared expert (`expert_shared_count` × the expert width; 0: none).
    pub n_ff_shexp: u32,
    /// The router: gating function, selection bias `exp_probs_b`, renormalisation, scale.
    pub router: RouterParams,
}

impl HParams {
    /// Whether layer `il` has the dense FFN (else routed experts).
    pub fn dense(&self, il: u32) -> bool {
        il < self.n_dense_lead
    }
}

/// The router's scoring function from `expert_gating_func` (llama.cpp's numbering; a file
/// without the key routes with the sigmoid, as llama.cpp's `glm4moe` does).
fn gating(keys: &ArchKeys<'_>) -> Result<Gating, PluginError> {
    match keys.u32_or("expert_gating_func", 0)? {
        0 | 2 => Ok(Gating::Sigmoid),
        1 => Ok(Gating::Softmax),
        3 => Ok(Gating::SoftmaxSelected),
        4 => Ok(Gating::SqrtSoftplus),
        other => Err(keys.bad(
            "expert_gating_func",
            format!("unknown gating function {other} (1 softmax, 2 sigmoid, 3 softmax of the chosen, 4 sqrt-softplus)"),
        )),
    }
}

/// The router's expert groups (`expert_group_count`, `expert_group_used_count`), checked as
/// llama.cpp checks them; `(1, 1)` when the file has none.
fn groups(keys: &ArchKeys<'_>, n_expert: u32) -> Result<(u32, u32), PluginError> {
    let n_group = keys.u32_or("expert_group_count", 0)?;
    if n_group <= 1 {
        return Ok((1, 1));
    }
    keys.check(
        n_group < n_expert && n_expert.is_multiple_of(n_group),
        "expert_group_count",
        || format!("{n_group} groups of {n_expert} experts"),
    )?;
    let used = keys.u32_or("expert_group_used_count", 0)?;
    keys.check(
        used > 0 && used < n_group,
        "expert_group_used_count",
        || format!("{used} groups kept of {n_group}"),
    )?;
    Ok((n_group, used))
}

impl ArchHParams for HParams {
    fn read(view: &ModelFileView) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, ARCH);
        let n_mtp = keys.u32_or("nextn_predict_layers", 0)?;
        let lm = LmHParams::read_trunk(&keys, n_mtp)?;
        let sections = keys.u32_array_or_empty("rope.dimension_sections")?;
        keys.check(
            sections.iter().all(|&s| s == 0),
            "rope.dimension_sections",
            || format!("multimodal rope sections {sections:?} (GLM-4.xV) are not supported"),
        )?;
        let n_dense_lead = keys.u32_or("leading_dense_block_count", 0)?;
        keys.check(
            n_dense_lead < lm.n_layer,
            "leading_dense_block_count",
            || {
                format!(
                    "{n_dense_lead} dense layers of {} (at least one must have experts)",
                    lm.n_layer
                )
            },
        )?;
        let n_ff = match n_dense_lead {
            0 => 0,
            _ => keys.width("feed_forward_length", "ffn_down.weight", 0)?,
        };
        let experts = Experts::read(&keys)?;
        let n_shared = keys.u32("expert_shared_count")?;
        let n_ff_shexp = experts.n_ff_exp.checked_mul(n_shared).ok_or_else(|| {
            let w = experts.n_ff_exp;
            keys.bad(
                "expert_shared_count",
                format!("{n_shared} shared experts of width {w} overflow"),
            )
        })?;
        let t = view.first_layer_tensor("ffn_down_shexp.weight");
        let implied = Some(u64::from(n_ff_shexp));
        if n_shared > 0 {
            keys.agrees("expert_shared_count", u64::from(n_shared), implied, t, 0)?;
        }
        let (n_group, topk_group) = groups(&keys, experts.n_expert)?;
        let norm = view.bool_or(&keys.key("expert_weights_norm"), false)?;
        let router = RouterParams {
            gating: gating(&keys)?,
            n_expert: experts.n_expert,
            k: experts.n_expert_used,
            n_group,
            topk_group,
            bias: true,
            norm,
            norm_min: NORM_MIN,
            scale: experts.weights_scale,
        };
        Ok(HParams {
            lm,
            n_mtp,
            n_dense_lead,
            n_ff,
            experts,
            n_ff_shexp,
            router,
        })
    }

    fn lm(&self) -> &LmHParams {
        &self.lm
    }

    fn summary(&self) -> Summary {
        Summary {
            n_ff: self.n_ff,
            ..self.lm.moe_summary(&self.experts)
        }
    }

    fn caps(&self) -> ModelCaps {
        ModelCaps {
            n_mtp_layers: self.n_mtp,
            ..ModelCaps::kv_only(u64::from(self.lm.n_ctx_train))
        }
    }
}
