//! The per-layer state of a Qwen3.5 hybrid: a key and a value cache per attention layer, a
//! convolution history and a recurrent matrix per Gated DeltaNet layer; the MTP block, a
//! gated-attention layer, its own key and value caches after the trunk's.

use abi_stable::std_types::RVec;
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
    /// A Gated DeltaNet layer's state.
    Recurrent {
        /// The last `taps - 1` convolution inputs.
        conv: u32,
        /// The `[dk, dv]` matrix of every value head.
        ssm: u32,
    },
}

/// Declares every state buffer of the trunk's layers and, when `mtp`, of the MTP block after
/// them, in layer order, and where each layer's is.
pub fn declare(hp: &HParams, mtp: bool) -> (RVec<StateDecl>, Vec<LayerState>) {
    let mut decls = Vec::new();
    let n = hp.lm.n_layer + u32::from(mtp);
    let mut layers = Vec::with_capacity(n as usize);
    let g = hp.gdn;
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
        let recurrent = hp.recurrent.get(il as usize).copied().unwrap_or(false);
        layers.push(if recurrent {
            LayerState::Recurrent {
                conv: add(
                    "conv_state",
                    StateKind::Conv,
                    g.conv_channels() * u64::from(g.taps - 1),
                ),
                ssm: add(
                    "ssm_state",
                    StateKind::Recurrent,
                    u64::from(g.dk) * u64::from(g.dv) * u64::from(g.n_head_v),
                ),
            }
        } else {
            let kv = hp.lm.attn.kv_width();
            LayerState::Attention {
                k: add("cache_k", StateKind::Keys, kv),
                v: add("cache_v", StateKind::Values, kv),
            }
        });
    }
    (decls.into(), layers)
}
