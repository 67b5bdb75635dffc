//! The weight table a model plugin fills at load: every weight declared by its GGUF name, role
//! (global, layer, routed experts) and class with the shape the hyperparameters give, checked
//! against the file; and the groups of weights several architectures share (the LM's globals, a
//! GQA attention layer, a gated FFN, routed experts).
//!
//! A plugin writes its declarations once, as a function of a [`WeightTable`]: reading a file
//! ([`WeightTable::new`]) they are checked against its tensors; for `bloomery synth`
//! ([`WeightTable::synth`], through [`crate::synth::PresetBuilder`]) they list the tensors a
//! synthetic file holds, in the same order.

use abi_stable::std_types::RVec;

use crate::builders::{kv_cache_indices, AttentionBlock, MoeBlock};
use crate::hparams::{AttentionShape, LmHParams};
use crate::meta::ModelFileView;
use crate::model::{SynthTensor, WeightClass, WeightDecl, WeightRole};
use crate::op::{AttentionParams, GluKind, RopeParams, RouterParams};
use crate::{DType, PluginError};

/// A weight found in the file: its index in the model's weight list, type and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightRef {
    /// Index into `ModelSpec::weights`.
    pub index: u32,
    /// GGUF name.
    pub name: String,
    /// Type in the file.
    pub dtype: DType,
    /// Shape in the file.
    pub ne: [u64; 4],
}

/// What the declarations are checked against.
enum Source<'v> {
    /// A model file: each weight must be there with the declared shape.
    File(&'v ModelFileView),
    /// No file: each declaration becomes a tensor of a synthetic file; of the optional weights,
    /// those named are written.
    Synth { optional: &'v [&'v str] },
}

/// Collects the weights a model declares, checking each against the file.
pub struct WeightTable<'v> {
    source: Source<'v>,
    decls: Vec<WeightDecl>,
    synth: Vec<SynthTensor>,
}

impl<'v> WeightTable<'v> {
    /// A table that checks every declaration against `view`.
    pub fn new(view: &'v ModelFileView) -> Self {
        WeightTable {
            source: Source::File(view),
            decls: Vec::new(),
            synth: Vec::new(),
        }
    }

    /// A table that lists every declaration as a tensor of a synthetic file (F32, the declared
    /// shape); an optional weight is there when `optional` names it.
    pub fn synth(optional: &'v [&'v str]) -> Self {
        WeightTable {
            source: Source::Synth { optional },
            decls: Vec::new(),
            synth: Vec::new(),
        }
    }

    /// Declares a weight that must exist with the extents `ne` (1 to 4 dimensions, ne0 first).
    pub fn require(
        &mut self,
        name: &str,
        role: WeightRole,
        class: WeightClass,
        ne: &[u64],
    ) -> Result<WeightRef, PluginError> {
        self.declare(name, role, class, ne, true)?
            .ok_or_else(|| PluginError::MissingTensor { name: name.into() })
    }

    /// Declares a weight that may be absent; when present it must have the extents `ne`.
    pub fn optional(
        &mut self,
        name: &str,
        role: WeightRole,
        class: WeightClass,
        ne: &[u64],
    ) -> Result<Option<WeightRef>, PluginError> {
        self.declare(name, role, class, ne, false)
    }

    fn declare(
        &mut self,
        name: &str,
        role: WeightRole,
        class: WeightClass,
        ne: &[u64],
        required: bool,
    ) -> Result<Option<WeightRef>, PluginError> {
        if ne.is_empty() || ne.len() > 4 {
            return Err(PluginError::BadTensor {
                name: name.into(),
                message: format!("declared with {} dimensions (1 to 4)", ne.len()).into(),
            });
        }
        let mut full = [1u64; 4];
        full[..ne.len()].copy_from_slice(ne);
        let dtype = match &self.source {
            Source::File(view) => {
                let Some(t) = view.tensor(name) else {
                    return Ok(None);
                };
                if t.ne != full {
                    return Err(PluginError::BadTensor {
                        name: name.into(),
                        message: format!("expected shape {full:?}, found {:?}", t.ne).into(),
                    });
                }
                if t.dtype.layout().is_none() {
                    return Err(PluginError::BadTensor {
                        name: name.into(),
                        message: format!("unknown type {}", t.dtype).into(),
                    });
                }
                t.dtype
            }
            Source::Synth { optional } => {
                if !required && !optional.contains(&name) {
                    return Ok(None);
                }
                self.synth
                    .push(SynthTensor::new(name.to_owned(), class, ne));
                DType::F32
            }
        };
        let index = self.decls.len() as u32;
        self.decls.push(WeightDecl {
            name: name.into(),
            role,
            class,
        });
        Ok(Some(WeightRef {
            index,
            name: name.to_owned(),
            dtype,
            ne: full,
        }))
    }

    /// Declares the weights outside the layers of a causal LM: `token_embd` `[n_embd, n_vocab]`,
    /// `output_norm` and `output` (the embedding when the file ties them).
    pub fn lm_globals(&mut self, n_embd: u64, n_vocab: u64) -> Result<LmGlobals, PluginError> {
        let (e, v, g) = (n_embd, n_vocab, WeightRole::Global);
        let tok_embd = self.require("token_embd.weight", g, WeightClass::Embedding, &[e, v])?;
        let output_norm = self.require("output_norm.weight", g, WeightClass::Norm, &[e])?;
        let output = self
            .optional("output.weight", g, WeightClass::Output, &[e, v])?
            .unwrap_or_else(|| tok_embd.clone());
        Ok(LmGlobals {
            tok_embd,
            output_norm,
            output,
        })
    }

    /// The weights of layer `layer`.
    pub fn layer(&mut self, layer: u32) -> LayerWeights<'_, 'v> {
        LayerWeights { table: self, layer }
    }

    /// The tensors of a synthetic file ([`WeightTable::synth`]), in declaration order.
    pub(crate) fn into_synth_tensors(self) -> Vec<SynthTensor> {
        self.synth
    }
}

/// The weights outside the layers of a causal LM ([`WeightTable::lm_globals`]).
pub struct LmGlobals {
    /// Token embedding.
    pub tok_embd: WeightRef,
    /// Final norm.
    pub output_norm: WeightRef,
    /// Output head (the embedding when the file ties them).
    pub output: WeightRef,
}

/// The weights of one layer, named `blk.{layer}.{name}`.
pub struct LayerWeights<'t, 'v> {
    table: &'t mut WeightTable<'v>,
    layer: u32,
}

impl LayerWeights<'_, '_> {
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

impl AttentionWeights {
    /// The attention block of layer `layer`, over the caches [`crate::builders::kv_cache_decls`]
    /// declares for it, its QK-norms with ε `norm_eps`.
    pub fn block(
        &self,
        layer: u32,
        params: AttentionParams,
        rope: Option<RopeParams>,
        norm_eps: f32,
    ) -> AttentionBlock<'_> {
        let (k_cache, v_cache) = kv_cache_indices(layer);
        AttentionBlock {
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            wo: &self.wo,
            q_norm: Some(&self.q_norm),
            k_norm: Some(&self.k_norm),
            norm_eps,
            rope,
            params,
            k_cache,
            v_cache,
        }
    }
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

impl ExpertWeights {
    /// The experts' block with router parameters `route` and activation `glu` (no selection
    /// bias, no clamp).
    pub fn block(&self, route: RouterParams, glu: GluKind) -> MoeBlock<'_> {
        MoeBlock {
            router: &self.router,
            router_bias: None,
            route,
            gate: &self.gate,
            up: self.up.as_ref(),
            down: &self.down,
            glu,
            limit: 0.0,
        }
    }
}

/// Every weight of a causal LM whose layers hold an `L` each.
pub struct ModelWeights<L> {
    /// Embedding, final norm and head.
    pub globals: LmGlobals,
    /// Layers.
    pub layers: Vec<L>,
    /// Declarations in index order.
    pub decls: RVec<WeightDecl>,
}

impl<L> ModelWeights<L> {
    /// Declares the globals ([`WeightTable::lm_globals`]), then each of `lm.n_layer` layers with
    /// `layer`.
    pub fn declare(
        t: &mut WeightTable<'_>,
        lm: &LmHParams,
        mut layer: impl FnMut(&mut LayerWeights<'_, '_>) -> Result<L, PluginError>,
    ) -> Result<Self, PluginError> {
        let globals = t.lm_globals(u64::from(lm.n_embd), u64::from(lm.n_vocab))?;
        let layers = (0..lm.n_layer)
            .map(|il| layer(&mut t.layer(il)))
            .collect::<Result<Vec<L>, PluginError>>()?;
        Ok(ModelWeights {
            globals,
            layers,
            decls: t.decls.clone().into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::TensorInfo;

    fn file(tensors: &[(&str, [u64; 4])]) -> ModelFileView {
        ModelFileView {
            metadata: RVec::new(),
            tensors: tensors
                .iter()
                .map(|(name, ne)| TensorInfo {
                    name: (*name).into(),
                    dtype: DType::Q8_0,
                    n_dims: 2,
                    ne: *ne,
                })
                .collect(),
        }
    }

    #[test]
    fn a_file_must_hold_each_required_weight_with_its_shape() {
        let v = file(&[("blk.0.attn_norm.weight", [8, 1, 1, 1])]);
        let mut t = WeightTable::new(&v);
        let r = t.layer(0).norm("attn_norm", 8).unwrap();
        assert_eq!((r.index, r.dtype, r.ne), (0, DType::Q8_0, [8, 1, 1, 1]));
        let e = t.layer(0).norm("attn_norm", 9).unwrap_err();
        assert!(matches!(e, PluginError::BadTensor { .. }), "{e}");
        let e = t.layer(1).norm("attn_norm", 8).unwrap_err();
        assert_eq!(
            e,
            PluginError::MissingTensor {
                name: "blk.1.attn_norm.weight".into()
            }
        );
    }

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

    #[test]
    fn a_synth_table_lists_required_and_named_optional_weights_in_order() {
        let mut t = WeightTable::synth(&[]);
        let g = t.lm_globals(8, 32).unwrap();
        assert_eq!(g.output, g.tok_embd);
        t.layer(2).glu_ffn("", WeightClass::Ffn, 8, 16).unwrap();
        let listed: Vec<(String, u32, [u64; 4])> = t
            .into_synth_tensors()
            .iter()
            .map(|s| (s.name.to_string(), s.n_dims, s.ne))
            .collect();
        let want = [
            ("token_embd.weight", 2, [8, 32, 1, 1]),
            ("output_norm.weight", 1, [8, 1, 1, 1]),
            ("blk.2.ffn_gate.weight", 2, [8, 16, 1, 1]),
            ("blk.2.ffn_up.weight", 2, [8, 16, 1, 1]),
            ("blk.2.ffn_down.weight", 2, [16, 8, 1, 1]),
        ]
        .map(|(n, d, ne)| (n.to_owned(), d, ne));
        assert_eq!(listed, want);
        let mut t = WeightTable::synth(&["output.weight"]);
        let g = t.lm_globals(8, 32).unwrap();
        assert_eq!(g.output.name, "output.weight");
        assert_eq!(t.into_synth_tensors().len(), 3);
    }
}
