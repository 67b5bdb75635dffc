//! Every weight of a `glm4moe` model, by role and shape: GQA attention whose biases and QK-norms
//! a file may or may not carry (GLM-4.5 has biases, GLM-4.7 both, Solar-Open-100B neither), a
//! pre-FFN norm named `post_attention_norm`, and a dense SwiGLU FFN in the leading layers or
//! routed experts with a selection bias and a shared expert in the others. MTP layers after the
//! main ones are not declared: the main graph never reads them.

use bloomery_plugin_api::model::WeightClass as C;
use bloomery_plugin_api::weights::{
    ExpertWeights, GluFfnWeights, LayerWeights, ModelWeights, WeightRef, WeightTable,
};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;

/// One layer's attention.
pub struct Attention {
    /// Query projection `[n_embd, head_dim·n_head]`.
    pub wq: WeightRef,
    /// Key projection `[n_embd, head_dim·n_head_kv]`.
    pub wk: WeightRef,
    /// Value projection, as wide as the keys.
    pub wv: WeightRef,
    /// Output projection `[head_dim·n_head, n_embd]`.
    pub wo: WeightRef,
    /// Biases of the query, key and value projections (`attn_q.bias` ...), where the file has them.
    pub bias: [Option<WeightRef>; 3],
    /// Per-head RMS norm of the queries `[head_dim]`, where the file has it.
    pub q_norm: Option<WeightRef>,
    /// Per-head RMS norm of the keys, where the file has it.
    pub k_norm: Option<WeightRef>,
}

/// The routed experts of a layer and what goes with them.
pub struct Moe {
    /// Router and routed stacks.
    pub experts: ExpertWeights,
    /// Selection bias `exp_probs_b.bias` `[n_expert]`: it changes which experts are chosen, not
    /// their weights.
    pub probs_bias: WeightRef,
    /// The shared expert, when the file has one.
    pub shared: Option<GluFfnWeights>,
}

/// The FFN half of a layer.
pub enum Ffn {
    /// A dense SwiGLU FFN (the leading layers).
    Dense(GluFfnWeights),
    /// Routed experts.
    Moe(Box<Moe>),
}

/// The weights of one layer.
pub struct Layer {
    /// Pre-attention RMS norm.
    pub attn_norm: WeightRef,
    /// Attention.
    pub attn: Attention,
    /// Pre-FFN RMS norm (`post_attention_norm` in the file).
    pub ffn_norm: WeightRef,
    /// FFN.
    pub ffn: Ffn,
}

/// All weights.
pub type Weights = ModelWeights<Layer>;

/// Declares every weight into `t`.
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    ModelWeights::declare(t, &hp.lm, |l| {
        let attn_norm = l.norm("attn_norm", e)?;
        let attn = attention(l, hp)?;
        let ffn_norm = l.norm("post_attention_norm", e)?;
        let ffn = if hp.dense(l.index()) {
            Ffn::Dense(l.glu_ffn("", C::Ffn, e, u64::from(hp.n_ff))?)
        } else {
            Ffn::Moe(Box::new(moe(l, hp)?))
        };
        Ok(Layer {
            attn_norm,
            attn,
            ffn_norm,
            ffn,
        })
    })
}

fn attention(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<Attention, PluginError> {
    let a = &hp.lm.attn;
    let (e, q, kv, hd) = (
        u64::from(hp.lm.n_embd),
        a.q_width(),
        a.kv_width(),
        u64::from(a.head_dim),
    );
    let c = C::Attention;
    let wq = l.weight("attn_q", c, &[e, q])?;
    let wk = l.weight("attn_k", c, &[e, kv])?;
    let wv = l.weight("attn_v", c, &[e, kv])?;
    // Biases stay F32 in quantized files, as norms do.
    let bias = [
        l.optional_tensor("attn_q.bias", C::Norm, &[q])?,
        l.optional_tensor("attn_k.bias", C::Norm, &[kv])?,
        l.optional_tensor("attn_v.bias", C::Norm, &[kv])?,
    ];
    Ok(Attention {
        wq,
        wk,
        wv,
        wo: l.weight("attn_output", c, &[q, e])?,
        bias,
        q_norm: l.optional_tensor("attn_q_norm.weight", C::Norm, &[hd])?,
        k_norm: l.optional_tensor("attn_k_norm.weight", C::Norm, &[hd])?,
    })
}

fn moe(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<Moe, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let x = hp.experts;
    let experts = l.experts(e, u64::from(x.n_ff_exp), x.n_expert)?;
    let probs_bias = l.tensor("exp_probs_b.bias", C::Router, &[u64::from(x.n_expert)])?;
    let shared = match hp.n_ff_shexp {
        0 => None,
        w => Some(l.glu_ffn("_shexp", C::SharedExpert, e, u64::from(w))?),
    };
    Ok(Moe {
        experts,
        probs_bias,
        shared,
    })
}
