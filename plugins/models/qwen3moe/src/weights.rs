//! Every weight of a `qwen3moe` model, by role and shape.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::builders::{LmGlobals, WeightRef, WeightTable};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{WeightClass as C, WeightDecl, WeightRole};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;

/// The weights of one layer.
pub struct Layer {
    /// Pre-attention RMS norm.
    pub attn_norm: WeightRef,
    /// Query projection.
    pub wq: WeightRef,
    /// Key projection.
    pub wk: WeightRef,
    /// Value projection.
    pub wv: WeightRef,
    /// Output projection.
    pub wo: WeightRef,
    /// Query per-head norm.
    pub q_norm: WeightRef,
    /// Key per-head norm.
    pub k_norm: WeightRef,
    /// Pre-FFN RMS norm.
    pub ffn_norm: WeightRef,
    /// Router.
    pub router: WeightRef,
    /// Gate stack, or fused gate+up stack.
    pub gate: WeightRef,
    /// Up stack (absent when fused).
    pub up: Option<WeightRef>,
    /// Down stack.
    pub down: WeightRef,
}

/// All weights.
pub struct Weights {
    /// Embedding, final norm and head.
    pub globals: LmGlobals,
    /// Layers.
    pub layers: Vec<Layer>,
    /// Declarations in index order.
    pub decls: RVec<WeightDecl>,
}

impl Weights {
    /// Finds every weight in the file, checking shapes.
    pub fn from_view(view: &ModelFileView, hp: &HParams) -> Result<Self, PluginError> {
        let mut t = WeightTable::new();
        let (e, v) = (u64::from(hp.n_embd), u64::from(hp.n_vocab));
        let q = u64::from(hp.head_dim * hp.n_head);
        let kv = u64::from(hp.head_dim * hp.n_head_kv);
        let hd = u64::from(hp.head_dim);
        let (ff, ne) = (u64::from(hp.n_ff_exp), u64::from(hp.n_expert));
        let globals = t.lm_globals(view, e, v)?;
        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for il in 0..hp.n_layer {
            let r = WeightRole::Layer { layer: il };
            let x = WeightRole::RoutedExperts {
                layer: il,
                n_expert: hp.n_expert,
            };
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let fused = t.optional(
                view,
                &n("ffn_gate_up_exps"),
                x,
                C::Experts,
                [e, 2 * ff, ne, 1],
            )?;
            let (gate, up) = match fused {
                Some(gu) => (gu, None),
                None => (
                    t.require(view, &n("ffn_gate_exps"), x, C::Experts, [e, ff, ne, 1])?,
                    Some(t.require(view, &n("ffn_up_exps"), x, C::Experts, [e, ff, ne, 1])?),
                ),
            };
            layers.push(Layer {
                attn_norm: t.require(view, &n("attn_norm"), r, C::Norm, [e, 1, 1, 1])?,
                wq: t.require(view, &n("attn_q"), r, C::Attention, [e, q, 1, 1])?,
                wk: t.require(view, &n("attn_k"), r, C::Attention, [e, kv, 1, 1])?,
                wv: t.require(view, &n("attn_v"), r, C::Attention, [e, kv, 1, 1])?,
                wo: t.require(view, &n("attn_output"), r, C::Attention, [q, e, 1, 1])?,
                q_norm: t.require(view, &n("attn_q_norm"), r, C::Norm, [hd, 1, 1, 1])?,
                k_norm: t.require(view, &n("attn_k_norm"), r, C::Norm, [hd, 1, 1, 1])?,
                ffn_norm: t.require(view, &n("ffn_norm"), r, C::Norm, [e, 1, 1, 1])?,
                router: t.require(view, &n("ffn_gate_inp"), r, C::Router, [e, ne, 1, 1])?,
                gate,
                up,
                down: t.require(view, &n("ffn_down_exps"), x, C::Experts, [ff, e, ne, 1])?,
            });
        }
        Ok(Weights {
            globals,
            layers,
            decls: t.into_decls(),
        })
    }
}
