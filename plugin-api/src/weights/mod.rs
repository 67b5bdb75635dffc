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

use crate::hparams::LmHParams;
use crate::meta::ModelFileView;
use crate::model::{SynthTensor, WeightClass, WeightDecl, WeightRole};
use crate::{DType, PluginError};

mod layer;

pub use layer::{AttentionWeights, ExpertWeights, GluFfnWeights, LayerWeights, PreNormLayer};

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

/// Collects the weights a model declares, checking each against the file (or listing it for a
/// synthetic file).
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

    /// A table that lists every declaration as a tensor of a synthetic file (F32, or I32 for an
    /// id table, in the declared shape); an optional weight is there when `optional` names it, or names it with `*` for
    /// its layer (`blk.*.attn_q.bias`: that tensor of every layer).
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

    /// Declares a weight that must exist with one of the extents `shapes` (converters write
    /// some tensors with or without unit axes); a synthetic file gets the first.
    pub fn require_one_of(
        &mut self,
        name: &str,
        role: WeightRole,
        class: WeightClass,
        shapes: &[&[u64]],
    ) -> Result<WeightRef, PluginError> {
        let padded = |ne: &[u64]| {
            let mut full = [1u64; 4];
            full[..ne.len().min(4)].copy_from_slice(&ne[..ne.len().min(4)]);
            full
        };
        let pick = match &self.source {
            Source::File(view) => view
                .tensor(name)
                .and_then(|t| shapes.iter().find(|s| padded(s) == t.ne)),
            Source::Synth { .. } => shapes.first(),
        };
        match pick {
            Some(ne) => self.require(name, role, class, ne),
            None => self.require(name, role, class, shapes.first().copied().unwrap_or(&[])),
        }
    }

    /// The extents of the file's tensor `name` (None when absent, or for a synthetic table).
    pub fn found_shape(&self, name: &str) -> Option<[u64; 4]> {
        match &self.source {
            Source::File(view) => view.tensor(name).map(|t| t.ne),
            Source::Synth { .. } => None,
        }
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
                if (class == WeightClass::Index) != (t.dtype == DType::I32) {
                    return Err(PluginError::BadTensor {
                        name: name.into(),
                        message: format!(
                            "type {} (an id table is I32, and only an id table is)",
                            t.dtype
                        )
                        .into(),
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
                if !required && !optional.iter().any(|o| names_optional(o, name)) {
                    return Ok(None);
                }
                self.synth
                    .push(SynthTensor::new(name.to_owned(), class, ne));
                SynthTensor::dtype_of(class)
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

    /// Every declaration so far, in index order.
    pub fn decls(&self) -> Vec<WeightDecl> {
        self.decls.clone()
    }

    /// The file the declarations are checked against (`None` for a synthetic file).
    pub fn file(&self) -> Option<&'v ModelFileView> {
        match self.source {
            Source::File(view) => Some(view),
            Source::Synth { .. } => None,
        }
    }

    /// The weights of layer `layer`.
    pub fn layer(&mut self, layer: u32) -> LayerWeights<'_, 'v> {
        LayerWeights::new(self, layer)
    }

    /// The tensors of a synthetic file ([`WeightTable::synth`]), in declaration order.
    pub(crate) fn into_synth_tensors(self) -> Vec<SynthTensor> {
        self.synth
    }
}

/// Whether the synthetic file's optional entry `pattern` names the tensor `name`: the same name,
/// or `blk.*.{rest}` for `blk.{i}.{rest}` of any layer `i`.
fn names_optional(pattern: &str, name: &str) -> bool {
    match (pattern.strip_prefix("blk.*."), name.strip_prefix("blk.")) {
        (Some(rest), Some(tail)) => tail
            .split_once('.')
            .is_some_and(|(layer, r)| r == rest && layer.bytes().all(|b| b.is_ascii_digit())),
        _ => pattern == name,
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

    /// A file view of Q8_0 tensors with these names and shapes.
    pub(super) fn file(tensors: &[(&str, [u64; 4])]) -> ModelFileView {
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
        let mut t = WeightTable::synth(&["blk.*.ffn_up.bias"]);
        let mut l = t.layer(3);
        assert!(l
            .optional_tensor("ffn_up.bias", WeightClass::Ffn, &[16])
            .unwrap()
            .is_some());
        assert!(l
            .optional_tensor("ffn_gate.bias", WeightClass::Ffn, &[16])
            .unwrap()
            .is_none());
        assert_eq!(t.into_synth_tensors()[0].name.as_str(), "blk.3.ffn_up.bias");
        assert!(!names_optional("blk.*.up.bias", "blk.x.up.bias"));
        assert!(!names_optional("blk.*.up.bias", "blk.1.2.up.bias"));
        let mut t = WeightTable::synth(&["output.weight"]);
        let g = t.lm_globals(8, 32).unwrap();
        assert_eq!(g.output.name, "output.weight");
        assert_eq!(t.into_synth_tensors().len(), 3);
    }
}
