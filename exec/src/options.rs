//! How a model is loaded: slots, context, cache type, threads, graphs, `--mlock`.

use bloomery_plugin_api::DType;

/// How to load a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Sequence slots (parallel sequences).
    pub n_slots: u32,
    /// Context positions per slot.
    pub ctx_per_slot: u32,
    /// Key/value cache type (F32 or F16).
    pub kv_type: DType,
    /// CPU worker threads (0 = one per core).
    pub threads: u32,
    /// Capture each batch shape's calls into a device graph on its second pass and replay it
    /// after (devices that cannot capture run eagerly either way).
    pub graphs: bool,
    /// Lock the model's mapped bytes in RAM at load (`--mlock`; see `mlock.rs`).
    pub mlock: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            n_slots: 1,
            ctx_per_slot: 4096,
            kv_type: DType::F16,
            threads: 0,
            graphs: true,
            mlock: false,
        }
    }
}
