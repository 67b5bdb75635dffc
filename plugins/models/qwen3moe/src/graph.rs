//! The `qwen3moe` forward graph: pre-norm GQA with QK-norm and NEOX rope, then routed experts
//! (softmax router, top-k, renormalised), for a batch of rows from any number of sequences.

use bloomery_plugin_api::builders::{AttentionBlock, MoeBlock};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder};
use bloomery_plugin_api::op::{AttentionParams, Gating, GluKind, RopeParams, RouterParams};
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
    let embd = g.w(&w.tok_embd)?;
    let mut x = g.get_rows("inp_embd", embd, inp.tokens)?;
    let attn = AttentionParams {
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        dk: hp.head_dim,
        dv: hp.head_dim,
        scale: 1.0 / (hp.head_dim as f32).sqrt(),
        softcap: 0.0,
        window: 0,
        v_from_k: false,
        sinks: false,
        selected: false,
    };
    let route = RouterParams {
        gating: Gating::Softmax,
        n_expert: hp.n_expert,
        k: hp.n_expert_used,
        n_group: 1,
        topk_group: 1,
        bias: false,
        norm: true,
        norm_min: 6.103_515_6e-5,
        scale: if hp.expert_weights_scale == 0.0 {
            1.0
        } else {
            hp.expert_weights_scale
        },
    };
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
    g.set_layer(-1);
    let on = g.w(&w.output_norm)?;
    let x = g.rms_norm("result_norm", x, Some(on), hp.eps)?;
    let head = g.w(&w.output)?;
    let logits = g.matmul("result_output", head, x)?;
    g.output("logits", logits);
    Ok(g.finish())
}
