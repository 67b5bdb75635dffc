//! One layer's weights, named `blk.{layer}.*`, and the groups several architectures share: GQA
//! attention with QK-norm, gated FFNs, routed experts, the pre-norm layer.

use crate::hparams::AttentionShape;
use crate::model::{WeightClass, WeightRole};
use crate::PluginError;

use super::{WeightRef, WeightTable};

/// The weights of one layer, named `blk.{layer}.{name}`.
pub struct LayerWeights<'t, 'v> {
    table: &'t mut WeightTable<'v>,
    layer: u32,
}

impl<'t, 'v> LayerWeights<'t, 'v> {
    pub(super) fn new(table: &'t mut WeightTable<'v>, layer: u32) -> Self {
        LayerWeights { table, layer }
    }

    /// The layer's index.
    pub fn index(&self) -> u32 {
        self.layer
    }

    /// Declares `blk.{layer}.{name}.weight` of the layer.
    pub fn weight(
        &mut self,
        name: &str,
        class: WeightClass,
        ne: &[u64],
    ) -> Result<WeightRef, PluginError> {
        self.tensor(&format!("{name}.weight"), class, ne)
    }

    /// Declares `blk.{layer}.{name}` of the layer (a tensor without the `.weight` suffix, such
    /// as a bias `ssm_dt.bias`).
    pub fn tensor(
        &mut self,
        name: &str,
        class: WeightClass,
        ne: &[u64],
    ) -> Result<WeightRef, PluginError> {
        let role = WeightRole::Layer { layer: self.layer };
        let full = format!("blk.{}.{name}", self.layer);
        self.table.require(&full, role, class, ne)
    }

    /// Declares `blk.{layer}.{name}` of the layer when the file holds it (a bias or norm some
    /// files of an architecture carry and others do not); when present it must have extents `ne`.
    pub fn optional_tensor(
        &mut self,
        name: &str,
        class: WeightClass,
        ne: &[u64],
    ) -> Result<Option<WeightRef>, PluginError> {
        let role = WeightRole::Layer { layer: self.layer };
        let full = format!("blk.{}.{name}", self.layer);
        self.table.optional(&full, role, class, ne)
    }

    /// The extents of the file's `blk.{layer}.{name}` (None when absent, or for a synthetic
    /// table), to tell variants apart before declaring.
    pub fn found_shape(&self, name: &str) -> Option<[u64; 4]> {
        self.table
            .found_shape(&format!("blk.{}.{name}", self.layer))
    }

    /// Declares `blk.{layer}.{name}` with one of the extents `shapes`
    /// ([`WeightTable::require_one_of`]).
    pub fn tensor_of_shapes(
        &mut self,
        name: &str,
        class: WeightClass,
        shapes: &[&[u64]],
    ) -> Result<WeightRef, PluginError> {
        let role = WeightRole::Layer { layer: self.layer };
        let full = format!("blk.{}.{name}", self.layer);
        self.table.require_one_of(&full, role, class, shapes)
    }

    /// Declares the norm weight `blk.{layer}.{name}.weight` of `width` elements.
    pub fn norm(&mut self, name: &str, width: u64) -> Result<WeightRef, PluginError> {
        self.weight(name, WeightClass::Norm, &[width])
    }

    /// Declares a GQA attention layer with QK-norm: `attn_q`, `attn_k`, `attn_v`,
    /// `attn_output`, `attn_q_norm`, `attn_k_norm`.
    pub fn attention(
        &mut self,
        n_embd: u64,
        shape: &AttentionShape,
    ) -> Result<AttentionWeights, PluginError> {
        self.attention_with_q(n_embd, shape, shape.q_width())
    }

    /// Declares a GQA attention layer with QK-norm whose query projection also holds an output
    /// gate: `attn_q` is `[n_embd, 2·head_dim·n_head]`, each head's query followed by its gate.
    pub fn gated_attention(
        &mut self,
        n_embd: u64,
        shape: &AttentionShape,
    ) -> Result<AttentionWeights, PluginError> {
        self.attention_with_q(n_embd, shape, 2 * shape.q_width())
    }

    fn attention_with_q(
        &mut self,
        e: u64,
        shape: &AttentionShape,
        q_out: u64,
    ) -> Result<AttentionWeights, PluginError> {
        let (q, kv, hd) = (shape.q_width(), shape.kv_width(), u64::from(shape.head_dim));
        let c = WeightClass::Attention;
        Ok(AttentionWeights {
            wq: self.weight("attn_q", c, &[e, q_out])?,
            wk: self.weight("attn_k", c, &[e, kv])?,
            wv: self.weight("attn_v", c, &[e, kv])?,
            wo: self.weight("attn_output", c, &[q, e])?,
            q_norm: self.norm("attn_q_norm", hd)?,
            k_norm: self.norm("attn_k_norm", hd)?,
        })
    }

    /// Declares a pre-norm layer: `attn_norm`, the attention ([`LayerWeights::attention`]),
    /// `ffn_norm`, then the FFN that `ffn` declares.
    pub fn pre_norm<F>(
        &mut self,
        n_embd: u64,
        shape: &AttentionShape,
        ffn: impl FnOnce(&mut Self) -> Result<F, PluginError>,
    ) -> Result<PreNormLayer<F>, PluginError> {
        Ok(PreNormLayer {
            attn_norm: self.norm("attn_norm", n_embd)?,
            attn: self.attention(n_embd, shape)?,
            ffn_norm: self.norm("ffn_norm", n_embd)?,
            ffn: ffn(self)?,
        })
    }

    /// Declares a gated FFN: `ffn_gate{suffix}`, `ffn_up{suffix}` `[n_embd, n_ff]` and
    /// `ffn_down{suffix}` `[n_ff, n_embd]` (suffix `""` for a dense FFN of class
    /// [`WeightClass::Ffn`], `"_shexp"` for a shared expert of class
    /// [`WeightClass::SharedExpert`]).
    pub fn glu_ffn(
        &mut self,
        suffix: &str,
        class: WeightClass,
        n_embd: u64,
        n_ff: u64,
    ) -> Result<GluFfnWeights, PluginError> {
        let (e, ff) = (n_embd, n_ff);
        Ok(GluFfnWeights {
            gate: self.weight(&format!("ffn_gate{suffix}"), class, &[e, ff])?,
            up: self.weight(&format!("ffn_up{suffix}"), class, &[e, ff])?,
            down: self.weight(&format!("ffn_down{suffix}"), class, &[ff, e])?,
        })
    }

    /// Declares routed experts: the router `ffn_gate_inp` `[n_embd, n_expert]`, then the stacks
    /// `[n_embd, n_ff, n_expert]`, a fused `ffn_gate_up_exps` (twice as wide) when the file has
    /// one, else `ffn_gate_exps` and `ffn_up_exps`, then `ffn_down_exps` `[n_ff, n_embd,
    /// n_expert]`.
    pub fn experts(
        &mut self,
        n_embd: u64,
        n_ff: u64,
        n_expert: u32,
    ) -> Result<ExpertWeights, PluginError> {
        let (e, ff, ne) = (n_embd, n_ff, u64::from(n_expert));
        let router = self.weight("ffn_gate_inp", WeightClass::Router, &[e, ne])?;
        let layer = self.layer;
        let role = WeightRole::RoutedExperts { layer, n_expert };
        let name = |s: &str| format!("blk.{layer}.{s}.weight");
        let (t, c) = (&mut *self.table, WeightClass::Experts);
        let (gate, up) = match t.optional(&name("ffn_gate_up_exps"), role, c, &[e, 2 * ff, ne])? {
            Some(gate_up) => (gate_up, None),
            None => (
                t.require(&name("ffn_gate_exps"), role, c, &[e, ff, ne])?,
                Some(t.require(&name("ffn_up_exps"), role, c, &[e, ff, ne])?),
            ),
        };
        Ok(ExpertWeights {
            router,
            gate,
            up,
            down: t.require(&name("ffn_down_exps"), role, c, &[ff, e, ne])?,
        })
    }
}

/// The weights of a pre-norm transformer layer: an RMS norm and GQA attention with QK-norm, then
/// an RMS norm and the FFN `F` ([`LayerWeights::pre_norm`]).
pub struct PreNormLayer<F> {
    /// Pre-attention RMS norm `attn_norm`.
    pub attn_norm: WeightRef,
    /// Attention.
    pub attn: AttentionWeights,
    /// Pre-FFN RMS norm `ffn_norm`.
    pub ffn_norm: WeightRef,
    /// The FFN.
    pub ffn: F,
}

/// A GQA attention layer's projections and QK-norms ([`LayerWeights::attention`]).
pub struct AttentionWeights {
    /// Query projection.
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

/// A gated FFN's projections ([`LayerWeights::glu_ffn`]).
pub struct GluFfnWeights {
    /// Gate projection.
    pub gate: WeightRef,
    /// Up projection.
    pub up: WeightRef,
    /// Down projection.
    pub down: WeightRef,
}

/// Routed experts' router and stacks ([`LayerWeights::experts`]).
pub struct ExpertWeights {
    /// Router.
    pub router: WeightRef,
    /// Gate stack, or fused gate+up stack.
    pub gate: WeightRef,
    /// Up stack (absent when fused).
    pub up: Option<WeightRef>,
    /// Down stack.
    pub down: WeightRef,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::tests::file;

    #[test]
    fn expert_stacks_are_fused_when_the_file_fuses_them() {
        let v = file(&[
            ("blk.0.ffn_gate_inp.weight", [8, 4, 1, 1]),
            ("blk.0.ffn_gate_up_exps.weight", [8, 32, 4, 1]),
            ("blk.0.ffn_down_exps.weight", [16, 8, 4, 1]),
        ]);
        let mut t = WeightTable::new(&v);
        let x = t.layer(0).experts(8, 16, 4).unwrap();
        assert!(x.up.is_none());
        assert_eq!(x.gate.name, "blk.0.ffn_gate_up_exps.weight");
        let roles: Vec<WeightRole> = t.decls.iter().map(|d| d.role).collect();
        let stack = WeightRole::RoutedExperts {
            layer: 0,
            n_expert: 4,
        };
        assert_eq!(roles, [WeightRole::Layer { layer: 0 }, stack, stack]);
    }
}
