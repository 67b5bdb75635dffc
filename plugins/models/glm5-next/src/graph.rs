//! The trunk's forward graph, in llama.cpp b11434's order (`glm5-next.cpp`): the embeddings
//! repeated into 4 residual streams; per layer the hyper-connection pre mix, `attn_norm`, KDA or
//! MLA, the post update; the same around `ffn_norm` and the FFN (a dense SwiGLU in the lead
//! layers, else sigmoid-routed experts plus the shared expert, both clamped); then the mean of
//! the streams, `output_norm` and the head, for the wanted rows.

use bloomery_plugin_api::builders::{LmInputs, MoeBlock};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder, TensorId};
use bloomery_plugin_api::kda::{kda_layer, KdaInputs};
use bloomery_plugin_api::mhc_graph::Hc;
use bloomery_plugin_api::op::GluKind;
use bloomery_plugin_api::weights::GluFfnWeights;
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;
use crate::mla::{mla_layer, MlaState};
use crate::state::LayerState;
use crate::weights::{Ffn, Layer, Mixer, Weights};

/// What a graph needs besides the batch shape.
pub struct Model<'a> {
    /// Hyperparameters.
    pub hp: &'a HParams,
    /// Weights.
    pub w: &'a Weights,
    /// Each layer's state indices, trunk then NextN.
    pub state: &'a [LayerState],
    /// A verify pass (`GraphKind::Verify`): the KDA layers also write every row's state into
    /// their state's row states.
    pub verify: bool,
}

/// A SwiGLU FFN whose gate is clamped to at most `limit` and up to `[-limit, limit]` (0: none),
/// nodes `{prefix}gate`, `{prefix}up`, `{prefix}swiglu`, `{prefix}down`.
fn clamped_ffn(
    g: &mut GraphBuilder,
    prefix: &str,
    f: &GluFfnWeights,
    limit: f32,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    let (gate, up, down) = (g.w(&f.gate)?, g.w(&f.up)?, g.w(&f.down)?);
    let a = g.matmul(&format!("{prefix}gate"), gate, x)?;
    let b = g.matmul(&format!("{prefix}up"), up, x)?;
    let h = g.glu(&format!("{prefix}swiglu"), a, b, GluKind::SwiGlu, limit)?;
    g.matmul(&format!("{prefix}down"), down, h)
}

/// Layer `il`'s FFN of the normed `x`: the dense SwiGLU (clamped by `swiglu_clamp_shexp`, as
/// llama.cpp's `build_ffn` does), or the routed experts (`swiglu_clamp_exp`) plus the shared
/// expert (`swiglu_clamp_shexp`), the shared one between the routing and the experts.
pub fn ffn(
    g: &mut GraphBuilder,
    hp: &HParams,
    il: u32,
    f: &Ffn,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    let at = il as usize;
    let (exp, shexp) = (hp.clamp_exp[at], hp.clamp_shexp[at]);
    match f {
        Ffn::Dense(d) => clamped_ffn(g, "ffn_", d, shexp, x),
        Ffn::Moe(e) => {
            let blk = MoeBlock {
                router_bias: Some(&e.bias),
                limit: exp,
                ..e.experts.block(hp.route, GluKind::SwiGlu)
            };
            let route = g.moe_route(&blk, x)?;
            let sh = match &e.shared {
                Some(s) => Some(clamped_ffn(g, "ffn_shexp_", s, shexp, x)?),
                None => None,
            };
            let moe = g.moe_experts(&blk, x, route)?;
            match sh {
                Some(sh) => g.add("ffn_out", moe, sh),
                None => Ok(moe),
            }
        }
    }
}

/// Layer `il`'s mixer (KDA or MLA) of the normed `x`; `sel` carries the last full indexer's
/// selection to the shared-indexer layers after it.
pub fn mixer(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    (il, l): (u32, &Layer),
    x: TensorId,
    inp: &LmInputs,
    sel: &mut Option<TensorId>,
) -> Result<TensorId, PluginError> {
    match (&l.mixer, m.state.get(il as usize).copied()) {
        (Mixer::Kda(w), Some(LayerState::Kda(s))) => {
            let ki = KdaInputs {
                slots: inp.slots,
                positions: inp.positions,
                verify: m.verify,
            };
            kda_layer(g, &m.hp.kda, w, &s, x, &ki)
        }
        (Mixer::Mla(w), Some(LayerState::Mla { latent, indexer })) => {
            let st = MlaState { latent, indexer };
            mla_layer(g, m.hp, w, st, x, inp, sel)
        }
        _ => Err(PluginError::invalid(format!(
            "layer {il}: weights and state disagree"
        ))),
    }
}

/// The trunk of `shape`'s rows: the mean of the final streams, `[n_embd, rows]` (`hc_head`,
/// every row, before the final norm), with the batch inputs.
pub fn trunk(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    shape: BatchShape,
) -> Result<(TensorId, LmInputs), PluginError> {
    let hp = m.hp;
    let eps = hp.lm.eps;
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let x = g.embed(&m.w.trunk.globals, &inp)?;
    let (hc, mut streams) = Hc::init(g, hp.hc, eps, x)?;
    let mut sel = None;
    for (il, l) in m.w.trunk.layers.iter().enumerate() {
        let il = il as u32;
        g.set_layer(il as i32);
        let [hc_attn, hc_ffn] =
            l.hc.as_ref()
                .ok_or_else(|| PluginError::invalid(format!("layer {il}: no hyper-connections")))?;
        let (cur, mix) = hc.pre(g, hc_attn, streams, "hc_attn")?;
        let an = g.w(&l.attn_norm)?;
        let cur = g.rms_norm("attn_norm", cur, Some(an), eps)?;
        let cur = mixer(m, g, (il, l), cur, &inp, &mut sel)?;
        streams = hc.post(g, &mix, streams, cur, "hc_attn")?;
        let (cur, mix) = hc.pre(g, hc_ffn, streams, "hc_ffn")?;
        let fnorm = g.w(&l.ffn_norm)?;
        let cur = g.rms_norm("ffn_norm", cur, Some(fnorm), eps)?;
        let cur = ffn(g, hp, il, &l.ffn, cur)?;
        streams = hc.post(g, &mix, streams, cur, "l_out")?;
    }
    g.set_layer(-1);
    Ok((hc.mean(g, streams)?, inp))
}

/// Builds the trunk's graph for `shape`: the wanted rows of the streams' mean, `output_norm`
/// (`result_norm`) and the head: `logits` `[n_vocab, n_outputs]`.
pub fn build(m: &Model<'_>, shape: BatchShape) -> Result<Graph, PluginError> {
    let mut g = GraphBuilder::new();
    let (mean, inp) = trunk(m, &mut g, shape)?;
    let x = g.select_outputs(mean, &inp)?;
    let logits = g.lm_head(&m.w.trunk.globals, x, m.hp.lm.eps)?;
    g.output("logits", logits);
    Ok(g.finish())
}
