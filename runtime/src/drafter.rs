//! What drafts in a scheduler: the model's MTP block, a separate draft model, or a source of
//! drafts (token history, tests), after any n-gram drafters consulted first, as llama-server
//! b11434 chains the types of one `--spec-type` list (common/speculative.cpp
//! `common_speculative_draft` and `common_speculative_accept`): each step the drafters are
//! consulted in order, the first non-empty draft drafts the step, and only its drafter hears how
//! much of it was kept. The MTP block takes in every pass's kept rows whichever drafted, so its
//! next draft pairs with the right row.

use crate::draft_model::ModelDrafter;
use crate::spec::{DraftSource, MtpDrafter, SpecType, Want};

/// What drafts when no drafter consulted before it does.
pub(crate) enum Drafter {
    /// The model's MTP block.
    Mtp(MtpDrafter),
    /// A source from outside.
    Source(Box<dyn DraftSource>),
    /// A separate draft model.
    Model(ModelDrafter),
}

/// The drafters of a scheduler, in the order they are consulted.
pub(crate) struct Drafters {
    /// The n-gram drafters consulted first ([`crate::spec::SpecConfig::first`]), each with its
    /// type.
    pub(crate) first: Vec<(SpecType, Box<dyn DraftSource>)>,
    /// What drafts when none of them does.
    pub(crate) last: Drafter,
    /// The type `last` drafts as (a test source: the configured type).
    pub(crate) last_type: SpecType,
}

/// A draft and the place of its drafter in the chain ([`Drafters::first`]'s length: the last).
pub(crate) type Drafted = (usize, Vec<u32>);

impl Drafters {
    /// Whether target passes read their rows' final-norm rows for the MTP block (a slot whose
    /// gate has drafting off only before its probes).
    pub(crate) fn reads_rows(&self) -> bool {
        matches!(self.last, Drafter::Mtp(_))
    }

    /// Slot `slot` begins generating after `prompt`; `fresh`: none of its cache was reused
    /// (the MTP block's carried row and put-off rows are forgotten).
    pub(crate) fn begin(&mut self, slot: usize, prompt: &[u32], fresh: bool) {
        for (_, src) in &mut self.first {
            src.begin(slot, prompt);
        }
        match &mut self.last {
            Drafter::Mtp(m) if fresh => m.reset(slot),
            Drafter::Source(src) => src.begin(slot, prompt),
            _ => {}
        }
    }

    /// The drafts of the drafters consulted first, in the order of `wants`: for each, the first
    /// non-empty draft of at most `cap(type)` and the want's room, or None where none drafts.
    /// `tokens` gives what a want's slot holds and the token just sampled after it; `open(w,
    /// k)` whether the drafter at place `k` may draft for want `w` (its gate).
    pub(crate) fn draft_first(
        &mut self,
        wants: &[Want],
        tokens: impl Fn(&Want) -> Vec<u32>,
        cap: impl Fn(SpecType) -> usize,
        open: impl Fn(&Want, usize) -> bool,
    ) -> Vec<Option<Drafted>> {
        let mut out: Vec<Option<Drafted>> = vec![None; wants.len()];
        if self.first.is_empty() {
            return out;
        }
        let held: Vec<Vec<u32>> = wants.iter().map(&tokens).collect();
        for (k, (t, src)) in self.first.iter_mut().enumerate() {
            let max = cap(*t);
            for ((w, held), d) in wants.iter().zip(&held).zip(&mut out) {
                if d.is_some() || !open(w, k) {
                    continue;
                }
                let mut draft = src.draft(w.slot, held, max.min(w.max));
                draft.truncate(w.max);
                if !draft.is_empty() {
                    *d = Some((k, draft));
                }
            }
        }
        out
    }

    /// The type of the drafter at place `by` of the chain.
    pub(crate) fn type_at(&self, by: usize) -> SpecType {
        self.first.get(by).map_or(self.last_type, |(t, _)| *t)
    }

    /// The target kept `accepted` tokens of slot `slot`'s last draft, drafted by the drafter at
    /// place `by` of the chain: only that drafter hears it (the others' `accept` with
    /// `is_other` in b11434 changes nothing of theirs, and the MTP block takes in the kept
    /// rows of every pass).
    pub(crate) fn accepted(&mut self, slot: usize, by: usize, accepted: usize) {
        match self.first.get_mut(by) {
            Some((_, src)) => src.accepted(slot, accepted),
            None => {
                if let Drafter::Source(src) = &mut self.last {
                    src.accepted(slot, accepted);
                }
            }
        }
    }
}
