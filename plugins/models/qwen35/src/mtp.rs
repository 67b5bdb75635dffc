//! The MTP (nextn) block's forward pass, in the form of llama.cpp b11434's `qwen35moe.cpp` /
//! `qwen35.cpp` `graph_mtp`: for the trunk's hidden state `h` (its `output_norm` row) and the
//! embedding `e` of the token that follows it,
//!
//! ```text
//! x   = eh_proj·[enorm(e); hnorm(h)]                          (e first)
//! x   = x + gated_attention(attn_norm(x))                     (its own K/V caches)
//! x   = x + ffn(post_attention_norm(x))                       (the trunk's FFN kind)
//! out = head(shared_head_norm(x))                             (else output_norm, output)
//! ```
//!
//! The trunk's graph never reads these weights; the draft graph ([`build`], `GraphKind::Mtp`)
//! takes `h` as a batch input (`BatchInput::Hidden`: the trunk's final-norm row, which the host
//! reads from an earlier pass) with each row's token.

use bloomery_plugin_api::graph::{BatchInput, BatchShape, Graph, GraphBuilder};
use bloomery_plugin_api::nextn::NextnFallbacks;
use bloomery_plugin_api::PluginError;

use crate::graph::{attention, ffn, Model};
use crate::state::LayerState;
use crate::weights::Mixer;

/// The draft graph of `shape`: row `r` pairs its token with its hidden row (`inp_hidden`
/// `[n_embd, rows]`) at its position of the MTP block's caches; `logits` `[n_vocab,
/// n_outputs]` of the wanted rows. A file without the MTP block is refused by name.
pub fn build(m: &Model<'_>, shape: BatchShape) -> Result<Graph, PluginError> {
    let b =
        m.w.mtp
            .as_ref()
            .ok_or_else(|| PluginError::invalid("the file holds no MTP (nextn) block"))?;
    let il = b.index;
    let (Mixer::Attention(a), Some(&LayerState::Attention { k, v })) =
        (&b.layer.mixer, m.state.get(il as usize))
    else {
        return Err(PluginError::invalid(format!(
            "MTP layer {il}: not an attention layer with its caches"
        )));
    };
    let eps = m.hp.lm.eps;
    let globals = &m.w.lm.globals;
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let ne = [u64::from(m.hp.lm.n_embd), u64::from(shape.n_rows), 1, 1];
    let h = g.input(BatchInput::Hidden, ne)?;
    g.set_layer(il as i32);
    let model = NextnFallbacks {
        tok_embd: &globals.tok_embd,
        output_norm: &globals.output_norm,
        output: &globals.output,
    };
    let x = b.glue.joined_input(&mut g, &model, inp.tokens, h, eps)?;
    let an = g.w(&b.layer.attn_norm)?;
    let cur = g.rms_norm("mtp_attn_norm", x, Some(an), eps)?;
    let cur = attention(m, &mut g, a, (k, v), cur, &inp)?;
    let res = g.add("mtp_attn_residual", cur, x)?;
    let pn = g.w(&b.layer.post_norm)?;
    let cur = g.rms_norm("mtp_attn_post_norm", res, Some(pn), eps)?;
    let cur = ffn(m, &mut g, &b.layer.ffn, cur)?;
    let out = g.add("mtp_post_ffn", cur, res)?;
    g.set_layer(-1);
    let out = g.select_outputs(out, &inp)?;
    let logits = b.glue.logits(&mut g, &model, out, eps)?;
    g.output("logits", logits);
    Ok(g.finish())
}
