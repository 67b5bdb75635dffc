//! The forward graph of a `deepseek41` file (DeepSeek-V4.1-Flash, `docs/deepseek41-plan.md`):
//! V4's latent attention, MoE and hyper-connection mixers ([`crate::graph`]) with V4.1's changes.
//!
//! - **Engram** on its layers, before the attention, on the streams: the site's 24 table rows
//!   (gathered by the host into `BatchInput::NgramEmbd`, site after site; the tables are
//!   `WeightClass::NgramTable`, never on a card), `engram_wkv` by `MatMul`, then
//!   `EngramGate` (ε the model's, scale `1/√n_embd`, floor 1e-6).
//! - **Shared compressed rows**: a compressor source layer pools its rows (`Compress`, one
//!   series, no position bias: a zero `ape`; at ratio 1 without a gate the score is the kv
//!   itself, a softmax over one position being 1), and makes the index keys from the normed rows
//!   before their rope (`Compress` `Plain`, then `indexer.attn_k` by `MatMul`, then `Compress`
//!   `Store` with `indexer.k_norm`); the layers of its group attend over its rows.
//! - **Indexer**: every index layer scores its own queries and head weights against its group's
//!   keys (`CompSelect`, top `indexer.top_k`); the compressed layers after it read its picks.
//! - **Late mix** (S6): a block's attention input is mixed by the previous block's FFN `pre`
//!   (the first block's by `(1, 0, …, 0)`), its attention mixes' `pre` mixes its FFN input, its
//!   FFN mixes' `pre` goes to the next block; the collapse before `output_norm` mixes the
//!   streams by the last FFN's `pre`.
//! - The query per-head norm: [`QUERY_HEAD_NORM`].

use bloomery_plugin_api::builders::LmInputs;
use bloomery_plugin_api::graph::{BatchInput, BatchShape, Graph, GraphBuilder, TensorId};
use bloomery_plugin_api::mhc_graph::{Hc, HcMix};
use bloomery_plugin_api::op::{CompressForm, CompressParams, Op};
use bloomery_plugin_api::{DType, PluginError};

use crate::graph::{attend, ffn, latent_params, pick, queries_and_ring, rope, Model};
use crate::hparams::HParams;
use crate::layers::Ratio;
use crate::state::LayerState;
use crate::v41::V41;
use crate::weights::{EngramWeights, Layer, Source41Weights};

/// **Choice** (`docs/deepseek41-plan.md`, "Open, seen in S6"): whether V4.1's queries get V4's
/// unweighted per-head RMS norm before their rope. S6, the one source that read V4.1's
/// attention code, applies none; no second source pins it. Off, here and in
/// `tests/oracle/numpy_deepseek41.py`.
pub const QUERY_HEAD_NORM: bool = false;

/// Bytes of an f32 or i32.
const F: u64 = 4;

/// What the layers of a graph hand on: each compressor source's rows and index keys, and each
/// index layer's picks, by layer.
struct Shared {
    /// A source layer's compressed rows and index keys.
    comp: Vec<Option<(TensorId, TensorId)>>,
    /// An index layer's picks.
    picks: Vec<Option<TensorId>>,
}

/// Builds the graph for `shape`: `logits` `[n_vocab, n_outputs]`.
pub fn build(m: &Model<'_>, v: &V41, shape: BatchShape) -> Result<Graph, PluginError> {
    let hp = m.hp;
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let rows = u64::from(shape.n_rows);
    let per_site = u64::from(v.engram.heads_per_site());
    let n_ids = per_site * v.engram.layers.len() as u64;
    // Every site's table rows, gathered by the host (the tables are
    // `WeightClass::NgramTable`: never on a card).
    let width = u64::from(v.engram.row_width);
    let gathered = g.input(BatchInput::NgramEmbd, [width, n_ids, rows, 1])?;
    let table = g.w(&m.w.globals.tok_embd)?;
    let x = g.get_rows("inp_embd", table, inp.tokens)?;
    let (hc, mut streams) = Hc::init(&mut g, hp.hc, hp.lm.eps, x)?;
    let mut pre = first_pre(&mut g, &hc, rows)?;
    let n_layer = m.w.layers.len();
    let mut shared = Shared {
        comp: vec![None; n_layer],
        picks: vec![None; n_layer],
    };
    for (il, l) in m.w.layers.iter().enumerate() {
        g.set_layer(il as i32);
        let il = il as u32;
        if let Some(e) = &l.engram {
            let site = v.engram.site(il).ok_or_else(|| {
                PluginError::invalid(format!("layer {il}: Engram weights on no site"))
            })?;
            let site = site_rows(&mut g, gathered, (site as u64, per_site))?;
            streams = engram(&mut g, hp, e, streams, site)?;
        }
        let st = m
            .state
            .get(il as usize)
            .copied()
            .ok_or_else(|| PluginError::invalid(format!("layer {il}: no state")))?;
        (streams, pre) = layer(
            m,
            v,
            &mut g,
            &hc,
            (il, l, st),
            (streams, pre),
            &mut shared,
            &inp,
        )?;
    }
    g.set_layer(-1);
    let [e, _, _, _] = g.ne(streams);
    let x = g.op(
        "hc_head",
        Op::StreamMix,
        &[streams, pre],
        DType::F32,
        [e, rows, 1, 1],
    )?;
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

/// The first block's `pre`, `(1, 0, …, 0)` per row `[n, rows]`, from the mixers' constants
/// (the op set has no constant tensors).
fn first_pre(g: &mut GraphBuilder, hc: &Hc, rows: u64) -> Result<TensorId, PluginError> {
    let n = u64::from(hc.shape.n_stream);
    let ones = g.scale("hc_ones", hc.rows.mean, n as f32)?;
    let nb = [F, n * F, n * rows * F, n * rows * F];
    let first = g.view(ones, "hc_first", [1, rows, 1, 1], nb, 0);
    let first = g.op("hc_first", Op::Copy, &[first], DType::F32, [1, rows, 1, 1])?;
    let rest = g.view(ones, "hc_rest", [n - 1, rows, 1, 1], nb, F);
    let rest = g.op(
        "hc_rest",
        Op::Copy,
        &[rest],
        DType::F32,
        [n - 1, rows, 1, 1],
    )?;
    let rest = g.scale("hc_rest", rest, 0.0)?;
    g.op(
        "hc_pre_first",
        Op::Concat,
        &[first, rest],
        DType::F32,
        [n, rows, 1, 1],
    )
}

/// Site `site`'s `per_site` gathered table rows of every row, `[width·per_site, rows]`, out of
/// every site's `gathered` `[width, n_ids, rows]`.
fn site_rows(
    g: &mut GraphBuilder,
    gathered: TensorId,
    (site, per_site): (u64, u64),
) -> Result<TensorId, PluginError> {
    let [width, n_ids, rows, _] = g.ne(gathered);
    let nb = [F, width * F, width * n_ids * F, width * n_ids * rows * F];
    let v = g.view(
        gathered,
        "engram_rows",
        [width, per_site, rows, 1],
        nb,
        site * per_site * width * F,
    );
    let v = g.op(
        "engram_rows",
        Op::Copy,
        &[v],
        DType::F32,
        [width, per_site, rows, 1],
    )?;
    g.reshape(v, [width * per_site, rows, 1, 1])
}

/// An Engram site's gated read on the streams `[n_embd, n, rows]`.
fn engram(
    g: &mut GraphBuilder,
    hp: &HParams,
    w: &EngramWeights,
    streams: TensorId,
    got: TensorId,
) -> Result<TensorId, PluginError> {
    let [e, n, rows, _] = g.ne(streams);
    let wkv = g.w(&w.wkv)?;
    let kv = g.matmul("engram_kv", wkv, got)?;
    let (q_norm, k_norm) = (g.w(&w.q_norm)?, g.w(&w.k_norm)?);
    let gate = Op::EngramGate {
        eps: hp.lm.eps,
        scale: 1.0 / (e as f32).sqrt(),
        floor: 1e-6,
    };
    g.op(
        "engram_out",
        gate,
        &[streams, kv, q_norm, k_norm],
        DType::F32,
        [e, n, rows, 1],
    )
}

/// One block on the streams with the previous block's FFN `pre`: the new streams and this
/// block's FFN `pre`.
#[allow(clippy::too_many_arguments)]
fn layer(
    m: &Model<'_>,
    v: &V41,
    g: &mut GraphBuilder,
    hc: &Hc,
    (il, l, st): (u32, &Layer, LayerState),
    (streams, pre_in): (TensorId, TensorId),
    shared: &mut Shared,
    inp: &LmInputs,
) -> Result<(TensorId, TensorId), PluginError> {
    let hp = m.hp;
    let eps = hp.lm.eps;
    let [e, _, rows, _] = g.ne(streams);
    let cur = g.op(
        "hc_attn_pre",
        Op::StreamMix,
        &[streams, pre_in],
        DType::F32,
        [e, rows, 1, 1],
    )?;
    let mix = hc.mixes(g, &l.hc[0], streams)?;
    let an = g.w(&l.attn_norm)?;
    let cur = g.rms_norm("attn_norm", cur, Some(an), eps)?;
    let cur = attention(m, v, g, (il, l, st), cur, shared, inp)?;
    let streams = hc.post(g, &mix, streams, cur, "hc_attn")?;
    let cur = g.op(
        "hc_ffn_pre",
        Op::StreamMix,
        &[streams, mix.pre],
        DType::F32,
        [e, rows, 1, 1],
    )?;
    let fmix: HcMix = hc.mixes(g, &l.hc[1], streams)?;
    let fnorm = g.w(&l.ffn_norm)?;
    let cur = g.rms_norm("ffn_norm", cur, Some(fnorm), eps)?;
    let cur = ffn(g, hp, il, &l.ffn, cur, inp)?;
    let streams = hc.post(g, &fmix, streams, cur, "l_out")?;
    Ok((streams, fmix.pre))
}

/// Layer `il`'s latent attention of the normed `x`: over the window ring, and on a compressed
/// layer over the picked rows of its group's source.
fn attention(
    m: &Model<'_>,
    v: &V41,
    g: &mut GraphBuilder,
    (il, l, st): (u32, &Layer, LayerState),
    x: TensorId,
    shared: &mut Shared,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let hp = m.hp;
    let w = &l.attn;
    let ratio = hp.ratios[il as usize];
    let rp = rope(hp, ratio, hp.attn.head_dim);
    let (q, qr, ring) = queries_and_ring(g, hp, (w, st), (rp, QUERY_HEAD_NORM), x, inp)?;
    let mut params = latent_params(hp);
    if ratio == Ratio::Window {
        return attend(g, hp, w, (params, rp), (q, ring, &[]), inp);
    }
    let at = il as usize;
    if let Some(sw) = &w.source41 {
        shared.comp[at] = Some(source(g, hp, (sw, st), ratio, x, inp)?);
    }
    let missing = |what: &str| PluginError::invalid(format!("deepseek41 layer {il}: no {what}"));
    let cs = v.comp_source[at].ok_or_else(|| missing("compressor source"))?;
    let (comp, keys) = shared.comp[cs as usize].ok_or_else(|| missing("source rows"))?;
    if let Some(iw) = &w.indexer {
        shared.picks[at] = Some(pick(g, hp, iw, (x, qr), (keys, ratio), inp)?);
    }
    let is = v.index_source[at].ok_or_else(|| missing("index source"))?;
    let picks = shared.picks[is as usize].ok_or_else(|| missing("indexer picks"))?;
    params.comp = ratio.positions();
    params.comp_selected = true;
    attend(g, hp, w, (params, rp), (q, ring, &[comp, picks]), inp)
}

/// A compressor source's work on the normed `x`: the normed rows before their rope (`Plain`,
/// before the pooling call stores this call's rows in the raw state), the compressed rows
/// (`Pool`) and the index keys (`Store` of `indexer.attn_k` times the plain rows); returns the
/// compressed rows' and the keys' caches.
fn source(
    g: &mut GraphBuilder,
    hp: &HParams,
    (w, st): (&Source41Weights, LayerState),
    ratio: Ratio,
    x: TensorId,
    inp: &LmInputs,
) -> Result<(TensorId, TensorId), PluginError> {
    let (Some(cs), Some(ks)) = (st.compressor, st.index_keys) else {
        return Err(PluginError::invalid(
            "a deepseek41 compressor source without its state",
        ));
    };
    let d = hp.attn.head_dim;
    let r = u64::from(ratio.positions());
    let (wkv, norm) = (g.w(&w.kv)?, g.w(&w.norm)?);
    let kv = g.matmul("cache_comp_kv", wkv, x)?;
    let score = match &w.gate {
        Some(gw) => {
            let gw = g.w(gw)?;
            g.matmul("cache_comp_score", gw, x)?
        }
        None if ratio == Ratio::One => kv,
        None => {
            return Err(PluginError::invalid(
                "a deepseek41 ratio-2 compressor without its gate",
            ))
        }
    };
    // No position bias: zeros `[d, ratio]` made from the norm weight.
    let zero = g.scale("cache_comp_ape", norm, 0.0)?;
    let mut ape = zero;
    for _ in 1..r {
        let k = g.ne(ape)[0];
        ape = g.op(
            "cache_comp_ape",
            Op::Concat,
            &[ape, zero],
            DType::F32,
            [k + u64::from(d), 1, 1, 1],
        )?;
    }
    let ape = g.reshape(ape, [u64::from(d), r, 1, 1])?;
    let raw = g.state(cs.raw, "cache_comp_raw");
    let rows = g.state(cs.rows, "cache_comp");
    let p = CompressParams {
        ratio: ratio.positions(),
        overlap: false,
        width: d,
        eps: hp.lm.eps,
        rope: rope(hp, ratio, d),
        form: CompressForm::Plain,
    };
    let n = g.ne(x)[1];
    let plain = g.op(
        "cache_comp_plain",
        Op::Compress(p),
        &[kv, score, ape, norm, raw, inp.slots, inp.positions],
        DType::F32,
        [u64::from(d), n, 1, 1],
    )?;
    let pool = CompressParams {
        form: CompressForm::Pool,
        ..p
    };
    g.op_into(
        Op::Compress(pool),
        &[kv, score, ape, norm, raw, rows, inp.slots, inp.positions],
        rows,
    )?;
    let wk = g.w(&w.index_k)?;
    let k = g.matmul("cache_index_k", wk, plain)?;
    let kn = g.w(&w.index_k_norm)?;
    let keys = g.state(ks, "cache_index_keys");
    let di = hp.indexer.head_dim;
    let store = CompressParams {
        width: di,
        rope: rope(hp, ratio, di),
        form: CompressForm::Store,
        ..p
    };
    g.op_into(
        Op::Compress(store),
        &[k, kn, keys, inp.slots, inp.positions],
        keys,
    )?;
    Ok((rows, keys))
}
