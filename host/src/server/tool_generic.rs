//! Tools offered to a chat template that never renders them. llama-server b11434 passes such
//! tools to the template, which drops them, and reads the reply as plain content (its
//! template analysis finds no call format: `common/chat-auto-parser-generator.cpp`), so the
//! model never learns of them. bloomery does not drop them: a system message describes them,
//! and a grammar holds the reply to one JSON object, either calls,
//! `{"tool_calls": [{"name": …, "arguments": {…}}]}`, or an answer, `{"response": "…"}`,
//! which is read back into tool calls or content.

use std::sync::Arc;

use bloomery_grammar::{schema, Grammar};
use bloomery_runtime::request::GrammarSpec;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::tool_parse::ToolCall;
use super::tools::Choice;

/// The object key of a reply's calls.
const CALLS: &str = "tool_calls";
/// The object key of a reply's answer.
const RESPONSE: &str = "response";

/// Whether a template's source renders `tools` at all (a template that never reads the
/// variable would drop them).
pub fn renders_tools(template_source: &str) -> bool {
    template_source.contains("tools")
}

/// `messages` with the tools described at the start of the system message (a system message
/// is added first when there is none).
pub fn with_tools_described(
    messages: &Value,
    tools: &Value,
    choice: &Choice,
    parallel: bool,
) -> Result<Value, ApiError> {
    let text = description(tools, choice, parallel)?;
    let mut list = messages.as_array().cloned().unwrap_or_default();
    match list.first_mut() {
        Some(first) if first.get("role").and_then(Value::as_str) == Some("system") => {
            let old = match first.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "the system message's content must be a string or a list of parts",
                    ))
                }
            };
            first["content"] = json!(if old.is_empty() {
                text
            } else {
                format!("{text}\n\n{old}")
            });
        }
        _ => list.insert(0, json!({"role": "system", "content": text})),
    }
    Ok(Value::Array(list))
}

/// The system message's text: the tools as JSON and the shape of the reply.
fn description(tools: &Value, choice: &Choice, parallel: bool) -> Result<String, ApiError> {
    let listed = serde_json::to_string_pretty(tools)
        .map_err(|e| ApiError::internal(format!("writing the tools: {e}")))?;
    let calls = if parallel {
        "{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<its arguments>}}, ...]} with one or more calls"
    } else {
        "{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<its arguments>}}]} with one call"
    };
    let how = match choice {
        Choice::Auto => format!(
            "To call tools, reply with {calls}. To answer without a tool, reply with {{\"response\": \"<your answer>\"}}."
        ),
        Choice::Required => format!("Call a tool: reply with {calls}."),
        Choice::Named(name) => format!("Call the tool `{name}`: reply with {calls}."),
    };
    Ok(format!(
        "You can use these tools (JSON function descriptions):\n{listed}\n\nReply with one JSON object and nothing else. {how}"
    ))
}

/// The JSON schema of a reply: calls of the wanted tools (one, or one or more when
/// `parallel`), or, with `auto`, an answer.
fn reply_schema(tools: &Value, choice: &Choice, parallel: bool) -> Result<Value, ApiError> {
    let mut calls = Vec::new();
    for (i, t) in tools.as_array().into_iter().flatten().enumerate() {
        let name = t
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("tools[{i}] has no function name")))?;
        if matches!(choice, Choice::Named(n) if n != name) {
            continue;
        }
        let params = match t.pointer("/function/parameters") {
            Some(p) if p.as_object().is_some_and(|o| !o.is_empty()) => p.clone(),
            _ => json!({"type": "object"}),
        };
        calls.push(json!({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
    }
    if calls.is_empty() {
        let name = match choice {
            Choice::Named(n) => n.as_str(),
            _ => "",
        };
        return Err(ApiError::invalid(format!(
            "tool_choice names `{name}`, which no tool is"
        )));
    }
    let mut list = json!({"type": "array", "items": {"anyOf": calls}, "minItems": 1});
    if !parallel {
        list["maxItems"] = json!(1);
    }
    let call_reply = json!({
        "type": "object",
        "properties": {CALLS: list},
        "required": [CALLS],
        "additionalProperties": false,
    });
    Ok(match choice {
        Choice::Auto => json!({"anyOf": [call_reply, {
            "type": "object",
            "properties": {RESPONSE: {"type": "string"}},
            "required": [RESPONSE],
            "additionalProperties": false,
        }]}),
        Choice::Required | Choice::Named(_) => call_reply,
    })
}

/// The grammar of a reply, applying from its first token.
pub fn grammar(tools: &Value, choice: &Choice, parallel: bool) -> Result<GrammarSpec, ApiError> {
    let gbnf = schema::to_gbnf(&reply_schema(tools, choice, parallel)?).map_err(|e| {
        ApiError::invalid(format!(
            "\"tools\": a tool's parameters cannot be enforced: {e}"
        ))
    })?;
    let g = Grammar::parse(&gbnf, None)
        .map_err(|e| ApiError::internal(format!("the tool-call grammar: {e}")))?;
    Ok(GrammarSpec {
        grammar: Arc::new(g),
        after: None,
        lazy: None,
    })
}

/// A reply read back: its answer and its calls. A reply that is not such an object (cut short,
/// say) is all content.
pub fn parse(text: &str) -> (String, Vec<ToolCall>) {
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text.trim()) else {
        return (text.trim().to_owned(), Vec::new());
    };
    if let Some(Value::String(answer)) = obj.get(RESPONSE) {
        return (answer.clone(), Vec::new());
    }
    let Some(Value::Array(list)) = obj.get(CALLS) else {
        return (text.trim().to_owned(), Vec::new());
    };
    let calls: Option<Vec<ToolCall>> = list
        .iter()
        .map(|c| {
            let name = c.get("name")?.as_str()?.to_owned();
            let args = c
                .get("arguments")
                .cloned()
                .unwrap_or_else(|| Value::Object(Map::new()));
            Some(ToolCall {
                id: None,
                name,
                arguments: args.to_string(),
            })
        })
        .collect();
    match calls {
        Some(calls) => (String::new(), calls),
        None => (text.trim().to_owned(), Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    const ONE: &str =
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}"#;
    const TWO: &str = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]}"#;
    const ANSWER: &str = r#"{"response": "It is sunny."}"#;

    #[test]
    fn the_grammar_admits_calls_of_the_offered_tools_or_with_auto_an_answer() {
        let t = tools();
        let auto = grammar(&t, &Choice::Auto, true).unwrap();
        assert!(accepts(&auto, ONE) && accepts(&auto, TWO) && accepts(&auto, ANSWER));
        assert!(!accepts(&auto, "It is sunny."));
        assert!(!accepts(&auto, &ONE.replace("get_weather", "get_time")));
        assert!(!accepts(&auto, &ONE.replace("\"Paris\"", "3")));
        assert!(!accepts(&auto, r#"{"tool_calls": []}"#));
        let single = grammar(&t, &Choice::Auto, false).unwrap();
        assert!(accepts(&single, ONE) && !accepts(&single, TWO));
        let required = grammar(&t, &Choice::Required, true).unwrap();
        assert!(accepts(&required, TWO) && !accepts(&required, ANSWER));
        let named = grammar(&t, &Choice::Named("add".into()), true).unwrap();
        assert!(
            !accepts(&named, ONE)
                && accepts(
                    &named,
                    r#"{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}"#
                )
        );
        assert!(grammar(&t, &Choice::Named("nope".into()), true).is_err());
    }

    #[test]
    fn replies_read_back_into_calls_or_content() {
        let (content, calls) = parse(TWO);
        assert_eq!(content, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[1].name.as_str(), calls[1].arguments.as_str()),
            ("add", r#"{"a":1,"b":2}"#)
        );
        assert_eq!(parse(ANSWER), ("It is sunny.".to_owned(), Vec::new()));
        // Cut short: the text as it stands.
        assert_eq!(parse(r#"{"response": "It is"#).0, r#"{"response": "It is"#);
    }

    #[test]
    fn the_tools_are_described_in_the_system_message() {
        let t = tools();
        let user = json!([{"role": "user", "content": "hi"}]);
        let m = with_tools_described(&user, &t, &Choice::Auto, true).unwrap();
        assert_eq!(m[0]["role"], "system");
        let text = m[0]["content"].as_str().unwrap();
        assert!(text.contains("\"get_weather\"") && text.contains("\"response\""));
        assert_eq!(m[1], user[0]);
        let sys =
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]);
        let m = with_tools_described(&sys, &t, &Choice::Required, false).unwrap();
        assert_eq!(m.as_array().unwrap().len(), 2);
        let text = m[0]["content"].as_str().unwrap();
        assert!(text.ends_with("\n\nBe brief.") && !text.contains("\"response\""));
    }
}
