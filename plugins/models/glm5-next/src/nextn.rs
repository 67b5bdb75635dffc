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
//! graph that pairs each trunk row's `h` with the next token is the MTP issue's, which calls
//! [`draft_head`].

use bloomery_plugin_api::builders::LmInputs;
use bloomery_plugin_api::graph::{GraphBuilder, TensorId};
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::{DType, PluginError};

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
    let table = g.w(n.embed_tokens.as_ref().unwrap_or(&globals.tok_embd))?;
    let e = g.get_rows("mtp_tok_embd", table, tokens)?;
    let en = g.w(&n.enorm)?;
    let e = g.rms_norm("mtp_enorm", e, Some(en), eps)?;
    let hn = g.w(&n.hnorm)?;
    let h = g.rms_norm("mtp_hnorm", h, Some(hn), eps)?;
    let [ne, rows, _, _] = g.ne(h);
    let eh = g.op(
        "mtp_concat",
        Op::Concat,
        &[e, h],
        DType::F32,
        [2 * ne, rows, 1, 1],
    )?;
    let proj = g.w(&n.eh_proj)?;
    let x = g.matmul("mtp_eh_proj", proj, eh)?;
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
    let hw = g.w(n.head_norm.as_ref().unwrap_or(&globals.output_norm))?;
    let out = g.rms_norm("mtp_shared_head_norm", out, Some(hw), eps)?;
    let head = g.w(n.head.as_ref().unwrap_or(&globals.output))?;
    g.matmul("result_output", head, out)
}
