//! The MTP block's draft graph ([`GraphKind::Mtp`](bloomery_plugin_api::graph::GraphKind)), in
//! the form of llama.cpp b11434's `qwen4exp.cpp` `graph_mtp`: row `r` pairs its token `t` with
//! the hyper-connection residual `h` `[n, s]` of the trunk (or of the block's previous draft
//! step), read as the batch input `Hidden` `[s·n, rows]`:
//!
//! ```text
//! x_j    = eh_proj · [enorm(embd(t)); hnorm_j(h_j)]       each stream j, the embedding first
//! x      = the QSA layer of the block on the streams x    (its own mixers, caches and experts)
//! h_next = x                                              named `h_nextn`: the next step's h
//! logits = output · hc_head mixer(x)                      (`nextn.hc_head_*`, no inject)
//! ```
//!
//! `enorm` is one gamma repeated over the streams, `hnorm` one per stream; the block's layer
//! is a trunk QSA layer's graph (`graph::layer`), attending over its own K/V and
//! indexer caches. Reference: `tests/oracle/numpy_qwen4exp_mtp.py`.

use bloomery_plugin_api::graph::{BatchInput, BatchShape, Graph, GraphBuilder};
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::{DType, PluginError};

use crate::graph::{grouped_norm, head, layer, Model};

/// The draft graph of `shape`: `logits` `[n_vocab, n_outputs]` and the block's residual rows
/// `h_nextn` `[s·n, n_outputs]` of the wanted rows. A file without the block is refused by name.
pub fn build(m: &Model<'_>, shape: BatchShape) -> Result<Graph, PluginError> {
    let b =
        m.w.nextn
            .as_ref()
            .ok_or_else(|| PluginError::invalid("the qwen4exp file holds no MTP (nextn) block"))?;
    let hp = m.hp;
    let (n, s) = (u64::from(hp.lm.n_embd), u64::from(hp.hc.n_stream));
    let rows = u64::from(shape.n_rows);
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let h = g.input(BatchInput::Hidden, [n * s, rows, 1, 1])?;
    g.set_layer(b.index as i32);
    let hn = grouped_norm(m, &mut g, "mtp_hnorm", h, &b.hnorm)?;
    let table = g.w(&m.w.tok_embd)?;
    let e = g.get_rows("mtp_tok_embd", table, inp.tokens)?;
    let enorm = g.w(&b.enorm)?;
    let mut en = g.rms_norm("mtp_enorm", e, Some(enorm), hp.lm.eps)?;
    let single = en;
    for j in 2..=s {
        en = g.op(
            "mtp_enorm_streams",
            Op::Concat,
            &[en, single],
            DType::F32,
            [j * n, rows, 1, 1],
        )?;
    }
    // Per stream [e; h_j]: both as [n, s·rows], joined along ne0.
    let en = g.reshape(en, [n, s * rows, 1, 1])?;
    let hn = g.reshape(hn, [n, s * rows, 1, 1])?;
    let cat = g.op(
        "mtp_eh_cat",
        Op::Concat,
        &[en, hn],
        DType::F32,
        [2 * n, s * rows, 1, 1],
    )?;
    let eh = g.w(&b.eh_proj)?;
    let x = g.matmul("mtp_eh_proj", eh, cat)?;
    let x = g.reshape(x, [n, s, rows, 1])?;
    let x = layer(m, &mut g, (b.index, &b.layer), x, (&inp, None))?;
    g.set_layer(-1);
    let flat = g.reshape(x, [n * s, rows, 1, 1])?;
    let flat = g.select_outputs(flat, &inp)?;
    let logits = head(m, &mut g, &b.hc_head, flat, "mtp_hc_head")?;
    g.output("logits", logits);
    Ok(g.finish())
}
