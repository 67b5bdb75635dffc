//! Every weight of a `deepseek4` file, by role and shape, in llama.cpp b11434's order
//! (`load_arch_tensors` of `src/models/deepseek4.cpp`): the globals with the trained
//! hyper-connection head, then per layer the latent attention, its compressor (ratio 4 and 128)
//! and indexer (ratio 4), the two mHC mixers, and the routed experts with either the hash table
//! (the first `hash_layer_count` layers) or the selection bias, and the shared expert.

use bloomery_plugin_api::model::{WeightClass as C, WeightDecl, WeightRole};
use bloomery_plugin_api::weights::{
    ExpertWeights, GluFfnWeights, LayerWeights, WeightRef, WeightTable,
};
use bloomery_plugin_api::{DType, PluginError};

use crate::hparams::HParams;
use crate::layers::Ratio;

pub use bloomery_plugin_api::mhc_graph::HcWeights;

/// The globals.
pub struct Globals {
    /// Token embedding `[n_embd, n_vocab]`.
    pub tok_embd: WeightRef,
    /// Final RMS norm `[n_embd]`.
    pub output_norm: WeightRef,
    /// Output head `[n_embd, n_vocab]` (never tied).
    pub output: WeightRef,
    /// The trained head that collapses the streams (`output_hc_*`).
    pub hc_head: HcWeights,
}

/// A compressor (`attn_compressor_*` or `indexer_compressor_*`): `c` series of width `w`.
pub struct CompressorWeights {
    /// Row projection `[n_embd, c·w]`.
    pub kv: WeightRef,
    /// Score projection `[n_embd, c·w]`.
    pub gate: WeightRef,
    /// Position bias of the scores `[c·w, ratio]`.
    pub ape: WeightRef,
    /// RMS norm of a compressed row `[w]`.
    pub norm: WeightRef,
}

/// The indexer of a ratio-4 layer.
pub struct IndexerWeights {
    /// Head weights `[n_embd, n_head]` (`indexer.proj`).
    pub proj: WeightRef,
    /// Query projection from the query low-rank output `[q_lora, n_head·head_dim]`.
    pub q_b: WeightRef,
    /// The index keys' compressor (two series of the indexer head width).
    pub compressor: CompressorWeights,
}

/// The latent attention of a layer.
pub struct AttentionWeights {
    /// Sinks `[n_head]`: one logit per head in the softmax denominator.
    pub sinks: WeightRef,
    /// Query down-projection `[n_embd, q_lora]`.
    pub q_a: WeightRef,
    /// Its RMS norm `[q_lora]`.
    pub q_a_norm: WeightRef,
    /// Query up-projection `[q_lora, n_head·head_dim]`.
    pub q_b: WeightRef,
    /// Latent row projection `[n_embd, head_dim]` (key and value).
    pub kv: WeightRef,
    /// Its RMS norm `[head_dim]`.
    pub kv_norm: WeightRef,
    /// Grouped output down-projection, as the file stores it: `[n_head·head_dim / g, g·rank]`
    /// (group `j` is columns `j·rank .. (j+1)·rank`; llama.cpp views it as `[.., rank, g]`).
    pub out_a: WeightRef,
    /// Output up-projection `[g·rank, n_embd]`.
    pub out_b: WeightRef,
    /// The compressor of the attention rows (ratio 4 and 128 layers).
    pub compressor: Option<CompressorWeights>,
    /// The indexer (ratio 4 layers).
    pub indexer: Option<IndexerWeights>,
}

/// How a layer picks its experts.
pub enum Routing {
    /// The token's row of `ffn_gate_tid2eid`: I32 `[n_expert_used, n_vocab]`.
    Hash(WeightRef),
    /// The router's top-k with the selection bias `exp_probs_b` `[n_expert]`.
    Biased(WeightRef),
}

/// The FFN of a layer: routed experts and the shared expert.
pub struct Moe {
    /// Router (the hash layers' router still weighs the picked experts) and stacks.
    pub experts: ExpertWeights,
    /// How the experts are picked.
    pub routing: Routing,
    /// The vision variant's bias for image tokens (`exp_probs_b_vl`), declared when present so
    /// that the file loads as in llama.cpp; text never reads it.
    pub bias_vl: Option<WeightRef>,
    /// The shared expert.
    pub shared: GluFfnWeights,
}

/// The weights of one layer.
pub struct Layer {
    /// Pre-attention RMS norm.
    pub attn_norm: WeightRef,
    /// The latent attention.
    pub attn: AttentionWeights,
    /// The mHC mixers around the attention and the FFN.
    pub hc: [HcWeights; 2],
    /// Pre-FFN RMS norm.
    pub ffn_norm: WeightRef,
    /// The FFN.
    pub ffn: Moe,
}

/// All weights.
pub struct Weights {
    /// The globals.
    pub globals: Globals,
    /// The layers.
    pub layers: Vec<Layer>,
    /// Every declaration in index order.
    pub decls: Vec<WeightDecl>,
}

/// Declares every weight into `t`.
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let globals = globals(t, hp)?;
    let layers = (0..hp.lm.n_layer)
        .map(|il| layer(&mut t.layer(il), hp))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Weights {
        globals,
        layers,
        decls: t.decls(),
    })
}

fn globals(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Globals, PluginError> {
    let (e, v, n) = (
        u64::from(hp.lm.n_embd),
        u64::from(hp.lm.n_vocab),
        u64::from(hp.hc.n_stream),
    );
    let g = WeightRole::Global;
    let tok_embd = t.require("token_embd.weight", g, C::Embedding, &[e, v])?;
    let output_norm = t.require("output_norm.weight", g, C::Norm, &[e])?;
    let output = t.require("output.weight", g, C::Output, &[e, v])?;
    let hc_head = HcWeights {
        proj: t.require("output_hc_fn.weight", g, C::Other, &[n * e, n])?,
        base: t.require("output_hc_base.weight", g, C::Other, &[n])?,
        scale: t.require("output_hc_scale.weight", g, C::Other, &[1])?,
    };
    f32_only(
        &[&hc_head.base, &hc_head.scale],
        "hyper-connection base and scale",
    )?;
    Ok(Globals {
        tok_embd,
        output_norm,
        output,
        hc_head,
    })
}

fn layer(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<Layer, PluginError> {
    let il = l.index();
    let e = u64::from(hp.lm.n_embd);
    let attn_norm = l.norm("attn_norm", e)?;
    let attn = attention(l, hp)?;
    let hc = [hc(l, hp, "hc_attn")?, hc(l, hp, "hc_ffn")?];
    let x = hp.experts;
    let (ne, k, v) = (
        u64::from(x.n_expert),
        u64::from(x.n_expert_used),
        u64::from(hp.lm.n_vocab),
    );
    let router = l.weight("ffn_gate_inp", C::Router, &[e, ne])?;
    let routing = match hp.hashed(il) {
        true => Routing::Hash(l.weight("ffn_gate_tid2eid", C::Index, &[k, v])?),
        false => Routing::Biased(l.tensor("exp_probs_b.bias", C::Router, &[ne])?),
    };
    let bias_vl = l.optional_tensor("exp_probs_b_vl.bias", C::Router, &[ne])?;
    let ffn_norm = l.norm("ffn_norm", e)?;
    let experts = stacks(l, router, hp)?;
    let shared = l.glu_ffn("_shexp", C::SharedExpert, e, u64::from(hp.n_ff_shexp))?;
    Ok(Layer {
        attn_norm,
        attn,
        hc,
        ffn_norm,
        ffn: Moe {
            experts,
            routing,
            bias_vl,
            shared,
        },
    })
}

/// The expert stacks, declared after the router, the routing tensors and `ffn_norm` as in
/// llama.cpp (gate, down, up).
fn stacks(
    l: &mut LayerWeights<'_, '_>,
    router: WeightRef,
    hp: &HParams,
) -> Result<ExpertWeights, PluginError> {
    let x = hp.experts;
    let (e, ff, ne) = (
        u64::from(hp.lm.n_embd),
        u64::from(x.n_ff_exp),
        u64::from(x.n_expert),
    );
    let gate = l.weight("ffn_gate_exps", C::Experts, &[e, ff, ne])?;
    let down = l.weight("ffn_down_exps", C::Experts, &[ff, e, ne])?;
    let up = l.weight("ffn_up_exps", C::Experts, &[e, ff, ne])?;
    Ok(ExpertWeights {
        router,
        gate,
        up: Some(up),
        down,
    })
}

fn attention(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<AttentionWeights, PluginError> {
    let il = l.index();
    let a = hp.attn;
    let (e, ql, d) = (
        u64::from(hp.lm.n_embd),
        u64::from(a.q_lora),
        u64::from(a.head_dim),
    );
    let (g, r) = (u64::from(a.out_groups), u64::from(a.out_rank));
    let c = C::Attention;
    let sinks = l.weight("attn_sinks", C::Other, &[u64::from(a.n_head)])?;
    let q_a = l.weight("attn_q_a", c, &[e, ql])?;
    let q_a_norm = l.norm("attn_q_a_norm", ql)?;
    let q_b = l.weight("attn_q_b", c, &[ql, a.q_width()])?;
    let kv = l.weight("attn_kv", c, &[e, d])?;
    let kv_norm = l.norm("attn_kv_a_norm", d)?;
    let out_a = l.weight("attn_output_a", c, &[a.q_width() / g, g * r])?;
    let out_b = l.weight("attn_output_b", c, &[g * r, e])?;
    let ratio = hp
        .ratio(il)
        .ok_or_else(|| PluginError::invalid(format!("layer {il}: no compress ratio")))?;
    let compressor = match ratio {
        Ratio::Window => None,
        r => Some(compressor(
            l,
            "attn_compressor",
            hp,
            r.series(),
            a.head_dim,
            r,
        )?),
    };
    let indexer = match ratio {
        Ratio::Four => Some(indexer(l, hp)?),
        _ => None,
    };
    Ok(AttentionWeights {
        sinks,
        q_a,
        q_a_norm,
        q_b,
        kv,
        kv_norm,
        out_a,
        out_b,
        compressor,
        indexer,
    })
}

fn compressor(
    l: &mut LayerWeights<'_, '_>,
    name: &str,
    hp: &HParams,
    series: u32,
    width: u32,
    ratio: Ratio,
) -> Result<CompressorWeights, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let (cw, w) = (u64::from(series) * u64::from(width), u64::from(width));
    let c = C::Attention;
    let ape_shape = [cw, u64::from(ratio.positions())];
    Ok(CompressorWeights {
        kv: l.weight(&format!("{name}_kv"), c, &[e, cw])?,
        gate: l.weight(&format!("{name}_gate"), c, &[e, cw])?,
        ape: l.weight(&format!("{name}_ape"), C::Other, &ape_shape)?,
        norm: l.norm(&format!("{name}_norm"), w)?,
    })
}

fn indexer(l: &mut LayerWeights<'_, '_>, hp: &HParams) -> Result<IndexerWeights, PluginError> {
    let x = hp.indexer;
    let (e, ql) = (u64::from(hp.lm.n_embd), u64::from(hp.attn.q_lora));
    let width = u64::from(x.n_head) * u64::from(x.head_dim);
    let proj = l.weight("indexer.proj", C::Attention, &[e, u64::from(x.n_head)])?;
    let q_b = l.weight("indexer.attn_q_b", C::Attention, &[ql, width])?;
    let compressor = compressor(l, "indexer_compressor", hp, 2, x.head_dim, Ratio::Four)?;
    Ok(IndexerWeights {
        proj,
        q_b,
        compressor,
    })
}

fn hc(l: &mut LayerWeights<'_, '_>, hp: &HParams, name: &str) -> Result<HcWeights, PluginError> {
    let mix = hp.hc.n_mix();
    let w = HcWeights {
        proj: l.weight(&format!("{name}_fn"), C::Other, &[hp.hc_width(), mix])?,
        base: l.weight(&format!("{name}_base"), C::Other, &[mix])?,
        scale: l.weight(&format!("{name}_scale"), C::Other, &[3])?,
    };
    f32_only(&[&w.base, &w.scale], "hyper-connection base and scale")?;
    Ok(w)
}

/// Refuses any of `ws` not stored as F32: the graph reads pieces of them in place.
fn f32_only(ws: &[&WeightRef], what: &str) -> Result<(), PluginError> {
    match ws.iter().find(|w| w.dtype != DType::F32) {
        Some(w) => Err(PluginError::BadTensor {
            name: w.name.as_str().into(),
            message: format!("{} ({what} are F32)", w.dtype).into(),
        }),
        None => Ok(()),
    }
}
