//! One log line per request at the default level, as llama-server logs its requests and each
//! slot's timings, in one line: the method and route, the status, and for a generation its
//! slot, prompt tokens (new and cached), generated tokens and both rates:
//!
//! ```text
//! request: POST /v1/chat/completions 200 | slot 1 | prompt 12 tokens (40 cached), 812.50 t/s | generated 32 tokens, 41.20 t/s
//! ```
//!
//! Monitors' polls (`GET /health`, `/metrics`, `/slots`, `/props`) are logged at debug level.
//! The line is written when the response body ends (a stream's last frame, or the client
//! going away), so it carries the generation's counts. A generation's numbers reach it through
//! [`Events`], the receiver [`super::gen::submit`] hands out: the record of the request in
//! progress is found by a task-local the middleware sets, and a token costs one comparison.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bloomery_runtime::request::{Decided, Embedded, Event, Finish};
use hyper::body::{Frame, SizeHint};
use tokio::sync::mpsc::UnboundedReceiver;

tokio::task_local! {
    /// The record of the request whose handler is running.
    static RECORD: Arc<Record>;
}

/// What a request's generations did (several prompts of one request add up).
#[derive(Default, Debug)]
struct Totals {
    slots: Vec<usize>,
    /// Prompt tokens evaluated (the cached ones left out).
    n_prompt: usize,
    n_cached: usize,
    n_predicted: usize,
    prompt_ms: f64,
    predicted_ms: f64,
}

/// A request's generation counts, filled as its generations end.
#[derive(Default, Debug)]
pub struct Record(Mutex<Option<Totals>>);

impl Record {
    fn add(&self, f: &Finish) {
        if let Ok(mut t) = self.0.lock() {
            let t = t.get_or_insert_with(Totals::default);
            if !t.slots.contains(&f.id_slot) {
                t.slots.push(f.id_slot);
            }
            t.n_prompt += f.n_prompt.saturating_sub(f.n_cached);
            t.n_cached += f.n_cached;
            t.n_predicted += f.n_predicted;
            t.prompt_ms += f.prompt_ms;
            t.predicted_ms += f.predicted_ms;
        }
    }

    fn add_embedding(&self, x: &Embedded) {
        if let Ok(mut t) = self.0.lock() {
            let t = t.get_or_insert_with(Totals::default);
            if !t.slots.contains(&x.id_slot) {
                t.slots.push(x.id_slot);
            }
            t.n_prompt += x.n_prompt;
            t.prompt_ms += x.prompt_ms;
        }
    }

    fn add_decision(&self, d: &Decided) {
        if let Ok(mut t) = self.0.lock() {
            let t = t.get_or_insert_with(Totals::default);
            if !t.slots.contains(&d.id_slot) {
                t.slots.push(d.id_slot);
            }
            t.n_prompt += d.n_prompt.saturating_sub(d.n_cached);
            t.n_cached += d.n_cached;
            t.prompt_ms += d.prompt_ms;
        }
    }

    /// The generation part of the line (empty without a finished generation).
    fn fields(&self) -> String {
        let Ok(t) = self.0.lock() else {
            return String::new();
        };
        let Some(t) = t.as_ref() else {
            return String::new();
        };
        let rate = |n: usize, ms: f64| if ms > 0.0 { 1e3 * n as f64 / ms } else { 0.0 };
        let slots: Vec<String> = t.slots.iter().map(ToString::to_string).collect();
        format!(
            " | slot {} | prompt {} tokens ({} cached), {:.2} t/s | generated {} tokens, {:.2} t/s",
            slots.join(","),
            t.n_prompt,
            t.n_cached,
            rate(t.n_prompt, t.prompt_ms),
            t.n_predicted,
            rate(t.n_predicted, t.predicted_ms),
        )
    }
}

/// A generation's events, as [`super::gen::submit`] hands them out: each `Done` is also
/// counted in the request's log line.
pub struct Events {
    rx: UnboundedReceiver<Event>,
    record: Option<Arc<Record>>,
}

impl Events {
    /// The events of `rx`, counted in the record of the request being handled (if any).
    pub fn new(rx: UnboundedReceiver<Event>) -> Events {
        Events {
            rx,
            record: RECORD.try_with(Arc::clone).ok(),
        }
    }

    /// The next event (None once the scheduler dropped the request).
    pub async fn recv(&mut self) -> Option<Event> {
        let e = self.rx.recv().await;
        match (&e, &self.record) {
            (Some(Event::Done(f)), Some(r)) => r.add(f),
            (Some(Event::Embedded(x)), Some(r)) => r.add_embedding(x),
            (Some(Event::Decided(d)), Some(r)) => r.add_decision(d),
            _ => {}
        }
        e
    }
}

/// Writes the line when dropped: when the response body has ended or been dropped.
struct LineOnDrop {
    head: String,
    record: Arc<Record>,
    /// A monitor's poll: logged at debug level.
    quiet: bool,
}

impl Drop for LineOnDrop {
    fn drop(&mut self) {
        if self.quiet {
            tracing::debug!("request: {}{}", self.head, self.record.fields());
        } else {
            tracing::info!("request: {}{}", self.head, self.record.fields());
        }
    }
}

/// Routes monitors poll (a load balancer's health check every second): their lines are
/// debug-level, so the default log holds the requests that do work.
const POLLED: &[&str] = &["/health", "/v1/health", "/metrics", "/slots", "/props"];

/// A response body that logs its request's line when it ends.
struct LoggedBody {
    inner: Body,
    _line: LineOnDrop,
}

impl hyper::body::Body for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The middleware: runs the request with its record in scope and logs its line once the
/// response body ends. `prefix` is `--api-prefix` (the polled routes sit under it).
pub async fn log_requests(State(prefix): State<Arc<str>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let head = format!("{} {path}", req.method());
    let quiet = req.method() == axum::http::Method::GET
        && path
            .strip_prefix(&*prefix)
            .is_some_and(|route| POLLED.contains(&route));
    let record = Arc::new(Record::default());
    let response = RECORD.scope(Arc::clone(&record), next.run(req)).await;
    let line = LineOnDrop {
        head: format!("{head} {}", response.status().as_u16()),
        record,
        quiet,
    };
    response.map(|inner| Body::new(LoggedBody { inner, _line: line }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_runtime::request::StopType;

    #[test]
    fn a_generation_adds_its_slot_counts_and_rates() {
        let r = Record::default();
        assert_eq!(r.fields(), "");
        r.add(&Finish {
            stop_type: StopType::Limit,
            stopping_word: String::new(),
            id_slot: 2,
            n_prompt: 50,
            n_cached: 40,
            n_predicted: 8,
            n_forced: 0,
            n_drafted: 0,
            n_accepted: 0,
            grammar_ms: None,
            prompt_ms: 20.0,
            predicted_ms: 200.0,
            truncated: false,
        });
        assert_eq!(
            r.fields(),
            " | slot 2 | prompt 10 tokens (40 cached), 500.00 t/s | generated 8 tokens, 40.00 t/s"
        );
    }
}
