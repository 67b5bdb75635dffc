//! The NextN layer's forward pass (multi-token prediction), in the form of llama.cpp b11434's
//! `glm4-moe.cpp` MTP graph (GLM-5.3's own is not written there yet): for the trunk's hidden
//! state `h` (`output_norm` of the streams' mean) and the embedding `e` of the token that
//! follows it,
//!
//! ```text
//! x   = eh_proj·[enorm(e); hnorm(h)]                   (e first)
//! x   = x + MLA(attn_norm(x))                          (its own full indexer and caches)
//! x   = x + (experts + shared expert)(ffn_norm(x))     (clamped as the layer's keys say)
//! out = head(shared_head_norm(x))                      (else output_norm, output)
//! ```
//!
//! No hyper-connections: one stream. The trunk's graph never reads these weights; the draft
//! graph ([`build`], `GraphKind::Mtp`) takes `h` as a batch input (`BatchInput::Hidden`: the
//! trunk's final-norm row, which the host reads from an earlier pass) with each row's token.

use bloomery_plugin_api::builders::LmInputs;
use bloomery_plugin_api::graph::{BatchInput, BatchShape, Graph, GraphBuilder, TensorId};
use bloomery_plugin_api::nextn::NextnFallbacks;
use bloomery_plugin_api::PluginError;

use crate::graph::{ffn, mixer, Model};

/// The NextN layer's logits `[n_vocab, n_outputs]` for hidden states `h` `[n_embd, rows]` and
/// token ids `tokens` i32 `[rows]` (row `r` pairs `h[:, r]` with `tokens[r]`), the layer's
/// attention reading `inp`'s slots and positions, only `inp`'s wanted rows going to the head.
pub fn draft_head(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    h: TensorId,
    tokens: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let n =
        m.w.nextn
            .as_ref()
            .ok_or_else(|| PluginError::invalid("the file holds no NextN layer"))?;
    let eps = m.hp.lm.eps;
    let il = n.index;
    g.set_layer(il as i32);
    let globals = &m.w.trunk.globals;
    let model = NextnFallbacks {
        tok_embd: &globals.tok_embd,
        output_norm: &globals.output_norm,
        output: &globals.output,
    };
    let x = n.glue.joined_input(g, &model, tokens, h, eps)?;
    let an = g.w(&n.layer.attn_norm)?;
    let cur = g.rms_norm("mtp_attn_norm", x, Some(an), eps)?;
    let mut sel = None;
    let cur = mixer(m, g, (il, &n.layer), cur, inp, &mut sel)?;
    let ffn_inp = g.add("mtp_ffn_inp", cur, x)?;
    let fnorm = g.w(&n.layer.ffn_norm)?;
    let cur = g.rms_norm("mtp_ffn_norm", ffn_inp, Some(fnorm), eps)?;
    let cur = ffn(g, m.hp, il, &n.layer.ffn, cur)?;
    let out = g.add("mtp_post_ffn", cur, ffn_inp)?;
    g.set_layer(-1);
    let out = g.select_outputs(out, inp)?;
    n.glue.logits(g, &model, out, eps)
}

/// The draft graph of `shape`: row `r` pairs its token with its hidden row (`inp_hidden`
/// `[n_embd, rows]`) at its position of the NextN layer's caches; `logits` `[n_vocab,
/// n_outputs]` of the wanted rows. A file without the NextN layer is refused by name.
pub fn build(m: &Model<'_>, shape: BatchShape) -> Result<Graph, PluginError> {
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let ne = [u64::from(m.hp.lm.n_embd), u64::from(shape.n_rows), 1, 1];
    let h = g.input(BatchInput::Hidden, ne)?;
    let logits = draft_head(m, &mut g, h, inp.tokens, &inp)?;
    g.output("logits", logits);
    Ok(g.finish())
}
