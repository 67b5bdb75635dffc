//! A request while it runs in a slot: its progress through the prompt, its sampler, decoder and
//! stop-string matcher, and its clock.

use std::time::Instant;

use bloomery_text::StreamDecoder;

use crate::grammar::Constraint;
use crate::reasoning_budget::Budget;
use crate::request::Job;
use crate::sampling::rng::Mt19937;
use crate::sampling::Sampler;
use crate::stop::StopScan;

/// A request running in a slot.
pub(crate) struct Task<'t> {
    pub(crate) job: Job,
    /// Prompt tokens whose K/V are in the cache.
    pub(crate) n_past: usize,
    pub(crate) n_cached: usize,
    pub(crate) sampler: Sampler,
    pub(crate) decoder: StreamDecoder<'t>,
    pub(crate) stop: StopScan,
    pub(crate) generated: usize,
    /// The generated tokens whose K/V the next passes write (the sampled token, any tokens
    /// schemajump forced after it and its draft); empty while the prompt is evaluated.
    pub(crate) next: Vec<u32>,
    /// How many tokens at the end of `next` were drafted (by schemajump or the MTP block), to
    /// be verified by sampling.
    pub(crate) draft: usize,
    /// Drafted tokens a pass evaluated so far (schemajump's or the MTP block's; llama-server's
    /// `draft_n`).
    pub(crate) n_drafted: usize,
    /// Of them, those the target's own choice confirmed (`draft_n_accepted`).
    pub(crate) n_accepted: usize,
    /// Which drafter drafted the drafted tokens in `next` (its place in the scheduler's chain,
    /// [`crate::drafter::Drafters`]); None where they are schemajump's, or none.
    pub(crate) spec_by: Option<usize>,
    /// With synthetic acceptance (`--spec-synth-len`), its draws, seeded with the request's
    /// seed as llama-server seeds them.
    pub(crate) synth_rng: Option<Mt19937>,
    /// The request's grammar, if it has one.
    pub(crate) grammar: Option<Constraint>,
    /// The request's reasoning budget, if it has one.
    pub(crate) budget: Option<Budget>,
    pub(crate) started: Instant,
    pub(crate) first_token: Option<Instant>,
    /// The vocabulary's ids and logits, reused to select each token's most likely
    /// alternatives (empty unless the request asks for probabilities).
    pub(crate) probs_scratch: Vec<(u32, f32)>,
    /// The final-norm rows an embedding request has read so far, in prompt order (`n_embd`
    /// values each; empty for a generation).
    pub(crate) rows: Vec<f32>,
    /// A context shift dropped part of what the slot held (the answer says `truncated`).
    pub(crate) shifted: bool,
    /// The event that ends the request (`Done`, `Failed`, `Embedded`, `Decided`), sent only
    /// once its slot is free and `/slots` and `/metrics` show it free (a client that reads
    /// `/metrics` right after its answer must not see its request still running).
    pub(crate) end: Option<crate::request::Event>,
}
