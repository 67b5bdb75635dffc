//! One generated token of a request: drawn from its logits by the request's sampler (or taken
//! from its forced tokens), reported with its text once no stop string can still claim it, and
//! the request's end when a stop rule says so.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bloomery_text::Tokenizer;

use crate::request::{Event, Finish, Piece, StopType, TokenProbs};
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
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |l| l - lse),
        top: scratch[..n].iter().map(|&(i, l)| (i, l - lse)).collect(),
    }
}

/// Samples the next token of `task` from `row`, reports it, and says whether the request ended.
pub(crate) fn step(
    id_slot: usize,
    task: &mut Task<'_>,
    row: &[f32],
    tok: &Tokenizer,
    n_cached: usize,
    n_ctx: usize,
    c: &Counters,
) -> bool {
    let now = Instant::now();
    let first = *task.first_token.get_or_insert(now);
    if task.job.params.prompt_only {
        let done = Finish {
            stop_type: StopType::Limit,
            stopping_word: String::new(),
            id_slot,
            n_prompt: task.job.prompt.len(),
            n_cached: task.n_cached,
            n_predicted: 0,
            prompt_ms: (first - task.started).as_secs_f64() * 1e3,
            predicted_ms: 0.0,
            truncated: false,
        };
        let _ = task.job.events.send(Event::Done(done));
        return true;
    }
    let id = match task.job.params.forced.get(task.generated) {
        Some(&forced) => forced,
        None => task.sampler.sample(row),
    };
    task.sampler.accept(id);
    task.generated += 1;
    c.predicted_tokens.fetch_add(1, Ordering::Relaxed);
    let n_probs = task.job.params.n_probs;
    let probs = (n_probs > 0).then(|| log_probs(row, id, n_probs, &mut task.probs_scratch));
    let finish = |task: &Task<'_>, stop_type: StopType, word: String, truncated: bool| Finish {
        stop_type,
        stopping_word: word,
        id_slot,
        n_prompt: task.job.prompt.len(),
        n_cached: task.n_cached,
        n_predicted: task.generated,
        prompt_ms: (first - task.started).as_secs_f64() * 1e3,
        predicted_ms: (now - first).as_secs_f64() * 1e3,
        truncated,
    };
    let send = |task: &Task<'_>, e: Event| task.job.events.send(e).is_ok();
    // The end of a request: what the stop-string matcher and the decoder still hold, then Done.
    let end = |task: &mut Task<'_>, stop_type: StopType, truncated: bool| {
        let tail = task.stop.flush(&task.decoder.flush());
        if !tail.is_empty() {
            send(
                task,
                Event::Token(Piece {
                    id,
                    text: tail,
                    probs: None,
                }),
            );
        }
        send(
            task,
            Event::Done(finish(task, stop_type, String::new(), truncated)),
        );
        true
    };
    if tok.is_eog(id) && !task.job.params.ignore_eos {
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
                }),
            );
        }
        send(task, Event::Done(finish(task, StopType::Word, word, false)));
        return true;
    }
    if !send(
        task,
        Event::Token(Piece {
            id,
            text: released,
            probs,
        }),
    ) {
        return true;
    }
    let at_limit = task
        .job
        .params
        .n_predict
        .is_some_and(|n| task.generated >= n);
    let ctx_full = n_cached + 1 >= n_ctx;
    if at_limit || ctx_full {
        return end(task, StopType::Limit, ctx_full && !at_limit);
    }
    task.next = Some(id);
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
