//! Every weight of a `gemma3` model, by role and shape.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::builders::{LmGlobals, WeightRef, WeightTable};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{WeightClass as C, WeightDecl, WeightRole};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;

/// The weights of one layer. Norm weights are used as stored: the GGUF converter already folded
/// Gemma's `1 + w` into them.
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
    /// RMS norm of the attention output, before the residual add.
    pub attn_post_norm: WeightRef,
    /// Pre-FFN RMS norm.
    pub ffn_norm: WeightRef,
    /// FFN gate projection.
    pub gate: WeightRef,
    /// FFN up projection.
    pub up: WeightRef,
    /// FFN down projection.
    pub down: WeightRef,
    /// RMS norm of the FFN output, before the residual add.
    pub ffn_post_norm: WeightRef,
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
        let (hd, ff) = (u64::from(hp.head_dim), u64::from(hp.n_ff));
        let globals = t.lm_globals(view, e, v)?;
        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for il in 0..hp.n_layer {
            let r = WeightRole::Layer { layer: il };
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let norm = |t: &mut WeightTable, s: &str, w: u64| {
                t.require(view, &n(s), r, C::Norm, [w, 1, 1, 1])
            };
            layers.push(Layer {
                attn_norm: norm(&mut t, "attn_norm", e)?,
                wq: t.require(view, &n("attn_q"), r, C::Attention, [e, q, 1, 1])?,
                wk: t.require(view, &n("attn_k"), r, C::Attention, [e, kv, 1, 1])?,
                wv: t.require(view, &n("attn_v"), r, C::Attention, [e, kv, 1, 1])?,
                wo: t.require(view, &n("attn_output"), r, C::Attention, [q, e, 1, 1])?,
                q_norm: norm(&mut t, "attn_q_norm", hd)?,
                k_norm: norm(&mut t, "attn_k_norm", hd)?,
                attn_post_norm: norm(&mut t, "post_attention_norm", e)?,
                ffn_norm: norm(&mut t, "ffn_norm", e)?,
                gate: t.require(view, &n("ffn_gate"), r, C::Ffn, [e, ff, 1, 1])?,
                up: t.require(view, &n("ffn_up"), r, C::Ffn, [e, ff, 1, 1])?,
                down: t.require(view, &n("ffn_down"), r, C::Ffn, [ff, e, 1, 1])?,
                ffn_post_norm: norm(&mut t, "post_ffw_norm", e)?,
            });
        }
        Ok(Weights {
            globals,
            layers,
            decls: t.into_decls(),
        })
    }
}
