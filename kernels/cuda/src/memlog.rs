//! Where the card's memory goes, for finding what a placement's budget misses: with
//! `BLOOMERY_CUDA_MEMLOG=1` every device allocation of at least 1 MiB, every scratch growth and
//! every captured graph prints the bytes the device has allocated so far beside the memory the
//! driver reports in use on the card (which adds its context, the kernels' code and local
//! memory, and graphs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use cudarc::driver::result;

/// Bytes allocated through the device and its scratch, less those freed.
static ALLOCATED: AtomicU64 = AtomicU64::new(0);

fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("BLOOMERY_CUDA_MEMLOG").is_some_and(|v| v == "1"))
}

const MIB: f64 = (1u64 << 20) as f64;

/// Counts an allocation of `bytes` (negative: a free) and, when logging and `what` is worth a
/// line, prints it.
pub fn note(what: &str, bytes: i64) {
    let total = if bytes >= 0 {
        ALLOCATED.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64
    } else {
        ALLOCATED.fetch_sub(bytes.unsigned_abs(), Ordering::Relaxed) - bytes.unsigned_abs()
    };
    if on() && bytes.unsigned_abs() >= 1 << 20 {
        line(what, bytes, total);
    }
}

/// Prints an event that allocates nothing through the device (a captured graph), when logging.
pub fn event(what: &str) {
    if on() {
        line(what, 0, ALLOCATED.load(Ordering::Relaxed));
    }
}

fn line(what: &str, bytes: i64, total: u64) {
    let used = result::mem_get_info().map_or(f64::NAN, |(free, all)| (all - free) as f64 / MIB);
    eprintln!(
        "cuda memory: {what} {:+.1} MiB; allocated {:.1} MiB; card in use {used:.1} MiB",
        bytes as f64 / MIB,
        total as f64 / MIB
    );
}
