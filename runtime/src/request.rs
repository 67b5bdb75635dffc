//! What front ends send the scheduler (generation requests, slot operations) and what it sends
//! back to a request (its slot, its tokens, its end).

use std::path::PathBuf;
use std::sync::Arc;

use bloomery_grammar::Grammar;

use tokio::sync::{mpsc, oneshot};

use crate::embedding::Pooling;
use crate::reasoning_budget::BudgetSpec;
use crate::sampling::SamplerParams;

/// A grammar that constrains what a request generates.
#[derive(Clone, Debug)]
pub struct GrammarSpec {
    /// The grammar, parsed once.
    pub grammar: Arc<Grammar>,
    /// Text the model writes before the grammar applies (the end of a think span); `None`: the
    /// grammar applies from the first token.
    pub after: Option<String>,
    /// When set, the grammar is lazy (llama.cpp's `grammar_lazy`): it waits for a trigger word.
    pub lazy: Option<Box<LazyOpening>>,
}

/// What opens a lazy grammar: the text is free until one of `triggers` appears (after
/// `GrammarSpec::after`, if set), and the grammar applies from the start of the first one
/// written, the word itself included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LazyOpening {
    /// The trigger words (not empty).
    pub triggers: Vec<String>,
    /// A span the text may open with (`<think>`, `</think>` of a model that opens its thinking
    /// itself): trigger words inside it do not count.
    pub optional_span: Option<(String, String)>,
}

/// What a request asks of generation.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// The sampler chain's settings.
    pub sampler: SamplerParams,
    /// Most tokens to generate (`None`: until an end-of-generation token or the context's end).
    pub n_predict: Option<usize>,
    /// Texts that end generation; the text from the match on is not returned.
    pub stop: Vec<String>,
    /// Alternatives to report per generated token with their log-probabilities (0: none).
    pub n_probs: usize,
    /// Report how far the prompt has been evaluated: once when a slot takes the request and
    /// after each pass that evaluates part of it (llama-server's `return_progress`).
    pub return_progress: bool,
    /// Report the probabilities the sampler chain drew from (its candidates after every stage)
    /// rather than the softmax of the raw logits (llama-server's `post_sampling_probs`).
    pub post_sampling_probs: bool,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Reuse the slot's cached prefix.
    pub cache_prompt: bool,
    /// Tokens emitted in order in place of sampled ones while they last (benchmarks feed
    /// llama-bench's random tokens this way); the logits are computed all the same.
    pub forced: Vec<u32>,
    /// Evaluate the prompt and end without generating (`run -n 0`; a benchmark's context).
    pub prompt_only: bool,
    /// The grammar generation must follow (`grammar`, `json_schema`, `response_format`).
    pub grammar: Option<GrammarSpec>,
    /// Once generation has run this many milliseconds (from its first token), end at the next
    /// token whose text holds a newline (llama-server's `t_max_predict_ms`; `None`: no limit).
    pub t_max_predict_ms: Option<u64>,
    /// Control tokens whose text the output keeps (the tags a chat format's tool-call parser
    /// reads, llama.cpp's preserved tokens); others decode to nothing.
    pub preserved: Vec<u32>,
    /// Every special token's text is kept in the output (llama-server's `--special`), not only
    /// the preserved ones'.
    pub special: bool,
    /// What a context shift keeps and drops (with `--context-shift`) and which cached runs a
    /// prompt reuses.
    pub shift: ShiftParams,
    /// The reasoning budget: how many tokens a thinking span may take before its end is forced
    /// (`None`: spans are not counted).
    pub reasoning_budget: Option<BudgetSpec>,
}

/// What moving cached positions may do: what a context shift keeps and drops when generation
/// reaches the slot's context (llama-server's `n_keep` and `n_discard`), and which cached runs
/// a new prompt reuses (`n_cache_reuse`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShiftParams {
    /// Prompt tokens kept at the front, after the BOS token when the model adds one (-1: the
    /// whole prompt); at most the context less 4.
    pub n_keep: i32,
    /// Tokens dropped after the kept ones (0: half of what follows them).
    pub n_discard: usize,
    /// Reuse cached runs of at least this many tokens that moved within a new prompt by moving
    /// them in the cache (llama-server's `n_cache_reuse`, `--cache-reuse`; 0: off).
    pub n_cache_reuse: usize,
}

impl GenParams {
    /// The settings an embedding job carries ([`Job::embed`]): nothing is sampled, and every
    /// prompt row is evaluated (no cached prefix is reused).
    pub fn embedding() -> GenParams {
        GenParams {
            sampler: SamplerParams::default(),
            n_predict: Some(0),
            stop: Vec::new(),
            n_probs: 0,
            post_sampling_probs: false,
            return_progress: false,
            ignore_eos: false,
            cache_prompt: false,
            forced: Vec::new(),
            prompt_only: true,
            grammar: None,
            t_max_predict_ms: None,
            preserved: Vec::new(),
            special: false,
            shift: ShiftParams::default(),
            reasoning_budget: None,
        }
    }
}

/// A generation request handed to the scheduler.
pub struct Job {
    /// Prompt token ids (not empty, shorter than a slot's context).
    pub prompt: Vec<u32>,
    /// Settings.
    pub params: GenParams,
    /// The slot asked for (`None`: any free one).
    pub id_slot: Option<usize>,
    /// Embed the prompt instead of generating: its final-norm rows pooled so, sent as
    /// [`Event::Embedded`] (`params` unused but for `cache_prompt`). The prompt may fill the
    /// slot's context.
    pub embed: Option<Pooling>,
    /// Score the prompt's options with the model's decision head instead of generating, sent
    /// as [`Event::Decided`] (`params` unused but for `cache_prompt`). The prompt may fill the
    /// slot's context.
    pub decide: Option<Box<Decision>>,
    /// Where the scheduler sends what happens; dropping the receiver cancels the request.
    pub events: mpsc::UnboundedSender<Event>,
}

impl Job {
    /// Whether the job generates tokens (not an embedding, not a decision).
    pub fn generates(&self) -> bool {
        self.embed.is_none() && self.decide.is_none()
    }
}

/// A slot operation of `/slots/:id?action=…`.
#[derive(Debug)]
pub enum SlotAction {
    /// Write the slot's tokens and state to this file.
    Save(PathBuf),
    /// Load the slot from this file.
    Restore(PathBuf),
    /// Forget what the slot holds.
    Erase,
}

/// What a slot operation did.
#[derive(Debug, Clone)]
pub struct SlotReply {
    /// Tokens saved, restored or erased.
    pub n_tokens: usize,
    /// Bytes written or read.
    pub n_bytes: u64,
    /// Time taken.
    pub ms: f64,
}

/// A slot operation and where its answer goes.
pub struct SlotCommand {
    /// The slot.
    pub id: usize,
    /// What to do.
    pub action: SlotAction,
    /// The answer (an error message on failure).
    pub reply: oneshot::Sender<Result<SlotReply, String>>,
}

/// A decision's layout: the prompt's final-norm rows go through the model's decision head, one
/// score per option. The prompt's chunks share passes with other requests' rows, and the head
/// runs once over every decision whose prompt ends in the same pass.
#[derive(Clone, Debug)]
pub struct Decision {
    /// Its question spans.
    pub questions: Vec<bloomery_exec::decision::QuestionSpan>,
    /// Its option spans.
    pub options: Vec<bloomery_exec::decision::OptionSpan>,
    /// The leading prompt tokens other decisions may share (the state's part, before any
    /// question): a chunk ends there, so a hybrid model's recurrent state is kept at that point
    /// and a later decision on the same state restores it with its final-norm rows.
    pub shared: usize,
}

impl GenParams {
    /// The settings a decision job carries ([`Job::decide`]): nothing is sampled; a cached
    /// prefix is reused where its final-norm rows are kept.
    pub fn decision() -> GenParams {
        GenParams {
            cache_prompt: true,
            ..GenParams::embedding()
        }
    }
}

/// What a front end sends the scheduler.
pub enum Request {
    /// Generate, embed or decide.
    Generate(Box<Job>),
    /// Generate several requests that start together, in the same passes (a benchmark's
    /// parallel sequences); one that finds no free slot fails.
    GenerateTogether(Vec<Job>),
    /// Save, restore or erase a slot.
    Slot(SlotCommand),
    /// Forget the routing counts that move experts onto the card; the answer says whether the
    /// model has host experts.
    ResidencyReset(oneshot::Sender<bool>),
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopType {
    /// An end-of-generation token.
    Eos,
    /// `n_predict` or the context's end.
    Limit,
    /// A stop string.
    Word,
}

impl StopType {
    /// llama-server's name (`stop_type`).
    pub fn name(self) -> &'static str {
        match self {
            StopType::Eos => "eos",
            StopType::Limit => "limit",
            StopType::Word => "word",
        }
    }
}

/// Log-probabilities around one generated token: of the softmax of the model's logits, or,
/// with `post_sampling`, of the candidates the sampler chain drew from (none of zero
/// probability).
#[derive(Clone, Debug)]
pub struct TokenProbs {
    /// Whether these are the sampler chain's probabilities (`post_sampling_probs`).
    pub post_sampling: bool,
    /// The generated token's log-probability.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, in no particular order: the
    /// scheduler selects them in one pass over the vocabulary and leaves ranking them to the
    /// request's own thread ([`TokenProbs::ranked`]), off the pass every slot shares.
    pub top: Vec<(u32, f32)>,
}

impl TokenProbs {
    /// The most likely tokens, best first (ties by id).
    pub fn ranked(&self) -> Vec<(u32, f32)> {
        let mut top = self.top.clone();
        top.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        top
    }
}

/// One generated token and the text it releases (text can lag its token while a stop string
/// might still match, or a UTF-8 character is incomplete).
#[derive(Clone, Debug)]
pub struct Piece {
    /// The token id.
    pub id: u32,
    /// Text released with this token.
    pub text: String,
    /// Log-probabilities, when asked for.
    pub probs: Option<TokenProbs>,
    /// The request's counts and times up to this token (llama-server's `timings_per_token`).
    pub so_far: Progress,
}

/// A running request's counts and times, as [`Finish`] gives them at its end.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Of them, those reused from a cache.
    pub n_cached: usize,
    /// Tokens generated so far.
    pub n_predicted: usize,
    /// Of them, those schemajump forced.
    pub n_forced: usize,
    /// Tokens drafted (by schemajump or the MTP block) so far.
    pub n_drafted: usize,
    /// Of those, the tokens sampling confirmed.
    pub n_accepted: usize,
    /// Milliseconds from the slot taking the request to its first token.
    pub prompt_ms: f64,
    /// Milliseconds since the first token.
    pub predicted_ms: f64,
}

/// How far a request's prompt has been evaluated (llama-server's `prompt_progress`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PromptProgress {
    /// Prompt tokens.
    pub total: usize,
    /// Of them, those reused from a cache.
    pub cache: usize,
    /// Of them, those in the slot's cache now (the reused ones included).
    pub processed: usize,
    /// Milliseconds since the slot took the request (0 in the report before the first pass).
    pub elapsed_ms: f64,
}

/// The end of a request, with its counts and timings.
#[derive(Clone, Debug)]
pub struct Finish {
    /// Why it ended.
    pub stop_type: StopType,
    /// The stop string that matched (empty otherwise).
    pub stopping_word: String,
    /// The slot that served it.
    pub id_slot: usize,
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Prompt tokens reused from the slot's cache.
    pub n_cached: usize,
    /// Tokens generated (the end-of-generation token included).
    pub n_predicted: usize,
    /// Of those, the tokens schemajump forced (the grammar admitted only them).
    pub n_forced: usize,
    /// Tokens drafted (by schemajump or the MTP block) and a pass evaluated (llama-server's
    /// `draft_n`).
    pub n_drafted: usize,
    /// Of those, the tokens sampling confirmed, generated without a pass of their own
    /// (llama-server's `draft_n_accepted`; counted in `n_predicted`, not in `n_forced`).
    pub n_accepted: usize,
    /// Time the request's grammar took (masks, re-sampling, advancing, drafting); none without
    /// a grammar.
    pub grammar_ms: Option<f64>,
    /// Time from the start of prompt processing to the first token.
    pub prompt_ms: f64,
    /// Time from the first token to the end.
    pub predicted_ms: f64,
    /// Generation stopped because the context was full.
    pub truncated: bool,
}

/// What kind of failure ended a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The request asked for what this server cannot give (a slot it does not have, a prompt
    /// over a slot's context).
    Invalid,
    /// The server is shutting down: the request was cut at the end of the drain.
    ShuttingDown,
    /// Something failed inside the server (a forward pass, a caught panic).
    Internal,
}

/// Why a request ended without finishing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The kind, for the status a front end answers with.
    pub kind: FailureKind,
    /// What happened.
    pub message: String,
}

impl Failure {
    /// A failure of `kind` saying `message`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The end of an embedding request: its pooled rows, with its counts.
#[derive(Clone, Debug)]
pub struct Embedded {
    /// One row per prompt token (pooling `none`) or one pooled row, `n_embd` values each, not
    /// normalized.
    pub rows: Vec<Vec<f32>>,
    /// The slot that served it.
    pub id_slot: usize,
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Time from the slot taking the request to its rows.
    pub prompt_ms: f64,
}

/// The end of a decision request: one score per option, with its counts.
#[derive(Clone, Debug)]
pub struct Decided {
    /// The head's scores, in the order of [`Decision::options`].
    pub scores: Vec<f32>,
    /// The slot that served it.
    pub id_slot: usize,
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Of them, those whose state and rows were reused from a cache.
    pub n_cached: usize,
    /// Requests the head scored in the same run (this one included).
    pub n_batched: usize,
    /// Time from the slot taking the request to its scores.
    pub prompt_ms: f64,
}

/// What the scheduler reports to a request.
#[derive(Clone, Debug)]
pub enum Event {
    /// A slot took the request.
    Started {
        /// The slot.
        id_slot: usize,
        /// Prompt tokens reused from its cache.
        n_cached: usize,
    },
    /// Part of the prompt was evaluated (only for requests with `return_progress`).
    PromptProgress(PromptProgress),
    /// A generated token.
    Token(Piece),
    /// The end.
    Done(Finish),
    /// The end of an embedding request ([`Job::embed`]).
    Embedded(Embedded),
    /// The end of a decision request ([`Job::decide`]).
    Decided(Decided),
    /// The request failed; the failure says why.
    Failed(Failure),
}
