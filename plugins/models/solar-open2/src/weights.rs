//! Every weight of a `solar-open2` or `kimi-linear` file, by role and shape.

use bloomery_plugin_api::kda::{KdaWeights, SsmAShape};
use bloomery_plugin_api::model::WeightClass as C;
use bloomery_plugin_api::weights::{
    ExpertWeights, GluFfnWeights, LayerWeights, ModelWeights, WeightRef, WeightTable,
};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;

/// Solar-Open2's gated NoPE GQA layer.
pub struct Gqa {
    /// Query projection `[n_embd, head_dim·n_head]`.
    pub wq: WeightRef,
    /// Key projection `[n_embd, head_dim·n_head_kv]`.
    pub wk: WeightRef,
    /// Value projection, as the keys.
    pub wv: WeightRef,
    /// Output gate projection `[n_embd, head_dim·n_head]` (`g_proj`).
    pub gate: WeightRef,
    /// Its bias `[head_dim·n_head]`, when the file has one.
    pub gate_bias: Option<WeightRef>,
    /// Output projection `[head_dim·n_head, n_embd]`.
    pub wo: WeightRef,
}

/// The mixing half of a layer.
pub enum Mixer {
    /// Gated GQA.
    Gqa(Box<Gqa>),
    /// Kimi Delta Attention.
    Kda(Box<KdaWeights>),
}

/// Routed experts with a selection bias, and the shared expert.
pub struct Moe {
    /// Router and stacks.
    pub experts: ExpertWeights,
    /// Selection bias `[n_expert]` (`exp_probs_b.bias`).
    pub bias: WeightRef,
    /// The shared expert, when the model has one.
    pub shared: Option<GluFfnWeights>,
}

/// The FFN half of a layer.
pub enum FfnWeights {
    /// Experts.
    Moe(Box<Moe>),
    /// A dense lead layer's SwiGLU.
    Dense(GluFfnWeights),
}

/// The weights of one layer.
pub struct Layer {
    /// Pre-mixer RMS norm.
    pub attn_norm: WeightRef,
    /// Pre-FFN RMS norm.
    pub ffn_norm: WeightRef,
    /// GQA or KDA.
    pub mixer: Mixer,
    /// FFN.
    pub ffn: FfnWeights,
}

/// All weights.
pub type Weights = ModelWeights<Layer>;

/// Declares every weight into `t`.
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    ModelWeights::declare(t, &hp.lm, |l| {
        let il = l.index();
        let attn_norm = l.norm("attn_norm", e)?;
        let mixer = if hp.is_kda(il) {
            Mixer::Kda(Box::new(KdaWeights::declare(
                l,
                &hp.kda,
                e,
                SsmAShape::Row,
            )?))
        } else {
            Mixer::Gqa(Box::new(gqa(l, hp, hp.n_head_kv[il as usize])?))
        };
        let ffn_norm = l.norm("ffn_norm", e)?;
        let ffn = if il < hp.n_dense_lead {
            FfnWeights::Dense(l.glu_ffn("", C::Ffn, e, u64::from(hp.n_ff))?)
        } else {
            let x = hp.experts;
            let shared = match hp.n_ff_shexp {
                0 => None,
                ff => Some(l.glu_ffn("_shexp", C::SharedExpert, e, u64::from(ff))?),
            };
            FfnWeights::Moe(Box::new(Moe {
                experts: l.experts(e, u64::from(x.n_ff_exp), x.n_expert)?,
                bias: l.tensor("exp_probs_b.bias", C::Router, &[u64::from(x.n_expert)])?,
                shared,
            }))
        };
        Ok(Layer {
            attn_norm,
            ffn_norm,
            mixer,
            ffn,
        })
    })
}

fn gqa(l: &mut LayerWeights<'_, '_>, hp: &HParams, n_kv: u32) -> Result<Gqa, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let a = &hp.lm.attn;
    let (q, kv) = (a.q_width(), u64::from(a.head_dim) * u64::from(n_kv));
    let c = C::Attention;
    Ok(Gqa {
        wq: l.weight("attn_q", c, &[e, q])?,
        wk: l.weight("attn_k", c, &[e, kv])?,
        wv: l.weight("attn_v", c, &[e, kv])?,
        gate: l.weight("attn_gate", c, &[e, q])?,
        gate_bias: l.optional_tensor("attn_gate.bias", c, &[q])?,
        wo: l.weight("attn_output", c, &[q, e])?,
    })
}
