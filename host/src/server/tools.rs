//! Tool calls: which format a chat template's family writes them in (read from the template's
//! text, as llama.cpp's chat.cpp recognises it, until model plugins declare it), and the grammar
//! that makes a reply one or more calls when the request asks for them (`tool_choice`
//! `required`/`any` or a named function, `parallel_tool_calls`).
//!
//! Constrained so far: Hermes JSON (`<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`,
//! Qwen3). The other formats are recognised and parsed where `chat.rs` parses them (Qwen XML);
//! a request that needs their grammar is refused with the format named, never answered
//! unconstrained.

use std::sync::Arc;

use bloomery_grammar::{schema, Grammar};
use bloomery_runtime::request::GrammarSpec;
use serde_json::{json, Value};

use super::error::ApiError;
use super::params::Fields;

/// How a template's family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>` around `{"name": …, "arguments": …}` (Qwen3, Hermes).
    HermesJson,
    /// `<tool_call><function=NAME><parameter=P>…` (Qwen3.5/3.6, Qwen3-Coder).
    QwenXml,
    /// `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>` (GLM).
    GlmXml,
    /// `<｜DSML｜tool_calls><｜DSML｜invoke name="…">…` (DeepSeek V3.2/V4).
    DeepSeekDsml,
    /// `<|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{json}<|tool_call:end|>`.
    Solar,
}

impl ToolFormat {
    /// The format a template's source text writes, by the markers llama.cpp's chat.cpp looks
    /// for (None: the template writes no tool calls this server knows).
    pub fn of_template(src: &str) -> Option<Self> {
        let has = |s: &str| src.contains(s);
        if has("dsml_token") && has("DSML") && (has("tool_calls") || has("function_calls")) {
            return Some(ToolFormat::DeepSeekDsml);
        }
        if has("<|tool_call:begin|>") {
            return Some(ToolFormat::Solar);
        }
        if has("<arg_key>") && has("<arg_value>") {
            return Some(ToolFormat::GlmXml);
        }
        if has("<tool_call>") && has("<function=") && has("<parameter=") {
            return Some(ToolFormat::QwenXml);
        }
        if has("<tool_call>") {
            return Some(ToolFormat::HermesJson);
        }
        None
    }
}

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The model decides (no grammar).
    Auto,
    /// At least one call.
    Required,
    /// A call of this function.
    Named(String),
}

/// `tool_choice` in the OpenAI (`"required"`, `{"type": "function", "function": {"name"}}`) or
/// Anthropic (`{"type": "any"}`, `{"type": "tool", "name"}`) spelling; `none` never gets here
/// (the tools are not offered).
pub fn choice(f: &Fields<'_>) -> Result<Choice, ApiError> {
    let bad = || {
        ApiError::invalid("\"tool_choice\" is not one of none, auto, required or a named function")
    };
    Ok(match f.get("tool_choice") {
        None => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" | "none" => Choice::Auto,
            "required" | "any" => Choice::Required,
            _ => return Err(bad()),
        },
        Some(v) => match v.get("type").and_then(Value::as_str) {
            Some("auto") | Some("none") => Choice::Auto,
            Some("any") => Choice::Required,
            Some("function") => Choice::Named(
                v.pointer("/function/name")
                    .and_then(Value::as_str)
                    .ok_or_else(bad)?
                    .to_owned(),
            ),
            Some("tool") => Choice::Named(
                v.get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(bad)?
                    .to_owned(),
            ),
            _ => return Err(bad()),
        },
    })
}

/// Whether the request allows several calls in one reply (`parallel_tool_calls`, default
/// true; Anthropic's `tool_choice.disable_parallel_tool_use`).
pub fn parallel(f: &Fields<'_>) -> Result<bool, ApiError> {
    let disabled = f
        .get("tool_choice")
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(f.bool("parallel_tool_calls")?.unwrap_or(true) && !disabled)
}

/// The grammar that makes the reply tool calls, when `choice` asks for them; `tools` are the
/// offered tools, OpenAI-shaped.
pub fn grammar(
    format: Option<ToolFormat>,
    tools: &Value,
    choice: &Choice,
    parallel: bool,
) -> Result<Option<GrammarSpec>, ApiError> {
    let wanted: Vec<&Value> = match choice {
        Choice::Auto => return Ok(None),
        Choice::Required => tools
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        Choice::Named(n) => {
            let t: Vec<&Value> = tools
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(n))
                .collect();
            if t.is_empty() {
                return Err(ApiError::invalid(format!(
                    "tool_choice names `{n}`, which no tool is"
                )));
            }
            t
        }
    };
    match format {
        Some(ToolFormat::HermesJson) => {}
        other => {
            return Err(ApiError::invalid(format!(
                "tool_choice {choice:?} needs a tool-call grammar, not built yet for this template's format ({})",
                other.map_or("none recognised".to_owned(), |f| format!("{f:?}"))
            )))
        }
    }
    let mut named = Vec::with_capacity(wanted.len());
    for (i, t) in wanted.iter().enumerate() {
        let name = t
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("tools[{i}] has no function name")))?;
        let params = t
            .pointer("/function/parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        let params = if params.as_object().is_some_and(|o| o.is_empty()) {
            json!({"type": "object"})
        } else {
            params
        };
        named.push((name.to_owned(), format!("tool-{i}-args"), params));
    }
    let list: Vec<(&str, &Value)> = named.iter().map(|(_, r, p)| (r.as_str(), p)).collect();
    let (rules, arg_rules) = schema::rules_for(&list).map_err(|e| {
        ApiError::invalid(format!(
            "a tool's parameters: {e} (keyword `{}`)",
            e.keyword
        ))
    })?;
    let calls: Vec<String> = named
        .iter()
        .zip(&arg_rules)
        .map(|((name, _, _), args)| {
            let head = schema_literal(&format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                Value::String(name.clone())
            ));
            format!("{head} {args} \"}}\\n</tool_call>\"")
        })
        .collect();
    let mut gbnf = format!("tool-call ::= {}\n", calls.join(" | "));
    gbnf.push_str(if parallel {
        "root ::= tool-call (\"\\n\" tool-call)*\n"
    } else {
        "root ::= tool-call\n"
    });
    gbnf.push_str(&rules);
    let g = Grammar::parse(&gbnf, None)
        .map_err(|e| ApiError::internal(format!("the tool-call grammar: {e}")))?;
    Ok(Some(GrammarSpec {
        grammar: Arc::new(g),
        after: None,
    }))
}

/// A GBNF string literal.
fn schema_literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::chat::parse_tool_calls;

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "add", "parameters": {
                "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"]}}},
        ])
    }

    fn accepts(spec: &GrammarSpec, text: &str) -> bool {
        let vocab = Arc::new(bloomery_grammar::TokenTrie::new(0, |_| &[][..], &[]));
        let mut m = bloomery_grammar::Matcher::new(&spec.grammar, vocab);
        m.accept_text(text) && m.accepts_end()
    }

    #[test]
    fn templates_name_their_format() {
        assert_eq!(
            ToolFormat::of_template(include_str!(
                "../../../text/tests/fixtures/templates/qwen3.jinja"
            )),
            Some(ToolFormat::HermesJson)
        );
        assert_eq!(
            ToolFormat::of_template("{{ '<|tool_call:begin|>' }}"),
            Some(ToolFormat::Solar)
        );
        assert_eq!(
            ToolFormat::of_template("<tool_call>{{ n }}<arg_key>k</arg_key><arg_value>"),
            Some(ToolFormat::GlmXml)
        );
        assert_eq!(ToolFormat::of_template("plain"), None);
    }

    #[test]
    fn required_and_named_calls_are_the_only_replies() {
        let t = tools();
        let fmt = Some(ToolFormat::HermesJson);
        let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let two = format!("{one}\n<tool_call>\n{{\"name\": \"add\", \"arguments\": {{\"a\": 1, \"b\": 2}}}}\n</tool_call>");
        let req = grammar(fmt, &t, &Choice::Required, true).unwrap().unwrap();
        assert!(accepts(&req, one) && accepts(&req, &two));
        assert!(!accepts(&req, "Paris is sunny."));
        assert!(!accepts(&req, &one.replace("Paris\"", "Paris\", \"x\": 1")));
        let single = grammar(fmt, &t, &Choice::Required, false).unwrap().unwrap();
        assert!(accepts(&single, one) && !accepts(&single, &two));
        let named = grammar(fmt, &t, &Choice::Named("add".into()), true)
            .unwrap()
            .unwrap();
        assert!(!accepts(&named, one));
        let (_, calls) = parse_tool_calls(&two, Some(&t));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, "{\"a\":1,\"b\":2}");
        assert!(grammar(fmt, &t, &Choice::Named("nope".into()), true).is_err());
        assert!(grammar(Some(ToolFormat::GlmXml), &t, &Choice::Required, true).is_err());
        assert!(grammar(fmt, &t, &Choice::Auto, true).unwrap().is_none());
    }
}
