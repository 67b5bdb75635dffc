//! GLM-5.3's NoPE latent attention over the k-pool indexer's selection (llama.cpp b11434
//! `glm5-next.cpp` `build_dsa_layer`, `build_kpool_select`), for the normed input `x`:
//!
//! ```text
//! qr     = rms_norm(attn_q_a·x)·attn_q_a_norm                         [q_lora, rows]
//! q      = attn_q_b·qr                                                [key_length, n_head, rows]
//! latent = rms_norm(attn_kv_a_mqa·x)·attn_kv_a_norm   → latent cache  [kv_lora, rows]
//! q_abs  = attn_k_b_h·q_h per head                                    [kv_lora, n_head, rows]
//! sel    = the indexer's positions (full layers), else the previous full layer's
//! o      = attention(q_abs; K = V = the latent rows at sel; scale 1/√key_length)
//! out    = attn_output·(attn_v_b_h·o_h per head)
//!
//! indexer: iq = indexer.attn_q_b·qr [dh, n_ih, rows]; key = LayerNorm(indexer.attn_k·x) with
//! bias; gate = indexer_compressor_gate·x; [key | gate | 0] → indexer cache; w = indexer.proj·x
//! / √(dh·n_ih); sel = KPoolSelect(iq, w, cache, indexer_compressor_ape)
//! ```

use bloomery_plugin_api::builders::LmInputs;
use bloomery_plugin_api::graph::{GraphBuilder, TensorId};
use bloomery_plugin_api::op::{AttentionParams, Op};
use bloomery_plugin_api::{DType, PluginError};

use crate::hparams::HParams;
use crate::weights::{IndexerWeights, MlaWeights};

/// An MLA layer's state indices.
#[derive(Clone, Copy, Debug)]
pub struct MlaState {
    /// The latent cache.
    pub latent: u32,
    /// The indexer cache of a full layer.
    pub indexer: Option<u32>,
}

/// One product per head: `w [k, n, h]` × `x [k, h, rows]` → `[n, h, rows]`.
fn per_head(
    g: &mut GraphBuilder,
    name: &str,
    w: TensorId,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    let [_, n, h, _] = g.ne(w);
    let rows = g.ne(x)[2];
    g.op(name, Op::MatMul, &[w, x], DType::F32, [n, h, rows, 1])
}

/// The indexer's selection for the rows of `x` (normed input) and `qr` (the query's low-rank
/// output): i32 `[n_sel, rows]` (`indexer_sel_idx`).
fn select(
    g: &mut GraphBuilder,
    hp: &HParams,
    w: &IndexerWeights,
    cache: u32,
    (x, qr): (TensorId, TensorId),
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let ix = hp.indexer;
    let rows = g.ne(x)[1];
    let (dh, nh) = (u64::from(ix.head_dim), u64::from(ix.n_head));
    let wq = g.w(&w.q_b)?;
    let iq = g.matmul("indexer_q", wq, qr)?;
    let iq = g.reshape(iq, [dh, nh, rows, 1])?;
    let wk = g.w(&w.k)?;
    let k = g.matmul("indexer_k", wk, x)?;
    let (kn, kb) = (g.w(&w.k_norm)?, g.w(&w.k_norm_bias)?);
    let k = g.op(
        "indexer_k_norm",
        Op::LayerNorm { eps: ix.eps },
        &[k, kn, kb],
        DType::F32,
        [dh, rows, 1, 1],
    )?;
    let wg = g.w(&w.gate)?;
    let gate = g.matmul("indexer_gate", wg, x)?;
    let zeros = g.scale("indexer_pool_zero", k, 0.0)?;
    let kg = g.op(
        "indexer_kg",
        Op::Concat,
        &[k, gate],
        DType::F32,
        [2 * dh, rows, 1, 1],
    )?;
    let row = g.op(
        "indexer_row",
        Op::Concat,
        &[kg, zeros],
        DType::F32,
        [3 * dh, rows, 1, 1],
    )?;
    let c = g.state(cache, "cache_indexer");
    g.op_into(
        Op::CacheStore { rot: 0 },
        &[row, c, inp.slots, inp.positions],
        c,
    )?;
    let wp = g.w(&w.proj)?;
    let weights = g.matmul("indexer_weights", wp, x)?;
    let weights = g.scale("indexer_weights", weights, 1.0 / ((dh * nh) as f32).sqrt())?;
    let ape = g.w(&w.ape)?;
    g.op(
        "indexer_sel_idx",
        Op::KPoolSelect(ix.params()),
        &[iq, weights, c, ape, inp.slots, inp.positions],
        DType::I32,
        [u64::from(ix.n_sel()), rows, 1, 1],
    )
}

/// An MLA layer of the normed input `x` `[n_embd, rows]`: `[n_embd, rows]` (`attn_out`). A full
/// layer sets `sel` to its selection; a shared layer reads the one `sel` holds.
pub fn mla_layer(
    g: &mut GraphBuilder,
    hp: &HParams,
    w: &MlaWeights,
    st: MlaState,
    x: TensorId,
    inp: &LmInputs,
    sel: &mut Option<TensorId>,
) -> Result<TensorId, PluginError> {
    let m = hp.mla;
    let rows = g.ne(x)[1];
    let (nh, kl, kvl, vl) = (
        u64::from(m.n_head),
        u64::from(m.key_length),
        u64::from(m.kv_lora),
        u64::from(m.value_length),
    );
    let eps = hp.lm.eps;
    let wqa = g.w(&w.q_a)?;
    let qr = g.matmul("q_a", wqa, x)?;
    let qn = g.w(&w.q_a_norm)?;
    let qr = g.rms_norm("q_resid", qr, Some(qn), eps)?;
    let wqb = g.w(&w.q_b)?;
    let q = g.matmul("q", wqb, qr)?;
    let q = g.reshape(q, [kl, nh, rows, 1])?;
    let wkv = g.w(&w.kv_a)?;
    let kv = g.matmul("kv_a", wkv, x)?;
    let kvn = g.w(&w.kv_a_norm)?;
    let kv = g.rms_norm("kv_cmpr", kv, Some(kvn), eps)?;
    let kb = g.w(&w.k_b)?;
    let q_abs = per_head(g, "q_absorbed", kb, q)?;
    match (&w.indexer, st.indexer) {
        (Some(iw), Some(cache)) => *sel = Some(select(g, hp, iw, cache, (x, qr), inp)?),
        (None, None) => {}
        _ => {
            return Err(PluginError::invalid(
                "MLA layer: indexer weights and state disagree",
            ))
        }
    }
    let Some(sel) = *sel else {
        return Err(PluginError::invalid(
            "a shared-indexer MLA layer with no full-indexer layer before it",
        ));
    };
    let lc = g.state(st.latent, "cache_latent");
    g.op_into(
        Op::CacheStore { rot: 0 },
        &[kv, lc, inp.slots, inp.positions],
        lc,
    )?;
    let params = AttentionParams {
        n_head: m.n_head,
        n_head_kv: 1,
        dk: m.kv_lora,
        dv: m.kv_lora,
        scale: 1.0 / (m.key_length as f32).sqrt(),
        softcap: 0.0,
        window: 0,
        v_from_k: true,
        sinks: false,
        selected: true,
        rot_k: 0,
        rot_v: 0,
        comp: 0,
        comp_selected: false,
    };
    let o = g.op(
        "kqv_latent",
        Op::Attention(params),
        &[q_abs, lc, lc, inp.slots, inp.positions, sel],
        DType::F32,
        [kvl, nh, rows, 1],
    )?;
    let vb = g.w(&w.v_b)?;
    let o = per_head(g, "kqv_out", vb, o)?;
    let o = g.reshape(o, [vl * nh, rows, 1, 1])?;
    let wo = g.w(&w.out)?;
    g.matmul("attn_out", wo, o)
}
