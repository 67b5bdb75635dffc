//! The Walsh-Hadamard rotation of quantized K/V caches (`bl_fwht_f32` in `cu/cache_store.cuh`):
//! the rows a quantized cache stores, the queries that score it and the output of its values are
//! rotated in chunks as llama.cpp rotates them (kernels/cpu `ops/hadamard.rs` computes the same
//! bits). Launched by the cache store and attention launchers, never claimed as an op.

use bloomery_plugin_api::PluginError;

use super::{cfg, driver_err, Launcher};

impl Launcher {
    /// `y` = the `n_values` f32 at `x` rotated in chunks of `rot` (a power of two dividing
    /// `n_values`); `x` may be `y`. A block per chunk.
    pub(super) fn rotate(
        &self,
        x: u64,
        y: u64,
        n_values: u64,
        rot: u32,
    ) -> Result<(), PluginError> {
        if rot == 0 || !rot.is_power_of_two() || !n_values.is_multiple_of(u64::from(rot)) {
            return Err(PluginError::invalid(format!(
                "a Walsh-Hadamard rotation in chunks of {rot} over {n_values} values"
            )));
        }
        let chunks = u32::try_from(n_values / u64::from(rot))
            .map_err(|_| PluginError::invalid("too many chunks to rotate in one launch"))?;
        if chunks == 0 {
            return Ok(());
        }
        let n = rot as i32;
        let f = self.func("bl_fwht_f32")?;
        let mut l = self.args(&f);
        l.arg(&x).arg(&y).arg(&n);
        // SAFETY: x and y hold `n_values` f32 each (the callers' checked tensors or scratch sized
        // for them); each block reads and writes only its own chunk.
        unsafe { l.launch(cfg(chunks, (rot / 2).clamp(1, 128))) }.map_err(driver_err("bl_fwht_f32"))
    }
}
