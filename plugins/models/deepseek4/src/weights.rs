//! Every weight of a `deepseek4` file, by role and shape, in llama.cpp b11434's order
//! (`load_arch_tensors` of `src/models/deepseek4.cpp`): the globals with the trained
//! hyper-connection head, then per layer the latent attention, its compressor (ratio 4 and 128)
//! and indexer (ratio 4), the two mHC mixers, and the routed experts with either the hash table
//! (the first `hash_layer_count` layers) or the selection bias, and the shared expert.
//!
//! A `deepseek41` file: no trained collapse head; on each compressor source layer
//! ([`crate::v41`]) the compressor (one series, a score projection at ratio 2 only, no position
//! bias) and the index keys' projection of its compressed rows with their norm; on each index
//! layer the indexer's queries and head weights; on each Engram layer its table, the key/value
//! projection and the gate's two norm weights (`engram_q`, `engram_k`: the plan's **Choice** of
//! names). The facts: `docs/deepseek41-plan.md`, source S6.

use bloomery_plugin_api::model::{WeightClass as C, WeightDecl, WeightRole};
use bloomery_plugin_api::weights::{
    ExpertWeights, GluFfnWeights, LayerWeights, WeightRef, WeightTable,
};
use bloomery_plugin_api::{DType, PluginError};

use crate::engram::Engram;
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
    /// The trained head that collapses the streams (`output_hc_*`; V4 only).
    pub hc_head: Option<HcWeights>,
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

/// A V4.1 compressor source layer's compressor and index keys.
pub struct Source41Weights {
    /// Row projection `[n_embd, head_dim]` (`attn_compressor_kv`).
    pub kv: WeightRef,
    /// Score projection `[n_embd, head_dim]` (`attn_compressor_gate`; ratio 2 only: the softmax
    /// over one position at ratio 1 is 1, and the source reads no gate there).
    pub gate: Option<WeightRef>,
    /// RMS norm of a compressed row `[head_dim]` (`attn_compressor_norm`).
    pub norm: WeightRef,
    /// The index keys' projection of the normed compressed row `[head_dim, d_I]`
    /// (`indexer.attn_k`).
    pub index_k: WeightRef,
    /// The index keys' RMS norm `[d_I]` (`indexer.k_norm`, llama.cpp's name for a DSA
    /// indexer's key norm).
    pub index_k_norm: WeightRef,
}

/// The indexer of a ratio-4 layer (V4) or an index layer (V4.1).
pub struct IndexerWeights {
    /// Head weights `[n_embd, n_head]` (`indexer.proj`).
    pub proj: WeightRef,
    /// Query projection from the query low-rank output `[q_lora, n_head·head_dim]`.
    pub q_b: WeightRef,
    /// V4: the index keys' own compressor (two series of the indexer head width). `None` on
    /// V4.1, whose index keys the compressor source layer makes ([`Source41Weights`]).
    pub compressor: Option<CompressorWeights>,
}

/// An Engram site's weights (V4.1).
pub struct EngramWeights {
    /// The table `[row_width, rows]` (`engram_embd`).
    pub table: WeightRef,
    /// Keys and value from the gathered rows `[heads·row_width, (n_stream + 1)·n_embd]`
    /// (`engram_wkv`).
    pub wkv: WeightRef,
    /// The gate's norm weight of the streams `[n_embd, n_stream]` (`engram_q`).
    pub q_norm: WeightRef,
    /// The gate's norm weight of the keys `[n_embd, n_stream]` (`engram_k`).
    pub k_norm: WeightRef,
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
    /// The compressor of the attention rows (V4's ratio 4 and 128 layers).
    pub compressor: Option<CompressorWeights>,
    /// The compressor and index keys of a V4.1 compressor source layer.
    pub source41: Option<Source41Weights>,
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
    /// The Engram read before the attention (V4.1 Engram layers).
    pub engram: Option<EngramWeights>,
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
    let hc_head = match hp.v41 {
        Some(_) => None,
        None => {
            let head = HcWeights {
                proj: t.require("output_hc_fn.weight", g, C::Other, &[n * e, n])?,
                base: t.require("output_hc_base.weight", g, C::Other, &[n])?,
                scale: t.require("output_hc_scale.weight", g, C::Other, &[1])?,
            };
            f32_only(
                &[&head.base, &head.scale],
                "hyper-connection base and scale",
            )?;
            Some(head)
        }
    };
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
    let engram = match &hp.v41 {
        Some(v) => v.engram.site(il).map(|s| engram(l, hp, &v.engram, s)),
        None => None,
    }
    .transpose()?;
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
        engram,
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
    let (comp, index, source41) = match &hp.v41 {
        None => (ratio != Ratio::Window, ratio == Ratio::Four, None),
        Some(v) => (
            false,
            v.is_index_source(il),
            match v.is_comp_source(il) {
                true => Some(source41(l, hp, ratio)?),
                false => None,
            },
        ),
    };
    let compressor = match comp {
        false => None,
        true => Some(compressor(
            l,
            "attn_compressor",
            hp,
            ratio.series(),
            a.head_dim,
            ratio,
        )?),
    };
    let indexer = match index {
        true => Some(indexer(l, hp)?),
        false => None,
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
        source41,
        indexer,
    })
}

/// A V4.1 compressor source: a file carrying a compressor position bias (`attn_compressor_ape`,
/// which V4 has and the source's V4.1 math does not read) is refused by name.
fn source41(
    l: &mut LayerWeights<'_, '_>,
    hp: &HParams,
    ratio: Ratio,
) -> Result<Source41Weights, PluginError> {
    let (e, d, di) = (
        u64::from(hp.lm.n_embd),
        u64::from(hp.attn.head_dim),
        u64::from(hp.indexer.head_dim),
    );
    let ape = format!("blk.{}.attn_compressor_ape.weight", l.index());
    if l.found_shape("attn_compressor_ape.weight").is_some() {
        return Err(PluginError::BadTensor {
            name: ape.into(),
            message: "a V4.1 compressor position bias: the V4.1 math read here has none \
                      (docs/deepseek41-plan.md)"
                .into(),
        });
    }
    let c = C::Attention;
    let kv = l.weight("attn_compressor_kv", c, &[e, d])?;
    let gate = match ratio {
        Ratio::One => l.optional_tensor("attn_compressor_gate.weight", c, &[e, d])?,
        _ => Some(l.weight("attn_compressor_gate", c, &[e, d])?),
    };
    Ok(Source41Weights {
        kv,
        gate,
        norm: l.norm("attn_compressor_norm", d)?,
        index_k: l.weight("indexer.attn_k", c, &[d, di])?,
        index_k_norm: l.norm("indexer.k_norm", di)?,
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
    let compressor = match hp.v41 {
        None => Some(compressor(
            l,
            "indexer_compressor",
            hp,
            2,
            x.head_dim,
            Ratio::Four,
        )?),
        Some(_) => None,
    };
    Ok(IndexerWeights {
        proj,
        q_b,
        compressor,
    })
}

fn engram(
    l: &mut LayerWeights<'_, '_>,
    hp: &HParams,
    en: &Engram,
    site: usize,
) -> Result<EngramWeights, PluginError> {
    let (e, n) = (u64::from(hp.lm.n_embd), u64::from(hp.hc.n_stream));
    let w = u64::from(en.row_width);
    let gathered = u64::from(en.heads_per_site()) * w;
    Ok(EngramWeights {
        table: l.weight("engram_embd", C::NgramTable, &[w, en.rows[site]])?,
        wkv: l.weight("engram_wkv", C::Other, &[gathered, (n + 1) * e])?,
        q_norm: l.weight("engram_q", C::Norm, &[e, n])?,
        k_norm: l.weight("engram_k", C::Norm, &[e, n])?,
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
