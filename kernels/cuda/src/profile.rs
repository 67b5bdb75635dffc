//! Per-op timing for finding where a pass spends its time: with `BLOOMERY_CUDA_PROFILE=1` every
//! eager call is bracketed by CUDA events, times are summed per label at each synchronisation,
//! and the table is printed to stderr when the device closes. Each profiled pass starts behind a
//! 40 ms hold on the stream, so the host has queued every call before the first one runs: the
//! events then time the kernels back to back, not the host's launches. Off by default.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bloomery_plugin_api::tensor::OpCall;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};

/// Pending event pairs and the totals per label.
pub struct Profile {
    pending: Mutex<Vec<(String, CudaEvent, CudaEvent)>>,
    totals: Mutex<HashMap<String, (u64, f64)>>,
}

/// What a call is reported as: its op, the type of its first source and whether it is one row.
pub fn label(c: &OpCall) -> String {
    use bloomery_plugin_api::op::Op;
    // Token rows of the pass: ops whose output rows are heads count their position list.
    let rows = match c.op {
        Op::Attention(_) => c.srcs().get(3).map_or(0, |t| t.elements()),
        Op::Rope(_) => c.srcs().get(1).map_or(0, |t| t.elements()),
        Op::CacheStore { .. } => c.srcs().get(3).map_or(0, |t| t.elements()),
        _ => c.dst.rows(),
    };
    let dtype = c
        .srcs()
        .first()
        .map(|s| s.dtype.to_string())
        .unwrap_or_default();
    let w = match c.srcs().get(3) {
        Some(t) if matches!(c.op, Op::MoeExperts(_)) => t.dtype.to_string(),
        _ => dtype,
    };
    format!(
        "{} {} {}",
        c.op.kind(),
        w,
        if rows == 1 { "m=1" } else { "m>1" }
    )
}

impl Profile {
    /// A profile when the environment asks for one.
    pub fn from_env() -> Option<Profile> {
        match std::env::var("BLOOMERY_CUDA_PROFILE") {
            Ok(v) if !v.is_empty() && v != "0" => Some(Profile {
                pending: Mutex::new(Vec::new()),
                totals: Mutex::new(HashMap::new()),
            }),
            _ => None,
        }
    }

    /// Runs `f` between two recorded events on `stream`.
    pub fn time<T>(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        label: String,
        f: impl FnOnce() -> T,
    ) -> T {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (a, b) = match (ctx.new_event(flags), ctx.new_event(flags)) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return f(),
        };
        let _ = a.record(stream);
        let out = f();
        let _ = b.record(stream);
        if let Ok(mut p) = self.pending.lock() {
            p.push((label, a, b));
        }
        out
    }

    /// Adds the finished pairs to the totals (after a synchronisation).
    pub fn collect(&self) {
        let pending = match self.pending.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => return,
        };
        if let Ok(mut t) = self.totals.lock() {
            for (label, a, b) in pending {
                let ms = a.elapsed_ms(&b).unwrap_or(0.0);
                let e = t.entry(label).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += f64::from(ms);
            }
        }
    }

    /// The table, longest total first.
    pub fn report(&self) -> String {
        self.collect();
        let t = match self.totals.lock() {
            Ok(t) => t.clone(),
            Err(_) => return String::new(),
        };
        let mut rows: Vec<_> = t.into_iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let all: f64 = rows.iter().map(|r| r.1 .1).sum();
        let mut s = format!(
            "{:<32} {:>8} {:>12} {:>10} {:>6}\n",
            "op", "calls", "total ms", "mean us", "share"
        );
        for (label, (n, ms)) in rows {
            s += &format!(
                "{label:<32} {n:>8} {ms:>12.3} {:>10.2} {:>5.1}%\n",
                ms * 1000.0 / n as f64,
                100.0 * ms / all.max(1e-9)
            );
        }
        s
    }
}
