//! Every weight of a `glm5-next` file, by role and shape (llama.cpp b11434 `load_arch_tensors`):
//! the trunk layers with their hyper-connection mixers, and the NextN layer after them, declared
//! (so that tiering places it) when the file holds it, and read only by the draft graph
//! ([`crate::nextn`]).

use bloomery_plugin_api::kda::{KdaWeights, SsmAShape};
use bloomery_plugin_api::model::WeightClass as C;
use bloomery_plugin_api::nextn::NextnWeights;
use bloomery_plugin_api::weights::{
    ExpertWeights, GluFfnWeights, LayerWeights, ModelWeights, WeightRef, WeightTable,
};
use bloomery_plugin_api::{DType, PluginError};

use crate::hparams::HParams;
use crate::layers::LayerKind;

pub use bloomery_plugin_api::mhc_graph::HcWeights;

/// A full layer's k-pool indexer.
pub struct IndexerWeights {
    /// Query projection from the query low-rank output `[q_lora, head_dim·n_head]`.
    pub q_b: WeightRef,
    /// Key projection `[n_embd, head_dim]`.
    pub k: WeightRef,
    /// The keys' LayerNorm weight `[head_dim]`.
    pub k_norm: WeightRef,
    /// Its bias `[head_dim]`.
    pub k_norm_bias: WeightRef,
    /// Head weights `[n_embd, n_head]`.
    pub proj: WeightRef,
    /// Pool gate projection `[n_embd, head_dim]` (`indexer_compressor_gate`).
    pub gate: WeightRef,
    /// Position bias of the pool softmax `[head_dim, kpool]` (`indexer_compressor_ape`).
    pub ape: WeightRef,
}

/// A NoPE latent attention layer.
pub struct MlaWeights {
    /// Query down-projection `[n_embd, q_lora]`.
    pub q_a: WeightRef,
    /// Its RMS norm `[q_lora]`.
    pub q_a_norm: WeightRef,
    /// Query up-projection `[q_lora, key_length·n_head]`.
    pub q_b: WeightRef,
    /// Latent projection `[n_embd, kv_lora]`.
    pub kv_a: WeightRef,
    /// Its RMS norm `[kv_lora]`.
    pub kv_a_norm: WeightRef,
    /// Per-head key absorption `[key_length, kv_lora, n_head]`.
    pub k_b: WeightRef,
    /// Per-head value expansion `[kv_lora, value_length, n_head]`.
    pub v_b: WeightRef,
    /// Output projection `[value_length·n_head, n_embd]`.
    pub out: WeightRef,
    /// The indexer (full layers only).
    pub indexer: Option<IndexerWeights>,
}

/// The mixing half of a layer.
pub enum Mixer {
    /// Kimi Delta Attention.
    Kda(Box<KdaWeights>),
    /// Latent attention.
    Mla(Box<MlaWeights>),
}

/// Routed experts with their selection bias, and the shared expert.
pub struct Moe {
    /// Router and stacks.
    pub experts: ExpertWeights,
    /// Selection bias `[n_expert]` (`exp_probs_b.bias`).
    pub bias: WeightRef,
    /// The shared expert (absent when `expert_shared_count` is 0).
    pub shared: Option<GluFfnWeights>,
}

/// The FFN half of a layer.
pub enum Ffn {
    /// A dense lead layer's SwiGLU.
    Dense(GluFfnWeights),
    /// Routed experts.
    Moe(Box<Moe>),
}

/// The weights of one layer.
pub struct Layer {
    /// Pre-mixer RMS norm.
    pub attn_norm: WeightRef,
    /// Pre-FFN RMS norm.
    pub ffn_norm: WeightRef,
    /// The hyper-connection mixers around the mixer and the FFN (trunk layers only).
    pub hc: Option<[HcWeights; 2]>,
    /// KDA or MLA.
    pub mixer: Mixer,
    /// FFN.
    pub ffn: Ffn,
}

/// The NextN (multi-token prediction) layer.
pub struct NextN {
    /// Its index (`block_count − 1`).
    pub index: u32,
    /// Its MLA layer and FFN (no hyper-connections).
    pub layer: Layer,
    /// `nextn.eh_proj`, its norms and its optional embedding table and head.
    pub glue: NextnWeights,
}

/// All weights.
pub struct Weights {
    /// The trunk (globals and layers); its `decls` list the trunk's weights only.
    pub trunk: ModelWeights<Layer>,
    /// The NextN layer, when the file holds it.
    pub nextn: Option<NextN>,
    /// Every declaration in index order, the NextN layer's included.
    pub decls: Vec<bloomery_plugin_api::model::WeightDecl>,
}

/// Declares every weight into `t`: the trunk, then the NextN layer when `n_mtp` is 1 and the
/// file holds its `nextn.eh_proj` (a synthetic file always does).
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let trunk = ModelWeights::declare(t, &hp.lm, |l| layer(l, hp, true))?;
    let il = hp.lm.n_layer;
    let probe = format!("blk.{il}.nextn.eh_proj.weight");
    let present = t.file().is_none_or(|f| f.tensor(&probe).is_some());
    let nextn = if hp.n_mtp == 1 && present {
        Some(nextn(&mut t.layer(il), hp)?)
    } else {
        None
    };
    Ok(Weights {
        trunk,
        nextn,
        decls: t.decls(),
    })
}

fn nextn(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<NextN, PluginError> {
    let (e, v) = (u64::from(hp.lm.n_embd), u64::from(hp.lm.n_vocab));
    let layer = layer(l, hp, false)?;
    Ok(NextN {
        index: l.index(),
        layer,
        glue: NextnWeights::declare(l, e, v)?,
    })
}

fn layer(l: &mut LayerWeights<'_, '_>, hp: &HParams, trunk: bool) -> Result<Layer, PluginError> {
    let il = l.index();
    let e = u64::from(hp.lm.n_embd);
    let attn_norm = l.norm("attn_norm", e)?;
    let ffn_norm = l.norm("ffn_norm", e)?;
    let hc = match trunk {
        true => Some([hc(l, hp, "hc_attn")?, hc(l, hp, "hc_ffn")?]),
        false => None,
    };
    let mixer = match hp.kind(il) {
        Some(LayerKind::Kda) => Mixer::Kda(Box::new(KdaWeights::declare(
            l,
            &hp.kda,
            e,
            SsmAShape::Flat,
        )?)),
        Some(LayerKind::Mla { full_indexer }) => Mixer::Mla(Box::new(mla(l, hp, full_indexer)?)),
        None => return Err(PluginError::invalid(format!("layer {il}: no kind"))),
    };
    let ffn = if hp.dense(il) && trunk {
        Ffn::Dense(l.glu_ffn("", C::Ffn, e, u64::from(hp.n_ff))?)
    } else {
        let x = hp.experts;
        let experts = l.experts(e, u64::from(x.n_ff_exp), x.n_expert)?;
        let bias = l.tensor("exp_probs_b.bias", C::Router, &[u64::from(x.n_expert)])?;
        let shared = match hp.n_ff_shexp {
            0 => None,
            w => Some(l.glu_ffn("_shexp", C::SharedExpert, e, u64::from(w))?),
        };
        Ffn::Moe(Box::new(Moe {
            experts,
            bias,
            shared,
        }))
    };
    Ok(Layer {
        attn_norm,
        ffn_norm,
        hc,
        mixer,
        ffn,
    })
}

fn hc(l: &mut LayerWeights<'_, '_>, hp: &HParams, name: &str) -> Result<HcWeights, PluginError> {
    let (e, n, mix) = (
        u64::from(hp.lm.n_embd),
        u64::from(hp.hc.n_stream),
        hp.hc.n_mix(),
    );
    let w = HcWeights {
        proj: l.weight(&format!("{name}_fn"), C::Other, &[n * e, mix])?,
        base: l.weight(&format!("{name}_base"), C::Other, &[mix])?,
        scale: l.weight(&format!("{name}_scale"), C::Other, &[3])?,
    };
    // The graph reads pieces of the base and scale in place: f32, as the converter keeps them.
    for t in [&w.base, &w.scale] {
        if t.dtype != DType::F32 {
            return Err(PluginError::BadTensor {
                name: t.name.as_str().into(),
                message: format!("{} (hyper-connection base and scale are F32)", t.dtype).into(),
            });
        }
    }
    Ok(w)
}

fn mla(l: &mut LayerWeights<'_, '_>, hp: &HParams, full: bool) -> Result<MlaWeights, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let m = hp.mla;
    let (nh, ql, kvl) = (
        u64::from(m.n_head),
        u64::from(m.q_lora),
        u64::from(m.kv_lora),
    );
    let (kl, vl) = (u64::from(m.key_length), u64::from(m.value_length));
    let a = C::Attention;
    let indexer = match full {
        true => Some(indexer(l, hp)?),
        false => None,
    };
    Ok(MlaWeights {
        q_a: l.weight("attn_q_a", a, &[e, ql])?,
        q_a_norm: l.norm("attn_q_a_norm", ql)?,
        q_b: l.weight("attn_q_b", a, &[ql, kl * nh])?,
        kv_a: l.weight("attn_kv_a_mqa", a, &[e, kvl])?,
        kv_a_norm: l.norm("attn_kv_a_norm", kvl)?,
        k_b: l.weight("attn_k_b", a, &[kl, kvl, nh])?,
        v_b: l.weight("attn_v_b", a, &[kvl, vl, nh])?,
        out: l.weight("attn_output", a, &[vl * nh, e])?,
        indexer,
    })
}

fn indexer(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<IndexerWeights, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let x = hp.indexer;
    let (nh, dh, ql) = (
        u64::from(x.n_head),
        u64::from(x.head_dim),
        u64::from(hp.mla.q_lora),
    );
    let a = C::Attention;
    let w = IndexerWeights {
        q_b: l.weight("indexer.attn_q_b", a, &[ql, dh * nh])?,
        k: l.weight("indexer.attn_k", a, &[e, dh])?,
        k_norm: l.norm("indexer.k_norm", dh)?,
        k_norm_bias: l.tensor("indexer.k_norm.bias", C::Norm, &[dh])?,
        proj: l.weight("indexer.proj", a, &[e, nh])?,
        gate: l.weight("indexer_compressor_gate", a, &[e, dh])?,
        ape: l.weight(
            "indexer_compressor_ape",
            C::Other,
            &[dh, u64::from(x.kpool)],
        )?,
    };
    if w.ape.dtype != DType::F32 {
        return Err(PluginError::BadTensor {
            name: w.ape.name.as_str().into(),
            message: format!("{} (the pool position bias is F32)", w.ape.dtype).into(),
        });
    }
    Ok(w)
}
