//! Presets for `bloomery synth`: a synthetic model's metadata, written under the architecture's
//! prefix, and its tensors, listed by the plugin's own weight declarations read against that
//! metadata, so that a synthetic file always holds what the plugin loads. The host writes the
//! file and fills the tensors with random values.

use abi_stable::std_types::RVec;

use crate::meta::{MetaEntry, MetaValue, ModelFileView, TensorInfo};
use crate::model::{ModelInstance, SynthPreset, SynthTensor, WeightClass};
use crate::weights::WeightTable;
use crate::{DType, PluginError};

/// Builds a [`SynthPreset`]: metadata in the order written, then the tensors.
pub struct PresetBuilder {
    arch: String,
    name: String,
    description: String,
    n_vocab: u32,
    metadata: Vec<MetaEntry>,
    optional: Vec<&'static str>,
    ranges: Vec<(&'static str, [f32; 2])>,
    stand_ins: Vec<(&'static str, [u64; 4])>,
}

impl PresetBuilder {
    /// A preset `name` of architecture `arch` with a vocabulary of `n_vocab` tokens; its metadata
    /// starts with `general.architecture` and `general.name` (`synthetic {arch} {name}`).
    pub fn new(arch: &str, name: &str, description: &str, n_vocab: u32) -> Self {
        let metadata = vec![
            MetaEntry::new("general.architecture", MetaValue::String(arch.into())),
            MetaEntry::new(
                "general.name",
                MetaValue::String(format!("synthetic {arch} {name}").into()),
            ),
        ];
        PresetBuilder {
            arch: arch.to_owned(),
            name: name.to_owned(),
            description: description.to_owned(),
            n_vocab,
            metadata,
            optional: Vec::new(),
            ranges: Vec::new(),
            stand_ins: Vec::new(),
        }
    }

    /// Adds `{arch}.{key}` = `value`.
    pub fn value(mut self, key: &str, value: MetaValue) -> Self {
        let key = format!("{}.{key}", self.arch);
        self.metadata.push(MetaEntry::new(&key, value));
        self
    }

    /// Adds `key` = `value` as written (a key outside the architecture's, such as a named chat
    /// template).
    pub fn global(mut self, key: &str, value: MetaValue) -> Self {
        self.metadata.push(MetaEntry::new(key, value));
        self
    }

    /// The declaring loader sees a tensor `name` of extents `ne` (one whose shape gives a size no
    /// key records, such as a decision head's width); the preset's own tensor is declared as usual.
    pub fn stand_in(mut self, name: &'static str, ne: [u64; 4]) -> Self {
        self.stand_ins.push((name, ne));
        self
    }

    /// Adds `{arch}.{key}` as a `u32`.
    pub fn u32(self, key: &str, v: u32) -> Self {
        self.value(key, MetaValue::U32(v))
    }

    /// Adds `{arch}.{key}` as an `f32`.
    pub fn f32(self, key: &str, v: f32) -> Self {
        self.value(key, MetaValue::F32(v))
    }

    /// Adds `{arch}.{key}` as an array of `u32`.
    pub fn u32s(self, key: &str, v: &[u32]) -> Self {
        self.value(
            key,
            MetaValue::Array(v.iter().map(|&x| MetaValue::U32(x)).collect()),
        )
    }

    /// Adds `block_count`, `context_length` and `embedding_length`.
    pub fn model(self, n_layer: u32, n_ctx: u32, n_embd: u32) -> Self {
        self.u32("block_count", n_layer)
            .u32("context_length", n_ctx)
            .u32("embedding_length", n_embd)
    }

    /// Adds `attention.head_count`, `attention.head_count_kv`, and `attention.key_length` and
    /// `attention.value_length` (both `head_dim`).
    pub fn attention(self, n_head: u32, n_head_kv: u32, head_dim: u32) -> Self {
        self.u32("attention.head_count", n_head)
            .u32("attention.head_count_kv", n_head_kv)
            .u32("attention.key_length", head_dim)
            .u32("attention.value_length", head_dim)
    }

    /// Adds `expert_count`, `expert_used_count` and `expert_feed_forward_length`.
    pub fn experts(self, n_expert: u32, n_used: u32, n_ff_exp: u32) -> Self {
        self.u32("expert_count", n_expert)
            .u32("expert_used_count", n_used)
            .u32("expert_feed_forward_length", n_ff_exp)
    }

    /// Writes the optional weight `name` (e.g. `output.weight`, an untied head); optional
    /// weights not named are left out.
    pub fn with_tensor(mut self, name: &'static str) -> Self {
        self.optional.push(name);
        self
    }

    /// Float values of every layer's tensor `blk.{i}.{name}` (or of the tensor named `name`
    /// exactly) are drawn from `[lo, hi]` (decay rates that must stay negative, biases of one
    /// sign); the others get the host's range for
    /// their class.
    pub fn range(mut self, name: &'static str, lo: f32, hi: f32) -> Self {
        self.ranges.push((name, [lo, hi]));
        self
    }

    /// The preset, its tensors listed by `declare`: given a view of this metadata and of the
    /// embedding table (`[embedding_length, n_vocab]`), it reads the hyperparameters and declares
    /// every weight into the table as the plugin's loader does. A preset whose metadata does not
    /// read back has no tensors and names the error in its description, so that `bloomery synth
    /// --list` shows it and `bloomery synth` refuses it (no panic crosses the plugin boundary).
    pub fn build(
        self,
        declare: impl FnOnce(&ModelFileView, &mut WeightTable<'_>) -> Result<(), PluginError>,
    ) -> SynthPreset {
        let (tensors, description) = match self.tensors(declare) {
            Ok(t) => (t, self.description.clone()),
            Err(e) => (RVec::new(), format!("cannot be built: {e}")),
        };
        SynthPreset {
            name: self.name.as_str().into(),
            description: description.into(),
            metadata: self.metadata.into(),
            tensors,
        }
    }

    fn tensors(
        &self,
        declare: impl FnOnce(&ModelFileView, &mut WeightTable<'_>) -> Result<(), PluginError>,
    ) -> Result<RVec<SynthTensor>, PluginError> {
        let view = ModelFileView {
            metadata: self.metadata.clone().into(),
            tensors: RVec::new(),
        };
        let n_embd = view.u32(&format!("{}.embedding_length", self.arch))?;
        let n_layer = view.u32(&format!("{}.block_count", self.arch))?;
        let tensor = |name: String, ne: [u64; 4]| TensorInfo {
            name: name.into(),
            dtype: DType::F32,
            n_dims: 2,
            ne,
        };
        // The embedding, and one stand-in tensor per layer so that the hyperparameter checks
        // against the file's tensors see the layers the preset declares.
        let embd = [u64::from(n_embd), u64::from(self.n_vocab), 1, 1];
        let mut tensors = vec![tensor("token_embd.weight".into(), embd)];
        tensors.extend((0..n_layer).map(|il| tensor(format!("blk.{il}.synth"), [1; 4])));
        tensors.extend(self.stand_ins.iter().map(|&(n, ne)| tensor(n.into(), ne)));
        let view = ModelFileView {
            tensors: tensors.into(),
            ..view
        };
        let mut table = WeightTable::synth(&self.optional);
        declare(&view, &mut table)?;
        Ok(table
            .into_synth_tensors()
            .into_iter()
            .map(|t| match self.range_of(t.name.as_str()) {
                Some([lo, hi]) => t.with_range(lo, hi),
                None => t,
            })
            .collect())
    }

    fn range_of(&self, tensor: &str) -> Option<[f32; 2]> {
        if let Some(&(_, r)) = self.ranges.iter().find(|(n, _)| *n == tensor) {
            return Some(r);
        }
        let (_, name) = tensor.strip_prefix("blk.")?.split_once('.')?;
        self.ranges
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, r)| r)
    }
}

/// Loads each preset's file view ([`SynthPreset::file_view`]) with `load` and checks that the model
/// declares exactly the preset's tensors: a plugin's test that its presets and its loader agree.
pub fn check_presets<M: ModelInstance>(
    presets: &[SynthPreset],
    load: impl Fn(&ModelFileView) -> Result<M, PluginError>,
) -> Result<(), String> {
    for p in presets {
        let m = load(&p.file_view(DType::F32)).map_err(|e| format!("{}: {e}", p.name))?;
        let (declared, listed) = (m.spec().weights.len(), p.tensors.len());
        if declared != listed {
            return Err(format!(
                "{}: {declared} weights declared, {listed} tensors listed",
                p.name
            ));
        }
    }
    Ok(())
}

impl SynthPreset {
    /// The file view a model plugin's loader would get for this preset, every tensor stored as
    /// `dtype` but id tables, which stay I32 (for tests of a plugin's loader and graph without
    /// writing a file).
    pub fn file_view(&self, dtype: DType) -> ModelFileView {
        ModelFileView {
            metadata: self.metadata.clone(),
            tensors: self
                .tensors
                .iter()
                .map(|t| TensorInfo {
                    name: t.name.clone(),
                    dtype: match t.class {
                        WeightClass::Index => DType::I32,
                        _ => dtype,
                    },
                    n_dims: t.n_dims,
                    ne: t.ne,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hparams::{ArchKeys, LmHParams};
    use crate::weights::ModelWeights;

    fn tiny(n_head_kv: u32) -> SynthPreset {
        PresetBuilder::new("a", "tiny", "two layers", 32)
            .model(2, 64, 8)
            .attention(2, n_head_kv, 4)
            .f32("attention.layer_norm_rms_epsilon", 1e-6)
            .range("ffn_down.weight", -0.5, 0.5)
            .build(|view, t| {
                let lm = LmHParams::read(&ArchKeys::new(view, "a"))?;
                ModelWeights::declare(t, &lm, |l| l.glu_ffn("", WeightClass::Ffn, 8, 16)).map(drop)
            })
    }

    #[test]
    fn a_preset_lists_the_weights_its_metadata_declares() {
        let p = tiny(1);
        let keys: Vec<&str> = p.metadata.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys[..3],
            ["general.architecture", "general.name", "a.block_count"]
        );
        assert_eq!(p.metadata[1].value.as_str(), Some("synthetic a tiny"));
        assert_eq!(p.tensors.len(), 2 + 2 * 3);
        let ranged: Vec<&str> = p
            .tensors
            .iter()
            .filter(|t| t.range == [-0.5, 0.5])
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(ranged, ["blk.0.ffn_down.weight", "blk.1.ffn_down.weight"]);
        let view = p.file_view(DType::F32);
        assert_eq!(
            view.tensor("blk.1.ffn_up.weight").map(|t| t.ne),
            Some([8, 16, 1, 1])
        );
    }

    #[test]
    fn a_preset_that_does_not_read_back_names_the_error_and_has_no_tensors() {
        let p = tiny(3);
        assert!(p.tensors.is_empty());
        assert_eq!(
            p.description.as_str(),
            "cannot be built: metadata key `a.attention.head_count_kv`: 3 KV heads do not divide 2 heads"
        );
    }
}
