//! Every weight of a `qwen4exp` file, by role and shape (llama.cpp b11434 `load_arch_tensors`):
//! the embeddings, the head (`output`, else the embedding) and the final hyper-connection mixer
//! `output_hc_*` in place of an output norm; per layer two gated hyper-connection mixers, a
//! Gated DeltaNet or a gated GQA layer with its QSA indexer, the n-gram table layer's
//! projections where it sits, the routed experts (fused `ffn_gate_up_exps` or separate) and the
//! sigmoid-gated shared expert; the MTP block after the trunk. An MTP-only file
//! ([`crate::hparams::mtp_only`]) declares the embeddings, the head and the MTP block alone.
//!
//! The grouped norms (`hc_*_norm`, `ple_norm_*`, `nextn.hnorm`, `nextn.hc_head_norm`) are stored
//! flat `[n_stream·n_embd]`; llama.cpp also accepts them as `[n_embd, n_stream]`, and so does
//! this loader.

use bloomery_plugin_api::model::{WeightClass as C, WeightDecl, WeightRole};
use bloomery_plugin_api::qwen_blocks::GatedDeltaNet;
use bloomery_plugin_api::weights::{
    AttentionWeights, ExpertWeights, GluFfnWeights, LayerWeights, WeightRef, WeightTable,
};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;
use crate::layers::LayerKind;
use crate::ple::TABLE;

/// One gated hyper-connection mixer (`{name}_norm`, `_down`, `_up`, and `_inject` but for the
/// final and MTP head mixers).
pub struct HcMixer {
    /// Grouped RMS norm, one gamma per stream value (stored 1 + w).
    pub norm: WeightRef,
    /// Down-projection `[n_stream·n_embd, low_rank]`.
    pub down: WeightRef,
    /// Up-projection `[low_rank, n_stream·n_embd]`.
    pub up: WeightRef,
    /// Per-stream injection weights `[n_stream·n_embd, n_stream]` (layer mixers only).
    pub inject: Option<WeightRef>,
}

/// The QSA indexer of an attention layer.
pub struct Indexer {
    /// Query projection `[n_embd, n_head·head_dim]`.
    pub q_proj: WeightRef,
    /// Raw key projection `[n_embd, head_dim]`.
    pub k_proj: WeightRef,
    /// Query RMS norm per head `[head_dim]` (stored 1 + w).
    pub q_norm: WeightRef,
    /// Pooled key RMS norm `[head_dim]` (stored 1 + w).
    pub k_norm: WeightRef,
}

/// The mixing half of a layer.
pub enum Mixer {
    /// Gated DeltaNet.
    Gdn(Box<GatedDeltaNet>),
    /// Gated GQA (`attn_q` holds each head's query then its gate) over the QSA selection.
    Qsa(Box<AttentionWeights>, Box<Indexer>),
}

/// The n-gram table layer's projections.
pub struct PleWeights {
    /// Key projection of the gathered rows `[n_embd, n_stream·n_embd]`.
    pub key: WeightRef,
    /// Value projection `[n_embd, n_embd]`.
    pub value: WeightRef,
    /// Grouped RMS norm of the key (stored 1 + w).
    pub norm_key: WeightRef,
    /// Grouped RMS norm of the residual, the query (stored 1 + w).
    pub norm_query: WeightRef,
    /// Grouped RMS norm before the convolution (stored 1 + w).
    pub norm_conv: WeightRef,
    /// Dilated depthwise convolution `[conv_kernel, n_stream·n_embd]`.
    pub conv: WeightRef,
}

/// The routed experts and the gated shared expert of a layer.
pub struct Moe {
    /// Router and stacks (fused gate+up or separate).
    pub experts: ExpertWeights,
    /// Shared expert gate logit `[n_embd, 1]`.
    pub shared_gate: WeightRef,
    /// The shared expert.
    pub shared: GluFfnWeights,
}

/// The weights of one layer (trunk or MTP block).
pub struct Layer {
    /// The mixer before the attention or DeltaNet.
    pub hc_attn: HcMixer,
    /// The mixer before the FFN.
    pub hc_ffn: HcMixer,
    /// DeltaNet or attention.
    pub mixer: Mixer,
    /// The n-gram table layer's projections (that layer only).
    pub ple: Option<PleWeights>,
    /// Experts.
    pub moe: Moe,
}

/// The MTP block's own weights besides its layer.
pub struct NextN {
    /// Its index (`block_count − 1`).
    pub index: u32,
    /// Its QSA layer and experts.
    pub layer: Layer,
    /// `[enorm(e) | hnorm(h)_s] → n_embd`, `[2·n_embd, n_embd]`.
    pub eh_proj: WeightRef,
    /// RMS norm of the next token's embedding (stored 1 + w).
    pub enorm: WeightRef,
    /// Grouped RMS norm of the trunk's residual streams (stored 1 + w).
    pub hnorm: WeightRef,
    /// Its head mixer (`nextn.hc_head_*`, no inject).
    pub hc_head: HcMixer,
}

/// All weights.
pub struct Weights {
    /// Token embedding `[n_embd, n_vocab]`.
    pub tok_embd: WeightRef,
    /// Output head (the embedding when the file has no `output`).
    pub output: WeightRef,
    /// The final mixer in place of an output norm (absent from an MTP-only file).
    pub output_hc: Option<HcMixer>,
    /// The n-gram table `[head_dim, rows]` (when the file has a PLE layer).
    pub ple_table: Option<WeightRef>,
    /// The trunk's layers (none in an MTP-only file).
    pub layers: Vec<Layer>,
    /// The MTP block, when the file holds it.
    pub nextn: Option<NextN>,
    /// Every declaration in index order.
    pub decls: Vec<WeightDecl>,
}

/// Declares every weight into `t`.
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let (e, v) = (u64::from(hp.lm.n_embd), u64::from(hp.lm.n_vocab));
    let g = WeightRole::Global;
    let tok_embd = t.require("token_embd.weight", g, C::Embedding, &[e, v])?;
    let output = t
        .optional("output.weight", g, C::Output, &[e, v])?
        .unwrap_or_else(|| tok_embd.clone());
    let trunk = !hp.mtp_only;
    let output_hc = match trunk {
        true => Some(global_mixer(t, hp)?),
        false => None,
    };
    let ple_table = match (&hp.ple, trunk) {
        (Some(p), true) => {
            let ne = [u64::from(p.head_dim), p.rows];
            Some(t.require(TABLE, g, C::NgramTable, &ne)?)
        }
        _ => None,
    };
    let n_trunk = if trunk { hp.lm.n_layer } else { 0 };
    let layers = (0..n_trunk)
        .map(|il| layer(&mut t.layer(il), hp))
        .collect::<Result<Vec<_>, _>>()?;
    let il = hp.lm.n_layer;
    let probe = format!("blk.{il}.nextn.eh_proj.weight");
    let present = t.file().is_none_or(|f| f.tensor(&probe).is_some());
    let nextn = match hp.n_mtp == 1 && present {
        true => Some(nextn(&mut t.layer(il), hp)?),
        false => None,
    };
    Ok(Weights {
        tok_embd,
        output,
        output_hc,
        ple_table,
        layers,
        nextn,
        decls: t.decls(),
    })
}

fn global_mixer(t: &mut WeightTable<'_>, hp: &HParams) -> Result<HcMixer, PluginError> {
    let (w, r, e, n) = (
        hp.hc_width(),
        u64::from(hp.hc.low_rank),
        u64::from(hp.lm.n_embd),
        u64::from(hp.hc.n_stream),
    );
    let g = WeightRole::Global;
    Ok(HcMixer {
        norm: t.require_one_of("output_hc_norm.weight", g, C::Norm, &[&[w], &[e, n]])?,
        down: t.require("output_hc_down.weight", g, C::Other, &[w, r])?,
        up: t.require("output_hc_up.weight", g, C::Other, &[r, w])?,
        inject: None,
    })
}

/// A layer mixer `{name}_*`, with `_inject` when `inject`.
fn mixer(
    l: &mut LayerWeights<'_, '_>,
    hp: &HParams,
    name: &str,
    inject: bool,
) -> Result<HcMixer, PluginError> {
    let (w, r, e, n) = (
        hp.hc_width(),
        u64::from(hp.hc.low_rank),
        u64::from(hp.lm.n_embd),
        u64::from(hp.hc.n_stream),
    );
    Ok(HcMixer {
        norm: grouped_norm(l, &format!("{name}_norm"), w, e, n)?,
        down: l.weight(&format!("{name}_down"), C::Other, &[w, r])?,
        up: l.weight(&format!("{name}_up"), C::Other, &[r, w])?,
        inject: match inject {
            true => Some(l.weight(&format!("{name}_inject"), C::Other, &[w, n])?),
            false => None,
        },
    })
}

fn grouped_norm(
    l: &mut LayerWeights<'_, '_>,
    name: &str,
    w: u64,
    e: u64,
    n: u64,
) -> Result<WeightRef, PluginError> {
    l.tensor_of_shapes(&format!("{name}.weight"), C::Norm, &[&[w], &[e, n]])
}

fn layer(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<Layer, PluginError> {
    let il = l.index();
    let hc_attn = mixer(l, hp, "hc_attn", true)?;
    let hc_ffn = mixer(l, hp, "hc_ffn", true)?;
    let mixer = match hp.kind(il) {
        Some(LayerKind::Gdn) => Mixer::Gdn(Box::new(GatedDeltaNet::load(
            l,
            hp.lm.n_embd,
            hp.gdn.dims(),
        )?)),
        Some(LayerKind::Qsa) => {
            let e = u64::from(hp.lm.n_embd);
            let attn = l.gated_attention(e, &hp.lm.attn)?;
            Mixer::Qsa(Box::new(attn), Box::new(indexer(l, hp)?))
        }
        None => return Err(PluginError::invalid(format!("layer {il}: no kind"))),
    };
    let ple = match &hp.ple {
        Some(p) if p.layer == il => Some(ple(l, hp, p.conv_kernel)?),
        _ => None,
    };
    Ok(Layer {
        hc_attn,
        hc_ffn,
        mixer,
        ple,
        moe: moe(l, hp)?,
    })
}

fn indexer(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<Indexer, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let (nh, dh) = (u64::from(hp.qsa.n_head), u64::from(hp.qsa.head_dim));
    Ok(Indexer {
        q_proj: l.weight("indexer.q_proj", C::Attention, &[e, nh * dh])?,
        k_proj: l.weight("indexer.k_proj", C::Attention, &[e, dh])?,
        q_norm: l.norm("indexer.q_norm", dh)?,
        k_norm: l.norm("indexer.k_norm", dh)?,
    })
}

fn ple(l: &mut LayerWeights<'_, '_>, hp: &HParams, taps: u32) -> Result<PleWeights, PluginError> {
    let (w, e, n) = (
        hp.hc_width(),
        u64::from(hp.lm.n_embd),
        u64::from(hp.hc.n_stream),
    );
    Ok(PleWeights {
        key: l.weight("ple_key", C::Other, &[e, w])?,
        value: l.weight("ple_value", C::Other, &[e, e])?,
        norm_key: grouped_norm(l, "ple_norm_key", w, e, n)?,
        norm_query: grouped_norm(l, "ple_norm_query", w, e, n)?,
        norm_conv: grouped_norm(l, "ple_norm_conv", w, e, n)?,
        conv: l.weight("ple_conv1d", C::Other, &[u64::from(taps), w])?,
    })
}

fn moe(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<Moe, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let x = hp.experts;
    Ok(Moe {
        experts: l.experts(e, u64::from(x.n_ff_exp), x.n_expert)?,
        // Written `[n_embd, 1]` as the converter does; a 1-D `[n_embd]` (llama.cpp's
        // declaration) has the same extents.
        shared_gate: l.weight("ffn_gate_inp_shexp", C::Router, &[e, 1])?,
        shared: l.glu_ffn("_shexp", C::SharedExpert, e, u64::from(hp.n_ff_shexp))?,
    })
}

fn nextn(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<NextN, PluginError> {
    let (w, e, n) = (
        hp.hc_width(),
        u64::from(hp.lm.n_embd),
        u64::from(hp.hc.n_stream),
    );
    let layer = layer(l, hp)?;
    Ok(NextN {
        index: l.index(),
        layer,
        eh_proj: l.weight("nextn.eh_proj", C::Other, &[2 * e, e])?,
        enorm: l.norm("nextn.enorm", e)?,
        hnorm: grouped_norm(l, "nextn.hnorm", w, e, n)?,
        hc_head: mixer(l, hp, "nextn.hc_head", false)?,
    })
}
