//! One generated token of a request: drawn from its logits by the request's sampler (within its
//! grammar, or taken from its forced tokens), reported with its text once no stop string can
//! still claim it, and the request's end when a stop rule says so; then, with schemajump, the
//! tokens its grammar admits alone, taken without a pass each, and a draft of the text its
//! grammar fixes next, which the next pass evaluates and the following rows verify.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bloomery_text::Tokenizer;

use crate::reasoning_budget::ends_whole_char;
use crate::request::{Event, Failure, FailureKind, Finish, Piece, Progress, StopType, TokenProbs};
use crate::sampling::Sampler;
use crate::status::Counters;
use crate::task::Task;

/// Natural-log softmax of `logits`: the log-probability of `id` and the `n` best tokens (at most
/// the whole vocabulary, as llama-server caps it), in no particular order. One pass for the
/// softmax and one selection over `scratch` (the vocabulary's ids and logits, reused across the
/// request's tokens): linear in the vocabulary whatever `n`, so a request asking for every
/// token's probability costs the shared pass no more than its sampler does; ranking is left to
/// the request's own thread.
fn log_probs(logits: &[f32], id: u32, n: usize, scratch: &mut Vec<(u32, f32)>) -> TokenProbs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    let n = n.min(logits.len());
    scratch.clear();
    scratch.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
    if n > 0 && n < scratch.len() {
        scratch.select_nth_unstable_by(n - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    }
    TokenProbs {
        post_sampling: false,
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |l| l - lse),
        top: scratch[..n].iter().map(|&(i, l)| (i, l - lse)).collect(),
    }
}

/// The probabilities the sampler drew `id` from, as log-probabilities (llama-server's
/// `post_sampling_probs`): the `n` likeliest candidates the chain left.
fn drawn_probs(sampler: &Sampler, id: u32, n: usize) -> TokenProbs {
    let (p, top) = sampler.drawn_probs(id, n);
    TokenProbs {
        post_sampling: true,
        logprob: p.ln(),
        top: top.into_iter().map(|(t, p)| (t, p.ln())).collect(),
    }
}

/// Longest run of tokens schemajump forces after one sampled token (the scheduler splits a run
/// over passes when it does not fit one).
const MAX_FORCED_RUN: usize = 256;

/// Most tokens schemajump drafts after one sampled token.
const MAX_DRAFT: usize = 16;

/// What every token of one step reports against.
pub(crate) struct StepContext<'a, 't> {
    pub(crate) id_slot: usize,
    pub(crate) tok: &'t Tokenizer,
    /// Positions before this row's token that the slot's cache holds verified.
    pub(crate) n_cached: usize,
    pub(crate) n_ctx: usize,
    /// The context's end shifts the slot's cache rather than ending the request.
    pub(crate) context_shift: bool,
    pub(crate) counters: &'a Counters,
    pub(crate) schemajump: bool,
    /// Whether the model's state rewinds to any position, so refused drafted tokens can be
    /// dropped (false for per-sequence state: no drafts).
    pub(crate) drafts: bool,
}

/// What one output row did to its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Row {
    /// The token sampled from the row was the drafted one: already in the cache, and the next
    /// row verifies the next drafted token.
    Accepted,
    /// A token was sampled (no draft here, or the draft refused); the tokens the next pass
    /// evaluates are in `task.next`.
    Sampled,
    /// The request ended (its end is reported).
    Ended,
}

/// What the token at a row's position was drafted as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drafted {
    /// Nothing drafted there: the row's sample is the next token.
    No,
    /// A drafted token, kept when the row's sample equals it.
    Check(u32),
    /// A drafted token kept whatever the row's sample (a benchmark's synthetic acceptance).
    Take(u32),
}

/// Samples the next token of `task` from `row`, reports it, and says what that did. `drafted`
/// says what was drafted for this position: a sample equal to a checked draft is accepted, and
/// a taken draft is accepted whatever the sample. Otherwise the sample is followed by the tokens
/// schemajump forces after it and a draft of the text the grammar fixes next, in `task.next`
/// (`task.draft` of them drafted).
pub(crate) fn step(
    cx: &StepContext<'_, '_>,
    task: &mut Task<'_>,
    row: &[f32],
    drafted: Drafted,
) -> Row {
    let now = Instant::now();
    let first = *task.first_token.get_or_insert(now);
    if task.job.params.prompt_only {
        let done = finish(cx, task, first, now, StopType::Limit, String::new(), false);
        task.end = Some(Event::Done(Finish {
            n_predicted: 0,
            predicted_ms: 0.0,
            ..done
        }));
        return Row::Ended;
    }
    let forced = task.job.params.forced.get(task.generated).copied();
    // An exhausted reasoning budget leaves the row one token to draw, before the grammar and
    // the chain (llama.cpp applies it first).
    if let Some(b) = task.budget.as_mut() {
        b.take_control();
    }
    let masked = task.budget.as_ref().and_then(|b| b.mask(row));
    let row = masked.as_deref().unwrap_or(row);
    let chosen = match forced {
        Some(forced) => Ok(forced),
        None => match task.grammar.as_mut() {
            Some(g) => g.choose(row, &mut task.sampler),
            None => Ok(task.sampler.sample(row)),
        },
    };
    let id = match chosen {
        Ok(id) => id,
        Err(msg) => {
            task.end = Some(Event::Failed(Failure::new(FailureKind::Internal, msg)));
            return Row::Ended;
        }
    };
    // A taken draft replaces the row's sample, which is drawn all the same, and leaves the
    // grammar where it was (llama-server's synthetic acceptance).
    let (id, grammar) = match (forced, drafted) {
        (None, Drafted::Take(t)) => (t, false),
        _ => (id, true),
    };
    let n_probs = task.job.params.n_probs;
    let probs = (n_probs > 0).then(|| {
        if task.job.params.post_sampling_probs {
            drawn_probs(&task.sampler, id, n_probs)
        } else {
            log_probs(row, id, n_probs, &mut task.probs_scratch)
        }
    });
    task.next.clear();
    task.draft = 0;
    if emit(cx, task, id, probs, first, now, grammar) {
        return Row::Ended;
    }
    if matches!(drafted, Drafted::Check(t) | Drafted::Take(t) if t == id) {
        task.n_accepted += 1;
        cx.counters.draft_accepted.fetch_add(1, Ordering::Relaxed);
        return Row::Accepted;
    }
    task.next.push(id);
    if !cx.schemajump {
        return Row::Sampled;
    }
    // Log-probabilities need every token's logits, so a request that asks for them samples
    // each: no forced tokens (drafted ones get their rows).
    while task.job.params.n_probs == 0 && task.next.len() < MAX_FORCED_RUN {
        let Some(g) = task.grammar.as_mut() else {
            break;
        };
        // A forced reasoning end outranks what the grammar admits.
        if task.budget.as_ref().is_some_and(|b| b.forced().is_some()) {
            break;
        }
        let Some(t) = g.only() else { break };
        if cx.tok.is_eog(t) {
            break;
        }
        task.sampler.skip_draw();
        g.forced += 1;
        cx.counters.forced_tokens.fetch_add(1, Ordering::Relaxed);
        if emit(cx, task, t, None, first, now, true) {
            return Row::Ended;
        }
        task.next.push(t);
    }
    if cx.drafts && task.job.params.forced.is_empty() {
        // Rows past the request's last token or the context's end would be wasted (the
        // context's: refused).
        let left = task
            .job
            .params
            .n_predict
            .map_or(usize::MAX, |n| n.saturating_sub(task.generated + 1));
        let room = cx.n_ctx.saturating_sub(cx.n_cached + task.next.len() + 1);
        let max = MAX_DRAFT.min(left).min(room);
        if let Some(g) = task.grammar.as_mut() {
            let before = task.next.len();
            g.draft(cx.tok, max, &mut task.next);
            task.draft = task.next.len() - before;
        }
    }
    Row::Sampled
}

/// The request's end as a `Finish`.
fn finish(
    cx: &StepContext<'_, '_>,
    task: &Task<'_>,
    first: Instant,
    now: Instant,
    stop_type: StopType,
    stopping_word: String,
    truncated: bool,
) -> Finish {
    Finish {
        stop_type,
        stopping_word,
        id_slot: cx.id_slot,
        n_prompt: task.job.prompt.len(),
        n_cached: task.n_cached,
        n_predicted: task.generated,
        n_forced: task.grammar.as_ref().map_or(0, |g| g.forced),
        n_drafted: task.n_drafted,
        n_accepted: task.n_accepted,
        grammar_ms: task.grammar.as_ref().map(|g| g.spent.as_secs_f64() * 1e3),
        prompt_ms: (first - task.started).as_secs_f64() * 1e3,
        predicted_ms: (now - first).as_secs_f64() * 1e3,
        truncated: truncated || task.shifted,
    }
}

/// Takes token `id` into the request: the sampler's window, the grammar (when `grammar`), the
/// text and stop strings, the limits. True when the request ended (its end is reported).
fn emit(
    cx: &StepContext<'_, '_>,
    task: &mut Task<'_>,
    id: u32,
    probs: Option<TokenProbs>,
    first: Instant,
    now: Instant,
    grammar: bool,
) -> bool {
    task.sampler.accept(id);
    if let Some(b) = task.budget.as_mut() {
        b.accept(id, ends_whole_char(cx.tok.token_to_piece(id, false)));
    }
    if let Some(g) = task.grammar.as_mut().filter(|_| grammar) {
        if let Err(msg) = g.accept(id, cx.tok) {
            task.end = Some(Event::Failed(Failure::new(FailureKind::Internal, msg)));
            return true;
        }
    }
    task.generated += 1;
    cx.counters.predicted_tokens.fetch_add(1, Ordering::Relaxed);
    let send = |task: &Task<'_>, e: Event| task.job.events.send(e).is_ok();
    let so_far = |task: &Task<'_>| Progress {
        n_prompt: task.job.prompt.len(),
        n_cached: task.n_cached,
        n_predicted: task.generated,
        n_forced: task.grammar.as_ref().map_or(0, |g| g.forced),
        n_drafted: task.n_drafted,
        n_accepted: task.n_accepted,
        prompt_ms: (first - task.started).as_secs_f64() * 1e3,
        predicted_ms: (now - first).as_secs_f64() * 1e3,
    };
    // The end of a request: what the stop-string matcher and the decoder still hold (after an
    // end-of-generation token, which sends no text of its own, as that token's piece), then Done.
    let end = |task: &mut Task<'_>, stop_type: StopType, truncated: bool| {
        let tail = task.stop.flush(&task.decoder.flush());
        if !tail.is_empty() {
            send(
                task,
                Event::Token(Piece {
                    id,
                    text: tail,
                    probs: None,
                    so_far: so_far(task),
                }),
            );
        }
        let done = finish(cx, task, first, now, stop_type, String::new(), truncated);
        task.end = Some(Event::Done(done));
        true
    };
    if cx.tok.is_eog(id) && !task.job.params.ignore_eos {
        return end(task, StopType::Eos, false);
    }
    let mut text = String::new();
    task.decoder.push_to(id, &mut text);
    let (released, matched) = task.stop.push(&text);
    if let Some(word) = matched {
        if !released.is_empty() {
            send(
                task,
                Event::Token(Piece {
                    id,
                    text: released,
                    probs,
                    so_far: so_far(task),
                }),
            );
        }
        let done = finish(cx, task, first, now, StopType::Word, word, false);
        task.end = Some(Event::Done(done));
        return true;
    }
    let has_newline = released.contains('\n');
    // llama-server's time limit: checked on a token whose sent text holds a newline.
    let out_of_time = task
        .job
        .params
        .t_max_predict_ms
        .is_some_and(|ms| has_newline && (now - first).as_secs_f64() * 1e3 > ms as f64);
    let at_limit = out_of_time
        || task
            .job
            .params
            .n_predict
            .is_some_and(|n| task.generated >= n);
    // Tokens taken but not yet in the cache occupy positions too. With context shift the
    // scheduler makes room before the next pass instead.
    let ctx_full = !cx.context_shift && cx.n_cached + task.next.len() + 1 >= cx.n_ctx;
    let last = at_limit || ctx_full;
    // The last token carries what the stop-string matcher and the decoder still hold, so the
    // request's tokens are each sent once.
    let mut text = released;
    if last {
        text.push_str(&task.stop.flush(&task.decoder.flush()));
    }
    if !send(
        task,
        Event::Token(Piece {
            id,
            text,
            probs,
            so_far: so_far(task),
        }),
    ) {
        return true;
    }
    if last {
        return end(task, StopType::Limit, ctx_full && !at_limit);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probs_select_the_best_tokens_and_cap_at_the_vocabulary() {
        let logits = [0.5f32, 3.0, -1.0, 3.0, 2.0];
        let mut scratch = Vec::new();
        let p = log_probs(&logits, 4, 3, &mut scratch);
        let lse = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln() as f32;
        assert!((p.logprob - (2.0 - lse)).abs() < 1e-5);
        let ids: Vec<u32> = p.ranked().iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 4]);
        // Asking for more than the vocabulary (2^62 here) gives the whole vocabulary, ranked.
        let all = log_probs(&logits, 0, 1 << 62, &mut scratch);
        let ids: Vec<u32> = all.ranked().iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 4, 0, 2]);
    }
}
