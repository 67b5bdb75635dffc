//! The per-layer state (docs/deepseek4-plan.md, "State"):
//!
//! * every layer: the window ring, one latent row of `head_dim` per position (key and value),
//!   [`StateKind::Latent`] with `window` = `attention.sliding_window`;
//! * ratio 4 and 128 layers: the compressor's raw rows (each position's `kv` and score, `c·d`
//!   each, f32) and the compressed rows (one of `head_dim` per `ratio` positions);
//! * ratio 4 layers also: the indexer compressor's raw rows (`2·d_I` each) and the index keys
//!   (one of `d_I` per 4 positions).
//!
//! A `deepseek41` file: on its compressor source layers only (the layers of a group read the
//! source's), the compressor's raw rows (`kv` and score, `d` each), the compressed rows and the
//! index keys made from them (one of `d_I` per `ratio` positions; `docs/deepseek41-plan.md`).
//!
//! The raw and compressed rows are [`StateKind::PooledKeys`], the positional kind the host keeps
//! in f32 (`Op::Compress` writes them in place, so they must not take the K cache's
//! type): block 1 for the raw rows, block `ratio` for the compressed ones.
//!
//! What the ABI and host lack: the host does not honour a state's `window` yet
//! (`exec/src/state.rs` gives every positional buffer `ctx` rows, `ctx / block` for pooled
//! ones), so the ring costs a full context until it does. The raw rows only need the open
//! window(s), `2·ratio` (ratio 4) or `ratio` (128) positions plus the longest rollback the host
//! allows; no field says "window plus rollback", so they are declared with window 0 (the whole
//! context), which is correct and larger than needed.

use bloomery_plugin_api::model::{StateDecl, StateKind};

use crate::hparams::HParams;
use crate::layers::Ratio;

/// A compressor's state: its raw rows and its compressed rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressorState {
    /// Raw rows (`PooledKeys`, block 1).
    pub raw: u32,
    /// Compressed rows (`PooledKeys`, block `ratio`).
    pub rows: u32,
}

/// Where one layer's state lives: indices into the declared state list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerState {
    /// The window ring.
    pub ring: u32,
    /// The attention rows' compressor (ratio 4 and 128).
    pub compressor: Option<CompressorState>,
    /// The index keys' compressor (ratio 4).
    pub indexer: Option<CompressorState>,
    /// A V4.1 compressor source's index keys (`PooledKeys`, block `ratio`, `d_I` wide).
    pub index_keys: Option<u32>,
}

/// Declares every layer's state buffers in layer order, and where each layer's is.
pub fn declare(hp: &HParams) -> (Vec<StateDecl>, Vec<LayerState>) {
    let mut decls = Vec::new();
    let d = u64::from(hp.attn.head_dim);
    let d_i = u64::from(hp.indexer.head_dim);
    let layers = hp
        .ratios
        .iter()
        .enumerate()
        .map(|(il, &ratio)| {
            let il = il as u32;
            let mut add = |name: &str, kind, row_elems, window, block| {
                decls.push(StateDecl {
                    name: format!("{name}_l{il}").into(),
                    layer: il,
                    kind,
                    row_elems,
                    window,
                    block,
                });
                decls.len() as u32 - 1
            };
            let ring = add("cache_ring", StateKind::Latent, d, hp.attn.window, 1);
            let r = ratio.positions();
            let series = u64::from(ratio.series());
            let mut compressor = |name: &str, width: u64, series: u64| CompressorState {
                raw: add(
                    &format!("{name}_raw"),
                    StateKind::PooledKeys,
                    2 * series * width,
                    0,
                    1,
                ),
                rows: add(name, StateKind::PooledKeys, width, 0, r),
            };
            let (comp, index) = match &hp.v41 {
                None => (ratio != Ratio::Window, ratio == Ratio::Four),
                Some(v) => (v.is_comp_source(il), false),
            };
            let attn = comp.then(|| compressor("cache_comp", d, series));
            let index = index.then(|| compressor("cache_index", d_i, 2));
            let index_keys = (hp.v41.is_some() && comp)
                .then(|| add("cache_index_keys", StateKind::PooledKeys, d_i, 0, r));
            LayerState {
                ring,
                compressor: attn,
                indexer: index,
                index_keys,
            }
        })
        .collect();
    (decls, layers)
}
