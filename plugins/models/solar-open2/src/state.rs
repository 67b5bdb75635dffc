//! The per-layer state: a key and a value cache per attention layer (its own KV width), three
//! convolution histories and a recurrent matrix per KDA layer.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::kda::KdaState;
use bloomery_plugin_api::model::{StateDecl, StateKind};

use crate::hparams::HParams;

/// Where one layer's state lives: indices into the declared state list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerState {
    /// An attention layer's caches.
    Attention {
        /// Key cache.
        k: u32,
        /// Value cache.
        v: u32,
    },
    /// A KDA layer's state.
    Kda(KdaState),
}

/// Declares every state buffer, in layer order, and where each layer's is.
pub fn declare(hp: &HParams) -> (RVec<StateDecl>, Vec<LayerState>) {
    let mut decls = Vec::new();
    let mut layers = Vec::with_capacity(hp.lm.n_layer as usize);
    for il in 0..hp.lm.n_layer {
        if hp.is_kda(il) {
            layers.push(LayerState::Kda(KdaState::declare(&mut decls, il, &hp.kda)));
            continue;
        }
        let kv = u64::from(hp.lm.attn.head_dim) * u64::from(hp.n_head_kv[il as usize]);
        let mut add = |name: &str, kind: StateKind| {
            decls.push(StateDecl {
                name: format!("{name}_l{il}").into(),
                layer: il,
                kind,
                row_elems: kv,
                window: 0,
                block: 1,
            });
            decls.len() as u32 - 1
        };
        let k = add("cache_k", StateKind::Keys);
        let v = add("cache_v", StateKind::Values);
        layers.push(LayerState::Attention { k, v });
    }
    (decls.into(), layers)
}
