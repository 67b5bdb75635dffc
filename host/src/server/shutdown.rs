//! Shutdown: SIGTERM (what Docker, systemd and Kubernetes send) and SIGINT both drain. The
//! listener closes, new requests on open connections get 503, and the running requests have
//! `--shutdown-timeout` seconds to finish; then the scheduler cuts each one that has not (a
//! stream ends with an error frame, never mid-chunk) and logs what it cut. The process ends once
//! every connection has closed, or [`GRACE`] after the cut whatever is left. A second signal ends
//! it at once, as llama-server does.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use super::AppState;

/// How long connections get after the cut to send their last frames.
const GRACE: Duration = Duration::from_secs(2);

/// The signals that stop the server.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Listens for SIGTERM and SIGINT from now on (their default action, ending the process at
    /// once, is replaced).
    pub fn new() -> std::io::Result<Self> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next signal's name.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Drains after the first signal `first`: `stop_http` closes the listener and lets in-flight
/// requests finish; `http` resolves once every connection has closed.
pub async fn drain(
    state: &AppState,
    signals: &mut Signals,
    first: &str,
    stop_http: tokio::sync::oneshot::Sender<()>,
    http: impl std::future::Future<Output = ()>,
) {
    let deadline = Duration::from_secs(state.args.shutdown_timeout);
    state.draining.store(true, Ordering::Relaxed);
    let running = busy_slots(state);
    tracing::warn!(
        "{first}: shutting down; {running} running request(s) have {} s to finish (a second signal exits at once)",
        deadline.as_secs()
    );
    let _ = stop_http.send(());
    let mut http = std::pin::pin!(http);
    tokio::select! {
        () = &mut http => {
            tracing::info!("every request finished; exiting");
            return;
        }
        () = tokio::time::sleep(deadline) => {}
        second = signals.next() => exit_now(second),
    }
    tracing::warn!(
        "the drain's {} s are over: cutting {} running request(s)",
        deadline.as_secs(),
        busy_slots(state)
    );
    if let Some(ready) = state.ready.get() {
        ready.shared.stop.store(true, Ordering::Relaxed);
    }
    tokio::select! {
        () = &mut http => tracing::info!("every connection closed; exiting"),
        () = tokio::time::sleep(GRACE) => {
            tracing::warn!("connections still open {} s after the cut; exiting", GRACE.as_secs());
        }
        second = signals.next() => exit_now(second),
    }
}

fn busy_slots(state: &AppState) -> usize {
    state.ready.get().map_or(0, |r| {
        r.shared
            .slots
            .lock()
            .map(|v| v.iter().filter(|s| s.is_processing).count())
            .unwrap_or(0)
    })
}

fn exit_now(signal: &str) -> ! {
    tracing::error!("{signal} again: exiting at once");
    std::process::exit(1)
}
