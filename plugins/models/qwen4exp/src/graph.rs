//! The trunk's forward graph, in llama.cpp b11434's order (`qwen4exp.cpp`; transformers 5.24
//! `Qwen4ExpTextDecoderLayer.forward`): the embedding repeated into `n_stream` residual streams;
//! per layer the n-gram table's contribution (its layer only), the attention mixer, Gated DeltaNet
//! or gated GQA over the QSA selection, the combine, the FFN mixer, the routed experts plus the
//! sigmoid-gated shared expert, the combine; then, for the wanted rows, the residual named
//! `h_nextn` (what the MTP block reads), the final `output_hc_*` mixer (in place of an output
//! norm) and the head.
//!
//! A gated hyper-connection mixer of the streams `x` `[n, s, rows]`:
//!
//! ```text
//! xn     = grouped RmsNorm(x)·norm                       (each n-wide stream on its own)
//! w      = σ(up · silu(down · xn / s)) / s               [n, s, rows]
//! mixed  = Σ_j w_j·xn_j                                  the block's input [n, rows]
//! inject = 2·σ(inject · xn / s)                          [s, rows] (layer mixers only)
//! x_j   += inject_j·block(mixed)                         the combine, on the raw x
//! ```

use bloomery_plugin_api::builders::{unary, LmInputs};
use bloomery_plugin_api::graph::{
    BatchInput, BatchShape, Graph, GraphBuilder, TensorId, FINAL_NORM, NEXTN_HIDDEN,
};
use bloomery_plugin_api::op::{KPoolMode, KPoolParams, Op, RouterParams, UnaryFn};
use bloomery_plugin_api::qwen_blocks::{
    gated_attention, gated_delta_net, shared_gated_moe, GatedAttentionCall, GatedDeltaNet, GdnCall,
};
use bloomery_plugin_api::weights::{AttentionWeights, WeightRef};
use bloomery_plugin_api::{DType, PluginError};

use crate::hparams::HParams;
use crate::state::LayerState;
use crate::weights::{HcMixer, Indexer, Layer, Mixer, Moe, PleWeights, Weights};

/// What a graph needs besides the batch shape.
pub struct Model<'a> {
    /// Hyperparameters.
    pub hp: &'a HParams,
    /// Weights.
    pub w: &'a Weights,
    /// Each layer's state indices.
    pub state: &'a [Option<LayerState>],
    /// A verify pass ([`bloomery_plugin_api::graph::GraphKind::Verify`]): the GDN convolution and
    /// delta rule and the n-gram table layer's convolution also write every row's state.
    pub verify: bool,
}

/// A grouped RMS norm of `x` (`[n·s, rows]` or `[n, s, rows]`, contiguous): each `n`-wide
/// stream normed on its own, times the `[n·s]` gamma (stored flat or `[n, s]`): `[n·s, rows]`.
pub(crate) fn grouped_norm(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    gamma: &WeightRef,
) -> Result<TensorId, PluginError> {
    let n = u64::from(m.hp.lm.n_embd);
    let w = m.hp.hc_width();
    let rows = g.ne(x).iter().product::<u64>() / w;
    let per = g.reshape(x, [n, w / n * rows, 1, 1])?;
    let normed = g.rms_norm(name, per, None, m.hp.lm.eps)?;
    let normed = g.reshape(normed, [w, rows, 1, 1])?;
    let mut gm = g.w(gamma)?;
    if g.ne(gm)[0] != w {
        gm = g.reshape(gm, [w, 1, 1, 1])?;
    }
    g.mul(&format!("{name}_scaled"), normed, gm)
}

/// A mixer of the streams `x` `[n, s, rows]`: the block's input `[n, rows]` and, for a layer
/// mixer, the injection weights `[s, rows]`.
pub(crate) fn mix(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    w: &HcMixer,
    x: TensorId,
    name: &str,
) -> Result<(TensorId, Option<TensorId>), PluginError> {
    let [n, s, rows, _] = g.ne(x);
    let inv_s = 1.0 / s as f32;
    let xn = grouped_norm(m, g, &format!("{name}_norm"), x, &w.norm)?;
    let down = g.w(&w.down)?;
    let d = g.matmul(&format!("{name}_down"), down, xn)?;
    let d = g.scale(&format!("{name}_down_scaled"), d, inv_s)?;
    let d = unary(g, &format!("{name}_down_silu"), d, UnaryFn::Silu)?;
    let up = g.w(&w.up)?;
    let u = g.matmul(&format!("{name}_up"), up, d)?;
    let u = unary(g, &format!("{name}_up_sigmoid"), u, UnaryFn::Sigmoid)?;
    let u = g.scale(&format!("{name}_weights"), u, inv_s)?;
    let u = g.reshape(u, [n, s, rows, 1])?;
    let xs = g.reshape(xn, [n, s, rows, 1])?;
    let mixed = g.op(
        &format!("{name}_mixed"),
        Op::StreamMix,
        &[xs, u],
        DType::F32,
        [n, rows, 1, 1],
    )?;
    let inject = match &w.inject {
        Some(iw) => {
            let iw = g.w(iw)?;
            let i = g.matmul(&format!("{name}_inject"), iw, xn)?;
            let i = g.scale(&format!("{name}_inject_scaled"), i, inv_s)?;
            let i = unary(g, &format!("{name}_inject_sigmoid"), i, UnaryFn::Sigmoid)?;
            Some(g.scale(&format!("{name}_inject_weights"), i, 2.0)?)
        }
        None => None,
    };
    Ok((mixed, inject))
}

/// `x_j + post_j·y` for every stream `j` (the identity-comb [`Op::StreamUpdate`]).
fn combine(
    g: &mut GraphBuilder,
    x: TensorId,
    post: TensorId,
    y: TensorId,
    name: &str,
) -> Result<TensorId, PluginError> {
    let ne = g.ne(x);
    g.op(name, Op::StreamUpdate, &[x, post, y], DType::F32, ne)
}

/// The n-gram table's contribution to the streams `x` `[n, s, rows]`, added to them: `x +
/// gv + silu(conv(grouped RmsNorm(gv)))` with `gv_j = σ(gate_j)·value` (transformers 5.24
/// `Qwen4ExpTextPLELayer.forward`, llama.cpp b11434 `build_ple`).
fn ple(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    w: &PleWeights,
    conv_state: u32,
    (x, rows_in): (TensorId, TensorId),
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let [n, s, rows, _] = g.ne(x);
    let p =
        m.hp.ple
            .as_ref()
            .ok_or_else(|| PluginError::invalid("PLE weights without keys"))?;
    // The host's gather of the table rows, `[head_dim, n_heads, rows]`.
    let [width, heads, _, _] = g.ne(rows_in);
    if width * heads != n || heads != u64::from(p.n_heads()) {
        return Err(PluginError::invalid(format!(
            "PLE rows of {heads} heads × {width} for streams of width {n}"
        )));
    }
    let emb = g.reshape(rows_in, [n, rows, 1, 1])?;
    let wk = g.w(&w.key)?;
    let key = g.matmul("ple_key", wk, emb)?;
    let kn = grouped_norm(m, g, "ple_key_norm", key, &w.norm_key)?;
    let wv = g.w(&w.value)?;
    let value = g.matmul("ple_value", wv, emb)?;
    let qn = grouped_norm(m, g, "ple_query_norm", x, &w.norm_query)?;
    let kn = g.reshape(kn, [n, s, rows, 1])?;
    let qn = g.reshape(qn, [n, s, rows, 1])?;
    let gate = g.op(
        "ple_gate",
        Op::GroupDotGate {
            scale: 1.0 / (n as f32).sqrt(),
            floor: 1e-6,
        },
        &[kn, qn],
        DType::F32,
        [s, rows, 1, 1],
    )?;
    // gate_j·value exactly: the identity update of zero streams.
    let zeros = g.scale("ple_zeros", x, 0.0)?;
    let gv = combine(g, zeros, gate, value, "ple_gated_value")?;
    let gvn = grouped_norm(m, g, "ple_conv_norm", gv, &w.norm_conv)?;
    let wc = g.w(&w.conv)?;
    let cs = g.state(conv_state, "ple_conv_state");
    let mut srcs = vec![gvn, wc, cs, inp.slots, inp.positions];
    if m.verify {
        let width = n * s * p.conv_history();
        srcs.push(g.row_states(conv_state, "ple_conv_state_rows", width, rows)?);
    }
    let conv = g.op(
        "ple_conv",
        Op::ConvCausal {
            taps: p.conv_kernel,
            dilation: p.ngram_size,
        },
        &srcs,
        DType::F32,
        [n * s, rows, 1, 1],
    )?;
    let conv = unary(g, "ple_conv_silu", conv, UnaryFn::Silu)?;
    let gv = g.reshape(gv, [n * s, rows, 1, 1])?;
    let out = g.add("ple_out", gv, conv)?;
    let xf = g.reshape(x, [n * s, rows, 1, 1])?;
    let x = g.add("ple_residual", xf, out)?;
    g.reshape(x, [n, s, rows, 1])
}

/// A Gated DeltaNet layer of the mixed input `x` `[n, rows]`, output gate `RmsNorm(o)·ssm_norm·
/// σ(z)` (Qwen3.5's is SiLU).
fn delta_net(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    d: &GatedDeltaNet,
    states: (u32, u32),
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let call = GdnCall {
        dims: m.hp.gdn.dims(),
        eps: m.hp.lm.eps,
        z_gate: UnaryFn::Sigmoid,
        verify: m.verify,
        states,
    };
    gated_delta_net(g, d, &call, x, inp)
}

/// The QSA block selection of the mixed input `x`: the cache positions each row attends, i32
/// `[n_sel, rows]` (`KPoolSelect` with [`KPoolMode::MeanNormRope`]).
fn qsa_select(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    ix: &Indexer,
    cache: u32,
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let hp = m.hp;
    let q = hp.qsa;
    let rows = g.ne(x)[1];
    let (nh, dh) = (u64::from(q.n_head), u64::from(q.head_dim));
    let wq = g.w(&ix.q_proj)?;
    let iq = g.matmul("indexer_q", wq, x)?;
    let iq = g.reshape(iq, [dh, nh, rows, 1])?;
    let qn = g.w(&ix.q_norm)?;
    let iq = g.rms_norm("indexer_q_norm", iq, Some(qn), hp.lm.eps)?;
    let iq = g.op(
        "indexer_q_rope",
        Op::Rope(hp.rope),
        &[iq, inp.positions],
        DType::F32,
        [dh, nh, rows, 1],
    )?;
    // The raw key, then room for the pooled key the selection writes into a block's last row.
    let wk = g.w(&ix.k_proj)?;
    let k = g.matmul("indexer_k", wk, x)?;
    let zeros = g.scale("indexer_pool_zero", k, 0.0)?;
    let row = g.op(
        "indexer_row",
        Op::Concat,
        &[k, zeros],
        DType::F32,
        [2 * dh, rows, 1, 1],
    )?;
    let c = g.state(cache, "cache_indexer");
    g.op_into(
        Op::CacheStore { rot: 0 },
        &[row, c, inp.slots, inp.positions],
        c,
    )?;
    let params = KPoolParams {
        n_head: q.n_head,
        head_dim: q.head_dim,
        kpool: q.ratio,
        n_top: q.n_blocks(),
        tail: true,
        mode: KPoolMode::MeanNormRope {
            eps: hp.lm.eps,
            rope: hp.rope,
            scale: 1.0 / (q.head_dim as f32).sqrt(),
        },
    };
    let n_sel = u64::from(q.ratio) * u64::from(q.n_blocks()) + u64::from(q.ratio) - 1;
    let kn = g.w(&ix.k_norm)?;
    g.op(
        "indexer_sel_idx",
        Op::KPoolSelect(params),
        &[iq, kn, c, inp.slots, inp.positions],
        DType::I32,
        [n_sel, rows, 1, 1],
    )
}

/// Gated GQA of the mixed input `x` over the QSA selection: each head's query and output gate
/// from `attn_q`, QK-norm, IMROPE, `σ(gate)` on the output.
fn attention(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    (a, ix): (&AttentionWeights, &Indexer),
    (k_cache, v_cache, indexer): (u32, u32, u32),
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let sel = qsa_select(m, g, ix, indexer, x, inp)?;
    let call = GatedAttentionCall {
        params: m.hp.lm.attn.gqa(),
        rope: m.hp.rope,
        eps: m.hp.lm.eps,
        caches: (k_cache, v_cache),
    };
    gated_attention(g, a, &call, x, (inp, Some(sel)))
}

/// The routed experts (softmax, top-k, renormalised) plus the shared expert gated by
/// `σ(ffn_gate_inp_shexp · x)`, of the mixed input `x`.
fn moe(m: &Model<'_>, g: &mut GraphBuilder, f: &Moe, x: TensorId) -> Result<TensorId, PluginError> {
    let e = m.hp.experts;
    let route = RouterParams::softmax_renorm(e.n_expert, e.n_expert_used, e.weights_scale);
    shared_gated_moe(g, (&f.experts, &f.shared, &f.shared_gate), route, x)
}

/// Layer `il` of the streams `x` `[n, s, rows]`.
pub(crate) fn layer(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    (il, l): (u32, &Layer),
    x: TensorId,
    (inp, ngram): (&LmInputs, Option<TensorId>),
) -> Result<TensorId, PluginError> {
    let state = m.state.get(il as usize).copied().flatten();
    let mut x = x;
    if let Some(pw) = &l.ple {
        let (
            Some(LayerState::Gdn {
                ple_conv: Some(cs), ..
            }),
            Some(gathered),
        ) = (state, ngram)
        else {
            return Err(PluginError::invalid(format!(
                "layer {il}: PLE weights without their state or table rows"
            )));
        };
        x = ple(m, g, pw, cs, (x, gathered), inp)?;
    }
    let (cur, inject) = mix(m, g, &l.hc_attn, x, "hc_attn")?;
    let cur = match (&l.mixer, state) {
        (Mixer::Gdn(d), Some(LayerState::Gdn { conv, ssm, .. })) => {
            delta_net(m, g, d, (conv, ssm), cur, inp)?
        }
        (Mixer::Qsa(a, ix), Some(LayerState::Qsa { k, v, indexer })) => {
            attention(m, g, (a, ix), (k, v, indexer), cur, inp)?
        }
        _ => {
            return Err(PluginError::invalid(format!(
                "layer {il}: weights and state disagree"
            )))
        }
    };
    let inject = inject.ok_or_else(|| PluginError::invalid("a layer mixer without inject"))?;
    let x = combine(g, x, inject, cur, "hc_attn_post")?;
    let (cur, inject) = mix(m, g, &l.hc_ffn, x, "hc_ffn")?;
    let cur = moe(m, g, &l.moe, cur)?;
    let inject = inject.ok_or_else(|| PluginError::invalid("a layer mixer without inject"))?;
    combine(g, x, inject, cur, "l_out")
}

/// Builds the trunk's graph for `shape`: `logits` `[n_vocab, n_outputs]` of the wanted rows, the
/// final mixer's output before the head named [`FINAL_NORM`].
pub fn build(m: &Model<'_>, shape: BatchShape) -> Result<Graph, PluginError> {
    let hp = m.hp;
    let final_mixer = m.w.output_hc.as_ref().ok_or_else(|| {
        PluginError::unsupported("the qwen4exp trunk graph of an MTP-only file", &[])
    })?;
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let rows = u64::from(shape.n_rows);
    // The PLE table's rows each row's n-gram ids name, gathered by the host (the table is
    // `WeightClass::NgramTable`: never on a card).
    let ngram = match (&hp.ple, &m.w.ple_table) {
        (Some(p), Some(t)) => Some(g.input(
            BatchInput::NgramEmbd,
            [t.ne[0], u64::from(p.n_heads()), rows, 1],
        )?),
        (None, _) => None,
        (Some(_), None) => return Err(PluginError::invalid("PLE keys without the table")),
    };
    let (n, s) = (u64::from(hp.lm.n_embd), u64::from(hp.hc.n_stream));
    let table = g.w(&m.w.tok_embd)?;
    let emb = g.get_rows("inp_embd", table, inp.tokens)?;
    let mut x = emb;
    for j in 2..=s {
        x = g.op(
            "hc_init",
            Op::Concat,
            &[x, emb],
            DType::F32,
            [j * n, rows, 1, 1],
        )?;
    }
    let mut x = g.reshape(x, [n, s, rows, 1])?;
    for (il, l) in m.w.layers.iter().enumerate() {
        g.set_layer(il as i32);
        x = layer(m, &mut g, (il as u32, l), x, (&inp, ngram))?;
    }
    g.set_layer(-1);
    let flat = g.reshape(x, [n * s, rows, 1, 1])?;
    let flat = g.select_outputs(flat, &inp)?;
    let logits = head(m, &mut g, final_mixer, flat, "output_hc")?;
    g.output("logits", logits);
    Ok(g.finish())
}

/// The output rows' residual streams `flat` `[n·s, n_out]`, named [`NEXTN_HIDDEN`] (the rows
/// the MTP block pairs with the next token), through the head mixer `mixer` (its input named
/// [`FINAL_NORM`]) and the output head: the logits `[n_vocab, n_out]`.
pub(crate) fn head(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    mixer: &HcMixer,
    flat: TensorId,
    name: &str,
) -> Result<TensorId, PluginError> {
    let [w, n_out, _, _] = g.ne(flat);
    let n = u64::from(m.hp.lm.n_embd);
    let flat = g.op(
        NEXTN_HIDDEN,
        Op::Copy,
        &[flat],
        DType::F32,
        [w, n_out, 1, 1],
    )?;
    let x = g.reshape(flat, [n, w / n, n_out, 1])?;
    let (mixed, _) = mix(m, g, mixer, x, name)?;
    let hidden = g.op(FINAL_NORM, Op::Copy, &[mixed], DType::F32, [n, n_out, 1, 1])?;
    let out = g.w(&m.w.output)?;
    g.matmul("result_output", out, hidden)
}
