//! Handing a prompt to the scheduler and reading back what it generates, plus the pieces every
//! route's answer shares: `timings`, per-token probabilities and server-sent-event frames.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bloomery_text::Tokenizer;
use bytes::Bytes;
use futures_util::Stream;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::offload::heavy;
use super::params::Fields;
pub use super::request_log::Events;
use super::Ready;
use bloomery_runtime::embedding::Pooling;
use bloomery_runtime::request::{
    Decision, Event, Finish, GenParams, Job, Piece, Progress, PromptProgress, Request,
};

/// Queues a generation; the receiver yields its events (dropping it cancels the request) and
/// counts its end in the request's log line.
pub fn submit(
    ready: &Ready,
    prompt: Vec<u32>,
    params: GenParams,
    id_slot: Option<usize>,
) -> Result<Events, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty"));
    }
    if prompt.len() >= ready.n_ctx_slot {
        return Err(ApiError::exceeds_context(prompt.len(), ready.n_ctx_slot));
    }
    queue(ready, prompt, params, id_slot, None)
}

/// Queues a job as it is (a generation, or an embedding with `embed`); the receiver yields its
/// events and counts its end in the request's log line.
pub fn queue(
    ready: &Ready,
    prompt: Vec<u32>,
    params: GenParams,
    id_slot: Option<usize>,
    embed: Option<Pooling>,
) -> Result<Events, ApiError> {
    let (job, rx) = job(prompt, params, id_slot, embed, None);
    try_send(ready, job, rx)
}

/// Queues a decision (its prompt and layout); the receiver yields its events, the last of them
/// `Event::Decided` or `Event::Failed`, and counts its end in the request's log line.
pub fn queue_decision(
    ready: &Ready,
    prompt: Vec<u32>,
    decision: Decision,
) -> Result<Events, ApiError> {
    let params = GenParams::decision();
    let (job, rx) = job(prompt, params, None, None, Some(Box::new(decision)));
    try_send(ready, job, rx)
}

/// Queues `job` unless the queue is full (503); `rx` becomes its events.
fn try_send(
    ready: &Ready,
    job: Request,
    rx: mpsc::UnboundedReceiver<Event>,
) -> Result<Events, ApiError> {
    ready.jobs.try_send(job).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => ApiError::unavailable(
            "the server is busy: every slot is in use and the queue is full; retry later",
        ),
        mpsc::error::TrySendError::Closed(_) => ApiError::internal("the scheduler has stopped"),
    })?;
    Ok(Events::new(rx))
}

/// As [`queue`], waiting for room while the queue is full instead of answering 503: for the
/// later inputs of a request whose first one was queued (an embedding request may hold more
/// inputs than the queue).
pub async fn queue_waiting(
    ready: &Ready,
    prompt: Vec<u32>,
    params: GenParams,
    embed: Option<Pooling>,
) -> Result<Events, ApiError> {
    let (job, rx) = job(prompt, params, None, embed, None);
    ready
        .jobs
        .send(job)
        .await
        .map_err(|_| ApiError::internal("the scheduler has stopped"))?;
    Ok(Events::new(rx))
}

/// A job for the scheduler and the receiver of its events.
fn job(
    prompt: Vec<u32>,
    params: GenParams,
    id_slot: Option<usize>,
    embed: Option<Pooling>,
    decide: Option<Box<Decision>>,
) -> (Request, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt,
        params,
        id_slot,
        embed,
        decide,
        events: tx,
    };
    (Request::Generate(Box::new(job)), rx)
}

/// How many completions of each prompt a request asks for: `n_cmpl`, or OpenAI's `n` when it is
/// absent, from 1 to the slot count as llama-server holds it.
pub fn n_cmpl(f: &Fields<'_>, n_slots: usize) -> Result<usize, ApiError> {
    let max = n_slots.max(1) as i64;
    let n = match f.int_in("n_cmpl", 1, max)? {
        Some(n) => n,
        None => f.int_in("n", 1, max)?.unwrap_or(1),
    };
    Ok(n as usize)
}

/// Queues `n` completions of one prompt: the first on the slot asked for with the request's
/// seed, each further one on any slot with the seed plus its number (llama-server's child
/// tasks).
pub fn submit_n(
    ready: &Ready,
    prompt: &[u32],
    params: &GenParams,
    id_slot: Option<usize>,
    n: usize,
) -> Result<Vec<Events>, ApiError> {
    (0..n)
        .map(|j| {
            let mut p = params.clone();
            p.sampler.seed = p.sampler.seed.wrapping_add(j as u64);
            submit(ready, prompt.to_vec(), p, id_slot.filter(|_| j == 0))
        })
        .collect()
}

/// What a generation answered with an embedding's or a decision's end is told (the scheduler
/// sends `Event::Embedded` and `Event::Decided` to those requests only).
pub fn not_a_generation() -> ApiError {
    ApiError::internal("the scheduler answered a generation with an embedding or a decision")
}

/// Ends a stream that received an embedding's or a decision's end with an error frame (see
/// [`not_a_generation`]); true: the stream is over.
pub fn stream_not_a_generation(out: &mut Vec<u8>) -> bool {
    out.extend_from_slice(&sse_data(&not_a_generation().body()));
    true
}

/// Everything a finished generation produced.
pub struct Outcome {
    /// The text (stop strings removed).
    pub text: String,
    /// Each generated token.
    pub pieces: Vec<Piece>,
    /// Counts, timings and why it stopped.
    pub finish: Finish,
}

/// Waits for the end of a generation.
pub async fn collect(mut rx: Events) -> Result<Outcome, ApiError> {
    let mut text = String::new();
    let mut pieces = Vec::new();
    while let Some(e) = rx.recv().await {
        match e {
            Event::Started { .. } | Event::PromptProgress(_) => {}
            Event::Token(p) => {
                text.push_str(&p.text);
                pieces.push(p);
            }
            Event::Done(finish) => {
                return Ok(Outcome {
                    text,
                    pieces,
                    finish,
                })
            }
            Event::Failed(failure) => return Err(ApiError::from(failure)),
            Event::Embedded(_) | Event::Decided(_) => return Err(not_a_generation()),
        }
    }
    Err(ApiError::internal("the scheduler dropped the request"))
}

/// Every completion of a request with several (`n_cmpl`/`n`), in order; never empty, so the first,
/// whose `usage` and `timings` llama-server reports for the whole request, is always there.
pub async fn collect_all(
    receivers: impl IntoIterator<Item = Events>,
) -> Result<Vec<Outcome>, ApiError> {
    let mut outs = Vec::new();
    for rx in receivers {
        outs.push(collect(rx).await?);
    }
    if outs.is_empty() {
        return Err(ApiError::internal("no completion queued"));
    }
    Ok(outs)
}

/// llama-server's `timings` object of a finished request.
pub fn timings(f: &Finish) -> Value {
    let mut t = progress_timings(&Progress {
        n_prompt: f.n_prompt,
        n_cached: f.n_cached,
        n_predicted: f.n_predicted,
        n_forced: f.n_forced,
        n_drafted: f.n_drafted,
        n_accepted: f.n_accepted,
        prompt_ms: f.prompt_ms,
        predicted_ms: f.predicted_ms,
    });
    // Not llama-server's: the time the grammar took (masks, re-sampling, advancing, drafting),
    // given only when the request had one.
    if let Some(ms) = f.grammar_ms {
        t["grammar_ms"] = json!(ms);
    }
    t
}

/// llama-server's `timings` object of a request so far (a token's, for `timings_per_token`).
pub fn progress_timings(f: &Progress) -> Value {
    let n_prompt = f.n_prompt - f.n_cached;
    let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let rate = |ms: f64, n: usize| {
        if ms > 0.0 && n > 0 {
            1e3 * n as f64 / ms
        } else {
            0.0
        }
    };
    // As llama-server: the first token comes from the prompt's last pass, so the generation
    // rate is over the decode steps after it.
    let steps = f.n_predicted.saturating_sub(1);
    let mut t = json!({
        "cache_n": f.n_cached,
        "prompt_n": n_prompt,
        "prompt_ms": f.prompt_ms,
        "prompt_per_token_ms": per(f.prompt_ms, n_prompt),
        "prompt_per_second": rate(f.prompt_ms, n_prompt),
        "predicted_n": f.n_predicted,
        "predicted_ms": f.predicted_ms,
        "predicted_per_token_ms": per(f.predicted_ms, steps),
        "predicted_per_second": rate(f.predicted_ms, steps),
        // Of predicted_n, the tokens schemajump forced (the grammar admitted only them).
        "forced_n": f.n_forced,
    });
    // Schemajump's drafts, under llama-server's names for a speculative draft's counts (which
    // it too gives only when something was drafted).
    if f.n_drafted > 0 {
        t["draft_n"] = json!(f.n_drafted);
        t["draft_n_accepted"] = json!(f.n_accepted);
    }
    t
}

/// llama-server's `prompt_progress` object.
pub fn prompt_progress(p: &PromptProgress) -> Value {
    json!({
        "total": p.total,
        "cache": p.cache,
        "processed": p.processed,
        "time_ms": p.elapsed_ms as i64,
    })
}

/// The `timings` object of a progress report (with `timings_per_token`): the prompt so far,
/// nothing generated.
pub fn prompt_progress_timings(p: &PromptProgress) -> Value {
    progress_timings(&Progress {
        n_prompt: p.processed,
        n_cached: p.cache,
        prompt_ms: p.elapsed_ms,
        ..Progress::default()
    })
}

/// A token's text and bytes as llama-server reports them: a special token's text only with
/// `special` (`--special`; its `populate_token_probs`).
fn token_json(tok: &Tokenizer, id: u32, special: bool) -> (String, Vec<u8>) {
    let bytes = tok.token_to_piece(id, special).to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Alternatives past which a probability table is built off the async runtime's workers.
const LARGE_TABLE: usize = 1024;

/// One entry per piece that carries probabilities: the token, its bytes and logprob, and its
/// `top_logprobs`, best first; the shape both the native and the OpenAI APIs use. With
/// `post_sampling_probs` the values are probabilities, under `prob` and `top_probs`, as
/// llama-server names them. A large table (a request may ask for the whole vocabulary) is built
/// without holding up other requests.
fn prob_entries(tok: &Tokenizer, special: bool, pieces: &[Piece]) -> Vec<Value> {
    let build = || {
        pieces
            .iter()
            .filter_map(|p| {
                let pr = p.probs.as_ref()?;
                let (value, top_key) = if pr.post_sampling {
                    ("prob", "top_probs")
                } else {
                    ("logprob", "top_logprobs")
                };
                let shown = |lp: f32| if pr.post_sampling { lp.exp() } else { lp };
                let (text, bytes) = token_json(tok, p.id, special);
                let top: Vec<Value> = pr
                    .ranked()
                    .into_iter()
                    .map(|(id, lp)| {
                        let (t, b) = token_json(tok, id, special);
                        json!({"id": id, "token": t, "bytes": b, value: shown(lp)})
                    })
                    .collect();
                Some(json!({"id": p.id, "token": text, "bytes": bytes, value: shown(pr.logprob), top_key: top}))
            })
            .collect()
    };
    let size: usize = pieces
        .iter()
        .filter_map(|p| p.probs.as_ref())
        .map(|pr| pr.top.len())
        .sum();
    if size > LARGE_TABLE {
        heavy(build)
    } else {
        build()
    }
}

/// `completion_probabilities` entries of the native API (`special`: `--special`).
pub fn native_probs(tok: &Tokenizer, special: bool, pieces: &[Piece]) -> Value {
    Value::Array(prob_entries(tok, special, pieces))
}

/// OpenAI `logprobs.content` entries (`special`: `--special`).
pub fn openai_logprobs(tok: &Tokenizer, special: bool, pieces: &[Piece]) -> Value {
    json!({ "content": prob_entries(tok, special, pieces) })
}

/// One `data: {json}` frame.
pub fn sse_data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// One `event: NAME` + `data: {json}` frame (Anthropic's stream).
pub fn sse_event(name: &str, v: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

/// A streamed response of SSE frames.
fn sse_response<S>(frames: S) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    use futures_util::StreamExt;
    let body = Body::from_stream(frames.map(Ok::<_, Infallible>));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// An SSE answer driven by a request's events: `prelude` goes out with the first frame, then
/// `on_event` appends each event's frames to the pending bytes and says whether the stream ends
/// (after `Done` or `Failed`). Events that add nothing are folded into the next frame; a closed
/// channel ends the stream after whatever is pending.
pub fn event_stream<S, F>(
    rx: Events,
    ping: Option<Duration>,
    state: S,
    prelude: Vec<u8>,
    mut on_event: F,
) -> Response
where
    S: Send + 'static,
    F: FnMut(&mut S, Event, &mut Vec<u8>) -> bool + Send + 'static,
{
    event_streams(
        vec![rx],
        ping,
        state,
        prelude,
        b"",
        move |st, _, ev, out| on_event(st, ev, out),
    )
}

/// The keep-alive of a streamed answer, as llama-server b11434 sends it: a comment frame (`:`)
/// after this long without a frame (`sse_ping_interval` seconds, else `--sse-ping-interval`'s;
/// 0 or -1: none). Read (and checked) for every request, streamed or not.
pub fn sse_ping(f: &Fields<'_>, ready: &Ready) -> Result<Option<Duration>, ApiError> {
    let secs = f
        .int_in("sse_ping_interval", -1, i64::from(i32::MAX))?
        .unwrap_or(ready.defaults.sse_ping_interval);
    Ok(u64::try_from(secs)
        .ok()
        .filter(|&s| s > 0)
        .map(Duration::from_secs))
}

/// An SSE answer driven by the events of several completions of one request (`n_cmpl`/`n`),
/// interleaved as they come, as llama-server streams its child tasks: `on_event` gets each
/// event with its completion's index, appends its frames and says whether that completion
/// ended. The stream ends once every completion has ended, with `epilogue` after the last
/// frame (OpenAI's `[DONE]`), or at the first `Failed` (its frames, no epilogue) or when the
/// scheduler drops them all. With `ping`, a comment frame goes out whenever that long passes
/// without one.
pub fn event_streams<S, F>(
    receivers: Vec<Events>,
    ping: Option<Duration>,
    state: S,
    prelude: Vec<u8>,
    epilogue: &'static [u8],
    on_event: F,
) -> Response
where
    S: Send + 'static,
    F: FnMut(&mut S, usize, Event, &mut Vec<u8>) -> bool + Send + 'static,
{
    use futures_util::stream::{select_all, BoxStream, StreamExt};
    struct Drive<S, F> {
        events: futures_util::stream::SelectAll<BoxStream<'static, (usize, Event)>>,
        state: S,
        on_event: F,
        pending: Vec<u8>,
        running: usize,
        ended: bool,
    }
    let running = receivers.len();
    let events = select_all(receivers.into_iter().enumerate().map(|(i, rx)| {
        futures_util::stream::unfold(rx, move |mut rx| async move {
            rx.recv().await.map(|e| ((i, e), rx))
        })
        .boxed()
    }));
    let drive = Drive {
        events,
        state,
        on_event,
        pending: prelude,
        running,
        ended: running == 0,
    };
    let frames = futures_util::stream::unfold(drive, move |mut d| async move {
        let mut out = std::mem::take(&mut d.pending);
        while !d.ended && out.is_empty() {
            let next = match ping {
                None => d.events.next().await,
                Some(wait) => match tokio::time::timeout(wait, d.events.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        out.extend_from_slice(b":\n\n");
                        break;
                    }
                },
            };
            match next {
                Some((i, ev)) => {
                    let failed = matches!(ev, Event::Failed(_));
                    // A panic while framing an event ends this stream with an error frame.
                    let over = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        (d.on_event)(&mut d.state, i, ev, &mut out)
                    }))
                    .unwrap_or_else(|panic| {
                        let what = bloomery_runtime::panic_message(panic.as_ref());
                        tracing::error!("framing a streamed event panicked: {what}");
                        out.extend_from_slice(&sse_data(
                            &ApiError::internal(format!("internal error: {what}")).body(),
                        ));
                        d.ended = true;
                        true
                    });
                    if failed {
                        d.ended = true;
                    } else if over && !d.ended {
                        d.running -= 1;
                        if d.running == 0 {
                            out.extend_from_slice(epilogue);
                            d.ended = true;
                        }
                    }
                }
                None => d.ended = true,
            }
        }
        (!out.is_empty()).then(|| (Bytes::from(out), d))
    });
    sse_response(frames)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A random id with a prefix (`chatcmpl-…`, `msg_…`).
pub fn random_id(prefix: &str) -> String {
    let a: u64 = rand::random();
    let b: u64 = rand::random();
    format!("{prefix}{a:016x}{b:016x}")
}
