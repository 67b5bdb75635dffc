//! `--log-prompts-dir DIR`, a debugging aid, as llama-server b11434 writes it: each completion's
//! prompt into `DIR/<the monotonic clock in milliseconds, 12 digits>.txt` (ggml's `ggml_time_ms`
//! on Linux), a text prompt as it
//! is and any other (token ids, mixed lists) as JSON indented by two spaces. A chat's prompt is the
//! template's rendering, /infill's its token ids. A file that cannot be written is logged, and the
//! request goes on.

use std::path::Path;

use serde_json::Value;

/// CLOCK_MONOTONIC in milliseconds.
fn monotonic_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// Creates `dir` (a warning when it cannot be, as llama-server warns).
pub fn start(dir: Option<&Path>) {
    if let Some(d) = dir {
        if let Err(e) = std::fs::create_dir_all(d) {
            tracing::warn!("failed to create prompts-log-dir '{}': {e}", d.display());
        }
    }
}

/// A prompt as a request or the server holds it.
#[derive(Clone, Copy, Debug)]
pub enum Logged<'a> {
    /// A request's `prompt` field (a string is written as it is).
    Json(&'a Value),
    /// A rendered chat.
    Text(&'a str),
    /// Token ids the server built (/infill).
    Ids(&'a [u32]),
}

/// Writes `prompt` into `dir` (nothing, and no work, without one).
pub fn write(dir: Option<&Path>, prompt: Logged<'_>) {
    let Some(dir) = dir else { return };
    let path = dir.join(format!("{:012}.txt", monotonic_ms()));
    let text = match prompt {
        Logged::Json(Value::String(s)) => s.clone(),
        Logged::Text(s) => s.to_owned(),
        Logged::Json(other) => serde_json::to_string_pretty(other).unwrap_or_default(),
        Logged::Ids(ids) => serde_json::to_string_pretty(ids).unwrap_or_default(),
    };
    if let Err(e) = std::fs::write(&path, text) {
        tracing::error!("failed to create {}: {e}", path.display());
    }
}
