//! The per-layer state of a `gemma3` model: a key cache and a value cache per layer; the
//! sliding-window layers declare their window so the host may keep only that many positions.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::builders::kv_cache_decls;
use bloomery_plugin_api::model::StateDecl;

use crate::hparams::HParams;

/// The attention window of layer `il` in positions (0 = full causal).
pub fn window(hp: &HParams, il: u32) -> u32 {
    match hp.is_swa.get(il as usize) {
        Some(true) => hp.sliding_window,
        _ => 0,
    }
}

/// Declares every cache (keys and values per layer, sliding layers windowed).
pub fn declare(hp: &HParams) -> RVec<StateDecl> {
    kv_cache_decls(hp.lm.n_layer, hp.lm.attn.kv_width(), |il| window(hp, il))
}
