//! A JSON schema read into the shapes the converter emits, keyword by keyword, with llama.cpp's
//! reading of each (which keyword wins, how bounds round). Every key of a schema object must be
//! used or be an annotation: a keyword that the grammar cannot enforce is an error naming it and
//! its JSON path, never dropped.

use serde_json::{Map, Value};

use super::SchemaError;

/// Keys that describe and never constrain.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// String formats with a grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Date,
    Time,
    DateTime,
    Uuid,
}

/// One schema, read.
#[derive(Clone, Debug)]
pub(crate) enum Node {
    Any,
    Null,
    Boolean,
    Number,
    Integer {
        min: Option<i64>,
        max: Option<i64>,
    },
    String {
        pattern: Option<String>,
        format: Option<Format>,
        min_len: usize,
        max_len: Option<usize>,
    },
    Array {
        items: Box<Node>,
        min: usize,
        max: Option<usize>,
    },
    Tuple(Vec<Node>),
    Object {
        props: Vec<(String, Node, bool)>,
        additional: Option<Box<Node>>,
    },
    Const(Value),
    Enum(Vec<Value>),
    AnyOf(Vec<Node>),
    AllOf(Vec<Node>),
    /// A `$ref` into the same document, by its text; the target is read once under `refs`.
    Ref(String),
}

/// Reads a whole document; `refs` gets every referenced schema, read once.
pub(crate) struct Reader<'a> {
    root: &'a Value,
    pub(crate) refs: Vec<(String, Option<Node>)>,
}

type Res<T> = Result<T, SchemaError>;

fn fail(path: &str, keyword: &str, message: impl Into<String>) -> SchemaError {
    SchemaError {
        path: path.to_owned(),
        keyword: keyword.to_owned(),
        message: message.into(),
    }
}

/// The keys of one schema object and which of them were used.
struct Keys<'a> {
    obj: &'a Map<String, Value>,
    used: Vec<&'static str>,
}

impl<'a> Keys<'a> {
    fn get(&mut self, key: &'static str) -> Option<&'a Value> {
        let v = self.obj.get(key);
        if v.is_some() {
            self.used.push(key);
        }
        v
    }

    fn has(&self, key: &str) -> bool {
        self.obj.contains_key(key)
    }

    /// Errs on the first key neither used nor an annotation.
    fn check(&self, path: &str) -> Res<()> {
        for k in self.obj.keys() {
            if !self.used.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
                return Err(fail(
                    path,
                    k,
                    format!("`{k}` cannot be enforced here by a grammar"),
                ));
            }
        }
        Ok(())
    }

    fn count(&mut self, key: &'static str, path: &str) -> Res<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| fail(path, key, format!("`{key}` must be a non-negative integer"))),
        }
    }

    /// An integer bound, fractions rounded towards the integers it admits.
    fn bound(&mut self, key: &'static str, path: &str, up: bool) -> Res<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                if let Some(i) = v.as_i64() {
                    return Ok(Some(i));
                }
                let f = v
                    .as_f64()
                    .ok_or_else(|| fail(path, key, format!("`{key}` must be a number")))?;
                Ok(Some(if up { f.ceil() } else { f.floor() } as i64))
            }
        }
    }
}

impl<'a> Reader<'a> {
    pub(crate) fn new(root: &'a Value) -> Self {
        Reader {
            root,
            refs: Vec::new(),
        }
    }

    fn resolve(&self, r: &str, path: &str) -> Res<&'a Value> {
        let mut target = self.root;
        for part in r[2..].split('/') {
            let part = part.replace("~1", "/").replace("~0", "~");
            target = match target {
                Value::Object(o) if o.contains_key(&part) => &o[&part],
                Value::Array(a) => part
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| a.get(i))
                    .ok_or_else(|| {
                        fail(path, "$ref", format!("unresolved $ref {r}: no item {part}"))
                    })?,
                _ => {
                    return Err(fail(
                        path,
                        "$ref",
                        format!("unresolved $ref {r}: {part} not found"),
                    ))
                }
            };
        }
        Ok(target)
    }

    /// Reads the schema at `path`.
    pub(crate) fn node(&mut self, v: &Value, path: &str) -> Res<Node> {
        let obj = match v {
            Value::Object(o) => o,
            Value::Bool(true) => return Ok(Node::Any),
            _ => return Err(fail(path, "", "a schema must be an object")),
        };
        let mut k = Keys {
            obj,
            used: Vec::new(),
        };
        let node = self.keyed(&mut k, path)?;
        k.check(path)?;
        Ok(node)
    }

    fn keyed(&mut self, k: &mut Keys<'_>, path: &str) -> Res<Node> {
        if let Some(r) = k.get("$ref") {
            let r = r
                .as_str()
                .ok_or_else(|| fail(path, "$ref", "$ref must be a string"))?;
            if !r.starts_with("#/") && r != "#" {
                return Err(fail(
                    path,
                    "$ref",
                    format!(
                        "unresolved $ref {r}: only references into this document are supported"
                    ),
                ));
            }
            if !self.refs.iter().any(|(name, _)| name == r) {
                self.refs.push((r.to_owned(), None));
                let target = if r == "#" {
                    self.root
                } else {
                    self.resolve(r, path)?
                };
                let n = self.node(target, r)?;
                if let Some(slot) = self.refs.iter_mut().find(|(name, _)| name == r) {
                    slot.1 = Some(n);
                }
            }
            return Ok(Node::Ref(r.to_owned()));
        }
        for key in ["oneOf", "anyOf"] {
            if k.has(key) {
                let alts = k.get(if key == "oneOf" { "oneOf" } else { "anyOf" });
                return Ok(Node::AnyOf(self.list(
                    alts,
                    &format!("{path}/{key}"),
                    key,
                )?));
            }
        }
        let ty = k.get("type");
        if let Some(Value::Array(types)) = ty {
            if types.is_empty() {
                return Err(fail(path, "type", "`type` must not be empty"));
            }
            let mut alts = Vec::new();
            for (i, t) in types.iter().enumerate() {
                let mut alt = k.obj.clone();
                alt.insert("type".into(), t.clone());
                let alt = Value::Object(alt);
                let sub = format!("{path}/type/{i}");
                let mut kk = Keys {
                    obj: match &alt {
                        Value::Object(o) => o,
                        _ => unreachable!("built as an object just above"),
                    },
                    used: Vec::new(),
                };
                let n = self.keyed(&mut kk, &sub)?;
                kk.check(&sub)?;
                alts.push(n);
            }
            // Every key was checked per alternative.
            k.used
                .extend(k.obj.keys().filter_map(|key| static_key(key)));
            return Ok(Node::AnyOf(alts));
        }
        if let Some(c) = k.get("const") {
            return Ok(Node::Const(c.clone()));
        }
        if let Some(e) = k.get("enum") {
            return match e {
                Value::Array(vals) if !vals.is_empty() => Ok(Node::Enum(vals.clone())),
                _ => Err(fail(path, "enum", "`enum` must be a non-empty array")),
            };
        }
        let ty = match ty {
            None => "",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(fail(path, "type", "`type` must be a string or an array")),
        };
        let has_props = k.has("properties")
            || k.obj
                .get("additionalProperties")
                .is_some_and(|a| a != &Value::Bool(true));
        match ty {
            "" if has_props => self.object(k, path),
            "" if k.has("allOf") => self.all_of(k, path),
            "" if k.has("items") || k.has("prefixItems") => self.array(k, path),
            "" if ["pattern", "minLength", "maxLength", "format"]
                .iter()
                .any(|key| k.has(key)) =>
            {
                self.string(k, path)
            }
            "" => Ok(Node::Any),
            "object" if !has_props && k.has("allOf") => self.all_of(k, path),
            "object" => self.object(k, path),
            "string" if k.has("allOf") => self.all_of(k, path),
            "string" => self.string(k, path),
            "array" => self.array(k, path),
            "integer" => {
                let min = match k.bound("minimum", path, true)? {
                    Some(m) => Some(m),
                    None => k.bound("exclusiveMinimum", path, false)?.map(|m| m + 1),
                };
                let max = match k.bound("maximum", path, false)? {
                    Some(m) => Some(m),
                    None => k.bound("exclusiveMaximum", path, true)?.map(|m| m - 1),
                };
                Ok(Node::Integer { min, max })
            }
            "number" => Ok(Node::Number),
            "boolean" => Ok(Node::Boolean),
            "null" => Ok(Node::Null),
            other => Err(fail(path, "type", format!("unknown type `{other}`"))),
        }
    }

    fn list(&mut self, v: Option<&Value>, path: &str, key: &str) -> Res<Vec<Node>> {
        match v {
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .enumerate()
                .map(|(i, s)| self.node(s, &format!("{path}/{i}")))
                .collect(),
            _ => Err(fail(
                path,
                key,
                format!("`{key}` must be a non-empty array of schemas"),
            )),
        }
    }

    fn all_of(&mut self, k: &mut Keys<'_>, path: &str) -> Res<Node> {
        let v = k.get("allOf");
        Ok(Node::AllOf(self.list(
            v,
            &format!("{path}/allOf"),
            "allOf",
        )?))
    }

    fn object(&mut self, k: &mut Keys<'_>, path: &str) -> Res<Node> {
        let mut required: Vec<&str> = Vec::new();
        if let Some(r) = k.get("required") {
            let Value::Array(r) = r else {
                return Err(fail(path, "required", "`required` must be an array"));
            };
            for name in r {
                required.push(
                    name.as_str()
                        .ok_or_else(|| fail(path, "required", "`required` must list strings"))?,
                );
            }
        }
        let mut props = Vec::new();
        if let Some(p) = k.get("properties") {
            let Value::Object(p) = p else {
                return Err(fail(path, "properties", "`properties` must be an object"));
            };
            for (name, s) in p {
                let n = self.node(s, &format!("{path}/properties/{name}"))?;
                props.push((name.clone(), n, required.contains(&name.as_str())));
            }
        }
        if let Some(missing) = required
            .iter()
            .find(|r| !props.iter().any(|(n, _, _)| n == *r))
        {
            return Err(fail(
                path,
                "required",
                format!("`required` names `{missing}`, which `properties` does not define"),
            ));
        }
        let additional = match k.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(Box::new(Node::Any)),
            Some(Value::Bool(false)) => None,
            Some(s @ Value::Object(_)) => Some(Box::new(
                self.node(s, &format!("{path}/additionalProperties"))?,
            )),
            Some(_) => {
                return Err(fail(
                    path,
                    "additionalProperties",
                    "`additionalProperties` must be a boolean or a schema",
                ))
            }
            None if !k.has("properties") => Some(Box::new(Node::Any)),
            None => None,
        };
        Ok(Node::Object { props, additional })
    }

    fn array(&mut self, k: &mut Keys<'_>, path: &str) -> Res<Node> {
        if k.has("items") && k.has("prefixItems") {
            return Err(fail(
                path,
                "prefixItems",
                "`prefixItems` beside `items` cannot be enforced (llama.cpp reads `items` alone)",
            ));
        }
        let key = if k.has("items") {
            "items"
        } else {
            "prefixItems"
        };
        let items = match k.get(if key == "items" {
            "items"
        } else {
            "prefixItems"
        }) {
            None => Node::Any,
            Some(Value::Array(list)) => {
                let tuple = list
                    .iter()
                    .enumerate()
                    .map(|(i, s)| self.node(s, &format!("{path}/{key}/{i}")))
                    .collect::<Res<Vec<_>>>()?;
                return Ok(Node::Tuple(tuple));
            }
            Some(s) => self.node(s, &format!("{path}/{key}"))?,
        };
        Ok(Node::Array {
            items: Box::new(items),
            min: k.count("minItems", path)?.unwrap_or(0),
            max: k.count("maxItems", path)?,
        })
    }

    fn string(&mut self, k: &mut Keys<'_>, path: &str) -> Res<Node> {
        let pattern = match k.get("pattern") {
            None => None,
            Some(Value::String(p)) => {
                super::pattern::check(p).map_err(|m| fail(path, "pattern", m))?;
                Some(p.clone())
            }
            Some(_) => return Err(fail(path, "pattern", "`pattern` must be a string")),
        };
        let format = match k.get("format") {
            None => None,
            Some(Value::String(f)) => Some(match f.as_str() {
                "date" => Format::Date,
                "time" => Format::Time,
                "date-time" => Format::DateTime,
                "uuid" | "uuid1" | "uuid2" | "uuid3" | "uuid4" | "uuid5" => Format::Uuid,
                other => {
                    return Err(fail(
                        path,
                        "format",
                        format!(
                        "format `{other}` cannot be enforced (date, time, date-time and uuid can)"
                    ),
                    ))
                }
            }),
            Some(_) => return Err(fail(path, "format", "`format` must be a string")),
        };
        let min_len = k.count("minLength", path)?.unwrap_or(0);
        let max_len = k.count("maxLength", path)?;
        let lengths = min_len > 0 || max_len.is_some();
        if (pattern.is_some() || format.is_some()) && lengths {
            return Err(fail(
                path,
                if min_len > 0 {
                    "minLength"
                } else {
                    "maxLength"
                },
                "a length bound beside `pattern` or `format` cannot be enforced",
            ));
        }
        if pattern.is_some() && format.is_some() {
            return Err(fail(
                path,
                "format",
                "`format` beside `pattern` cannot be enforced",
            ));
        }
        Ok(Node::String {
            pattern,
            format,
            min_len,
            max_len,
        })
    }
}

/// The static spelling of a known keyword (so `Keys::used` can hold it).
fn static_key(key: &str) -> Option<&'static str> {
    const KNOWN: &[&str] = &[
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "pattern",
        "format",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "allOf",
        "const",
        "enum",
    ];
    KNOWN.iter().copied().find(|k| *k == key)
}
