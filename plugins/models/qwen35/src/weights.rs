//! Every weight of a Qwen3.5 hybrid, by role and shape.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::builders::{LmGlobals, WeightRef, WeightTable};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{WeightClass as C, WeightDecl, WeightRole};
use bloomery_plugin_api::PluginError;

use crate::hparams::{Ffn, HParams};

/// A gated attention layer's projections.
pub struct Attention {
    /// Query and output gate, interleaved per head: `[n_embd, 2·head_dim·n_head]`.
    pub wq: WeightRef,
    /// Key projection.
    pub wk: WeightRef,
    /// Value projection.
    pub wv: WeightRef,
    /// Output projection.
    pub wo: WeightRef,
    /// Query per-head RMS norm.
    pub q_norm: WeightRef,
    /// Key per-head RMS norm.
    pub k_norm: WeightRef,
}

/// A Gated DeltaNet layer's weights.
pub struct DeltaNet {
    /// Queries, keys and values in one projection `[n_embd, conv channels]`.
    pub wqkv: WeightRef,
    /// Output gate projection `[n_embd, value width]`.
    pub wgate: WeightRef,
    /// Depthwise convolution `[taps, conv channels]`.
    pub conv: WeightRef,
    /// Decay bias per value head.
    pub dt_bias: WeightRef,
    /// Decay rate per value head (`-exp(A_log)`, negative).
    pub a: WeightRef,
    /// β projection `[n_embd, value heads]`.
    pub beta: WeightRef,
    /// Decay projection `[n_embd, value heads]`.
    pub alpha: WeightRef,
    /// Output RMS norm per value head `[dv]`.
    pub norm: WeightRef,
    /// Output projection `[value width, n_embd]`.
    pub out: WeightRef,
}

/// The mixing half of a layer.
pub enum Mixer {
    /// Gated attention.
    Attention(Attention),
    /// Gated DeltaNet.
    DeltaNet(DeltaNet),
}

/// The routed and shared experts of a layer.
pub struct Moe {
    /// Router.
    pub router: WeightRef,
    /// Gate stack, or fused gate+up stack.
    pub gate: WeightRef,
    /// Up stack (absent when fused).
    pub up: Option<WeightRef>,
    /// Down stack.
    pub down: WeightRef,
    /// Shared expert gate logit `[n_embd]`.
    pub shared_gate: WeightRef,
    /// Shared expert gate projection.
    pub sh_gate: WeightRef,
    /// Shared expert up projection.
    pub sh_up: WeightRef,
    /// Shared expert down projection.
    pub sh_down: WeightRef,
}

/// A dense SwiGLU FFN.
pub struct Dense {
    /// Gate projection.
    pub gate: WeightRef,
    /// Up projection.
    pub up: WeightRef,
    /// Down projection.
    pub down: WeightRef,
}

/// The FFN half of a layer.
pub enum FfnWeights {
    /// Experts.
    Moe(Box<Moe>),
    /// Dense.
    Dense(Dense),
}

/// The weights of one layer.
pub struct Layer {
    /// Pre-mixer RMS norm.
    pub attn_norm: WeightRef,
    /// Pre-FFN RMS norm.
    pub post_norm: WeightRef,
    /// Attention or DeltaNet.
    pub mixer: Mixer,
    /// FFN.
    pub ffn: FfnWeights,
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
        let globals = t.lm_globals(view, e, v)?;
        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for il in 0..hp.n_layer {
            let r = WeightRole::Layer { layer: il };
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let attn_norm = t.require(view, &n("attn_norm"), r, C::Norm, [e, 1, 1, 1])?;
            let post_norm = t.require(view, &n("post_attention_norm"), r, C::Norm, [e, 1, 1, 1])?;
            let mixer = if hp.recurrent[il as usize] {
                Mixer::DeltaNet(delta_net(&mut t, view, hp, il)?)
            } else {
                let q = u64::from(hp.head_dim * hp.n_head);
                let kv = u64::from(hp.head_dim * hp.n_head_kv);
                let hd = u64::from(hp.head_dim);
                Mixer::Attention(Attention {
                    wq: t.require(view, &n("attn_q"), r, C::Attention, [e, 2 * q, 1, 1])?,
                    wk: t.require(view, &n("attn_k"), r, C::Attention, [e, kv, 1, 1])?,
                    wv: t.require(view, &n("attn_v"), r, C::Attention, [e, kv, 1, 1])?,
                    wo: t.require(view, &n("attn_output"), r, C::Attention, [q, e, 1, 1])?,
                    q_norm: t.require(view, &n("attn_q_norm"), r, C::Norm, [hd, 1, 1, 1])?,
                    k_norm: t.require(view, &n("attn_k_norm"), r, C::Norm, [hd, 1, 1, 1])?,
                })
            };
            let ffn = match hp.ffn {
                Ffn::Moe {
                    n_expert,
                    n_ff_exp,
                    n_ff_shexp,
                    ..
                } => FfnWeights::Moe(Box::new(moe(
                    &mut t, view, il, e, n_expert, n_ff_exp, n_ff_shexp,
                )?)),
                Ffn::Dense { n_ff } => {
                    let ff = u64::from(n_ff);
                    FfnWeights::Dense(Dense {
                        gate: t.require(view, &n("ffn_gate"), r, C::Ffn, [e, ff, 1, 1])?,
                        up: t.require(view, &n("ffn_up"), r, C::Ffn, [e, ff, 1, 1])?,
                        down: t.require(view, &n("ffn_down"), r, C::Ffn, [ff, e, 1, 1])?,
                    })
                }
            };
            layers.push(Layer {
                attn_norm,
                post_norm,
                mixer,
                ffn,
            });
        }
        Ok(Weights {
            globals,
            layers,
            decls: t.into_decls(),
        })
    }
}

fn delta_net(
    t: &mut WeightTable,
    view: &ModelFileView,
    hp: &HParams,
    il: u32,
) -> Result<DeltaNet, PluginError> {
    let r = WeightRole::Layer { layer: il };
    let n = |s: &str| format!("blk.{il}.{s}.weight");
    let g = hp.gdn;
    let e = u64::from(hp.n_embd);
    let ch = u64::from(g.conv_channels());
    let vw = u64::from(g.value_width());
    let hv = u64::from(g.n_head_v);
    let one = |x: u64| [x, 1, 1, 1];
    Ok(DeltaNet {
        wqkv: t.require(view, &n("attn_qkv"), r, C::Attention, [e, ch, 1, 1])?,
        wgate: t.require(view, &n("attn_gate"), r, C::Attention, [e, vw, 1, 1])?,
        conv: t.require(
            view,
            &n("ssm_conv1d"),
            r,
            C::Recurrent,
            [u64::from(g.taps), ch, 1, 1],
        )?,
        dt_bias: t.require(
            view,
            &format!("blk.{il}.ssm_dt.bias"),
            r,
            C::Recurrent,
            one(hv),
        )?,
        a: t.require(view, &format!("blk.{il}.ssm_a"), r, C::Recurrent, one(hv))?,
        beta: t.require(view, &n("ssm_beta"), r, C::Recurrent, [e, hv, 1, 1])?,
        alpha: t.require(view, &n("ssm_alpha"), r, C::Recurrent, [e, hv, 1, 1])?,
        norm: t.require(view, &n("ssm_norm"), r, C::Norm, one(u64::from(g.dv)))?,
        out: t.require(view, &n("ssm_out"), r, C::Attention, [vw, e, 1, 1])?,
    })
}

fn moe(
    t: &mut WeightTable,
    view: &ModelFileView,
    il: u32,
    e: u64,
    n_expert: u32,
    n_ff_exp: u32,
    n_ff_shexp: u32,
) -> Result<Moe, PluginError> {
    let r = WeightRole::Layer { layer: il };
    let x = WeightRole::RoutedExperts {
        layer: il,
        n_expert,
    };
    let n = |s: &str| format!("blk.{il}.{s}.weight");
    let (ff, ne, sh) = (
        u64::from(n_ff_exp),
        u64::from(n_expert),
        u64::from(n_ff_shexp),
    );
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
    Ok(Moe {
        router: t.require(view, &n("ffn_gate_inp"), r, C::Router, [e, ne, 1, 1])?,
        gate,
        up,
        down: t.require(view, &n("ffn_down_exps"), x, C::Experts, [ff, e, ne, 1])?,
        shared_gate: t.require(view, &n("ffn_gate_inp_shexp"), r, C::Router, [e, 1, 1, 1])?,
        sh_gate: t.require(
            view,
            &n("ffn_gate_shexp"),
            r,
            C::SharedExpert,
            [e, sh, 1, 1],
        )?,
        sh_up: t.require(view, &n("ffn_up_shexp"), r, C::SharedExpert, [e, sh, 1, 1])?,
        sh_down: t.require(
            view,
            &n("ffn_down_shexp"),
            r,
            C::SharedExpert,
            [sh, e, 1, 1],
        )?,
    })
}
