//! Structured output fields of a request, as llama-server reads them: `grammar` (GBNF),
//! `json_schema`, OpenAI's `response_format` (`text`, `json_object` with an optional `schema`,
//! `json_schema` with `json_schema.schema`) and the Responses API's `text.format`. An empty schema
//! means any object. Every failure is a 400 that says what is wrong and where: both `grammar` and
//! `json_schema`, an unknown `response_format` type, a grammar that does not parse (line and
//! column), a schema keyword that cannot be enforced (its JSON path).

use std::sync::Arc;

use bloomery_grammar::{schema, Grammar};
use bloomery_runtime::request::{GenParams, GrammarSpec};
use bloomery_text::Tokenizer;
use serde_json::{json, Value};

use super::chat::{ChatPrompt, OfferedTools};
use super::error::ApiError;
use super::params::Fields;

/// Where a thinking model's answer starts: the grammar applies after it.
const THINK_CLOSE: &str = "</think>";

/// The schema `response_format` (or `text.format`) asks for, if any.
fn format_schema(format: &Value, field: &str) -> Result<Option<Value>, ApiError> {
    let Some(obj) = format.as_object() else {
        return Err(ApiError::invalid(format!("\"{field}\" must be an object")));
    };
    match obj.get("type").and_then(Value::as_str).unwrap_or("") {
        "" | "text" => Ok(None),
        "json_object" => Ok(Some(
            obj.get("schema").cloned().unwrap_or_else(|| json!({})),
        )),
        // Chat completions nest the schema under `json_schema`; the Responses API does not.
        "json_schema" => Ok(Some(
            obj.get("json_schema")
                .and_then(|w| w.get("schema"))
                .or_else(|| obj.get("schema"))
                .cloned()
                .unwrap_or_else(|| json!({})),
        )),
        other => Err(ApiError::invalid(format!(
            "response_format type must be one of \"text\" or \"json_object\", but got: {other}"
        ))),
    }
}

/// The request's grammar, from whichever field gives it.
pub fn grammar(f: &Fields<'_>) -> Result<Option<GrammarSpec>, ApiError> {
    let gbnf = f.str("grammar")?.filter(|g| !g.is_empty());
    let mut schema = f.get("json_schema").cloned();
    if schema.is_some() && gbnf.is_some() {
        return Err(ApiError::invalid("Cannot use both json_schema and grammar"));
    }
    if let Some(rf) = f.get("response_format") {
        if let Some(s) = format_schema(rf, "response_format")? {
            schema = Some(s);
        }
    }
    if let Some(tf) = f.get("text").and_then(|t| t.get("format")) {
        if let Some(s) = format_schema(tf, "text.format")? {
            schema = Some(s);
        }
    }
    let text = match (gbnf, schema) {
        (Some(g), _) => g.to_owned(),
        (None, Some(mut s)) => {
            if s.as_object().is_some_and(|o| o.is_empty()) {
                s = json!({"type": "object"});
            }
            schema::to_gbnf(&s).map_err(|e| {
                ApiError::invalid(format!(
                    "\"json_schema\": {}{}",
                    e,
                    if e.keyword.is_empty() {
                        String::new()
                    } else {
                        format!(" (keyword `{}`)", e.keyword)
                    }
                ))
            })?
        }
        (None, None) => return Ok(None),
    };
    let grammar = Grammar::parse(&text, None)
        .map_err(|e| ApiError::invalid(format!("failed to parse grammar: {e}")))?;
    Ok(Some(GrammarSpec {
        grammar: Arc::new(grammar),
        after: None,
        lazy: None,
    }))
}

/// A chat request's checks and settings: a `grammar` beside tools is llama-server's 400; tools
/// get the tool-call grammar of the template's format (`tools.rs`); when the template opened a
/// think span the grammar applies after it, and when the model may open one itself the
/// grammar lets it; the format's tags that the vocabulary holds as control tokens stay in the
/// reply's text for the parser.
pub fn for_chat(
    f: &Fields<'_>,
    params: &mut GenParams,
    tools: Option<&OfferedTools>,
    prompt: &ChatPrompt,
    tok: &Tokenizer,
) -> Result<(), ApiError> {
    let starts_in_thinking = prompt.starts_in_thinking;
    if let Some(tools) = tools {
        if f.get("grammar").is_some() {
            return Err(ApiError::invalid(
                "Cannot use custom grammar constraints with tools.",
            ));
        }
        if let Some(format) = tools.format {
            params.preserved = super::tools::control_ids(tok, format.tags());
        }
        let choice = super::tools::choice(f)?;
        let parallel = super::tools::parallel(f)?;
        let think = prompt.may_open_thinking && tools.format.is_some_and(|f| f.thinks_in_tags());
        if let Some(spec) =
            super::tools::grammar(tools.format, &tools.list, &choice, parallel, think)?
        {
            params.grammar = Some(spec);
        }
    }
    if starts_in_thinking {
        if let Some(g) = params.grammar.as_mut() {
            g.after = Some(THINK_CLOSE.to_owned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(body: Value) -> Result<Option<GrammarSpec>, ApiError> {
        grammar(&Fields::of(&body).unwrap())
    }

    #[test]
    fn every_field_gives_a_grammar() {
        for body in [
            json!({"grammar": "root ::= \"a\""}),
            json!({"json_schema": {"type": "integer"}}),
            json!({"json_schema": {}}),
            json!({"response_format": {"type": "json_object"}}),
            json!({"response_format": {"type": "json_object", "schema": {"type": "string"}}}),
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "null"}}}}),
            json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "null"}}}}),
        ] {
            assert!(spec(body.clone()).unwrap().is_some(), "{body}");
        }
        assert!(spec(json!({"response_format": {"type": "text"}}))
            .unwrap()
            .is_none());
        assert!(spec(json!({})).unwrap().is_none());
    }

    #[test]
    fn llama_servers_refusals_are_400s_that_say_why() {
        for (body, says) in [
            (
                json!({"grammar": "root ::= \"a\"", "json_schema": {}}),
                "Cannot use both",
            ),
            (
                json!({"response_format": {"type": "yaml"}}),
                "but got: yaml",
            ),
            (json!({"grammar": "root ::= [a"}), "line 1, column 12"),
            (
                json!({"json_schema": {"type": "number", "maximum": 3}}),
                "#: `maximum`",
            ),
            (
                json!({"json_schema": {"properties": {"a": {"$ref": "#/$defs/x"}}}}),
                "unresolved $ref",
            ),
        ] {
            let e = spec(body.clone()).unwrap_err();
            assert_eq!(e.status.as_u16(), 400);
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
    }
}
