//! The launcher's device scratch: one area that kernels use for quantized activations, split
//! partials and intermediates. It grows (never while a graph is captured) and the outgrown areas
//! stay allocated until no captured graph names them.

use std::sync::atomic::Ordering;

use bloomery_plugin_api::PluginError;
use cudarc::driver::result;

use super::{driver_err, Launcher};

/// The scratch grows in whole multiples of this.
const SCRATCH_GRAIN: u64 = 2 << 20;

impl Launcher {
    /// A scratch area of at least `bytes`. When too small it grows (never while capturing), to
    /// whole 2 MiB; the old area stays allocated until [`Launcher::free_retired`] finds no
    /// captured graph naming it, since launches still queued or graphs may use it.
    pub(super) fn scratch(&self, bytes: u64) -> Result<u64, PluginError> {
        let mut s = self
            .scratch
            .lock()
            .map_err(|_| PluginError::device("scratch poisoned"))?;
        if s.1 < bytes {
            if self.capturing.load(Ordering::Acquire) {
                return Err(PluginError::unsupported(
                    "graph capture of a pass that needs more scratch than an eager pass made",
                    &[],
                ));
            }
            if s.0 != 0 {
                self.retired
                    .lock()
                    .map_err(|_| PluginError::device("scratch poisoned"))?
                    .push(*s);
                *s = (0, 0);
            }
            let bytes = bytes.div_ceil(SCRATCH_GRAIN) * SCRATCH_GRAIN;
            let n =
                usize::try_from(bytes).map_err(|_| PluginError::invalid("scratch too large"))?;
            // SAFETY: the context is current (bound by the caller); freed in Drop.
            let p = unsafe { result::malloc_sync(n) }.map_err(driver_err("cuMemAlloc scratch"))?;
            crate::memlog::note("scratch", bytes as i64);
            *s = (p, bytes);
        }
        Ok(s.0)
    }

    /// The scratch area in use (0 before the first), which a graph captured now names.
    pub fn scratch_base(&self) -> u64 {
        self.scratch.lock().map_or(0, |s| s.0)
    }

    /// Frees the outgrown scratch areas that no graph in `named` (the scratch bases of the live
    /// captured graphs) names. Call only with the kernel stream idle.
    pub fn free_retired(&self, named: &[u64]) -> Result<(), PluginError> {
        self.forget_quantized();
        let mut retired = self
            .retired
            .lock()
            .map_err(|_| PluginError::device("scratch poisoned"))?;
        let mut err = Ok(());
        retired.retain(|&(p, bytes)| {
            if named.contains(&p) {
                return true;
            }
            crate::memlog::note("scratch freed", -(bytes as i64));
            // SAFETY: `p` is an outgrown scratch area: no launch is queued (the caller's
            // contract) and no live graph names it; it leaves the list here, so it is freed once.
            if let Err(e) = unsafe { result::free_sync(p) } {
                err = Err(PluginError::device(format!("cuMemFree scratch: {e:?}")));
            }
            false
        });
        err
    }
}
