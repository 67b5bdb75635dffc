//! The per-layer state of a `gemma3` model: a key cache and a value cache per layer; the
//! sliding-window layers declare their window so the host may keep only that many positions.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::model::{StateDecl, StateKind};

use crate::hparams::HParams;

/// State indices of layer `il`'s key and value caches.
pub fn cache_indices(il: u32) -> (u32, u32) {
    (2 * il, 2 * il + 1)
}

/// The attention window of layer `il` in positions (0 = full causal).
pub fn window(hp: &HParams, il: u32) -> u32 {
    match hp.is_swa.get(il as usize) {
        Some(true) => hp.sliding_window,
        _ => 0,
    }
}

/// Declares every cache, in the order [`cache_indices`] gives.
pub fn declare(hp: &HParams) -> RVec<StateDecl> {
    let row = u64::from(hp.head_dim * hp.n_head_kv);
    (0..hp.n_layer)
        .flat_map(|il| {
            [(StateKind::Keys, "cache_k"), (StateKind::Values, "cache_v")].map(|(kind, name)| {
                StateDecl {
                    name: format!("{name}_l{il}").into(),
                    layer: il,
                    kind,
                    row_elems: row,
                    window: window(hp, il),
                    block: 1,
                }
            })
        })
        .collect()
}
