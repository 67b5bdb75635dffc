//! Every weight of a joint schema head by its GGUF name (`decision.*`, `token_types.weight`,
//! `dec.blk.N.*`), and the names the same tensors have in `joint_head.safetensors`.

use crate::meta::ModelFileView;
use crate::model::{WeightClass, WeightRole};
use crate::weights::{WeightRef, WeightTable};
use crate::PluginError;

use super::HeadHParams;

/// A layer norm's scale and shift.
#[derive(Clone, Debug)]
pub struct Norm {
    /// Scale `[n]`.
    pub w: WeightRef,
    /// Shift `[n]`.
    pub b: WeightRef,
}

/// A projection with a bias: `W` `[n_in, n_out]` and `b` `[n_out]`.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Weight.
    pub w: WeightRef,
    /// Bias.
    pub b: WeightRef,
}

/// A torch `MultiheadAttention`, its packed input projection split into q, k and v.
#[derive(Clone, Debug)]
pub struct Attention {
    /// Query projection.
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub o: Linear,
}

/// What sets a block apart: a routing block norms the memory it reads; a decoder block first
/// attends over the questions themselves.
#[derive(Clone, Debug)]
pub enum BlockKind {
    /// Cross-attention over the layer-normed memory (`cross_attn_norm_kv`).
    Routing {
        /// The memory's norm.
        memory_norm: Norm,
    },
    /// Self-attention (`attn_norm`, `attn_q/k/v/o`) before the cross-attention.
    Decoder {
        /// Pre-self-attention norm.
        norm: Norm,
        /// Self-attention.
        attn: Box<Attention>,
    },
}

/// One head block `dec.blk.N`.
#[derive(Clone, Debug)]
pub struct Block {
    /// Routing or decoder.
    pub kind: BlockKind,
    /// Pre-cross-attention norm of the queries.
    pub cross_norm: Norm,
    /// Cross-attention over the memory.
    pub cross: Attention,
    /// Pre-FFN norm.
    pub ffn_norm: Norm,
    /// FFN up projection `[width, n_ff]`.
    pub up: Linear,
    /// FFN down projection `[n_ff, width]`.
    pub down: Linear,
}

/// Every weight of the head.
#[derive(Clone, Debug)]
pub struct HeadWeights {
    /// Layer norm of the backbone's rows `[n_embd]`.
    pub hidden_norm: Norm,
    /// `[n_embd, width]` projections of the memory, a question's span, a question for its
    /// options, the last row, an option's span and an option's lexical rows.
    pub proj_memory: WeightRef,
    /// See `proj_memory`.
    pub proj_question: WeightRef,
    /// See `proj_memory`.
    pub proj_option_question: WeightRef,
    /// See `proj_memory`.
    pub proj_global: WeightRef,
    /// See `proj_memory`.
    pub proj_option_context: WeightRef,
    /// See `proj_memory`.
    pub proj_option_lexical: WeightRef,
    /// Question type rows `[width, 3]` (noul 0, choice 1, score 2).
    pub type_embd: WeightRef,
    /// Norm of a question's summary of its options.
    pub option_summary_norm: Norm,
    /// Final norm of the questions.
    pub field_norm: Norm,
    /// Final norm of the options.
    pub option_norm: Norm,
    /// Residual scorer `[4·width, width]` and its bias.
    pub scorer: Linear,
    /// Residual scorer output `[width, 1]` and its bias.
    pub scorer_out: Linear,
    /// `[prior scale, joint scale, residual gate]`, already transformed (exp, clamped at 100;
    /// sigmoid).
    pub scales: WeightRef,
    /// Routing blocks, then decoder blocks.
    pub blocks: Vec<Block>,
}

/// Prefix of every head name but `token_types.weight` and the blocks.
const DECISION: &str = "decision.";

/// Whether `name` is a tensor of a joint schema head (so a file's extra head tensors can be
/// found).
pub fn is_head_tensor(name: &str) -> bool {
    name.starts_with(DECISION) || name.starts_with("dec.blk.") || name == "token_types.weight"
}

/// Declares every weight of the head `hp` into `t`, each checked against the file by name and
/// shape.
pub fn declare(t: &mut WeightTable<'_>, hp: &HeadHParams) -> Result<HeadWeights, PluginError> {
    let (e, h, ff) = (
        u64::from(hp.n_embd),
        u64::from(hp.width),
        u64::from(hp.n_ff),
    );
    let g = WeightRole::Global;
    let mut w = |name: &str, class: WeightClass, ne: &[u64]| t.require(name, g, class, ne);
    let hidden_norm = norm(&mut w, "decision.hidden_norm", e)?;
    let mut proj = |name: &str| {
        w(
            &format!("decision.{name}.weight"),
            WeightClass::Other,
            &[e, h],
        )
    };
    let proj_memory = proj("proj_memory")?;
    let proj_question = proj("proj_question")?;
    let proj_option_question = proj("proj_option_question")?;
    let proj_global = proj("proj_global")?;
    let proj_option_context = proj("proj_option_context")?;
    let proj_option_lexical = proj("proj_option_lexical")?;
    let type_embd = w("token_types.weight", WeightClass::Other, &[h, 3])?;
    let option_summary_norm = norm(&mut w, "decision.option_summary_norm", h)?;
    let field_norm = norm(&mut w, "decision.field_norm", h)?;
    let option_norm = norm(&mut w, "decision.option_norm", h)?;
    let scorer = linear(&mut w, "decision.scorer", 4 * h, h)?;
    let scorer_out = linear(&mut w, "decision.scorer_out", h, 1)?;
    let scales = w("decision.scales", WeightClass::Other, &[3])?;
    let mut blocks = Vec::new();
    for i in 0..hp.n_blocks() {
        let p = format!("dec.blk.{i}.");
        let kind = if i < hp.n_routing {
            BlockKind::Routing {
                memory_norm: norm(&mut w, &format!("{p}cross_attn_norm_kv"), h)?,
            }
        } else {
            BlockKind::Decoder {
                norm: norm(&mut w, &format!("{p}attn_norm"), h)?,
                attn: Box::new(attention(&mut w, &format!("{p}attn_"), h)?),
            }
        };
        blocks.push(Block {
            kind,
            cross_norm: norm(&mut w, &format!("{p}cross_attn_norm"), h)?,
            cross: attention(&mut w, &format!("{p}cross_attn_"), h)?,
            ffn_norm: norm(&mut w, &format!("{p}ffn_norm"), h)?,
            up: linear(&mut w, &format!("{p}ffn_up"), h, ff)?,
            down: linear(&mut w, &format!("{p}ffn_down"), ff, h)?,
        });
    }
    Ok(HeadWeights {
        hidden_norm,
        proj_memory,
        proj_question,
        proj_option_question,
        proj_global,
        proj_option_context,
        proj_option_lexical,
        type_embd,
        option_summary_norm,
        field_norm,
        option_norm,
        scorer,
        scorer_out,
        scales,
        blocks,
    })
}

type Declare<'a> = dyn FnMut(&str, WeightClass, &[u64]) -> Result<WeightRef, PluginError> + 'a;

fn norm(w: &mut Declare<'_>, name: &str, n: u64) -> Result<Norm, PluginError> {
    Ok(Norm {
        w: w(&format!("{name}.weight"), WeightClass::Norm, &[n])?,
        b: w(&format!("{name}.bias"), WeightClass::Norm, &[n])?,
    })
}

fn linear(w: &mut Declare<'_>, name: &str, n_in: u64, n_out: u64) -> Result<Linear, PluginError> {
    Ok(Linear {
        w: w(
            &format!("{name}.weight"),
            WeightClass::Other,
            &[n_in, n_out],
        )?,
        b: w(&format!("{name}.bias"), WeightClass::Other, &[n_out])?,
    })
}

fn attention(w: &mut Declare<'_>, prefix: &str, h: u64) -> Result<Attention, PluginError> {
    Ok(Attention {
        q: linear(w, &format!("{prefix}q"), h, h)?,
        k: linear(w, &format!("{prefix}k"), h, h)?,
        v: linear(w, &format!("{prefix}v"), h, h)?,
        o: linear(w, &format!("{prefix}o"), h, h)?,
    })
}

/// Refuses, by name, a head tensor of `view` that `declared` (the names declared) lacks: a block
/// past the counts, a tensor of another head version.
pub fn refuse_extra(view: &ModelFileView, declared: &[&str]) -> Result<(), PluginError> {
    match view
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .find(|n| is_head_tensor(n) && !declared.contains(n))
    {
        Some(name) => Err(PluginError::BadTensor {
            name: name.into(),
            message: "is not a tensor of this decision head (its counts or names differ)".into(),
        }),
        None => Ok(()),
    }
}

/// The GGUF name of a `joint_head.safetensors` tensor as llama.cpp's converter names it, for the
/// tensors that map one to one (the packed `in_proj_*` tensors are split first, see
/// [`split_in_proj`]; the three scalars become `decision.scales`). `None` for a name the head
/// does not have.
pub fn gguf_name(st: &str, n_routing: u32) -> Option<String> {
    let (stem, suffix) = st.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let global = match stem {
        "hidden_norm" => Some("decision.hidden_norm"),
        "memory_projection" => Some("decision.proj_memory"),
        "question_projection" => Some("decision.proj_question"),
        "option_question_projection" => Some("decision.proj_option_question"),
        "global_projection" => Some("decision.proj_global"),
        "option_context_projection" => Some("decision.proj_option_context"),
        "option_lexical_projection" => Some("decision.proj_option_lexical"),
        "option_summary_norm" => Some("decision.option_summary_norm"),
        "field_norm" => Some("decision.field_norm"),
        "option_norm" => Some("decision.option_norm"),
        "residual_scorer.0" => Some("decision.scorer"),
        "residual_scorer.3" => Some("decision.scorer_out"),
        "type_embedding" => Some("token_types"),
        _ => None,
    };
    if let Some(g) = global {
        return Some(format!("{g}.{suffix}"));
    }
    let (group, rest) = stem.split_once('.')?;
    let (index, part) = rest.split_once('.')?;
    let index: u32 = index.parse().ok()?;
    let (block, part) = match group {
        "evidence_layers" => (index, evidence_part(part)?),
        "layers" => (index.checked_add(n_routing)?, decoder_part(part)?),
        _ => return None,
    };
    Some(format!("dec.blk.{block}.{part}.{suffix}"))
}

fn evidence_part(part: &str) -> Option<&'static str> {
    Some(match part {
        "query_norm" => "cross_attn_norm",
        "memory_norm" => "cross_attn_norm_kv",
        "attention.out_proj" => "cross_attn_o",
        "feedforward_norm" => "ffn_norm",
        "feedforward.0" => "ffn_up",
        "feedforward.3" => "ffn_down",
        _ => return None,
    })
}

fn decoder_part(part: &str) -> Option<&'static str> {
    Some(match part {
        "norm1" => "attn_norm",
        "self_attn.out_proj" => "attn_o",
        "norm2" => "cross_attn_norm",
        "multihead_attn.out_proj" => "cross_attn_o",
        "norm3" => "ffn_norm",
        "linear1" => "ffn_up",
        "linear2" => "ffn_down",
        _ => return None,
    })
}

/// The GGUF names of the q, k and v thirds of a packed `…in_proj_weight` / `…in_proj_bias`
/// safetensors tensor, rows in that order; `None` for any other name.
pub fn split_in_proj(st: &str, n_routing: u32) -> Option<[String; 3]> {
    let (stem, suffix) = if let Some(s) = st.strip_suffix(".in_proj_weight") {
        (s, "weight")
    } else {
        (st.strip_suffix(".in_proj_bias")?, "bias")
    };
    let (group, rest) = stem.split_once('.')?;
    let (index, part) = rest.split_once('.')?;
    let index: u32 = index.parse().ok()?;
    let (block, attn) = match (group, part) {
        ("evidence_layers", "attention") => (index, "cross_attn_"),
        ("layers", "self_attn") => (index.checked_add(n_routing)?, "attn_"),
        ("layers", "multihead_attn") => (index.checked_add(n_routing)?, "cross_attn_"),
        _ => return None,
    };
    Some(["q", "k", "v"].map(|x| format!("dec.blk.{block}.{attn}{x}.{suffix}")))
}

/// The safetensors names of the three learned scalars, in the order of `decision.scales`.
pub const SCALAR_NAMES: [&str; 3] = ["prior_logit_scale", "joint_logit_scale", "residual_gate"];

/// `decision.scales` from the raw scalars ([`SCALAR_NAMES`] order): the two logit scales as
/// `exp(min(s, ln 100))`, the gate as a sigmoid.
pub fn transform_scales(raw: [f64; 3]) -> [f32; 3] {
    let scale = |s: f64| s.min(100f64.ln()).exp() as f32;
    [
        scale(raw[0]),
        scale(raw[1]),
        (1.0 / (1.0 + (-raw[2]).exp())) as f32,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_names_map_as_the_converter_maps_them() {
        assert_eq!(
            gguf_name("memory_projection.weight", 2).as_deref(),
            Some("decision.proj_memory.weight")
        );
        assert_eq!(
            gguf_name("layers.1.linear2.bias", 2).as_deref(),
            Some("dec.blk.3.ffn_down.bias")
        );
        assert_eq!(
            gguf_name("evidence_layers.0.memory_norm.weight", 2).as_deref(),
            Some("dec.blk.0.cross_attn_norm_kv.weight")
        );
        assert_eq!(gguf_name("layers.0.dropout.weight", 2), None);
        let [q, _, v] = split_in_proj("layers.0.multihead_attn.in_proj_weight", 2).unwrap();
        assert_eq!(q, "dec.blk.2.cross_attn_q.weight");
        assert_eq!(v, "dec.blk.2.cross_attn_v.weight");
        let s = transform_scales([10.0, 0.0, 0.0]);
        assert!((s[0] - 100.0).abs() < 1e-3 && s[1] == 1.0 && s[2] == 0.5);
    }
}
