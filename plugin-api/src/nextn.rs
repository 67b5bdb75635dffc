//! The glue around a multi-token-prediction (nextn) block, as llama.cpp b11434 names and runs it
//! for every architecture that has one (`qwen35`/`qwen35moe`'s MTP block, GLM-5.3's NextN layer):
//!
//! ```text
//! x      = eh_proj · [enorm(embed(token)); hnorm(h)]     h: the trunk's final-norm row
//! (the block's own layer runs on x)
//! logits = head · shared_head_norm(out)                  each falling back to the model's
//! ```
//!
//! The block may carry its own embedding table, head norm and head; without them it uses the
//! model's `token_embd`, `output_norm` and `output`.

use crate::graph::{GraphBuilder, TensorId, FINAL_NORM};
use crate::model::WeightClass as C;
use crate::op::Op;
use crate::weights::{LayerWeights, WeightRef};
use crate::{DType, PluginError};

/// The weights around a nextn block's layer, `blk.{layer}.nextn.*`.
pub struct NextnWeights {
    /// Projection of `[enorm(e); hnorm(h)]`, `[2·n_embd, n_embd]`.
    pub eh_proj: WeightRef,
    /// RMS norm of the token embedding.
    pub enorm: WeightRef,
    /// RMS norm of the trunk's hidden state.
    pub hnorm: WeightRef,
    /// Its own embedding table, when the file has one (else the model's).
    pub embed_tokens: Option<WeightRef>,
    /// Its head's RMS norm, when the file has one (else `output_norm`).
    pub head_norm: Option<WeightRef>,
    /// Its head, when the file has one (else `output`).
    pub head: Option<WeightRef>,
}

/// The model's own weights a nextn block falls back to.
pub struct NextnFallbacks<'a> {
    /// `token_embd`.
    pub tok_embd: &'a WeightRef,
    /// `output_norm`.
    pub output_norm: &'a WeightRef,
    /// `output`.
    pub output: &'a WeightRef,
}

impl NextnWeights {
    /// Declares the glue of layer `l` for a model of width `n_embd` and `n_vocab` tokens.
    pub fn declare(
        l: &mut LayerWeights<'_, '_>,
        n_embd: u64,
        n_vocab: u64,
    ) -> Result<NextnWeights, PluginError> {
        let (e, v) = (n_embd, n_vocab);
        Ok(NextnWeights {
            eh_proj: l.weight("nextn.eh_proj", C::Other, &[2 * e, e])?,
            enorm: l.norm("nextn.enorm", e)?,
            hnorm: l.norm("nextn.hnorm", e)?,
            embed_tokens: l.optional_tensor("nextn.embed_tokens.weight", C::Embedding, &[e, v])?,
            head_norm: l.optional_tensor("nextn.shared_head_norm.weight", C::Norm, &[e])?,
            head: l.optional_tensor("nextn.shared_head_head.weight", C::Output, &[e, v])?,
        })
    }

    /// The block's input `x = eh_proj·[enorm(embed(tokens)); hnorm(hidden)]`, `[n_embd, rows]`.
    pub fn joined_input(
        &self,
        g: &mut GraphBuilder,
        model: &NextnFallbacks<'_>,
        tokens: TensorId,
        hidden: TensorId,
        eps: f32,
    ) -> Result<TensorId, PluginError> {
        let table = g.w(self.embed_tokens.as_ref().unwrap_or(model.tok_embd))?;
        let e = g.get_rows("mtp_tok_embd", table, tokens)?;
        let en = g.w(&self.enorm)?;
        let e = g.rms_norm("mtp_enorm", e, Some(en), eps)?;
        let hn = g.w(&self.hnorm)?;
        let h = g.rms_norm("mtp_hnorm", hidden, Some(hn), eps)?;
        let [width, rows, _, _] = g.ne(h);
        let eh = g.op(
            "mtp_concat",
            Op::Concat,
            &[e, h],
            DType::F32,
            [2 * width, rows, 1, 1],
        )?;
        let proj = g.w(&self.eh_proj)?;
        g.matmul("mtp_eh_proj", proj, eh)
    }

    /// The block's logits from its output rows: `head·shared_head_norm(out)`. The normed rows
    /// are named [`FINAL_NORM`] (llama.cpp's `h_nextn` of the draft context): a chained draft
    /// step pairs its next token with them, and the host reads them as it reads the trunk's.
    pub fn logits(
        &self,
        g: &mut GraphBuilder,
        model: &NextnFallbacks<'_>,
        out: TensorId,
        eps: f32,
    ) -> Result<TensorId, PluginError> {
        let hw = g.w(self.head_norm.as_ref().unwrap_or(model.output_norm))?;
        let out = g.rms_norm(FINAL_NORM, out, Some(hw), eps)?;
        let head = g.w(self.head.as_ref().unwrap_or(model.output))?;
        g.matmul("result_output", head, out)
    }
}
