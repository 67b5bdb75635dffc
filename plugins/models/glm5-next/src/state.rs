//! The per-layer state: a KDA layer's three convolution histories and recurrent matrix; an MLA
//! layer's latent cache (one row of `kv_lora` per position, serving as keys and values) and,
//! when it runs its own indexer, the indexer cache. The NextN layer's come last.
//!
//! The indexer cache holds one f32 row of `3·head_dim` per position, `[key | gate | pooled]`
//! ([`bloomery_plugin_api::op::Op::KPoolSelect`]): it is declared as
//! [`StateKind::PooledKeys`] with a block of 1, the positional kind the host keeps in f32 (the
//! op writes pooled keys into it in place, so it must not take the K cache's type).

use bloomery_plugin_api::kda::KdaState;
use bloomery_plugin_api::model::{StateDecl, StateKind};

use crate::hparams::HParams;
use crate::layers::LayerKind;

/// Where one layer's state lives: indices into the declared state list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerState {
    /// A KDA layer's state.
    Kda(KdaState),
    /// An MLA layer's caches.
    Mla {
        /// The latent cache.
        latent: u32,
        /// The indexer cache (full-indexer layers only).
        indexer: Option<u32>,
    },
}

/// Declares every state buffer of the trunk's layers and, when `nextn`, of the NextN layer after
/// them, in layer order, and where each layer's is.
pub fn declare(hp: &HParams, nextn: bool) -> (Vec<StateDecl>, Vec<LayerState>) {
    let mut decls = Vec::new();
    let n = hp.lm.n_layer + u32::from(nextn);
    let mut layers = Vec::with_capacity(n as usize);
    for il in 0..n {
        let mut add = |name: &str, kind: StateKind, row_elems: u64| {
            decls.push(StateDecl {
                name: format!("{name}_l{il}").into(),
                layer: il,
                kind,
                row_elems,
                window: 0,
                block: 1,
            });
            decls.len() as u32 - 1
        };
        let state = match hp.kind(il) {
            Some(LayerKind::Mla { full_indexer }) => LayerState::Mla {
                latent: add("cache_latent", StateKind::Latent, u64::from(hp.mla.kv_lora)),
                indexer: full_indexer.then(|| {
                    let row = 3 * u64::from(hp.indexer.head_dim);
                    add("cache_indexer", StateKind::PooledKeys, row)
                }),
            },
            _ => LayerState::Kda(KdaState::declare(&mut decls, il, &hp.kda)),
        };
        layers.push(state);
    }
    (decls, layers)
}
