//! The per-layer state, trunk then MTP block: a Gated DeltaNet layer's convolution history and
//! delta-rule matrices; an attention layer's key and value caches and its QSA indexer cache; the
//! n-gram table layer's dilated convolution history. (The table's row ids need the sequence's
//! last tokens, which the host keeps: `bloomery_plugin_api::ngram`.)
//!
//! The indexer cache holds one f32 row of `2·head_dim` per position, `[raw key | pooled key]`
//! (llama.cpp b11434's `kpool_row` 2): the raw key as projected, and in the row of a block's
//! last position the block's pooled key (mean of the raw keys, RMS-normed, roped at the block's
//! first position). It is declared [`StateKind::PooledKeys`] with a block of 1, the positional
//! kind the host keeps in f32, as glm5-next's is; `Op::KPoolSelect` with
//! `KPoolMode::MeanNormRope` fills it.

use bloomery_plugin_api::model::{StateDecl, StateKind};

use crate::hparams::HParams;
use crate::layers::LayerKind;

/// Where one layer's state lives: indices into the declared state list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerState {
    /// A Gated DeltaNet layer's state.
    Gdn {
        /// The last `taps − 1` convolution inputs.
        conv: u32,
        /// The `[head_dim, head_dim]` matrix of every value head.
        ssm: u32,
        /// The n-gram table layer's dilated convolution history, its last
        /// `(conv_kernel − 1)·ngram_size` inputs (that layer only).
        ple_conv: Option<u32>,
    },
    /// An attention layer's caches.
    Qsa {
        /// Key cache.
        k: u32,
        /// Value cache.
        v: u32,
        /// Indexer cache `[raw key | pooled key]`.
        indexer: u32,
    },
}

/// Declares the state of the layers the file holds (the trunk's unless it is MTP-only, then the
/// MTP block's when `nextn`), in layer order, and where each layer's is (`None` for a layer the
/// file does not hold).
pub fn declare(hp: &HParams, nextn: bool) -> (Vec<StateDecl>, Vec<Option<LayerState>>) {
    let mut decls = Vec::new();
    let n = hp.lm.n_layer + u32::from(nextn);
    let mut layers = Vec::with_capacity(n as usize);
    for il in 0..n {
        if hp.mtp_only && il < hp.lm.n_layer {
            layers.push(None);
            continue;
        }
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
        let g = hp.gdn;
        let state = match hp.kind(il) {
            Some(LayerKind::Gdn) => LayerState::Gdn {
                conv: add(
                    "conv_state",
                    StateKind::Conv,
                    g.conv_channels() * u64::from(g.taps - 1),
                ),
                ssm: add(
                    "ssm_state",
                    StateKind::Recurrent,
                    u64::from(g.head_dim) * u64::from(g.head_dim) * u64::from(g.n_head_v),
                ),
                ple_conv: match &hp.ple {
                    Some(p) if p.layer == il => Some(add(
                        "ple_conv_state",
                        StateKind::Conv,
                        hp.hc_width() * p.conv_history(),
                    )),
                    _ => None,
                },
            },
            _ => {
                let kv = hp.lm.attn.kv_width();
                LayerState::Qsa {
                    k: add("cache_k", StateKind::Keys, kv),
                    v: add("cache_v", StateKind::Values, kv),
                    indexer: add(
                        "cache_indexer",
                        StateKind::PooledKeys,
                        2 * u64::from(hp.qsa.head_dim),
                    ),
                }
            }
        };
        layers.push(Some(state));
    }
    (decls, layers)
}
