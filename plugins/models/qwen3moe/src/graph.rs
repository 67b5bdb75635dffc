//! The `qwen3moe` forward graph: pre-norm GQA with QK-norm and NEOX rope, then routed experts
//! (softmax router, top-k, renormalised), for a batch of rows from any number of sequences.

use bloomery_plugin_api::builders::{AttentionBlock, MoeBlock};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder};
use bloomery_plugin_api::op::{AttentionParams, GluKind, RopeParams, RouterParams};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;
use crate::weights::Weights;
use bloomery_plugin_api::builders::kv_cache_indices as cache_indices;

/// Builds the graph for `shape`.
pub fn build(
    hp: &HParams,
    w: &Weights,
    rope: RopeParams,
    shape: BatchShape,
) -> Result<Graph, PluginError> {
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let mut x = g.embed(&w.globals, &inp)?;
    let attn = AttentionParams::gqa(hp.n_head, hp.n_head_kv, hp.head_dim);
    let scale = if hp.expert_weights_scale == 0.0 {
        1.0
    } else {
        hp.expert_weights_scale
    };
    let route = RouterParams::softmax_renorm(hp.n_expert, hp.n_expert_used, scale);
    for (il, l) in w.layers.iter().enumerate() {
        g.set_layer(il as i32);
        let (k_cache, v_cache) = cache_indices(il as u32);
        let an = g.w(&l.attn_norm)?;
        let cur = g.rms_norm("attn_norm", x, Some(an), hp.eps)?;
        let blk = AttentionBlock {
            wq: &l.wq,
            wk: &l.wk,
            wv: &l.wv,
            wo: &l.wo,
            q_norm: Some(&l.q_norm),
            k_norm: Some(&l.k_norm),
            norm_eps: hp.eps,
            rope: Some(rope),
            params: attn,
            k_cache,
            v_cache,
        };
        let mut cur = g.attention_block(&blk, cur, &inp)?;
        if il + 1 == w.layers.len() {
            cur = g.select_outputs(cur, &inp)?;
            x = g.select_outputs(x, &inp)?;
        }
        let ffn_inp = g.add("ffn_inp", cur, x)?;
        let fnorm = g.w(&l.ffn_norm)?;
        let cur = g.rms_norm("ffn_norm", ffn_inp, Some(fnorm), hp.eps)?;
        let moe = MoeBlock {
            router: &l.router,
            router_bias: None,
            route,
            gate: &l.gate,
            up: l.up.as_ref(),
            down: &l.down,
            glu: GluKind::SwiGlu,
            limit: 0.0,
        };
        let cur = g.moe_block(&moe, cur)?;
        x = g.add("l_out", cur, ffn_inp)?;
    }
    let logits = g.lm_head(&w.globals, x, hp.eps)?;
    g.output("logits", logits);
    Ok(g.finish())
}
