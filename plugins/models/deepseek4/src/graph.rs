//! The forward graph (docs/deepseek4-plan.md, "The forward pass"): the embeddings repeated into
//! the hyper-connection streams; per layer the mHC pre mix, `attn_norm`, the latent attention
//! over the window ring and the compressed rows, the post update; the same around `ffn_norm` and
//! the routed (hash or biased) plus shared experts; then the trained head's collapse,
//! `output_norm` and the output head, for the wanted rows.

use bloomery_plugin_api::builders::{LmInputs, MoeBlock};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder, TensorId};
use bloomery_plugin_api::mhc_graph::Hc;
use bloomery_plugin_api::op::{
    AttentionParams, CompSelectParams, CompressForm, CompressParams, GluKind, Op, RopeParams,
    RouterParams,
};
use bloomery_plugin_api::weights::GluFfnWeights;
use bloomery_plugin_api::{DType, PluginError};

use crate::hparams::HParams;
use crate::layers::Ratio;
use crate::state::{CompressorState, LayerState};
use crate::weights::{
    AttentionWeights, CompressorWeights, IndexerWeights, Layer, Moe, Routing, Weights,
};

/// What a graph needs besides the batch shape.
pub struct Model<'a> {
    /// Hyperparameters.
    pub hp: &'a HParams,
    /// Weights.
    pub w: &'a Weights,
    /// Each layer's state indices.
    pub state: &'a [LayerState],
}

/// `op` of `x`'s shape on `srcs` (named `name`).
pub(crate) fn same(
    g: &mut GraphBuilder,
    name: &str,
    op: Op,
    srcs: &[TensorId],
) -> Result<TensorId, PluginError> {
    let ne = g.ne(srcs[0]);
    g.op(name, op, srcs, DType::F32, ne)
}

/// The rope of layer kind `ratio` on the last dims of heads of `head_dim`.
pub(crate) fn rope(hp: &HParams, ratio: Ratio, head_dim: u32) -> RopeParams {
    let base = match ratio {
        Ratio::Window => hp.rope.window,
        _ => hp.rope.compressed,
    };
    RopeParams {
        offset: head_dim - base.n_dims,
        ..base
    }
}

/// Runs a compressor of `width` (its state `st`) over the normed `x`, writing its compressed
/// rows; returns that cache.
fn compress(
    g: &mut GraphBuilder,
    hp: &HParams,
    (w, st): (&CompressorWeights, CompressorState),
    (ratio, width): (Ratio, u32),
    x: TensorId,
    inp: &LmInputs,
    name: &str,
) -> Result<TensorId, PluginError> {
    let (wkv, wg) = (g.w(&w.kv)?, g.w(&w.gate)?);
    let kv = g.matmul(&format!("{name}_kv"), wkv, x)?;
    let score = g.matmul(&format!("{name}_score"), wg, x)?;
    let (ape, norm) = (g.w(&w.ape)?, g.w(&w.norm)?);
    let raw = g.state(st.raw, &format!("{name}_raw"));
    let rows = g.state(st.rows, name);
    let p = CompressParams {
        ratio: ratio.positions(),
        overlap: ratio == Ratio::Four,
        width,
        eps: hp.lm.eps,
        rope: rope(hp, Ratio::Four, width),
        form: CompressForm::Pool,
    };
    g.op_into(
        Op::Compress(p),
        &[kv, score, ape, norm, raw, rows, inp.slots, inp.positions],
        rows,
    )?;
    Ok(rows)
}

/// The queries `[head_dim, n_head, rows]` (roped by `rp`; with `head_norm` each head RMS-normed
/// first, unweighted) and the query low-rank output `qr` of the normed `x`, and the window
/// ring with this call's latent rows stored: `(q, qr, ring)`.
pub(crate) fn queries_and_ring(
    g: &mut GraphBuilder,
    hp: &HParams,
    (w, st): (&AttentionWeights, LayerState),
    (rp, head_norm): (RopeParams, bool),
    x: TensorId,
    inp: &LmInputs,
) -> Result<(TensorId, TensorId, TensorId), PluginError> {
    let a = hp.attn;
    let (d, nh, rows) = (u64::from(a.head_dim), u64::from(a.n_head), g.ne(x)[1]);
    let eps = hp.lm.eps;
    let wqa = g.w(&w.q_a)?;
    let qr = g.matmul("q_a", wqa, x)?;
    let qn = g.w(&w.q_a_norm)?;
    let qr = g.rms_norm("q_a_norm", qr, Some(qn), eps)?;
    let wqb = g.w(&w.q_b)?;
    let q = g.matmul("q", wqb, qr)?;
    let mut q = g.reshape(q, [d, nh, rows, 1])?;
    if head_norm {
        q = g.rms_norm("q_norm", q, None, eps)?;
    }
    let q = same(g, "q_rope", Op::Rope(rp), &[q, inp.positions])?;
    let wkv = g.w(&w.kv)?;
    let kv = g.matmul("kv", wkv, x)?;
    let kvn = g.w(&w.kv_norm)?;
    let kv = g.rms_norm("kv_norm", kv, Some(kvn), eps)?;
    let kv = g.reshape(kv, [d, 1, rows, 1])?;
    let kv = same(g, "kv_rope", Op::Rope(rp), &[kv, inp.positions])?;
    let kv = g.reshape(kv, [d, rows, 1, 1])?;
    let ring = g.state(st.ring, "cache_ring");
    g.op_into(
        Op::CacheStore { rot: 0 },
        &[kv, ring, inp.slots, inp.positions],
        ring,
    )?;
    Ok((q, qr, ring))
}

/// The latent attention's core over the ring (and the compressed rows `comp` of ratio
/// `params.comp`, with their picks when `params.comp_selected`: the last of `extra`), then the
/// inverse rope and the grouped output projection: `[n_embd, rows]`.
pub(crate) fn attend(
    g: &mut GraphBuilder,
    hp: &HParams,
    w: &AttentionWeights,
    (params, rp): (AttentionParams, RopeParams),
    (q, ring, extra): (TensorId, TensorId, &[TensorId]),
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let a = hp.attn;
    let (d, nh, rows) = (u64::from(a.head_dim), u64::from(a.n_head), g.ne(q)[2]);
    let sinks = g.w(&w.sinks)?;
    let mut srcs = vec![q, ring, ring, inp.slots, inp.positions, sinks];
    srcs.extend_from_slice(extra);
    let o = g.op(
        "kqv",
        Op::Attention(params),
        &srcs,
        DType::F32,
        [d, nh, rows, 1],
    )?;
    let inverse = RopeParams {
        inverse: true,
        ..rp
    };
    let o = same(g, "kqv_unrope", Op::Rope(inverse), &[o, inp.positions])?;
    // The grouped output projection: group j reads heads j·H/g .. (j+1)·H/g.
    let (groups, rank) = (u64::from(a.out_groups), u64::from(a.out_rank));
    let per_group = d * nh / groups;
    let o = g.reshape(o, [per_group, groups, rows, 1])?;
    let wa = g.w(&w.out_a)?;
    let wa = g.reshape(wa, [per_group, rank, groups, 1])?;
    let oa = g.op(
        "attn_out_a",
        Op::MatMul,
        &[wa, o],
        DType::F32,
        [rank, groups, rows, 1],
    )?;
    let oa = g.reshape(oa, [rank * groups, rows, 1, 1])?;
    let wb = g.w(&w.out_b)?;
    g.matmul("attn_out", wb, oa)
}

/// The attention parameters of the latent attention: values from the keys, sinks, the window.
pub(crate) fn latent_params(hp: &HParams) -> AttentionParams {
    let a = hp.attn;
    AttentionParams {
        v_from_k: true,
        sinks: true,
        window: a.window,
        ..AttentionParams::gqa(a.n_head, 1, a.head_dim)
    }
}

/// Layer `il`'s latent attention of the normed `x` `[n_embd, rows]`: `[n_embd, rows]`.
fn attention(
    g: &mut GraphBuilder,
    hp: &HParams,
    (il, ratio): (u32, Ratio),
    (w, st): (&AttentionWeights, LayerState),
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let rp = rope(hp, ratio, hp.attn.head_dim);
    let (q, qr, ring) = queries_and_ring(g, hp, (w, st), (rp, true), x, inp)?;
    let mut params = latent_params(hp);
    let mut extra = Vec::new();
    match (ratio, &w.compressor, st.compressor) {
        (Ratio::Window, None, None) => {}
        (_, Some(cw), Some(cs)) => {
            let comp = compress(
                g,
                hp,
                (cw, cs),
                (ratio, hp.attn.head_dim),
                x,
                inp,
                "cache_comp",
            )?;
            params.comp = ratio.positions();
            extra.push(comp);
            if ratio == Ratio::Four {
                extra.push(select(g, hp, w, st, (x, qr), inp)?);
                params.comp_selected = true;
            }
        }
        _ => {
            return Err(PluginError::invalid(format!(
                "layer {il}: compressor weights, state and ratio disagree"
            )))
        }
    }
    attend(g, hp, w, (params, rp), (q, ring, &extra), inp)
}

/// The indexer's picks for a ratio-4 layer: i32 `[top_k, rows]` (`indexer_sel_idx`).
fn select(
    g: &mut GraphBuilder,
    hp: &HParams,
    w: &AttentionWeights,
    st: LayerState,
    (x, qr): (TensorId, TensorId),
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let ix = hp.indexer;
    let (Some(iw), Some(is)) = (&w.indexer, st.indexer) else {
        return Err(PluginError::invalid(
            "a ratio-4 layer without its indexer weights or state",
        ));
    };
    let Some(kc) = &iw.compressor else {
        return Err(PluginError::invalid(
            "a deepseek4 indexer without its key compressor",
        ));
    };
    let keys = compress(
        g,
        hp,
        (kc, is),
        (Ratio::Four, ix.head_dim),
        x,
        inp,
        "cache_index",
    )?;
    pick(g, hp, iw, (x, qr), (keys, Ratio::Four), inp)
}

/// The indexer's picks over the index `keys` of a compressor of `ratio`: its roped queries
/// from the query low-rank output `qr`, its head weights from the normed `x` (times
/// `1/√(d_I·H_I)`), then `CompSelect`: i32 `[top_k, rows]` (`indexer_sel_idx`).
pub(crate) fn pick(
    g: &mut GraphBuilder,
    hp: &HParams,
    iw: &IndexerWeights,
    (x, qr): (TensorId, TensorId),
    (keys, ratio): (TensorId, Ratio),
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let ix = hp.indexer;
    let (dh, nh, rows) = (u64::from(ix.head_dim), u64::from(ix.n_head), g.ne(x)[1]);
    let wq = g.w(&iw.q_b)?;
    let q = g.matmul("indexer_q", wq, qr)?;
    let q = g.reshape(q, [dh, nh, rows, 1])?;
    let rp = rope(hp, ratio, ix.head_dim);
    let q = same(g, "indexer_q_rope", Op::Rope(rp), &[q, inp.positions])?;
    let wp = g.w(&iw.proj)?;
    let weights = g.matmul("indexer_weights", wp, x)?;
    let weights = g.scale("indexer_weights", weights, 1.0 / ((dh * nh) as f32).sqrt())?;
    let p = CompSelectParams {
        n_head: ix.n_head,
        head_dim: ix.head_dim,
        ratio: ratio.positions(),
        top_k: ix.top_k,
    };
    g.op(
        "indexer_sel_idx",
        Op::CompSelect(p),
        &[q, weights, keys, inp.slots, inp.positions],
        DType::I32,
        [u64::from(ix.top_k), rows, 1, 1],
    )
}

/// A SwiGLU FFN clamped by `limit` (0: none), nodes `{prefix}gate`, `up`, `swiglu`, `down`.
fn clamped_ffn(
    g: &mut GraphBuilder,
    prefix: &str,
    f: &GluFfnWeights,
    limit: f32,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    let (gate, up, down) = (g.w(&f.gate)?, g.w(&f.up)?, g.w(&f.down)?);
    let a = g.matmul(&format!("{prefix}gate"), gate, x)?;
    let b = g.matmul(&format!("{prefix}up"), up, x)?;
    let h = g.glu(&format!("{prefix}swiglu"), a, b, GluKind::SwiGlu, limit)?;
    g.matmul(&format!("{prefix}down"), down, h)
}

/// Layer `il`'s FFN of the normed `x`: the routed experts, picked by the token's row of the hash
/// table or by the biased router and weighed by the √softplus router, plus the shared expert.
pub(crate) fn ffn(
    g: &mut GraphBuilder,
    hp: &HParams,
    il: u32,
    f: &Moe,
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let at = il as usize;
    let route = match &f.routing {
        Routing::Hash(_) => RouterParams {
            bias: false,
            ..hp.route
        },
        Routing::Biased(_) => hp.route,
    };
    let blk = MoeBlock {
        router_bias: match &f.routing {
            Routing::Biased(b) => Some(b),
            Routing::Hash(_) => None,
        },
        limit: hp.clamp_exp[at],
        ..f.experts.block(route, GluKind::SwiGlu)
    };
    let chosen = match &f.routing {
        Routing::Biased(_) => g.moe_route(&blk, x)?,
        Routing::Hash(table) => {
            let rows = g.ne(x)[1];
            let t = g.w(table)?;
            let ids = g.get_rows("ffn_moe_topk", t, inp.tokens)?;
            let router = g.w(&f.experts.router)?;
            let logits = g.matmul("ffn_moe_logits", router, x)?;
            let weights = g.op(
                "ffn_moe_weights",
                Op::RouterWeights(route),
                &[logits, ids],
                DType::F32,
                [u64::from(route.k), rows, 1, 1],
            )?;
            (ids, weights)
        }
    };
    let sh = clamped_ffn(g, "ffn_shexp_", &f.shared, hp.clamp_shexp[at], x)?;
    let moe = g.moe_experts(&blk, x, chosen)?;
    g.add("ffn_out", moe, sh)
}

/// One layer of the trunk on the streams.
fn layer(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    hc: &Hc,
    (il, l): (u32, &Layer),
    streams: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let hp = m.hp;
    let eps = hp.lm.eps;
    let (ratio, st) = match (hp.ratios.get(il as usize), m.state.get(il as usize)) {
        (Some(&r), Some(&s)) => (r, s),
        _ => {
            return Err(PluginError::invalid(format!(
                "layer {il}: no ratio or state"
            )))
        }
    };
    let (cur, mix) = hc.pre(g, &l.hc[0], streams, "hc_attn")?;
    let an = g.w(&l.attn_norm)?;
    let cur = g.rms_norm("attn_norm", cur, Some(an), eps)?;
    let cur = attention(g, hp, (il, ratio), (&l.attn, st), cur, inp)?;
    let streams = hc.post(g, &mix, streams, cur, "hc_attn")?;
    let (cur, mix) = hc.pre(g, &l.hc[1], streams, "hc_ffn")?;
    let fnorm = g.w(&l.ffn_norm)?;
    let cur = g.rms_norm("ffn_norm", cur, Some(fnorm), eps)?;
    let cur = ffn(g, hp, il, &l.ffn, cur, inp)?;
    hc.post(g, &mix, streams, cur, "l_out")
}

/// Builds the graph for `shape`: `logits` `[n_vocab, n_outputs]`.
pub fn build(m: &Model<'_>, shape: BatchShape) -> Result<Graph, PluginError> {
    let hp = m.hp;
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let table = g.w(&m.w.globals.tok_embd)?;
    let x = g.get_rows("inp_embd", table, inp.tokens)?;
    let (hc, mut streams) = Hc::init(&mut g, hp.hc, hp.lm.eps, x)?;
    for (il, l) in m.w.layers.iter().enumerate() {
        g.set_layer(il as i32);
        streams = layer(m, &mut g, &hc, (il as u32, l), streams, &inp)?;
    }
    g.set_layer(-1);
    let head = m.w.globals.hc_head.as_ref().ok_or_else(|| {
        PluginError::invalid("a deepseek4 file without its collapse head `output_hc_*`")
    })?;
    let x = hc.collapse(&mut g, head, streams)?;
    let x = g.select_outputs(x, &inp)?;
    let norm = g.w(&m.w.globals.output_norm)?;
    let x = g.rms_norm(
        bloomery_plugin_api::graph::FINAL_NORM,
        x,
        Some(norm),
        hp.lm.eps,
    )?;
    let head = g.w(&m.w.globals.output)?;
    let logits = g.matmul("result_output", head, x)?;
    g.output("logits", logits);
    Ok(g.finish())
}
