//! The `glm4moe` architecture and its forward graph: pre-norm GQA (optional Q/K/V biases and
//! QK-norm, NEOX rope over the file's `rope.dimension_count`), then a dense SwiGLU FFN in the
//! leading layers or, in the others, routed experts chosen by a sigmoid router with a selection
//! bias plus an ungated shared expert, for a batch of rows from any number of sequences.

use bloomery_plugin_api::builders::{causal_lm, AttentionBlock, LayerAt, MoeBlock};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder, TensorId};
use bloomery_plugin_api::kv_model::{KvArchitecture, KvModel};
use bloomery_plugin_api::op::{GluKind, RopeMode};
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

use crate::hparams::{HParams, ARCH};
use crate::weights::{self, Attention, Ffn, Layer, Moe, Weights};

/// The `glm4moe` architecture: its state is a K/V cache per layer.
pub struct Glm4Moe;

impl KvArchitecture for Glm4Moe {
    const ARCH: &'static str = ARCH;
    const ROPE: RopeMode = RopeMode::Neox;
    type HParams = HParams;
    type Layer = Layer;

    fn weights(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
        weights::declare(t, hp)
    }

    fn graph(m: &KvModel<Self>, shape: BatchShape) -> Result<Graph, PluginError> {
        build(m, shape)
    }
}

/// The attention block of layer `il` over its caches.
fn attention<'a>(m: &KvModel<Glm4Moe>, a: &'a Attention, il: u32) -> AttentionBlock<'a> {
    let (k_cache, v_cache) = bloomery_plugin_api::builders::kv_cache_indices(il);
    AttentionBlock {
        wq: &a.wq,
        wk: &a.wk,
        wv: &a.wv,
        wo: &a.wo,
        q_norm: a.q_norm.as_ref(),
        k_norm: a.k_norm.as_ref(),
        qkv_bias: a.bias.each_ref().map(Option::as_ref),
        norm_eps: m.hp.lm.eps,
        rope: Some(m.rope),
        params: m.hp.lm.attn.gqa(),
        k_cache,
        v_cache,
    }
}

/// Routed experts plus the shared expert of the normed `x`; the shared expert runs between the
/// routing and the routed experts, so that with those on the host the card computes it meanwhile.
fn moe(g: &mut GraphBuilder, hp: &HParams, e: &Moe, x: TensorId) -> Result<TensorId, PluginError> {
    let blk = MoeBlock {
        router_bias: Some(&e.probs_bias),
        ..e.experts.block(hp.router, GluKind::SwiGlu)
    };
    let route = g.moe_route(&blk, x)?;
    let shared = match &e.shared {
        Some(s) => Some(g.glu_ffn("ffn_shexp_", s, GluKind::SwiGlu, x)?),
        None => None,
    };
    let out = g.moe_experts(&blk, x, route)?;
    match shared {
        Some(s) => g.add("ffn_out", out, s),
        None => Ok(out),
    }
}

/// One layer of `x`: `h = x + attention(rms_norm(x))`, then `h + ffn(rms_norm(h))`, only the
/// wanted rows going on after the last layer's attention.
fn layer(
    m: &KvModel<Glm4Moe>,
    g: &mut GraphBuilder,
    at: LayerAt<'_>,
    l: &Layer,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    let eps = m.hp.lm.eps;
    let an = g.w(&l.attn_norm)?;
    let cur = g.rms_norm("attn_norm", x, Some(an), eps)?;
    let mut cur = g.attention_block(&attention(m, &l.attn, at.index), cur, at.inp)?;
    let mut x = x;
    if at.last {
        cur = g.select_outputs(cur, at.inp)?;
        x = g.select_outputs(x, at.inp)?;
    }
    let ffn_inp = g.add("ffn_inp", cur, x)?;
    let fnorm = g.w(&l.ffn_norm)?;
    let cur = g.rms_norm("post_attn_norm", ffn_inp, Some(fnorm), eps)?;
    let cur = match &l.ffn {
        Ffn::Dense(f) => g.glu_ffn("ffn_", f, GluKind::SwiGlu, cur)?,
        Ffn::Moe(e) => moe(g, &m.hp, e, cur)?,
    };
    g.add("l_out", cur, ffn_inp)
}

/// Builds the graph for `shape`.
pub fn build(m: &KvModel<Glm4Moe>, shape: BatchShape) -> Result<Graph, PluginError> {
    let w = &m.weights;
    causal_lm(shape, &w.globals, m.hp.lm.eps, &w.layers, |g, at, l, x| {
        layer(m, g, at, l, x)
    })
}
