//! JSON schema to GBNF with llama.cpp's converter semantics (`common/json-schema-to-grammar.cpp`
//! of b11434): the same language for every schema both accept — properties in their order, the
//! required ones first and each optional one after those before it, JSON whitespace limited as
//! llama.cpp limits it, integers bounded digit by digit. Where llama.cpp ignores a keyword or a
//! pattern it cannot translate (and accepts any string), this converter refuses the schema with
//! the keyword and its JSON path, so nothing is dropped silently.

mod emit;
mod integers;
mod node;
mod pattern;

use serde_json::Value;

/// A schema the converter refuses: where, which keyword, why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("JSON schema {path}: {message}")]
pub struct SchemaError {
    /// JSON path of the schema object (`#/properties/a`).
    pub path: String,
    /// The keyword at fault (empty when the whole object is).
    pub keyword: String,
    /// What is wrong.
    pub message: String,
}

/// The GBNF grammar (with a `root` rule) that accepts the JSON texts `schema` describes.
pub fn to_gbnf(schema: &Value) -> Result<String, SchemaError> {
    let mut reader = node::Reader::new(schema);
    let root = reader.node(schema, "#")?;
    let mut conv = emit::Converter::new(reader.refs);
    conv.visit(&root, "")?;
    Ok(conv.format())
}

/// Rules for several schemas in one grammar (tool arguments): each `(name, schema)` becomes a
/// rule named after `name`, returned in order, beside the rules they share; the caller writes
/// `root`. A schema's `$ref`s resolve within that schema.
pub fn rules_for(schemas: &[(&str, &Value)]) -> Result<(String, Vec<String>), SchemaError> {
    let mut conv = emit::Converter::new(Vec::new());
    let mut names = Vec::with_capacity(schemas.len());
    for (name, schema) in schemas {
        let mut reader = node::Reader::new(schema);
        let root = reader.node(schema, "#")?;
        conv.add_refs(reader.refs);
        names.push(conv.visit(&root, name)?);
    }
    Ok((conv.format(), names))
}

/// llama-server's grammar for `response_format: {"type": "json_object"}` without a schema: any
/// JSON object.
pub fn any_object() -> String {
    to_gbnf(&serde_json::json!({"type": "object"}))
        .unwrap_or_else(|e| unreachable!("a constant schema converts: {e}"))
}

#[cfg(test)]
mod tests;
