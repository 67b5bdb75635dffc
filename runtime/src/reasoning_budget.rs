//! The reasoning budget (llama-server's `--reasoning-budget N`, `reasoning_budget_tokens`): a
//! count of the tokens written inside a thinking span, and once it runs out, the span's end
//! (after an optional message) forced token by token, every other token's logit set to minus
//! infinity before the sampler chain sees the row. The states are llama.cpp b11434's
//! (`common/reasoning-budget.h`): idle until a start sequence, counting, waiting for a token that
//! ends on a whole UTF-8 character, forcing, done (a later start sequence re-arms it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A request's switch that ends its thinking span now (llama-server's `reasoning_control` and
/// `POST /v1/chat/completions/control` `reasoning_end`): set from outside, taken by the budget
/// at the request's next token, where it forces the span's end if the budget is counting one
/// (`common_reasoning_budget_force`: any other state leaves the budget as it is).
#[derive(Clone, Debug, Default)]
pub struct EndSwitch(Arc<AtomicBool>);

impl EndSwitch {
    /// A switch not set.
    pub fn new() -> EndSwitch {
        EndSwitch::default()
    }

    /// Asks for the span's end at the next token.
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether it was set since the last take; clears it.
    fn take(&self) -> bool {
        self.0.swap(false, Ordering::AcqRel)
    }
}

impl PartialEq for EndSwitch {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for EndSwitch {}

/// What a request's budget is made of (token sequences from the model's tokenizer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetSpec {
    /// Tokens allowed inside a thinking span (`u32::MAX`: unlimited, the span only tracked).
    pub budget: u32,
    /// The sequence that opens a thinking span (`<think>`).
    pub start: Vec<u32>,
    /// The sequences that close one (`</think>`); the span's natural end.
    pub ends: Vec<Vec<u32>>,
    /// What is forced once the budget runs out: the message, if any, then the first end.
    pub forced: Vec<u32>,
    /// The prompt tokens the template wrote for the reply before the model's first token (its
    /// opening `<think>` among them, when it opens the span itself): taken in first, so the
    /// count starts inside a span the prompt opened.
    pub prefill: Vec<u32>,
    /// The request's switch that ends a span now, with `reasoning_control`.
    pub control: Option<EndSwitch>,
}

/// Where a budget is (llama.cpp's `common_reasoning_budget_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetState {
    /// Outside any span, watching for a start sequence.
    Idle,
    /// Inside a span, counting its tokens down.
    Counting,
    /// Out of budget, waiting for a token that ends on a whole UTF-8 character.
    WaitingUtf8,
    /// Forcing the end (`forced[pos]` next).
    Forcing,
    /// The span ended; a new start sequence re-arms the budget.
    Done,
}

/// Token sequences matched as they arrive: the longest one ending at the newest token, after
/// which matching starts afresh (so matches never overlap).
#[derive(Clone, Debug)]
struct Matcher {
    seqs: Vec<Vec<u32>>,
    /// The tokens since the last match or reset (at most the longest sequence).
    seen: Vec<u32>,
}

impl Matcher {
    fn new(seqs: impl IntoIterator<Item = Vec<u32>>) -> Self {
        let mut uniq: Vec<Vec<u32>> = Vec::new();
        for s in seqs {
            if !s.is_empty() && !uniq.contains(&s) {
                uniq.push(s);
            }
        }
        Matcher {
            seqs: uniq,
            seen: Vec::new(),
        }
    }

    /// Takes `token`; the index of the longest sequence it completes, if any.
    fn advance(&mut self, token: u32) -> Option<usize> {
        let longest = self.seqs.iter().map(Vec::len).max().unwrap_or(0);
        if longest == 0 {
            return None;
        }
        self.seen.push(token);
        if self.seen.len() > longest {
            self.seen.remove(0);
        }
        let hit = (0..self.seqs.len())
            .filter(|&i| self.seen.ends_with(&self.seqs[i]))
            .max_by_key(|&i| self.seqs[i].len());
        if hit.is_some() {
            self.seen.clear();
        }
        hit
    }

    fn reset(&mut self) {
        self.seen.clear();
    }
}

/// A request's budget as generation goes.
#[derive(Clone, Debug)]
pub struct Budget {
    budget: u32,
    start: Matcher,
    end: Matcher,
    forced: Vec<u32>,
    state: BudgetState,
    remaining: u32,
    pos: usize,
    control: Option<EndSwitch>,
}

impl Budget {
    /// A budget at the start of a reply, the template's `prefill` already taken in (each of
    /// them a whole character, as llama.cpp takes them).
    pub fn new(spec: &BudgetSpec) -> Self {
        let mut b = Budget {
            budget: spec.budget,
            start: Matcher::new([spec.start.clone()]),
            end: Matcher::new(spec.ends.iter().cloned()),
            forced: spec.forced.clone(),
            state: BudgetState::Idle,
            remaining: spec.budget,
            pos: 0,
            control: spec.control.clone(),
        };
        for &t in &spec.prefill {
            b.accept(t, true);
        }
        b
    }

    /// Takes the request's [`EndSwitch`]: set, it forces the span's end now if the budget is
    /// counting one (otherwise the request is dropped, as llama.cpp's manual transition).
    pub fn take_control(&mut self) {
        if self.control.as_ref().is_some_and(EndSwitch::take) && self.state == BudgetState::Counting
        {
            self.force();
        }
    }

    /// Where the budget is.
    pub fn state(&self) -> BudgetState {
        self.state
    }

    /// The token the next row must produce, while the end is being forced.
    pub fn forced(&self) -> Option<u32> {
        match self.state {
            BudgetState::Forcing => self.forced.get(self.pos).copied(),
            _ => None,
        }
    }

    fn open(&mut self) {
        self.remaining = self.budget;
        if self.remaining == 0 {
            self.force();
        } else {
            self.state = BudgetState::Counting;
        }
    }

    fn force(&mut self) {
        self.state = BudgetState::Forcing;
        self.pos = 0;
        self.end.reset();
    }

    /// Takes the generated token `token`; `whole_char`: its text ends on a whole UTF-8
    /// character ([`ends_whole_char`]).
    pub fn accept(&mut self, token: u32, whole_char: bool) {
        match self.state {
            BudgetState::Idle => {
                if self.start.advance(token).is_some() {
                    self.open();
                }
            }
            BudgetState::Counting | BudgetState::WaitingUtf8 => {
                if self.end.advance(token).is_some() {
                    self.state = BudgetState::Done;
                } else if self.state == BudgetState::WaitingUtf8 {
                    if whole_char {
                        self.force();
                    }
                } else {
                    self.remaining = self.remaining.saturating_sub(1);
                    if self.remaining == 0 {
                        if whole_char {
                            self.force();
                        } else {
                            self.state = BudgetState::WaitingUtf8;
                            self.end.reset();
                        }
                    }
                }
            }
            BudgetState::Forcing => {
                self.end.advance(token);
                self.pos += 1;
                if self.pos >= self.forced.len() {
                    self.state = BudgetState::Done;
                }
            }
            BudgetState::Done => {
                if self.start.advance(token).is_some() {
                    self.end.reset();
                    self.open();
                }
            }
        }
    }

    /// `row` with every logit but the forced token's at minus infinity, while forcing (`None`
    /// otherwise: the row stands).
    pub fn mask(&self, row: &[f32]) -> Option<Vec<f32>> {
        let t = self.forced()? as usize;
        let mut out = vec![f32::NEG_INFINITY; row.len()];
        if let (Some(o), Some(&l)) = (out.get_mut(t), row.get(t)) {
            *o = l;
        }
        Some(out)
    }
}

/// Whether `piece` ends on a whole UTF-8 character, judged from its own bytes as llama.cpp's
/// `common_utf8_is_complete` judges it (an empty piece does).
pub fn ends_whole_char(piece: &[u8]) -> bool {
    if piece.is_empty() {
        return true;
    }
    for i in 1..=piece.len().min(4) {
        let c = piece[piece.len() - i];
        if c & 0xC0 != 0x80 {
            let expected = match c {
                0xF0.. => 4,
                0xE0.. => 3,
                0xC0.. => 2,
                _ => 1,
            };
            return i >= expected;
        }
    }
    false
}
