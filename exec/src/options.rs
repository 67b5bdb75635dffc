//! How a model is loaded: slots, context, cache type, threads, graphs, `--mlock`, metadata
//! overrides.

use bloomery_plugin_api::DType;

use crate::overrides::MetaOverride;

/// How to load a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadOptions {
    /// Sequence slots (parallel sequences).
    pub n_slots: u32,
    /// Context positions per slot.
    pub ctx_per_slot: u32,
    /// Key cache type (`-ctk`: F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or IQ4_NL; latent rows too).
    pub kv_type_k: DType,
    /// Value cache type (`-ctv`, the same set), independent of the keys'.
    pub kv_type_v: DType,
    /// CPU worker threads (0 = one per core).
    pub threads: u32,
    /// Capture each batch shape's calls into a device graph on its second pass and replay it
    /// after (devices that cannot capture run eagerly either way).
    pub graphs: bool,
    /// Lock the model's mapped bytes in RAM at load (`--mlock`; see `mlock.rs`).
    pub mlock: bool,
    /// Values put over the file's metadata before anything reads it (`--override-kv`, the rope
    /// flags); the command line's, kept for the process.
    pub overrides: &'static [MetaOverride],
    /// Check every tensor's data before loading (`--check-tensors`: no NaN or infinite value
    /// or block scale, as llama.cpp's check); a bad tensor is refused by name.
    pub check_tensors: bool,
    /// Most tokens a draft decoding step drafts, where the runtime will draft with the model's
    /// MTP layers (0: it will not): the placement plan keeps card room for the rollback copy of
    /// the per-sequence state and the verify passes' per-row states ([`crate::state`]).
    pub draft_n_max: u32,
    /// Whether the drafts come from elsewhere than MTP layers (token history, a draft model),
    /// so that a model without MTP layers drafts too and its plan keeps the same room.
    pub draft_history: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            n_slots: 1,
            ctx_per_slot: 4096,
            kv_type_k: DType::F16,
            kv_type_v: DType::F16,
            threads: 0,
            graphs: true,
            mlock: false,
            overrides: &[],
            check_tensors: false,
            draft_n_max: 0,
            draft_history: false,
        }
    }
}
