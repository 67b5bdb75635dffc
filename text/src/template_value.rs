//! JSON input for chat templates, read so that object keys keep the order they were written in
//! (Python dicts keep insertion order, and `tojson` prints keys in that order).

use std::fmt;

use minijinja::value::{Value, ValueKind};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::error::TextError;
use crate::pyfmt::py_str;

/// A JSON value handed to a template, keeping object keys in the order they were written
/// (Python dicts keep insertion order, and `tojson` prints them so).
#[derive(Debug, Clone, Default)]
pub struct TemplateValue(Value);

impl TemplateValue {
    /// Parses JSON text, keeping key order.
    pub fn from_json_str(what: &'static str, text: &str) -> Result<Self, TextError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let v = OrderedJson::deserialize(&mut de).map_err(|e| TextError::Json {
            what,
            message: e.to_string(),
        })?;
        de.end().map_err(|e| TextError::Json {
            what,
            message: e.to_string(),
        })?;
        Ok(Self(v.0))
    }

    /// The value under `key` of an object; `None` when absent or not an object.
    pub fn field(&self, key: &str) -> Option<TemplateValue> {
        if self.0.kind() != ValueKind::Map {
            return None;
        }
        let v = self.0.get_item(&Value::from(key)).ok()?;
        (!v.is_undefined()).then_some(Self(v))
    }

    /// The elements of a list (empty for anything else).
    pub fn elements(&self) -> Vec<TemplateValue> {
        if self.0.kind() != ValueKind::Seq {
            return Vec::new();
        }
        self.0
            .try_iter()
            .map(|it| it.map(Self).collect())
            .unwrap_or_default()
    }

    /// The key/value pairs of an object in order (empty for anything else).
    pub fn entries(&self) -> Vec<(String, TemplateValue)> {
        if self.0.kind() != ValueKind::Map {
            return Vec::new();
        }
        let keys: Vec<Value> = self.0.try_iter().map(Iterator::collect).unwrap_or_default();
        keys.into_iter()
            .map(|k| (py_str(&k), Self(self.0.get_item(&k).unwrap_or_default())))
            .collect()
    }

    /// The template value inside.
    pub(crate) fn value(&self) -> &Value {
        &self.0
    }

    /// Unwraps the template value.
    pub(crate) fn into_value(self) -> Value {
        self.0
    }

    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        self.0.as_str()
    }

    /// The truth of a boolean value (`None` for anything else).
    pub fn as_bool(&self) -> Option<bool> {
        (self.0.kind() == ValueKind::Bool).then(|| self.0.is_true())
    }
}

impl From<&serde_json::Value> for TemplateValue {
    /// Converts a `serde_json` value; object keys come in the order its map holds them.
    fn from(v: &serde_json::Value) -> Self {
        fn conv(v: &serde_json::Value) -> Value {
            match v {
                serde_json::Value::Null => Value::from(()),
                serde_json::Value::Bool(b) => Value::from(*b),
                serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                    (Some(i), _, _) => Value::from(i),
                    (_, Some(u), _) => Value::from(u),
                    (_, _, Some(f)) => Value::from(f),
                    _ => Value::from(()),
                },
                serde_json::Value::String(s) => Value::from(s.as_str()),
                serde_json::Value::Array(a) => Value::from(a.iter().map(conv).collect::<Vec<_>>()),
                serde_json::Value::Object(o) => {
                    Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), conv(v))))
                }
            }
        }
        Self(conv(v))
    }
}

/// Deserializes JSON straight into template values, map keys in document order.
struct OrderedJson(Value);

impl<'de> Deserialize<'de> for OrderedJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = OrderedJson;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<OrderedJson, E> {
        Ok(OrderedJson(Value::from(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<OrderedJson, E> {
        Ok(OrderedJson(Value::from(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<OrderedJson, E> {
        Ok(OrderedJson(Value::from(v)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<OrderedJson, E> {
        Ok(OrderedJson(Value::from(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<OrderedJson, E> {
        Ok(OrderedJson(Value::from(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<OrderedJson, E> {
        Ok(OrderedJson(Value::from(())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OrderedJson, A::Error> {
        let mut items = Vec::new();
        while let Some(OrderedJson(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(OrderedJson(Value::from(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedJson, A::Error> {
        let mut pairs: Vec<(String, Value)> = Vec::new();
        while let Some((k, OrderedJson(v))) = map.next_entry::<String, OrderedJson>()? {
            pairs.push((k, v));
        }
        Ok(OrderedJson(Value::from_pairs(pairs)))
    }
}
