//! The loaded model of an architecture whose only state is a key and a value cache per layer over
//! the whole context (no recurrent state, no sliding window): its loader and [`ModelInstance`],
//! so that such an architecture's plugin holds only its hyperparameters ([`ArchHParams`]),
//! weights and graph ([`KvArchitecture`]), and presets.

use abi_stable::std_types::RResult;

use crate::builders::kv_cache_decls;
use crate::graph::{BatchShape, Graph};
use crate::hparams::{ArchKeys, LmHParams, RopeConfig};
use crate::meta::ModelFileView;
use crate::model::{HParams as Summary, ModelCaps, ModelInstance, ModelSpec};
use crate::op::{RopeMode, RopeParams};
use crate::weights::{ModelWeights, WeightTable};
use crate::PluginError;

/// Typed hyperparameters of an architecture, read once from the file's metadata.
pub trait ArchHParams: Sized + Send + Sync + 'static {
    /// Reads them; a missing or mistyped key is a named error.
    fn read(view: &ModelFileView) -> Result<Self, PluginError>;

    /// The part every causal LM has.
    fn lm(&self) -> &LmHParams;

    /// The summary the host shows and plans with.
    fn summary(&self) -> Summary;

    /// What the host reads before it touches a weight: by default K/V state only, no MTP
    /// layers, the training context as the longest.
    fn caps(&self) -> ModelCaps {
        ModelCaps::kv_only(u64::from(self.lm().n_ctx_train))
    }
}

/// An architecture served through [`KvModel`]: what its plugin declares.
pub trait KvArchitecture: Sized + 'static {
    /// `general.architecture`.
    const ARCH: &'static str;
    /// How its rotary embedding rotates.
    const ROPE: RopeMode;
    /// Typed hyperparameters.
    type HParams: ArchHParams;
    /// The weights of one layer.
    type Layer: Send + Sync + 'static;

    /// Declares every weight into `t` (checked against a file, or listed for `bloomery synth`).
    fn weights(
        t: &mut WeightTable<'_>,
        hp: &Self::HParams,
    ) -> Result<ModelWeights<Self::Layer>, PluginError>;

    /// Builds the forward graph of `m` for `shape`.
    fn graph(m: &KvModel<Self>, shape: BatchShape) -> Result<Graph, PluginError>;
}

/// A loaded model of architecture `A`.
pub struct KvModel<A: KvArchitecture> {
    /// Hyperparameters.
    pub hp: A::HParams,
    /// Weights.
    pub weights: ModelWeights<A::Layer>,
    /// Rotary parameters (`{arch}.rope.*`, rotation `A::ROPE`).
    pub rope: RopeParams,
}

impl<A: KvArchitecture> KvModel<A> {
    /// Reads hyperparameters, weights and rotary settings from the file view; a file of another
    /// architecture is refused by name.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        view.expect_architecture(A::ARCH)?;
        let hp = A::HParams::read(view)?;
        let weights = A::weights(&mut WeightTable::new(view), &hp)?;
        let keys = ArchKeys::new(view, A::ARCH);
        let rope = RopeConfig::read(&keys, A::ROPE, hp.lm().attn.head_dim)?.params;
        Ok(KvModel { hp, weights, rope })
    }

    /// The weights a synthetic file of this architecture holds, declared into `t` from the
    /// metadata in `view` (for [`crate::synth::PresetBuilder::build`]).
    pub fn declare(view: &ModelFileView, t: &mut WeightTable<'_>) -> Result<(), PluginError> {
        A::weights(t, &A::HParams::read(view)?).map(drop)
    }
}

impl<A: KvArchitecture> ModelInstance for KvModel<A> {
    fn spec(&self) -> ModelSpec {
        let lm = self.hp.lm();
        ModelSpec {
            architecture: A::ARCH.into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone(),
            state: kv_cache_decls(lm.n_layer, lm.attn.kv_width(), |_| 0),
            caps: self.hp.caps(),
            ngram: abi_stable::std_types::ROption::RNone,
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        A::graph(self, shape).into()
    }
}
