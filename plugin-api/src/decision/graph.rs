//! The joint schema head as a graph of ABI ops, for one request's prompt or several requests'
//! prompts stacked (one graph, one run): from the backbone's final-norm rows to one score per
//! option, `P·prior + g·(J·cos + r)`.
//!
//! The requests' layout is data, bound as tensors the graph reads ([`HeadInput`]): the graph
//! depends only on each request's counts of rows, questions and options ([`HeadShape`]), so it
//! serves every batch of those counts, on any device whose kernel plugin has the ops. Stacked
//! requests share every projection, norm and feed-forward (one product over all their rows); an
//! attention runs once per request over views of its own rows, so no request sees another's.

use crate::graph::{BatchInput, Graph, GraphBuilder, TensorId};
use crate::op::{Op, UnaryFn};
use crate::weights::WeightRef;
use crate::{DType, PluginError};

use super::weights::{Attention, BlockKind, HeadWeights, Linear, Norm};
use super::HeadHParams;

/// The counts a head graph is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeadShape {
    /// Prompt rows (the memory).
    pub n_rows: u32,
    /// Questions.
    pub n_questions: u32,
    /// Options of all questions.
    pub n_options: u32,
}

/// The per-request tensors a head graph reads, bound after the head's weights (as weight
/// indices `base + input as u32`); the token ids come as the `Tokens` batch input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadInput {
    /// f32 `[n_embd, n_rows]`: the backbone's final-norm rows.
    Hidden = 0,
    /// i32 `[2, n_questions]`: each question's span of rows (start, end exclusive).
    QuestionSpans = 1,
    /// i32 `[2, n_options]`: each option's span of rows.
    OptionSpans = 2,
    /// i32 `[n_questions]`: each question's type (noul 0, choice 1, score 2).
    QuestionTypes = 3,
    /// i32 `[n_options]`: the question each option belongs to.
    OptionOwners = 4,
    /// f32 `[n_options, n_questions]`: 0 where the option belongs to the question, else -inf.
    OptionMask = 5,
    /// f32 `[n_embd, 1]` of ones (sums over the backbone's width).
    OnesEmbd = 6,
    /// f32 `[width, 1]` of ones (sums over the head's width).
    OnesWidth = 7,
    /// i32 `[n_questions]`: the last row of each question's request (its prompt's last row).
    QuestionLastRows = 8,
}

/// Every [`HeadInput`], in index order.
pub const HEAD_INPUTS: [HeadInput; 9] = [
    HeadInput::Hidden,
    HeadInput::QuestionSpans,
    HeadInput::OptionSpans,
    HeadInput::QuestionTypes,
    HeadInput::OptionOwners,
    HeadInput::OptionMask,
    HeadInput::OnesEmbd,
    HeadInput::OnesWidth,
    HeadInput::QuestionLastRows,
];

impl HeadShape {
    /// The counts of `parts` stacked (the shape the inputs of a batch have).
    pub fn total(parts: &[HeadShape]) -> HeadShape {
        parts.iter().fold(
            HeadShape {
                n_rows: 0,
                n_questions: 0,
                n_options: 0,
            },
            |a, p| HeadShape {
                n_rows: a.n_rows.saturating_add(p.n_rows),
                n_questions: a.n_questions.saturating_add(p.n_questions),
                n_options: a.n_options.saturating_add(p.n_options),
            },
        )
    }
}

impl HeadInput {
    /// The element type and extents of this input for `shape`.
    pub fn layout(self, hp: &HeadHParams, shape: HeadShape) -> (DType, [u64; 4]) {
        let (t, q, o) = (
            u64::from(shape.n_rows),
            u64::from(shape.n_questions),
            u64::from(shape.n_options),
        );
        let (e, h) = (u64::from(hp.n_embd), u64::from(hp.width));
        match self {
            HeadInput::Hidden => (DType::F32, [e, t, 1, 1]),
            HeadInput::QuestionSpans => (DType::I32, [2, q, 1, 1]),
            HeadInput::OptionSpans => (DType::I32, [2, o, 1, 1]),
            HeadInput::QuestionTypes => (DType::I32, [q, 1, 1, 1]),
            HeadInput::OptionOwners => (DType::I32, [o, 1, 1, 1]),
            HeadInput::OptionMask => (DType::F32, [o, q, 1, 1]),
            HeadInput::OnesEmbd => (DType::F32, [e, 1, 1, 1]),
            HeadInput::OnesWidth => (DType::F32, [h, 1, 1, 1]),
            HeadInput::QuestionLastRows => (DType::I32, [q, 1, 1, 1]),
        }
    }
}

/// What a head graph is built from.
pub struct HeadModel<'a> {
    /// Sizes.
    pub hp: &'a HeadHParams,
    /// The head's weights (indices into the bound weight list).
    pub w: &'a HeadWeights,
    /// The backbone's output head `[n_embd, n_vocab]`, whose rows are the options' lexical rows.
    pub output: &'a WeightRef,
    /// Index of [`HeadInput::Hidden`] in the bound weight list; the other inputs follow it.
    pub inputs_base: u32,
    /// `decision.scales`' values: prior scale P, joint scale J, residual gate g.
    pub scales: [f32; 3],
}

/// Builds the head's graph for one request of `shape`; its output `scores` is f32
/// `[1, n_options]`.
pub fn build(m: &HeadModel<'_>, shape: HeadShape) -> Result<Graph, PluginError> {
    build_batch(m, &[shape])
}

/// Builds the head's graph for requests of the counts `parts`, stacked in that order: their rows
/// one after another, then their questions, then their options (the inputs' layout for the
/// total, [`HeadShape::total`]); its output `scores` is f32 `[1, n_options]` over all of them.
pub fn build_batch(m: &HeadModel<'_>, parts: &[HeadShape]) -> Result<Graph, PluginError> {
    if parts.is_empty()
        || parts
            .iter()
            .any(|s| s.n_rows == 0 || s.n_questions == 0 || s.n_options == 0)
    {
        return Err(PluginError::invalid(format!(
            "a decision head needs rows, questions and options for every request: {parts:?}"
        )));
    }
    let mut g = Head {
        g: GraphBuilder::new(),
        m,
        shape: HeadShape::total(parts),
        parts,
    };
    let scores = g.scores()?;
    g.g.output("scores", scores);
    Ok(g.g.finish())
}

struct Head<'a, 'm> {
    g: GraphBuilder,
    m: &'a HeadModel<'m>,
    /// The counts of all requests together.
    shape: HeadShape,
    /// Each request's counts.
    parts: &'a [HeadShape],
}

/// Which count of a request splits a tensor's columns among the requests.
#[derive(Clone, Copy)]
enum Columns {
    Rows,
    Questions,
    Options,
}

impl Columns {
    fn of(self, s: &HeadShape) -> u64 {
        u64::from(match self {
            Columns::Rows => s.n_rows,
            Columns::Questions => s.n_questions,
            Columns::Options => s.n_options,
        })
    }
}

impl Head<'_, '_> {
    fn scores(&mut self) -> Result<TensorId, PluginError> {
        let w = self.m.w;
        let t = u64::from(self.shape.n_rows);
        let hidden = self.input(HeadInput::Hidden)?;
        let tokens = self.g.input(BatchInput::Tokens, [t, 1, 1, 1])?;
        let q_spans = self.input(HeadInput::QuestionSpans)?;
        let o_spans = self.input(HeadInput::OptionSpans)?;
        let owners = self.input(HeadInput::OptionOwners)?;

        let hidden = self.norm("decision_hidden_norm", hidden, &w.hidden_norm)?;
        let memory = self.proj("decision_memory", &w.proj_memory, hidden)?;
        // Each question's request's last row.
        let last = self.input(HeadInput::QuestionLastRows)?;
        let global = self.g.get_rows("decision_global", hidden, last)?;
        let question = self.op("decision_question", Op::SpanMean, &[hidden, q_spans], |n| {
            [n[0][0], n[1][1], 1, 1]
        })?;
        let opt_ctx = self.op(
            "decision_option_ctx",
            Op::SpanMean,
            &[hidden, o_spans],
            |n| [n[0][0], n[1][1], 1, 1],
        )?;
        let table = self.g.w(self.m.output)?;
        let rows = self.g.get_rows("decision_token_rows", table, tokens)?;
        let lexical = self.op("decision_lexical", Op::SpanMean, &[rows, o_spans], |n| {
            [n[0][0], n[1][1], 1, 1]
        })?;

        // One query per option: its span, its lexical rows and its question.
        let a = self.proj("decision_opt_ctx", &w.proj_option_context, opt_ctx)?;
        let b = self.proj("decision_opt_lex", &w.proj_option_lexical, lexical)?;
        let mut options = self.g.add("decision_options", a, b)?;
        let oq = self.proj("decision_opt_question", &w.proj_option_question, question)?;
        let oq = self.g.get_rows("decision_opt_question_rows", oq, owners)?;
        options = self.g.add("decision_options", options, oq)?;

        let mut fields = Vec::new();
        for (il, blk) in w.blocks.iter().enumerate() {
            self.g.set_layer(il as i32);
            match &blk.kind {
                BlockKind::Routing { memory_norm } => {
                    let q = self.norm("cross_attn_norm", options, &blk.cross_norm)?;
                    let kv = self.norm("cross_attn_norm_kv", memory, memory_norm)?;
                    let cols = (Columns::Options, Columns::Rows);
                    let att = self.attention("cross_attn", q, kv, &blk.cross, cols)?;
                    options = self.g.add("cross_attn_residual", options, att)?;
                    options = self.ffn(options, blk)?;
                }
                BlockKind::Decoder { norm, attn } => {
                    if fields.is_empty() {
                        self.g.set_layer(-1);
                        fields.push(self.fields(question, global, options)?);
                        self.g.set_layer(il as i32);
                    }
                    let mut f = fields[0];
                    let x = self.norm("attn_norm", f, norm)?;
                    let cols = (Columns::Questions, Columns::Questions);
                    let att = self.attention("self_attn", x, x, attn, cols)?;
                    f = self.g.add("self_attn_residual", f, att)?;
                    let x = self.norm("cross_attn_norm", f, &blk.cross_norm)?;
                    let cols = (Columns::Questions, Columns::Rows);
                    let att = self.attention("cross_attn", x, memory, &blk.cross, cols)?;
                    f = self.g.add("cross_attn_residual", f, att)?;
                    fields[0] = self.ffn(f, blk)?;
                }
            }
        }
        self.g.set_layer(-1);
        let fields = match fields.first() {
            Some(&f) => f,
            None => self.fields(question, global, options)?,
        };
        let fields = self.norm("decision_fields", fields, &w.field_norm)?;
        self.logits(question, global, lexical, options, fields, owners)
    }

    /// One vector per question: its span, a summary of its options weighted by it, the last
    /// row and its type.
    fn fields(
        &mut self,
        question: TensorId,
        global: TensorId,
        options: TensorId,
    ) -> Result<TensorId, PluginError> {
        let w = self.m.w;
        let h = u64::from(self.m.hp.width);
        let o = u64::from(self.shape.n_options);
        let mask = self.input(HeadInput::OptionMask)?;
        let types = self.input(HeadInput::QuestionTypes)?;
        let f = self.proj("decision_fields_question", &w.proj_question, question)?;
        let weights = self.g.matmul("decision_option_weights", options, f)?;
        let scale = 1.0 / (h as f32).sqrt();
        let weights = self.op(
            "decision_option_softmax",
            Op::Softmax { scale },
            &[weights, mask],
            |n| n[0],
        )?;
        let opt_t = self.g.view(
            options,
            "decision_options_t",
            [o, h, 1, 1],
            [4 * h, 4, 4 * h * o, 4 * h * o],
            0,
        );
        let opt_t = self.op("decision_options_t", Op::Copy, &[opt_t], |n| n[0])?;
        let summary = self.g.matmul("decision_summary", opt_t, weights)?;
        let summary = self.norm("decision_summary_norm", summary, &w.option_summary_norm)?;
        let f = self.g.add("decision_fields", f, summary)?;
        let gl = self.proj("decision_fields_global", &w.proj_global, global)?;
        let f = self.g.add("decision_fields", f, gl)?;
        let te = self.g.w(&w.type_embd)?;
        let te = self.g.get_rows("decision_type_rows", te, types)?;
        self.g.add("decision_fields", f, te)
    }

    /// `P·prior + g·(J·cos + r)` per option.
    fn logits(
        &mut self,
        question: TensorId,
        global: TensorId,
        lexical: TensorId,
        options: TensorId,
        fields: TensorId,
        owners: TensorId,
    ) -> Result<TensorId, PluginError> {
        let w = self.m.w;
        let [p, j, gate] = self.m.scales;
        let ones_e = self.input(HeadInput::OnesEmbd)?;
        let ones_h = self.input(HeadInput::OnesWidth)?;

        // The prior: the options' lexical rows against their question and the last row.
        let anchor = self.g.add("decision_anchor", question, global)?;
        let anchor = self.l2("decision_anchor", anchor)?;
        let anchor = self.g.get_rows("decision_anchor_rows", anchor, owners)?;
        let lex = self.l2("decision_lexical_l2", lexical)?;
        let prior = self.g.mul("decision_prior", lex, anchor)?;
        let prior = self.g.matmul("decision_prior", ones_e, prior)?;

        // The joint score: each option against the vector of its question.
        let options = self.norm("decision_options_norm", options, &w.option_norm)?;
        let field = self.g.get_rows("decision_field_rows", fields, owners)?;
        let fl = self.l2("decision_field_l2", field)?;
        let ol = self.l2("decision_option_l2", options)?;
        let cos = self.g.mul("decision_cosine", fl, ol)?;
        let cos = self.g.matmul("decision_cosine", ones_h, cos)?;

        let prod = self.g.mul("decision_feat_mul", field, options)?;
        let neg = self.g.scale("decision_feat_neg", options, -1.0)?;
        let diff = self.g.add("decision_feat_diff", field, neg)?;
        let pos = self.unary("decision_feat_pos", diff, UnaryFn::Relu)?;
        let ndiff = self.g.scale("decision_feat_ndiff", diff, -1.0)?;
        let negp = self.unary("decision_feat_negpart", ndiff, UnaryFn::Relu)?;
        let abs = self.g.add("decision_feat_abs", pos, negp)?;
        let feat = self.concat("decision_features", field, options)?;
        let feat = self.concat("decision_features", feat, prod)?;
        let feat = self.concat("decision_features", feat, abs)?;
        let r = self.linear("decision_scorer", &w.scorer, feat)?;
        let r = self.unary("decision_scorer_gelu", r, UnaryFn::GeluErf)?;
        let r = self.linear("decision_scorer_out", &w.scorer_out, r)?;

        let joint = self.g.scale("decision_joint", cos, j)?;
        let joint = self.g.add("decision_joint", joint, r)?;
        let joint = self.g.scale("decision_joint_gated", joint, gate)?;
        let prior = self.g.scale("decision_prior_scaled", prior, p)?;
        self.g.add("result_decision", prior, joint)
    }

    fn input(&mut self, i: HeadInput) -> Result<TensorId, PluginError> {
        let (dtype, ne) = i.layout(self.m.hp, self.shape);
        let name = format!("decision_input_{}", i as u32);
        self.g
            .weight(self.m.inputs_base + i as u32, &name, dtype, ne)
    }

    /// A node whose f32 result has the extents `ne` gives from its sources' extents.
    fn op(
        &mut self,
        name: &str,
        op: Op,
        srcs: &[TensorId],
        ne: impl FnOnce(&[[u64; 4]]) -> [u64; 4],
    ) -> Result<TensorId, PluginError> {
        let extents: Vec<[u64; 4]> = srcs.iter().map(|&s| self.g.ne(s)).collect();
        self.g.op(name, op, srcs, DType::F32, ne(&extents))
    }

    fn unary(&mut self, name: &str, x: TensorId, f: UnaryFn) -> Result<TensorId, PluginError> {
        self.op(name, Op::Unary { f }, &[x], |n| n[0])
    }

    fn l2(&mut self, name: &str, x: TensorId) -> Result<TensorId, PluginError> {
        self.op(name, Op::L2Norm { eps: 1e-24 }, &[x], |n| n[0])
    }

    fn concat(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, PluginError> {
        self.op(name, Op::Concat, &[a, b], |n| {
            [n[0][0] + n[1][0], n[0][1], 1, 1]
        })
    }

    fn norm(&mut self, name: &str, x: TensorId, n: &Norm) -> Result<TensorId, PluginError> {
        let (w, b) = (self.g.w(&n.w)?, self.g.w(&n.b)?);
        let eps = self.m.hp.eps;
        self.op(name, Op::LayerNorm { eps }, &[x, w, b], |n| n[0])
    }

    fn proj(&mut self, name: &str, w: &WeightRef, x: TensorId) -> Result<TensorId, PluginError> {
        let w = self.g.w(w)?;
        self.g.matmul(name, w, x)
    }

    fn linear(&mut self, name: &str, l: &Linear, x: TensorId) -> Result<TensorId, PluginError> {
        let y = self.proj(name, &l.w, x)?;
        let b = self.g.w(&l.b)?;
        self.g.add(name, y, b)
    }

    /// torch `MultiheadAttention` of queries `q` `[width, n_q]` over `kv` `[width, n_kv]`, no
    /// mask, each request's queries over its own keys: `cols` says which of a request's counts
    /// splits the columns of `q` and of `kv`.
    fn attention(
        &mut self,
        name: &str,
        q: TensorId,
        kv: TensorId,
        a: &Attention,
        cols: (Columns, Columns),
    ) -> Result<TensorId, PluginError> {
        let (nh, d) = (u64::from(self.m.hp.n_head), u64::from(self.m.hp.head_dim()));
        let heads = |g: &mut GraphBuilder, x: TensorId| {
            let n = g.ne(x)[1];
            g.reshape(x, [d, nh, n, 1])
        };
        let qc = self.linear(&format!("{name}_q"), &a.q, q)?;
        let kc = self.linear(&format!("{name}_k"), &a.k, kv)?;
        let vc = self.linear(&format!("{name}_v"), &a.v, kv)?;
        let (qc, kc, vc) = (
            heads(&mut self.g, qc)?,
            heads(&mut self.g, kc)?,
            heads(&mut self.g, vc)?,
        );
        let op = Op::AttentionDense {
            scale: 1.0 / (d as f32).sqrt(),
            causal: false,
        };
        let out = if self.parts.len() == 1 {
            self.op(name, op, &[qc, kc, vc], |n| n[0])?
        } else {
            // The result's rows, each request's written by its own attention.
            let out = self.g.scale(name, qc, 0.0)?;
            let (mut at_q, mut at_kv) = (0, 0);
            for part in self.parts {
                let (nq, nkv) = (cols.0.of(part), cols.1.of(part));
                let view = |g: &mut GraphBuilder, x: TensorId, at: u64, n: u64| {
                    let ne = [d, nh, n, 1];
                    let nb = [4, 4 * d, 4 * d * nh, 4 * d * nh * n];
                    g.view(x, name, ne, nb, at * 4 * d * nh)
                };
                let q_r = view(&mut self.g, qc, at_q, nq);
                let k_r = view(&mut self.g, kc, at_kv, nkv);
                let v_r = view(&mut self.g, vc, at_kv, nkv);
                let o_r = view(&mut self.g, out, at_q, nq);
                self.g.op_into(op, &[q_r, k_r, v_r], o_r)?;
                at_q += nq;
                at_kv += nkv;
            }
            out
        };
        let n = self.g.ne(out)[2];
        let out = self.g.reshape(out, [d * nh, n, 1, 1])?;
        self.linear(&format!("{name}_o"), &a.o, out)
    }

    /// `x + down(gelu(up(norm(x))))`.
    fn ffn(&mut self, x: TensorId, blk: &super::weights::Block) -> Result<TensorId, PluginError> {
        let y = self.norm("ffn_norm", x, &blk.ffn_norm)?;
        let y = self.linear("ffn_up", &blk.up, y)?;
        let y = self.unary("ffn_gelu", y, UnaryFn::GeluErf)?;
        let y = self.linear("ffn_down", &blk.down, y)?;
        self.g.add("ffn_residual", x, y)
    }
}
