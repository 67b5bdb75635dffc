//! Metadata overrides, as llama.cpp's `--override-kv KEY=TYPE:VALUE` (and the rope flags, which
//! the host turns into overrides of the rope keys): values put over the model file's metadata
//! before the host or a model plugin reads it.

use bloomery_gguf::{Metadata, Value};

/// An override's value, in llama.cpp's four types.
#[derive(Clone, Debug, PartialEq)]
pub enum OverrideValue {
    /// `int:`.
    Int(i64),
    /// `float:`.
    Float(f64),
    /// `bool:` (`true` or `false`).
    Bool(bool),
    /// `str:`.
    Str(String),
}

/// A metadata key and the value put over it.
#[derive(Clone, Debug, PartialEq)]
pub struct MetaOverride {
    /// The full key (`qwen3moe.rope.freq_base`).
    pub key: String,
    /// Its new value.
    pub value: OverrideValue,
}

impl MetaOverride {
    /// Parses llama.cpp's `KEY=TYPE:VALUE` (types `int`, `float`, `bool`, `str`), or says why not.
    pub fn parse(item: &str) -> Result<MetaOverride, String> {
        let bad = |why: &str| {
            format!("--override-kv {item:?}: {why} (KEY=TYPE:VALUE, types int, float, bool, str)")
        };
        let (key, typed) = item.split_once('=').ok_or_else(|| bad("no '='"))?;
        if key.is_empty() || key.len() >= 128 {
            return Err(bad("the key must have 1 to 127 bytes"));
        }
        let (kind, text) = typed.split_once(':').ok_or_else(|| bad("no type"))?;
        let value = match kind {
            "int" => OverrideValue::Int(text.parse().map_err(|_| bad("not an integer"))?),
            "float" => OverrideValue::Float(
                text.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| bad("not a finite number"))?,
            ),
            "bool" => match text {
                "true" => OverrideValue::Bool(true),
                "false" => OverrideValue::Bool(false),
                _ => return Err(bad("a bool is true or false")),
            },
            "str" if text.len() > 127 => return Err(bad("a string has at most 127 bytes")),
            "str" => OverrideValue::Str(text.to_owned()),
            _ => return Err(bad("unknown type")),
        };
        Ok(MetaOverride {
            key: key.to_owned(),
            value,
        })
    }

    /// The value to store over `present` (the key's value in the file, if any): a present
    /// key keeps its type, so an integer key takes only `int:` within its range, a float key
    /// `float:`, and so on; an absent key is added as i64, f64, bool or string.
    fn value_over(&self, present: Option<&Value>) -> Result<Value, String> {
        let mismatch = |v: &Value| {
            format!(
                "--override-kv {}: the file's value is a {}, which this override's type cannot replace",
                self.key,
                v.value_type().name()
            )
        };
        let range = |v: i64| format!("--override-kv {}: {v} is out of the key's range", self.key);
        Ok(match (&self.value, present) {
            (OverrideValue::Int(v), None) => Value::I64(*v),
            (OverrideValue::Float(v), None) => Value::F64(*v),
            (OverrideValue::Bool(v), None) => Value::Bool(*v),
            (OverrideValue::Str(v), None) => Value::String(v.clone()),
            (OverrideValue::Int(v), Some(p)) => {
                let v = *v;
                match p {
                    Value::U8(_) => Value::U8(v.try_into().map_err(|_| range(v))?),
                    Value::I8(_) => Value::I8(v.try_into().map_err(|_| range(v))?),
                    Value::U16(_) => Value::U16(v.try_into().map_err(|_| range(v))?),
                    Value::I16(_) => Value::I16(v.try_into().map_err(|_| range(v))?),
                    Value::U32(_) => Value::U32(v.try_into().map_err(|_| range(v))?),
                    Value::I32(_) => Value::I32(v.try_into().map_err(|_| range(v))?),
                    Value::U64(_) => Value::U64(v.try_into().map_err(|_| range(v))?),
                    Value::I64(_) => Value::I64(v),
                    other => return Err(mismatch(other)),
                }
            }
            (OverrideValue::Float(v), Some(Value::F32(_))) => Value::F32(*v as f32),
            (OverrideValue::Float(v), Some(Value::F64(_))) => Value::F64(*v),
            (OverrideValue::Bool(v), Some(Value::Bool(_))) => Value::Bool(*v),
            (OverrideValue::Str(v), Some(Value::String(_))) => Value::String(v.clone()),
            (_, Some(other)) => return Err(mismatch(other)),
        })
    }
}

/// Puts `overrides` over `meta`, in order, or says which one cannot go there.
pub fn apply(meta: &mut Metadata, overrides: &[MetaOverride]) -> Result<(), String> {
    for o in overrides {
        let value = o.value_over(meta.get(&o.key))?;
        meta.set(&o.key, value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_gguf::Entry;

    fn meta() -> Metadata {
        let mut m = Metadata::new("t.gguf");
        for (key, value) in [
            ("a.n", Value::U32(7)),
            ("a.f", Value::F32(1.5)),
            ("a.b", Value::Bool(true)),
            ("a.s", Value::String("x".into())),
        ] {
            m.push(Entry {
                key: key.into(),
                value,
                offset: 0,
            })
            .unwrap();
        }
        m
    }

    fn parsed(items: &[&str]) -> Vec<MetaOverride> {
        items
            .iter()
            .map(|i| MetaOverride::parse(i).unwrap())
            .collect()
    }

    #[test]
    fn llama_cpp_spellings_parse_and_bad_ones_are_named() {
        assert_eq!(
            MetaOverride::parse("tokenizer.ggml.add_bos_token=bool:false").unwrap(),
            MetaOverride {
                key: "tokenizer.ggml.add_bos_token".into(),
                value: OverrideValue::Bool(false)
            }
        );
        assert_eq!(
            MetaOverride::parse("k=str:a:b").unwrap().value,
            OverrideValue::Str("a:b".into())
        );
        for bad in [
            "k",
            "k=3",
            "=int:3",
            "k=int:x",
            "k=bool:yes",
            "k=float:nan",
            "k=u32:3",
        ] {
            let e = MetaOverride::parse(bad).unwrap_err();
            assert!(e.contains("--override-kv") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn overrides_keep_the_file_types_and_add_absent_keys() {
        let mut m = meta();
        apply(
            &mut m,
            &parsed(&[
                "a.n=int:9",
                "a.f=float:0.25",
                "a.b=bool:false",
                "a.s=str:y",
                "a.new=int:-3",
            ]),
        )
        .unwrap();
        assert_eq!(m.get("a.n"), Some(&Value::U32(9)));
        assert_eq!(m.get("a.f"), Some(&Value::F32(0.25)));
        assert_eq!(m.get("a.b"), Some(&Value::Bool(false)));
        assert_eq!(m.get("a.s"), Some(&Value::String("y".into())));
        assert_eq!(m.get("a.new"), Some(&Value::I64(-3)));
        assert_eq!(m.entries().len(), 5);
        for (bad, says) in [
            ("a.n=int:-1", "out of the key's range"),
            ("a.n=float:2", "u32"),
            ("a.f=int:2", "f32"),
            ("a.s=bool:true", "string"),
        ] {
            let e = apply(&mut meta(), &parsed(&[bad])).unwrap_err();
            assert!(
                e.contains(says) && e.contains(bad.split('=').next().unwrap()),
                "{e}"
            );
        }
    }
}
