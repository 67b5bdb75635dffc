//! Tool calls: which format a chat template's family writes them in (read from the template's
//! text, as llama.cpp's chat.cpp recognises it, until model plugins declare it), and the grammar
//! that holds a reply to calls (`tool_grammar.rs`): from the first token when the request asks
//! for calls (`tool_choice` `required`/`any` or a named function), lazily from the format's
//! opening text on with `auto` (llama.cpp's lazy grammar), one or several per
//! `parallel_tool_calls`. A template whose format this server does not know gets no grammar,
//! and a request that needs one is refused.

use std::sync::Arc;

use bloomery_grammar::Grammar;
use bloomery_runtime::request::{GrammarSpec, LazyOpening};
use bloomery_text::Tokenizer;
use serde_json::{json, Value};

use super::error::ApiError;
use super::params::Fields;
use super::tool_grammar::{calls_gbnf, Tool};
use super::tool_parse::{DSML_OPEN, DSML_V32_OPEN, SOLAR_FRAME, SOLAR_OPEN};

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
    /// A template that never renders tools: bloomery's own reply, one JSON object of calls or
    /// an answer (`tool_generic.rs`).
    GenericJson,
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

    /// The texts that open a reply's calls: a lazy grammar's trigger words, and where a
    /// stream starts holding text back.
    pub fn openers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::HermesJson | ToolFormat::QwenXml | ToolFormat::GlmXml => &["<tool_call>"],
            ToolFormat::DeepSeekDsml => &[DSML_OPEN, DSML_V32_OPEN],
            ToolFormat::Solar => &[SOLAR_FRAME[0], SOLAR_OPEN],
            // The whole reply is the object.
            ToolFormat::GenericJson => &["{"],
        }
    }

    /// The fixed tags of the format (and of thinking), which a vocabulary may hold as control
    /// tokens that must still reach the parser as text.
    pub fn tags(self) -> &'static [&'static str] {
        match self {
            ToolFormat::HermesJson => &["<tool_call>", "</tool_call>", "<think>", "</think>"],
            ToolFormat::QwenXml => &[
                "<tool_call>",
                "</tool_call>",
                "</function>",
                "</parameter>",
                "<think>",
                "</think>",
            ],
            ToolFormat::GlmXml => &[
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
                "<think>",
                "</think>",
            ],
            ToolFormat::DeepSeekDsml => &["｜DSML｜", "<think>", "</think>"],
            ToolFormat::Solar => &[
                "<|tool_calls|>",
                "<|calls|>",
                "<|tool_call:begin|>",
                "<|tool_call:name|>",
                "<|tool_call:args|>",
                "<|tool_call:end|>",
            ],
            ToolFormat::GenericJson => &[],
        }
    }

    /// Whether the family thinks inside `<think>…</think>` (Solar has its own markers).
    pub fn thinks_in_tags(self) -> bool {
        !matches!(self, ToolFormat::Solar | ToolFormat::GenericJson)
    }
}

/// The ids of those `tags` that the vocabulary holds as one control token (whose text a reply
/// would otherwise lose): llama.cpp's preserved tokens.
pub fn control_ids(tok: &Tokenizer, tags: &[&str]) -> Vec<u32> {
    tags.iter()
        .filter_map(|t| match tok.encode(t, false, true).ok()?.as_slice() {
            [id] if tok.token_to_piece(*id, false).is_empty() => Some(*id),
            _ => None,
        })
        .collect()
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

/// The grammar that holds the reply to tool calls: from the first token when `choice` asks for
/// calls, lazily (from the format's opening text on) with `auto`; with `think` (the model may
/// open a think span itself) the span may come first, and a lazy grammar's trigger inside it does
/// not count; `tools` are the offered tools, OpenAI-shaped. With `auto`, a template of an unknown format or tools whose schemas cannot be
/// enforced leave the reply unconstrained, as without tools (logged).
pub fn grammar(
    format: Option<ToolFormat>,
    tools: &Value,
    choice: &Choice,
    parallel: bool,
    think: bool,
) -> Result<Option<GrammarSpec>, ApiError> {
    let offered: Vec<&Value> = tools
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let wanted: Vec<&Value> = match choice {
        Choice::Auto | Choice::Required => offered,
        Choice::Named(n) => {
            let t: Vec<&Value> = offered
                .into_iter()
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
    if format == Some(ToolFormat::GenericJson) {
        return super::tool_generic::grammar(tools, choice, parallel).map(Some);
    }
    let Some(format) = format else {
        if *choice == Choice::Auto {
            return Ok(None);
        }
        return Err(ApiError::invalid(format!(
            "tool_choice {choice:?} needs a tool-call grammar, and this template writes tool calls in no format this server knows"
        )));
    };
    let lazy = *choice == Choice::Auto;
    let built = spec(format, &wanted, parallel, think && !lazy);
    match (built, choice) {
        (Ok(mut spec), Choice::Auto) => {
            spec.lazy = Some(Box::new(LazyOpening {
                triggers: format.openers().iter().map(|s| (*s).to_owned()).collect(),
                optional_span: think.then(|| ("<think>".to_owned(), "</think>".to_owned())),
            }));
            Ok(Some(spec))
        }
        (Err(e), Choice::Auto) => {
            tracing::warn!("tool calls left unconstrained: {}", e.message);
            Ok(None)
        }
        (built, _) => built.map(Some),
    }
}

/// The grammar of calls of `wanted` in `format`, applying from the first token.
fn spec(
    format: ToolFormat,
    wanted: &[&Value],
    parallel: bool,
    think: bool,
) -> Result<GrammarSpec, ApiError> {
    let mut list = Vec::with_capacity(wanted.len());
    for (i, t) in wanted.iter().enumerate() {
        let name = t
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("tools[{i}] has no function name")))?;
        if name.contains(['<', '>', '"', '\n']) {
            return Err(ApiError::invalid(format!(
                "tools[{i}]: the name {name:?} cannot be written in this template's tool-call format"
            )));
        }
        let params = match t.pointer("/function/parameters") {
            Some(p) if p.as_object().is_some_and(|o| !o.is_empty()) => p.clone(),
            _ => json!({"type": "object"}),
        };
        list.push(Tool { name, params });
    }
    let gbnf = calls_gbnf(format, &list, parallel, think)?;
    let g = Grammar::parse(&gbnf, None)
        .map_err(|e| ApiError::internal(format!("the tool-call grammar: {e}")))?;
    Ok(GrammarSpec {
        grammar: Arc::new(g),
        after: None,
        lazy: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tool_parse::parse_tool_calls;

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
        let req = grammar(fmt, &t, &Choice::Required, true, false)
            .unwrap()
            .unwrap();
        assert!(accepts(&req, one) && accepts(&req, &two));
        assert!(!accepts(&req, "Paris is sunny."));
        assert!(!accepts(&req, &one.replace("Paris\"", "Paris\", \"x\": 1")));
        let single = grammar(fmt, &t, &Choice::Required, false, false)
            .unwrap()
            .unwrap();
        assert!(accepts(&single, one) && !accepts(&single, &two));
        let named = grammar(fmt, &t, &Choice::Named("add".into()), true, false)
            .unwrap()
            .unwrap();
        assert!(!accepts(&named, one));
        let (_, calls) = parse_tool_calls(&two, ToolFormat::HermesJson, Some(&t));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, "{\"a\":1,\"b\":2}");
        assert!(grammar(fmt, &t, &Choice::Named("nope".into()), true, false).is_err());
        assert!(grammar(None, &t, &Choice::Required, true, false).is_err());
        assert!(grammar(None, &t, &Choice::Auto, true, false)
            .unwrap()
            .is_none());
        let lazy = grammar(fmt, &t, &Choice::Auto, true, false)
            .unwrap()
            .unwrap();
        let opening = lazy.lazy.unwrap();
        assert_eq!(opening.triggers, ["<tool_call>"]);
        assert_eq!(opening.optional_span, None);
        let lazy = grammar(fmt, &t, &Choice::Auto, true, true)
            .unwrap()
            .unwrap();
        assert_eq!(lazy.lazy.unwrap().optional_span.unwrap().0, "<think>");
        assert!(req.lazy.is_none());
    }
}
