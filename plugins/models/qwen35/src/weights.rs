//! Every weight of a Qwen3.5 hybrid, by role and shape.

use bloomery_plugin_api::decision::{self, weights::HeadWeights};
use bloomery_plugin_api::model::WeightClass as C;
use bloomery_plugin_api::nextn::NextnWeights;
use bloomery_plugin_api::qwen_blocks::GatedDeltaNet;
use bloomery_plugin_api::weights::{
    AttentionWeights, ExpertWeights, GluFfnWeights, LayerWeights, ModelWeights, WeightRef,
    WeightTable,
};
use bloomery_plugin_api::PluginError;

use crate::hparams::{Ffn, HParams};

/// The mixing half of a layer.
pub enum Mixer {
    /// Gated attention: the query projection `[n_embd, 2·head_dim·n_head]` holds each head's
    /// query followed by its output gate.
    Attention(AttentionWeights),
    /// Gated DeltaNet.
    DeltaNet(GatedDeltaNet),
}

/// The routed and shared experts of a layer.
pub struct Moe {
    /// Router and routed stacks.
    pub experts: ExpertWeights,
    /// Shared expert gate logit `[n_embd]`.
    pub shared_gate: WeightRef,
    /// Shared expert.
    pub shared: GluFfnWeights,
}

/// The FFN half of a layer.
pub enum FfnWeights {
    /// Experts.
    Moe(Box<Moe>),
    /// Dense SwiGLU.
    Dense(GluFfnWeights),
}

/// The weights of one layer.
pub struct Layer {
    /// Pre-mixer RMS norm.
    pub attn_norm: WeightRef,
    /// Pre-FFN RMS norm.
    pub post_norm: WeightRef,
    /// Attention or DeltaNet.
    pub mixer: Mixer,
    /// FFN.
    pub ffn: FfnWeights,
}

/// The MTP (nextn) block stored after the trunk: a gated-attention layer with the trunk's FFN
/// kind, fed `eh_proj·[enorm(e); hnorm(h)]` ([`crate::mtp`]).
pub struct Mtp {
    /// Its index (the trunk's layer count).
    pub index: u32,
    /// Its attention layer and FFN.
    pub layer: Layer,
    /// `nextn.eh_proj`, its norms and its optional embedding table and head.
    pub glue: NextnWeights,
}

/// All weights: the backbone's, the MTP block's when the file has one and, in a `clef` file,
/// the decision head's.
pub struct Weights {
    /// The backbone; its `decls` list every declaration (the MTP block's and head's included).
    pub lm: ModelWeights<Layer>,
    /// The MTP block.
    pub mtp: Option<Mtp>,
    /// The decision head (declared so the host maps it; the host runs it).
    pub head: Option<HeadWeights>,
}

/// Declares every weight into `t`: the backbone's, then the MTP block's when
/// `nextn_predict_layers` is 1 (each of its tensors required), then the decision head's when
/// there is one.
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let mut lm = backbone(t, hp)?;
    let mtp = match hp.n_mtp {
        0 => None,
        _ => Some(mtp(&mut t.layer(hp.lm.n_layer), hp)?),
    };
    lm.decls = t.decls().into();
    let head = match &hp.head {
        Some(h) => {
            let head = decision::weights::declare(t, h)?;
            lm.decls = t.decls().into();
            Some(head)
        }
        None => None,
    };
    if let Some(view) = t.file() {
        let names: Vec<&str> = lm.decls.iter().map(|d| d.name.as_str()).collect();
        decision::weights::refuse_extra(view, &names)?;
    }
    Ok(Weights { lm, mtp, head })
}

fn backbone(t: &mut WeightTable<'_>, hp: &HParams) -> Result<ModelWeights<Layer>, PluginError> {
    ModelWeights::declare(t, &hp.lm, |l| {
        let recurrent = hp.recurrent[l.index() as usize];
        layer(l, hp, recurrent)
    })
}

fn mtp(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<Mtp, PluginError> {
    let (e, v) = (u64::from(hp.lm.n_embd), u64::from(hp.lm.n_vocab));
    let layer = layer(l, hp, false)?;
    Ok(Mtp {
        index: l.index(),
        layer,
        glue: NextnWeights::declare(l, e, v)?,
    })
}

/// A layer: a Gated DeltaNet one when `recurrent`, else gated attention; the file's FFN kind.
fn layer(
    l: &mut LayerWeights<'_, '_>,
    hp: &HParams,
    recurrent: bool,
) -> Result<Layer, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let attn_norm = l.norm("attn_norm", e)?;
    let post_norm = l.norm("post_attention_norm", e)?;
    let mixer = if recurrent {
        Mixer::DeltaNet(GatedDeltaNet::load(l, hp.lm.n_embd, hp.gdn)?)
    } else {
        Mixer::Attention(l.gated_attention(e, &hp.lm.attn)?)
    };
    let ffn = match hp.ffn {
        Ffn::Moe {
            experts: x,
            n_ff_shexp,
        } => FfnWeights::Moe(Box::new(Moe {
            experts: l.experts(e, u64::from(x.n_ff_exp), x.n_expert)?,
            shared_gate: l.weight("ffn_gate_inp_shexp", C::Router, &[e])?,
            shared: l.glu_ffn("_shexp", C::SharedExpert, e, u64::from(n_ff_shexp))?,
        })),
        Ffn::Dense { n_ff } => FfnWeights::Dense(l.glu_ffn("", C::Ffn, e, u64::from(n_ff))?),
    };
    Ok(Layer {
        attn_norm,
        post_norm,
        mixer,
        ffn,
    })
}
