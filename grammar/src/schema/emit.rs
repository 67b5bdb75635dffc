//! Schema nodes to GBNF rules, named after their JSON paths (`root`, `name-item`, `ref-defs-x`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::integers::int_range;
use super::node::{Format, Node};
use super::pattern;
use super::SchemaError;

/// The built-in rules (JSON's primitives and the string formats) and the rules each needs.
fn builtin(name: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match name {
        "boolean" => (r#"("true" | "false")"#, &[]),
        "decimal-part" => ("[0-9]{1,16}", &[]),
        "integral-part" => ("[0] | [1-9] [0-9]{0,15}", &[]),
        "number" => (
            r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?"#,
            &["integral-part", "decimal-part"],
        ),
        "integer" => (r#"("-"? integral-part)"#, &["integral-part"]),
        "value" => (
            "object | array | string | number | boolean | null",
            &["object", "array", "string", "number", "boolean", "null"],
        ),
        "object" => (
            r#""{" space ( string ":" space value ("," space string ":" space value)* )? space "}""#,
            &["string", "value"],
        ),
        "array" => (
            r#""[" space ( value ("," space value)* )? space "]""#,
            &["value"],
        ),
        "uuid" => (
            r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"""#,
            &[],
        ),
        "char" => (
            r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#,
            &[],
        ),
        "string" => (r#""\"" char* "\"""#, &["char"]),
        "null" => (r#""null""#, &[]),
        "date" => (
            r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#,
            &[],
        ),
        "time" => (
            r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
            &[],
        ),
        "date-time" => (r#"date "T" time"#, &["date", "time"]),
        "date-string" => (r#""\"" date "\"""#, &["date"]),
        "time-string" => (r#""\"" time "\"""#, &["time"]),
        "date-time-string" => (r#""\"" date-time "\"""#, &["date-time"]),
        _ => return None,
    })
}

/// JSON whitespace between tokens: none, one space, or one or two newlines and up to 20 blanks.
const SPACE: &str = r#"( " " | "\n" "\n"? [ \t]{0,20} )?"#;

fn reserved(name: &str) -> bool {
    name == "root" || builtin(name).is_some()
}

/// Runs of characters a rule name cannot hold, as one `-`.
fn rule_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            run = false;
        } else if !run {
            out.push('-');
            run = true;
        }
    }
    out
}

/// A GBNF string literal of `s`.
pub(crate) fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `item` between `min` and `max` times (None: unbounded), separated by `sep` when given.
pub(crate) fn repetition(item: &str, min: usize, max: Option<usize>, sep: &str) -> String {
    if max == Some(0) {
        return String::new();
    }
    if min == 0 && max == Some(1) {
        return format!("{item}?");
    }
    if sep.is_empty() {
        return match (min, max) {
            (1, None) => format!("{item}+"),
            (0, None) => format!("{item}*"),
            (m, None) => format!("{item}{{{m},}}"),
            (m, Some(x)) => format!("{item}{{{m},{x}}}"),
        };
    }
    let rest = repetition(
        &format!("({sep} {item})"),
        min.saturating_sub(1),
        max.map(|m| m - 1),
        "",
    );
    let once = format!("{item} {rest}");
    if min == 0 {
        format!("({once})?")
    } else {
        once
    }
}

/// The rules built so far and the `$ref` targets.
pub(crate) struct Converter {
    rules: BTreeMap<String, String>,
    refs: Vec<(String, Option<Node>)>,
    resolving: Vec<String>,
}

type Res<T> = Result<T, SchemaError>;

impl Converter {
    pub(crate) fn new(refs: Vec<(String, Option<Node>)>) -> Self {
        let mut rules = BTreeMap::new();
        rules.insert("space".to_owned(), SPACE.to_owned());
        Converter {
            rules,
            refs,
            resolving: Vec::new(),
        }
    }

    /// More `$ref` targets (another schema's, for `rules_for`).
    pub(crate) fn add_refs(&mut self, refs: Vec<(String, Option<Node>)>) {
        self.refs.extend(refs);
    }

    /// Adds a rule under `name` (or `name` and a number, when another rule holds the name) and
    /// returns the name used.
    fn add(&mut self, name: &str, body: String) -> String {
        let base = rule_name(name);
        let mut key = base.clone();
        let mut i = 0;
        while self.rules.get(&key).is_some_and(|b| *b != body) {
            key = format!("{base}{i}");
            i += 1;
        }
        self.rules.insert(key.clone(), body);
        key
    }

    fn primitive(&mut self, name: &str, kind: &str) -> String {
        let Some((body, deps)) = builtin(kind) else {
            unreachable!("`{kind}` is one of the built-in rules");
        };
        let n = self.add(name, body.to_owned());
        for dep in deps {
            if !self.rules.contains_key(*dep) {
                self.primitive(dep, dep);
            }
        }
        n
    }

    fn typed(&mut self, rule: &str, kind: &str) -> String {
        self.primitive(if rule == "root" { "root" } else { kind }, kind)
    }

    /// The GBNF text, one rule per line.
    pub(crate) fn format(&self) -> String {
        let mut out = String::new();
        for (name, body) in &self.rules {
            out.push_str(&format!("{name} ::= {body}\n"));
        }
        out
    }

    fn target(&self, r: &str) -> Option<Node> {
        self.refs
            .iter()
            .find(|(n, _)| n == r)
            .and_then(|(_, t)| t.clone())
    }

    /// Emits `node` as a rule named after `name`; returns the rule's name.
    pub(crate) fn visit(&mut self, node: &Node, name: &str) -> Res<String> {
        let rule = if reserved(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_owned()
        } else {
            name.to_owned()
        };
        let sub = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };
        Ok(match node {
            Node::Ref(r) => {
                let body = self.reference(r)?;
                self.add(&rule, body)
            }
            Node::AnyOf(alts) => {
                let mut bodies = Vec::with_capacity(alts.len());
                for (i, a) in alts.iter().enumerate() {
                    let n = if name.is_empty() {
                        format!("alternative-{i}")
                    } else {
                        format!("{name}-{i}")
                    };
                    bodies.push(self.visit(a, &n)?);
                }
                self.add(&rule, bodies.join(" | "))
            }
            Node::AllOf(parts) => self.all_of(parts, name, &rule)?,
            Node::Const(v) => self.add(&rule, literal(&v.to_string())),
            Node::Enum(vals) => {
                let alts: Vec<String> = vals.iter().map(|v| literal(&v.to_string())).collect();
                self.add(&rule, format!("({})", alts.join(" | ")))
            }
            Node::Object { props, additional } => {
                if props.is_empty() && matches!(additional.as_deref(), Some(Node::Any)) {
                    let o = self.primitive("object", "object");
                    self.add(&rule, o)
                } else {
                    let props: Vec<(String, &Node, bool)> =
                        props.iter().map(|(n, s, r)| (n.clone(), s, *r)).collect();
                    let body = self.object(&props, name, additional.as_deref())?;
                    self.add(&rule, body)
                }
            }
            Node::Tuple(items) => {
                let mut parts = Vec::with_capacity(items.len());
                for (i, it) in items.iter().enumerate() {
                    parts.push(self.visit(it, &format!("{sub}tuple-{i}"))?);
                }
                let body = format!(r#""[" space {} space "]""#, parts.join(r#" "," space "#));
                self.add(&rule, body)
            }
            Node::Array { items, min, max } => {
                if matches!(**items, Node::Any) && *min == 0 && max.is_none() {
                    self.typed(&rule, "array")
                } else {
                    let item = self.visit(items, &format!("{sub}item"))?;
                    let body = format!(
                        r#""[" space {} space "]""#,
                        repetition(&item, *min, *max, r#""," space"#)
                    );
                    self.add(&rule, body)
                }
            }
            Node::String {
                pattern: Some(p), ..
            } => {
                let body =
                    pattern::translate(p, &rule, &mut |n, b| self.add(n, b)).map_err(|m| {
                        SchemaError {
                            path: name.to_owned(),
                            keyword: "pattern".into(),
                            message: m,
                        }
                    })?;
                self.add(&rule, body)
            }
            Node::String {
                format: Some(Format::Uuid),
                ..
            } => self.typed(&rule, "uuid"),
            Node::String {
                format: Some(f), ..
            } => {
                let kind = match f {
                    Format::Date => "date-string",
                    Format::Time => "time-string",
                    _ => "date-time-string",
                };
                let p = self.primitive(kind, kind);
                self.add(&rule, p)
            }
            Node::String {
                min_len, max_len, ..
            } if *min_len > 0 || max_len.is_some() => {
                let c = self.primitive("char", "char");
                let body = format!(r#""\"" {} "\"""#, repetition(&c, *min_len, *max_len, ""));
                self.add(&rule, body)
            }
            Node::String { .. } => self.typed(&rule, "string"),
            Node::Integer {
                min: None,
                max: None,
            } => self.typed(&rule, "integer"),
            Node::Integer { min, max } => {
                let body = format!("({})", int_range(*min, *max));
                self.add(&rule, body)
            }
            Node::Number => self.typed(&rule, "number"),
            Node::Boolean => self.typed(&rule, "boolean"),
            Node::Null => self.typed(&rule, "null"),
            Node::Any => {
                let v = self.primitive("value", "value");
                self.add(&rule, v)
            }
        })
    }

    fn reference(&mut self, r: &str) -> Res<String> {
        let fragment = r.split_once('#').map_or(r, |(_, f)| f);
        let name = format!("ref{}", rule_name(fragment));
        if self.rules.contains_key(&name) || self.resolving.iter().any(|x| x == r) {
            return Ok(name);
        }
        let Some(target) = self.target(r) else {
            return Err(SchemaError {
                path: r.to_owned(),
                keyword: "$ref".into(),
                message: format!("unresolved $ref {r}"),
            });
        };
        self.resolving.push(r.to_owned());
        let n = self.visit(&target, &name);
        self.resolving.pop();
        n
    }

    fn all_of(&mut self, parts: &[Node], name: &str, rule: &str) -> Res<String> {
        let mut props: Vec<(String, Node, bool)> = Vec::new();
        let mut enums: BTreeMap<String, usize> = BTreeMap::new();
        for part in parts {
            match part {
                Node::AnyOf(alts) => {
                    for a in alts {
                        self.component(a, false, &mut props, &mut enums, name)?;
                    }
                }
                other => self.component(other, true, &mut props, &mut enums, name)?,
            }
        }
        if !enums.is_empty() {
            let common: Vec<String> = enums
                .into_iter()
                .filter(|&(_, n)| n == parts.len())
                .map(|(v, _)| v)
                .collect();
            if !common.is_empty() {
                return Ok(self.add(rule, format!("({})", common.join(" | "))));
            }
        }
        let props: Vec<(String, &Node, bool)> =
            props.iter().map(|(n, s, r)| (n.clone(), s, *r)).collect();
        let body = self.object(&props, name, None)?;
        Ok(self.add(rule, body))
    }

    /// One part of an `allOf`: an object's properties (all required when `required`), an
    /// enum's values; anything else cannot be combined by the grammar.
    fn component(
        &mut self,
        part: &Node,
        required: bool,
        props: &mut Vec<(String, Node, bool)>,
        enums: &mut BTreeMap<String, usize>,
        name: &str,
    ) -> Res<()> {
        match part {
            Node::Ref(r) => match self.target(r) {
                Some(t) => self.component(&t, required, props, enums, name),
                None => Err(SchemaError {
                    path: r.clone(),
                    keyword: "$ref".into(),
                    message: format!("unresolved $ref {r}"),
                }),
            },
            Node::Object { props: p, .. } => {
                for (n, s, _) in p {
                    props.push((n.clone(), s.clone(), required));
                }
                Ok(())
            }
            Node::Enum(vals) => {
                for v in vals {
                    *enums.entry(literal(&v.to_string())).or_default() += 1;
                }
                Ok(())
            }
            _ => Err(SchemaError {
                path: if name.is_empty() {
                    "#".into()
                } else {
                    name.into()
                },
                keyword: "allOf".into(),
                message: "`allOf` combines objects and enums only; this part cannot be enforced"
                    .into(),
            }),
        }
    }

    fn object(
        &mut self,
        props: &[(String, &Node, bool)],
        name: &str,
        additional: Option<&Node>,
    ) -> Res<String> {
        let prefix = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };
        let mut required: Vec<String> = Vec::new();
        let mut optional: Vec<String> = Vec::new();
        let mut kv: BTreeMap<String, String> = BTreeMap::new();
        for (prop, schema, req) in props {
            let value = self.visit(schema, &format!("{prefix}{prop}"))?;
            let key = literal(&Value::String(prop.clone()).to_string());
            let r = self.add(
                &format!("{prefix}{prop}-kv"),
                format!("{key} space \":\" space {value}"),
            );
            kv.insert(prop.clone(), r);
            if *req {
                required.push(prop.clone());
            } else {
                optional.push(prop.clone());
            }
        }
        if let Some(add) = additional {
            let sub = format!("{prefix}additional");
            let value = match add {
                Node::Any => self.primitive("value", "value"),
                other => self.visit(other, &format!("{sub}-value"))?,
            };
            let key = if props.is_empty() {
                self.primitive("string", "string")
            } else {
                let names: Vec<&str> = props.iter().map(|(n, _, _)| n.as_str()).collect();
                let body = self.not_strings(&names);
                self.add(&format!("{sub}-k"), body)
            };
            let r = self.add(&format!("{sub}-kv"), format!("{key} \":\" space {value}"));
            kv.insert("*".into(), r);
            optional.push("*".into());
        }
        if required.is_empty() && optional.is_empty() {
            return Ok(r#""{" space "}""#.into());
        }
        let mut rule = String::from(r#""{" space "#);
        let req: Vec<&str> = required.iter().map(|r| kv[r].as_str()).collect();
        rule.push_str(&req.join(r#" "," space "#));
        if !optional.is_empty() {
            rule.push_str(" (");
            if !required.is_empty() {
                rule.push_str(r#" "," space ( "#);
            }
            let mut alts = Vec::new();
            for i in 0..optional.len() {
                alts.push(self.chain(&optional[i..], false, &kv, &prefix));
            }
            rule.push_str(&alts.join(" | "));
            if !required.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }
        rule.push_str(r#" space "}""#);
        Ok(rule)
    }

    /// The optional properties from `keys[0]` on, in order, each after a comma; the first one
    /// present unless `first_optional`; `*` (additional properties) may repeat.
    fn chain(
        &mut self,
        keys: &[String],
        first_optional: bool,
        kv: &BTreeMap<String, String>,
        prefix: &str,
    ) -> String {
        let Some(k) = keys.first() else {
            return String::new();
        };
        let r = &kv[k];
        let comma = format!(r#"( "," space {r} )"#);
        let mut out = match (first_optional, k == "*") {
            (true, true) => format!("{comma}*"),
            (true, false) => format!("{comma}?"),
            (false, true) => format!("{r} {comma}*"),
            (false, false) => r.clone(),
        };
        if keys.len() > 1 {
            let body = self.chain(&keys[1..], true, kv, prefix);
            let rest = self.add(&format!("{prefix}{k}-rest"), body);
            out.push(' ');
            out.push_str(&rest);
        }
        out
    }

    /// A JSON string that is none of `names` (compared character by character): a trie of
    /// the names, each branch either leaving it or going on.
    fn not_strings(&mut self, names: &[&str]) -> String {
        #[derive(Default)]
        struct T {
            children: BTreeMap<char, T>,
            end: bool,
        }
        let mut root = T::default();
        for n in names {
            let mut t = &mut root;
            for c in n.chars() {
                t = t.children.entry(c).or_default();
            }
            t.end = true;
        }
        let ch = self.primitive("char", "char");
        fn walk(t: &T, ch: &str, out: &mut String) {
            let mut rejects = String::new();
            for (i, (c, child)) in t.children.iter().enumerate() {
                rejects.push(*c);
                if i > 0 {
                    out.push_str(" | ");
                }
                out.push_str(&format!("[{c}]"));
                if child.children.is_empty() {
                    out.push_str(&format!(" {ch}+"));
                } else {
                    out.push_str(" (");
                    walk(child, ch, out);
                    out.push(')');
                }
            }
            if !t.children.is_empty() {
                out.push_str(&format!(" | [^\"{rejects}] {ch}*"));
            }
        }
        let mut out = String::from("[\"] ( ");
        walk(&root, &ch, &mut out);
        out.push_str(" )");
        if !root.end {
            out.push('?');
        }
        out.push_str(" [\"]");
        out
    }
}
