//! `bloomery synth`: random-weight GGUF files with an architecture's real tensor names, shapes and
//! metadata (from its model plugin's presets), a loadable vocabulary, and per-class quant types.

pub mod depth;
pub mod fill;
pub mod vocab;

use std::path::Path;

use bloomery_gguf::{GgufWriter, Value};
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::model::{SynthPreset, SynthTensor, WeightClass};
use bloomery_plugin_api::DType;

/// Types per weight class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassTypes {
    /// Routed experts.
    pub experts: DType,
    /// Attention projections.
    pub attention: DType,
    /// Token embedding.
    pub embedding: DType,
    /// Output head.
    pub output: DType,
    /// Dense and shared-expert FFNs.
    pub dense: DType,
}

impl ClassTypes {
    /// The type a tensor of `class` and shape `ne` is written in: I32 for an id table; its
    /// class's type for matrices, f32 for a tensor of one row (a bias or a gate vector), as
    /// llama.cpp's quantizer keeps every tensor of fewer than two dimensions (trailing 1s not
    /// counted) in f32.
    pub fn for_tensor(&self, class: WeightClass, ne: &[u64]) -> DType {
        let dims = ne.iter().rposition(|&n| n != 1).map_or(0, |i| i + 1);
        if class == WeightClass::Index {
            DType::I32
        } else if dims < 2 {
            DType::F32
        } else {
            self.of(class)
        }
    }

    /// The type of a class (norms, routers and the rest stay f32).
    pub fn of(&self, class: WeightClass) -> DType {
        match class {
            WeightClass::Experts => self.experts,
            WeightClass::Attention => self.attention,
            WeightClass::Embedding => self.embedding,
            WeightClass::Output => self.output,
            WeightClass::Ffn | WeightClass::SharedExpert => self.dense,
            _ => DType::F32,
        }
    }
}

/// Types per tensor: the class types, and the routed experts' down projections apart when asked
/// (a Q4_K_M-style mix keeps them one type wider than gate and up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorTypes {
    /// Types per class.
    pub classes: ClassTypes,
    /// Type of the routed experts' down projections (`*.ffn_down_exps.weight`); `None` = the
    /// experts' type.
    pub experts_down: Option<DType>,
    /// Type of the hashed n-gram tables (`WeightClass::NgramTable`: Qwen3.8's PLE table, IQ4_NL
    /// in the published file; DeepSeek-V4.1's Engram tables); `None` = f32.
    pub ngram: Option<DType>,
}

impl TensorTypes {
    /// The type tensor `t` is written in.
    pub fn of(&self, t: &SynthTensor) -> DType {
        match self.experts_down {
            Some(down)
                if t.class == WeightClass::Experts
                    && t.name.as_str().ends_with(".ffn_down_exps.weight") =>
            {
                down
            }
            _ if t.class == WeightClass::NgramTable => self.ngram.unwrap_or(DType::F32),
            _ => self.classes.for_tensor(t.class, &t.ne[..t.n_dims as usize]),
        }
    }
}

impl From<ClassTypes> for TensorTypes {
    fn from(classes: ClassTypes) -> TensorTypes {
        TensorTypes {
            classes,
            experts_down: None,
            ngram: None,
        }
    }
}

fn to_value(v: &MetaValue) -> Result<Value, String> {
    Ok(match v {
        MetaValue::U8(x) => Value::U8(*x),
        MetaValue::I8(x) => Value::I8(*x),
        MetaValue::U16(x) => Value::U16(*x),
        MetaValue::I16(x) => Value::I16(*x),
        MetaValue::U32(x) => Value::U32(*x),
        MetaValue::I32(x) => Value::I32(*x),
        MetaValue::U64(x) => Value::U64(*x),
        MetaValue::I64(x) => Value::I64(*x),
        MetaValue::F32(x) => Value::F32(*x),
        MetaValue::F64(x) => Value::F64(*x),
        MetaValue::Bool(x) => Value::Bool(*x),
        MetaValue::String(s) => Value::String(s.to_string()),
        MetaValue::Array(items) => Value::Array(
            array(items)
                .ok_or_else(|| format!("preset array of mixed or unsupported types: {v:?}"))?,
        ),
    })
}

/// A GGUF array of the items' one element type (u32 when empty); `None` when they mix types or
/// are strings or arrays.
fn array(items: &[MetaValue]) -> Option<bloomery_gguf::Array> {
    use bloomery_gguf::Array;
    fn all<T>(items: &[MetaValue], f: impl Fn(&MetaValue) -> Option<T>) -> Option<Vec<T>> {
        items.iter().map(f).collect()
    }
    macro_rules! of {
        ($variant:ident) => {
            Array::$variant(all(items, |i| match i {
                MetaValue::$variant(x) => Some(*x),
                _ => None,
            })?)
        };
    }
    Some(match items.first() {
        None | Some(MetaValue::U32(_)) => of!(U32),
        Some(MetaValue::I32(_)) => of!(I32),
        Some(MetaValue::U64(_)) => of!(U64),
        Some(MetaValue::I64(_)) => of!(I64),
        Some(MetaValue::F32(_)) => of!(F32),
        Some(MetaValue::Bool(_)) => of!(Bool),
        _ => return None,
    })
}

/// What a synth run wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthReport {
    /// Bytes written.
    pub bytes: u64,
    /// Tensors written.
    pub tensors: usize,
}

/// Writes `preset` to `path` with the given types and seed.
pub fn write(
    preset: &SynthPreset,
    types: ClassTypes,
    seed: u64,
    path: &Path,
) -> anyhow::Result<SynthReport> {
    write_reporting(preset, types.into(), seed, path, &mut |_, _| {})
}

/// As [`write`], calling `progress(bytes, total)` after each tensor with the tensor bytes
/// written so far and in all.
pub fn write_reporting(
    preset: &SynthPreset,
    types: TensorTypes,
    seed: u64,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<SynthReport> {
    let mut w = GgufWriter::new();
    let mut n_vocab = None;
    for e in preset.metadata.iter() {
        w.set(
            e.key.as_str(),
            to_value(&e.value).map_err(anyhow::Error::msg)?,
        )?;
    }
    let mut ranges = Vec::new();
    for t in preset.tensors.iter() {
        let shape = &t.ne[..t.n_dims as usize];
        let dtype = types.of(t);
        let ids = t.class == WeightClass::Index;
        if !(ids || fill::SYNTH_TYPES.contains(&dtype)) {
            anyhow::bail!(
                "synth cannot write {dtype} (it writes {:?})",
                fill::SYNTH_TYPES
            );
        }
        if dtype.row_bytes(shape[0]).is_none() {
            anyhow::bail!(
                "tensor `{}`: rows of {} values are not whole {dtype} blocks; pick another type for {:?}",
                t.name,
                shape[0],
                t.class
            );
        }
        if t.class == WeightClass::Embedding {
            n_vocab = Some(shape[1] as usize);
        }
        w.add_tensor(t.name.as_str(), dtype, shape)?;
        ranges.push(fill::float_range(t.class, t.range));
    }
    let n_vocab = n_vocab
        .ok_or_else(|| anyhow::anyhow!("preset `{}` has no embedding table", preset.name))?;
    let v = vocab::build(n_vocab).map_err(anyhow::Error::msg)?;
    for (k, val) in vocab::metadata(&v) {
        w.set(&k, val)?;
    }
    let mut index = 0usize;
    let total: u64 = w.tensors().iter().map(|t| t.size).sum();
    let mut done = 0u64;
    let bytes = w.write_file(path, |t, sink| {
        let range = ranges
            .get(index)
            .copied()
            .unwrap_or(fill::float_range(WeightClass::Other, [0.0; 2]));
        index += 1;
        let mut rng = fill::Rng::for_tensor(seed, &t.name);
        // Only an id table is I32 (`ClassTypes::for_tensor`).
        match t.dtype {
            DType::I32 => fill::write_ids(sink, &mut rng, t.shape[0], range, t.size)?,
            dtype => fill::write_tensor(sink, &mut rng, dtype, range, t.size)?,
        }
        done += t.size;
        progress(done, total);
        Ok(())
    })?;
    Ok(SynthReport {
        bytes,
        tensors: preset.tensors.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_gguf::Array;

    fn f32s() -> ClassTypes {
        ClassTypes {
            experts: DType::F32,
            attention: DType::F32,
            embedding: DType::F32,
            output: DType::F32,
            dense: DType::F32,
        }
    }

    /// A preset of an embedding table, a dense down projection and one layer's expert stacks.
    fn preset() -> SynthPreset {
        let t = |name: &str, class, ne: &[u64]| SynthTensor::new(name.to_owned(), class, ne);
        SynthPreset {
            name: "down".into(),
            description: "expert stacks".into(),
            metadata: Default::default(),
            tensors: vec![
                t("token_embd.weight", WeightClass::Embedding, &[256, 300]),
                t("blk.0.ffn_down.weight", WeightClass::Ffn, &[256, 256]),
                t(
                    "blk.0.ffn_gate_exps.weight",
                    WeightClass::Experts,
                    &[256, 256, 2],
                ),
                t(
                    "blk.0.ffn_up_exps.weight",
                    WeightClass::Experts,
                    &[256, 256, 2],
                ),
                t(
                    "blk.0.ffn_down_exps.weight",
                    WeightClass::Experts,
                    &[256, 256, 2],
                ),
            ]
            .into(),
        }
    }

    /// `--ngram` types the hashed n-gram tables and nothing else; without it they stay f32.
    #[test]
    fn the_ngram_tables_take_their_own_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ngram.gguf");
        let mut p = preset();
        p.tensors.push(SynthTensor::new(
            "per_layer_token_embd.weight".to_owned(),
            WeightClass::NgramTable,
            &[160, 64],
        ));
        for (ngram, want) in [(None, DType::F32), (Some(DType::IQ4_NL), DType::IQ4_NL)] {
            let types = TensorTypes {
                classes: ClassTypes {
                    embedding: DType::Q8_0,
                    ..f32s()
                },
                experts_down: None,
                ngram,
            };
            write_reporting(&p, types, 1, &path, &mut |_, _| {}).unwrap();
            let file = bloomery_gguf::GgufFile::open(&path).unwrap();
            let of = |name: &str| file.tensor(name).unwrap().dtype;
            assert_eq!(of("per_layer_token_embd.weight"), want);
            assert_eq!(of("token_embd.weight"), DType::Q8_0);
        }
    }

    #[test]
    fn the_experts_down_projections_take_their_own_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("down.gguf");
        let types = TensorTypes {
            classes: ClassTypes {
                experts: DType::Q4_K,
                dense: DType::Q8_0,
                ..f32s()
            },
            experts_down: Some(DType::Q5_K),
            ngram: None,
        };
        write_reporting(&preset(), types, 1, &path, &mut |_, _| {}).unwrap();
        let file = bloomery_gguf::GgufFile::open(&path).unwrap();
        let of = |name: &str| file.tensor(name).unwrap().dtype;
        assert_eq!(of("blk.0.ffn_gate_exps.weight"), DType::Q4_K);
        assert_eq!(of("blk.0.ffn_up_exps.weight"), DType::Q4_K);
        assert_eq!(of("blk.0.ffn_down_exps.weight"), DType::Q5_K);
        assert_eq!(of("blk.0.ffn_down.weight"), DType::Q8_0);
        assert_eq!(of("token_embd.weight"), DType::F32);
        // Without a type of their own they take the experts'.
        let same = TensorTypes::from(types.classes);
        assert_eq!(same.of(&preset().tensors[4]), DType::Q4_K);
    }

    fn arr(items: Vec<MetaValue>) -> Result<Value, String> {
        to_value(&MetaValue::Array(items.into()))
    }

    /// qwen4exp's presets write bool flags (`attention.recurrent_layers`) and u64 hash constants
    /// (`ple.head_offsets`), as the b11434 converter does.
    #[test]
    fn arrays_keep_their_element_type() {
        let b = arr(vec![MetaValue::Bool(true), MetaValue::Bool(false)]);
        assert_eq!(b, Ok(Value::Array(Array::Bool(vec![true, false]))));
        let u = arr(vec![MetaValue::U64(1 << 40), MetaValue::U64(3)]);
        assert_eq!(u, Ok(Value::Array(Array::U64(vec![1 << 40, 3]))));
        let i = arr(vec![MetaValue::I64(-1)]);
        assert_eq!(i, Ok(Value::Array(Array::I64(vec![-1]))));
        let i = arr(vec![MetaValue::I32(-1), MetaValue::I32(4)]);
        assert_eq!(i, Ok(Value::Array(Array::I32(vec![-1, 4]))));
        assert_eq!(arr(vec![]), Ok(Value::Array(Array::U32(vec![]))));
        assert!(arr(vec![MetaValue::U32(1), MetaValue::U64(2)]).is_err());
        assert!(arr(vec![MetaValue::String("a".into())]).is_err());
    }
}
