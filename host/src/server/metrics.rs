//! `GET /metrics` (with `--metrics`): llama-server's Prometheus counters and gauges, and
//! bloomery's own (tiering, prompt cache, drafting, decisions). The throughput gauges are
//! averages over the window since the previous scrape, as llama-server b11434 reports them: a
//! scrape while nothing ran reads 0, and a server that slept and woke reports nothing twice.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppRef;

/// Token and microsecond totals of prompt processing and generation at one scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// Prompt tokens evaluated and the microseconds they took.
    pub prompt: (u64, u64),
    /// Tokens generated and the microseconds they took.
    pub predicted: (u64, u64),
}

/// The totals the previous scrape saw: the start of the throughput gauges' window.
#[derive(Debug, Default)]
pub struct Window {
    last: Totals,
}

impl Window {
    /// Prompt and generation tokens per second between the previous scrape and `now` (0 where
    /// no time was spent); `now` starts the next window.
    pub fn rates(&mut self, now: Totals) -> (f64, f64) {
        let rate = |(n, us): (u64, u64), (n0, us0): (u64, u64)| {
            let us = us.saturating_sub(us0);
            if us > 0 {
                n.saturating_sub(n0) as f64 * 1e6 / us as f64
            } else {
                0.0
            }
        };
        let out = (
            rate(now.prompt, self.last.prompt),
            rate(now.predicted, self.last.predicted),
        );
        self.last = now;
        out
    }
}

/// GET /metrics (with --metrics).
pub async fn metrics(State(state): State<AppRef>) -> Result<Response, ApiError> {
    if !state.args.metrics {
        return Err(ApiError::not_supported(
            "This server does not support metrics endpoint (start it with --metrics)",
        ));
    }
    let ready = state.ready()?;
    let c = &ready.shared.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let (pt, pus, gt, gus) = (
        get(&c.prompt_tokens),
        get(&c.prompt_us),
        get(&c.predicted_tokens),
        get(&c.predicted_us),
    );
    let busy = ready
        .shared
        .slots
        .lock()
        .map(|v| v.iter().filter(|s| s.is_processing).count())
        .unwrap_or(0);
    let calls = get(&c.decode_calls);
    let (prompt_rate, predicted_rate) = ready
        .scrape
        .lock()
        .map_err(|_| ApiError::internal("the metrics window's lock is poisoned"))?
        .rates(Totals {
            prompt: (pt, pus),
            predicted: (gt, gus),
        });
    let rows = [
        (
            "counter",
            "prompt_tokens_total",
            "Number of prompt tokens processed.",
            pt as f64,
        ),
        (
            "counter",
            "prompt_seconds_total",
            "Prompt process time",
            pus as f64 / 1e6,
        ),
        (
            "counter",
            "tokens_predicted_total",
            "Number of generation tokens processed.",
            gt as f64,
        ),
        (
            "counter",
            "tokens_predicted_seconds_total",
            "Predict process time",
            gus as f64 / 1e6,
        ),
        (
            "counter",
            "n_decode_total",
            "Total number of llama_decode() calls",
            calls as f64,
        ),
        (
            "counter",
            "prompt_tokens_cached_total",
            "Number of prompt tokens reused from the cache",
            get(&c.cached_tokens) as f64,
        ),
        (
            "counter",
            "n_tokens_max",
            "Largest observed sequence length (prompt + generation)",
            get(&c.n_tokens_max) as f64,
        ),
        // The draft decoder's (`--spec-type`) counters, as llama-server names them.
        (
            "counter",
            "spec_decode_num_draft_tokens_total",
            "Speculative: Total draft tokens generated",
            get(&c.spec_draft_tokens) as f64,
        ),
        (
            "counter",
            "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            get(&c.spec_accepted) as f64,
        ),
        (
            "counter",
            "spec_decode_num_drafts_total",
            "Speculative: Total speculative decoding verification steps",
            get(&c.spec_verify_steps) as f64,
        ),
        (
            "counter",
            "spec_gate_switches_total",
            "Times a slot's drafting gate turned drafting off or on (bloomery).",
            get(&c.spec_gate_switches) as f64,
        ),
        (
            "gauge",
            "n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            if calls > 0 {
                get(&c.busy_slot_passes) as f64 / calls as f64
            } else {
                0.0
            },
        ),
        (
            "gauge",
            "prompt_tokens_seconds",
            "Average prompt throughput in tokens/s since the last scrape.",
            prompt_rate,
        ),
        (
            "gauge",
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s since the last scrape.",
            predicted_rate,
        ),
        (
            "gauge",
            "requests_processing",
            "Number of requests processing.",
            busy as f64,
        ),
        (
            "gauge",
            "requests_deferred",
            "Number of requests deferred.",
            get(&c.deferred) as f64,
        ),
        (
            "counter",
            "routed_experts_card_total",
            "Routed expert calls of layers with host experts served on the card.",
            get(&c.routed_card) as f64,
        ),
        (
            "counter",
            "routed_experts_host_total",
            "Routed expert calls of layers with host experts served in host RAM.",
            get(&c.routed_host) as f64,
        ),
        (
            "counter",
            "routed_experts_bus_total",
            "Of the calls served in host RAM, those the card computed reading the expert over PCIe.",
            get(&c.routed_bus) as f64,
        ),
        (
            "counter",
            "expert_disk_reads_total",
            "Routed experts read from the model file by the disk tier.",
            get(&c.disk_reads) as f64,
        ),
        (
            "counter",
            "expert_disk_prefetched_total",
            "Of the disk tier's reads, the experts read ahead from the next layer's router.",
            get(&c.disk_prefetched) as f64,
        ),
        (
            "counter",
            "expert_disk_prefetch_hits_total",
            "Experts read ahead that the next layer then used.",
            get(&c.disk_prefetch_hits) as f64,
        ),
        (
            "counter",
            "residency_flips_total",
            "Experts moved onto the card by routing counts.",
            get(&c.residency_flips) as f64,
        ),
        (
            "counter",
            "prompt_cache_saves_total",
            "Slot states saved to the prompt cache in host RAM.",
            get(&c.cache_saves) as f64,
        ),
        (
            "counter",
            "prompt_cache_restores_total",
            "Requests that restored a prefix from the prompt cache.",
            get(&c.cache_restores) as f64,
        ),
        (
            "counter",
            "prompt_cache_restored_tokens_total",
            "Prompt tokens restored from the prompt cache.",
            get(&c.cache_restored_tokens) as f64,
        ),
        (
            "counter",
            "prompt_cache_evictions_total",
            "Saved states evicted from the prompt cache for room.",
            get(&c.cache_evictions) as f64,
        ),
        (
            "gauge",
            "prompt_cache_bytes",
            "Bytes the prompt cache holds.",
            get(&c.cache_bytes) as f64,
        ),
        (
            "gauge",
            "prompt_cache_states",
            "Saved states the prompt cache holds.",
            get(&c.cache_entries) as f64,
        ),
        (
            "counter",
            "tokens_forced_total",
            "Generated tokens schemajump forced (a grammar admitted only them).",
            get(&c.forced_tokens) as f64,
        ),
        (
            "counter",
            "tokens_drafted_total",
            "Tokens drafted (schemajump: the text a grammar fixes; the draft decoder) and a pass evaluated.",
            get(&c.drafted) as f64,
        ),
        (
            "counter",
            "tokens_drafted_accepted_total",
            "Drafted tokens that sampling confirmed.",
            get(&c.draft_accepted) as f64,
        ),
        (
            "counter",
            "decisions_total",
            "Decisions (/v1/systemone) the decision head scored.",
            get(&c.decisions) as f64,
        ),
        (
            "counter",
            "decision_head_runs_total",
            "Runs of the decision head, each over every decision whose prompt ended in one pass.",
            get(&c.decision_head_runs) as f64,
        ),
        (
            "counter",
            "decision_rows_total",
            "Prompt rows the decision head read.",
            get(&c.decision_rows) as f64,
        ),
    ];
    let mut out = String::new();
    for (kind, name, help, v) in rows {
        out.push_str(&format!(
            "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {v}\n"
        ));
    }
    // llama-server's labeled counter, one series per draft position, once a step verified.
    let per_pos = c
        .spec_accepted_per_pos
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    if !per_pos.is_empty() {
        let name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total";
        out.push_str(&format!(
            "# HELP {name} Accepted tokens per draft position\n# TYPE {name} counter\n"
        ));
        for (i, n) in per_pos.iter().enumerate() {
            out.push_str(&format!("{name}{{position=\"{i}\"}} {n}\n"));
        }
    }
    Ok((
        [
            (header::CONTENT_TYPE, "text/plain; version=0.0.4".to_owned()),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                state.started_unix.to_string(),
            ),
        ],
        out,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scrape_reports_the_window_since_the_last() {
        let mut w = Window::default();
        let t = |pt, pus, gt, gus| Totals {
            prompt: (pt, pus),
            predicted: (gt, gus),
        };
        assert_eq!(w.rates(t(10, 1_000, 8, 4_000)), (10_000.0, 2_000.0));
        // nothing ran since: an empty window reads 0, not the lifetime average
        assert_eq!(w.rates(t(10, 1_000, 8, 4_000)), (0.0, 0.0));
        // only generation ran: its window alone
        assert_eq!(w.rates(t(10, 1_000, 18, 6_000)), (0.0, 5_000.0));
    }
}
