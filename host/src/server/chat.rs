//! Chat requests to prompts and generated text back to messages: OpenAI and Anthropic messages
//! into the template's `messages`/`tools`, `<think>` spans into `reasoning_content`, and
//! `<tool_call>` blocks into tool calls: Hermes JSON (Qwen3) or XML functions (Qwen3.5,
//! Qwen3-Coder).

use bloomery_text::{ChatRequest, ChatTemplate, TemplateValue, Tokenizer};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::params::Fields;
use crate::flags::serve::ReasoningFormat;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// The text of an OpenAI content value: a string, or the concatenated `text` parts of a list.
fn content_text(v: &Value, what: &str) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push_str(t),
                    (Some(other), _) if other != "text" => {
                        return Err(ApiError::invalid(format!(
                        "{what}: content parts of type \"{other}\" are not supported (text only)"
                    )))
                    }
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "{what}: a malformed content part"
                        )))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid(format!(
            "{what}: \"content\" must be a string or a list of parts"
        ))),
    }
}

/// OpenAI `messages` normalised for a template: content as a string, tool-call arguments as
/// objects (templates print them with `tojson`).
pub fn openai_messages(messages: &Value) -> Result<Value, ApiError> {
    let list = messages
        .as_array()
        .ok_or_else(|| ApiError::invalid("\"messages\" must be an array"))?;
    if list.is_empty() {
        return Err(ApiError::invalid("\"messages\" must not be empty"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let obj = m
            .as_object()
            .ok_or_else(|| ApiError::invalid(format!("messages[{i}] must be an object")))?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("messages[{i}] needs a \"role\" string")))?;
        if !obj.contains_key("content") && !obj.contains_key("tool_calls") {
            // As llama-server refuses it (`content: null` is an empty message).
            return Err(ApiError::invalid(format!(
                "messages[{i}] needs \"content\" or \"tool_calls\""
            )));
        }
        let mut msg = Map::new();
        msg.insert("role".into(), json!(role));
        let content = content_text(
            obj.get("content").unwrap_or(&Value::Null),
            &format!("messages[{i}]"),
        )?;
        msg.insert("content".into(), json!(content));
        for key in ["name", "tool_call_id", "reasoning_content"] {
            if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
                msg.insert(key.into(), v.clone());
            }
        }
        if let Some(calls) = obj.get("tool_calls").and_then(Value::as_array) {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    if let Some(f) = c.get_mut("function") {
                        if let Some(Value::String(args)) = f.get("arguments") {
                            if let Ok(parsed) = serde_json::from_str::<Value>(args) {
                                f["arguments"] = parsed;
                            }
                        }
                    }
                    c
                })
                .collect();
            msg.insert("tool_calls".into(), Value::Array(calls));
        }
        out.push(Value::Object(msg));
    }
    Ok(Value::Array(out))
}

/// Anthropic `system` + `messages` as OpenAI messages (tool_use blocks become tool calls,
/// tool_result blocks tool messages), and Anthropic `tools` as OpenAI function tools.
pub fn anthropic_to_openai(body: &Map<String, Value>) -> Result<(Value, Option<Value>), ApiError> {
    let mut out = Vec::new();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => out.push(json!({"role": "system", "content": s})),
        Some(v @ Value::Array(_)) => {
            out.push(json!({"role": "system", "content": content_text(v, "system")?}))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "\"system\" must be a string or a list of blocks",
            ))
        }
    }
    let msgs = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::invalid("\"messages\" must be an array"))?;
    if msgs.is_empty() {
        return Err(ApiError::invalid("\"messages\" must not be empty"));
    }
    for (i, m) in msgs.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("messages[{i}] needs a \"role\" string")))?;
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            Some(Value::Array(b)) => b,
            _ => {
                return Err(ApiError::invalid(format!(
                    "messages[{i}]: \"content\" must be a string or a list of blocks"
                )))
            }
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for b in blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("thinking") | Some("redacted_thinking") => {}
                Some("tool_use") => calls.push(json!({
                    "id": b.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {
                        "name": b.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": b.get("input").cloned().unwrap_or(json!({})),
                    }
                })),
                Some("tool_result") => {
                    let content = match b.get("content") {
                        Some(v) => content_text(v, &format!("messages[{i}] tool_result"))?,
                        None => String::new(),
                    };
                    let error = b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                    out.push(json!({
                        "role": "tool",
                        "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                        "content": if error { format!("Error: {content}") } else { content },
                    }));
                }
                Some(other) => {
                    return Err(ApiError::invalid(format!(
                        "messages[{i}]: blocks of type \"{other}\" are not supported"
                    )))
                }
                None => {
                    return Err(ApiError::invalid(format!(
                        "messages[{i}]: a block without a type"
                    )))
                }
            }
        }
        if !text.is_empty() || !calls.is_empty() {
            let mut msg = json!({"role": role, "content": text});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
    }
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(ts)) => Some(Value::Array(
            ts.iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.get("name").cloned().unwrap_or(Value::Null),
                        "description": t.get("description").cloned().unwrap_or(json!("")),
                        "parameters": t.get("input_schema").cloned().unwrap_or(json!({})),
                    }})
                })
                .collect(),
        )),
        Some(_) => return Err(ApiError::invalid("\"tools\" must be an array")),
    };
    Ok((Value::Array(out), tools))
}

/// The offered `tools` (OpenAI-shaped), checked whatever the template makes of them: an array
/// of `{"type": "function", "function": {"name": …}}` with an optional string `description`
/// and object `parameters`. `None` when absent or empty.
pub fn tools(v: Option<&Value>) -> Result<Option<&Value>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid("\"tools\" must be an array")),
    };
    for (i, t) in list.iter().enumerate() {
        let bad = |why: &str| ApiError::invalid(format!("tools[{i}]: {why}"));
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("\"type\" must be \"function\""));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("\"function\" must be an object"))?;
        if f.get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(bad("\"function.name\" must be a non-empty string"));
        }
        if f.get("description")
            .is_some_and(|d| !d.is_string() && !d.is_null())
        {
            return Err(bad("\"function.description\" must be a string"));
        }
        if f.get("parameters")
            .is_some_and(|p| !p.is_object() && !p.is_null())
        {
            return Err(bad("\"function.parameters\" must be a JSON schema object"));
        }
    }
    Ok(v.filter(|_| !list.is_empty()))
}

/// Variables the template receives from the request's own fields, which
/// `chat_template_kwargs` may not replace.
const RESERVED_KWARGS: &[&str] = &["messages", "tools", "add_generation_prompt"];

/// `chat_template_kwargs`: an object of extra template variables, none of them one the request
/// sets through its own fields.
pub fn template_kwargs(f: &Fields<'_>) -> Result<Map<String, Value>, ApiError> {
    let kwargs = match f.get("chat_template_kwargs") {
        None => return Ok(Map::new()),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ApiError::invalid(
                "\"chat_template_kwargs\" must be an object",
            ))
        }
    };
    if let Some(k) = RESERVED_KWARGS.iter().find(|k| kwargs.contains_key(**k)) {
        return Err(ApiError::invalid(format!(
            "\"chat_template_kwargs\" may not set \"{k}\": it comes from the request itself"
        )));
    }
    Ok(kwargs.clone())
}

/// A rendered chat prompt.
pub struct ChatPrompt {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// The rendered text.
    pub text: String,
    /// The template opened a thinking span at the end of the prompt.
    pub starts_in_thinking: bool,
}

/// The switches a chat's rendering takes besides its messages, tools and kwargs.
#[derive(Clone, Copy, Debug)]
pub struct RenderSwitches {
    /// `enable_thinking` unless the request's kwargs set it.
    pub enable_thinking: bool,
    /// End with the opening of the assistant's turn (the request's `add_generation_prompt`).
    pub add_generation_prompt: bool,
}

/// Renders `messages` (OpenAI shape) and `tools` with the template and tokenizes the result.
/// `fits` checks the rendered text before it is tokenized (a prompt that cannot fit the
/// context is refused without the work).
pub fn render(
    tmpl: &ChatTemplate,
    tok: &Tokenizer,
    messages: &Value,
    tools: Option<&Value>,
    kwargs: &Map<String, Value>,
    switches: RenderSwitches,
    fits: impl FnOnce(&str) -> Result<(), ApiError>,
) -> Result<ChatPrompt, ApiError> {
    let mut kw: Vec<(String, TemplateValue)> = vec![(
        "enable_thinking".into(),
        TemplateValue::from(&json!(switches.enable_thinking)),
    )];
    for (k, v) in kwargs {
        kw.retain(|(name, _)| name != k);
        kw.push((k.clone(), TemplateValue::from(v)));
    }
    let req = ChatRequest {
        messages: TemplateValue::from(messages),
        tools: tools.map(TemplateValue::from),
        add_generation_prompt: switches.add_generation_prompt,
        kwargs: kw,
    };
    let rendered = tmpl
        .render(&req)
        .map_err(|e| ApiError::invalid(format!("the chat template failed: {e}")))?;
    let s = tok.special();
    let text = tmpl
        .strip_added_specials(&rendered, s.add_bos, s.add_eos)
        .to_owned();
    fits(&text)?;
    let tokens = tok
        .encode(&text, true, true)
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?;
    let starts_in_thinking = text.trim_end().ends_with(THINK_OPEN);
    Ok(ChatPrompt {
        tokens,
        text,
        starts_in_thinking,
    })
}

/// A tool call parsed from generated text.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// Function name.
    pub name: String,
    /// Arguments as JSON text.
    pub arguments: String,
}

/// Generated text split into its parts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    /// Thinking, when split out.
    pub reasoning: Option<String>,
    /// The answer.
    pub content: String,
    /// Tool calls (only parsed when the request offered tools).
    pub tool_calls: Vec<ToolCall>,
}

/// Splits `text` into thinking and answer as `format` says.
pub fn split_reasoning(
    text: &str,
    starts_in_thinking: bool,
    format: ReasoningFormat,
) -> (Option<String>, String) {
    if format == ReasoningFormat::None {
        return (None, text.to_owned());
    }
    let (think, rest) = if starts_in_thinking {
        match text.find(THINK_CLOSE) {
            Some(at) => (&text[..at], &text[at + THINK_CLOSE.len()..]),
            None => (text, ""),
        }
    } else {
        let trimmed = text.trim_start();
        match trimmed.strip_prefix(THINK_OPEN) {
            Some(inner) => match inner.find(THINK_CLOSE) {
                Some(at) => (&inner[..at], &inner[at + THINK_CLOSE.len()..]),
                None => (inner, ""),
            },
            None => return (None, text.to_owned()),
        }
    };
    let reasoning = think.trim().to_owned();
    let content = if format == ReasoningFormat::Legacy {
        text.to_owned()
    } else {
        rest.trim_start().to_owned()
    };
    (Some(reasoning), content)
}

/// Parses `<tool_call>` blocks out of `content`: Hermes JSON (`{"name": …, "arguments": …}`,
/// Qwen3) or XML functions (`<function=NAME><parameter=P>value</parameter></function>`, Qwen3.5
/// and Qwen3-Coder). The text outside them stays content; a block that is neither stays text.
/// `tools` (the offered tools, OpenAI-shaped) types XML parameters: a `string` parameter keeps its
/// text, any other is read as JSON where it parses.
pub fn parse_tool_calls(content: &str, tools: Option<&Value>) -> (String, Vec<ToolCall>) {
    let mut calls = Vec::new();
    let mut text = String::new();
    let mut rest = content;
    while let Some(at) = rest.find(TOOL_OPEN) {
        let after = &rest[at + TOOL_OPEN.len()..];
        let (body, next) = match after.find(TOOL_CLOSE) {
            Some(end) => (&after[..end], &after[end + TOOL_CLOSE.len()..]),
            None => (after, ""),
        };
        let parsed = serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| {
                let name = v.get("name")?.as_str()?.to_owned();
                let args = match v.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(a) => a.to_string(),
                    None => "{}".into(),
                };
                Some(ToolCall {
                    name,
                    arguments: args,
                })
            })
            .or_else(|| xml_call(body, tools));
        match parsed {
            Some(call) => {
                text.push_str(&rest[..at]);
                calls.push(call);
            }
            None => text.push_str(&rest[..at + TOOL_OPEN.len() + body.len()]),
        }
        rest = next;
    }
    text.push_str(rest);
    (text.trim().to_owned(), calls)
}

/// One XML-style call: `<function=NAME>` then `<parameter=P>value</parameter>` pairs (a value's
/// one leading and trailing newline belong to the format) up to `</function>`.
fn xml_call(body: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let rest = body.trim_start().strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let properties = tools
        .and_then(Value::as_array)
        .and_then(|ts| {
            ts.iter()
                .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
        })
        .and_then(|t| t.pointer("/function/parameters/properties"));
    let mut args = serde_json::Map::new();
    loop {
        let t = rest.trim_start();
        if t.is_empty() || t.starts_with("</function>") {
            break;
        }
        let after = t.strip_prefix("<parameter=")?;
        let (param, value_and_rest) = after.split_once('>')?;
        let end = value_and_rest.find("</parameter>")?;
        let raw = &value_and_rest[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let is_string = properties
            .and_then(|p| p.get(param.trim()))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .map(|t| t == "string");
        let value = match (is_string, raw.trim()) {
            (Some(true), _) => Value::String(raw.to_owned()),
            // Jinja's `| string` writes booleans as Python does.
            (Some(false), "True") => Value::Bool(true),
            (Some(false), "False") => Value::Bool(false),
            (_, t) => {
                serde_json::from_str::<Value>(t).unwrap_or_else(|_| Value::String(raw.to_owned()))
            }
        };
        args.insert(param.trim().to_owned(), value);
        rest = &value_and_rest[end + "</parameter>".len()..];
    }
    Some(ToolCall {
        name: name.to_owned(),
        arguments: Value::Object(args).to_string(),
    })
}

/// Generated text to its parts; `tools` are the tools the request offered (tool calls are
/// parsed only then).
pub fn parse(
    text: &str,
    starts_in_thinking: bool,
    format: ReasoningFormat,
    tools: Option<&Value>,
) -> Parsed {
    let (reasoning, content) = split_reasoning(text, starts_in_thinking, format);
    if tools.is_none() {
        return Parsed {
            reasoning,
            content,
            tool_calls: Vec::new(),
        };
    }
    let (content, tool_calls) = parse_tool_calls(&content, tools);
    Parsed {
        reasoning,
        content,
        tool_calls,
    }
}

/// Streams generated text as reasoning and content deltas: tags are held back until they are
/// whole, and from the first `<tool_call>` on (when tools were offered) text is held for the
/// final parse.
#[derive(Debug)]
pub struct DeltaSplitter {
    format: ReasoningFormat,
    tools: bool,
    in_think: bool,
    seen_any: bool,
    buf: String,
    holding_tools: bool,
    /// All text generated, for the final parse.
    pub full: String,
}

/// A streamed part.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    /// Thinking text.
    Reasoning(String),
    /// Answer text.
    Content(String),
}

impl DeltaSplitter {
    /// A splitter for a reply whose prompt ended inside thinking or not.
    pub fn new(starts_in_thinking: bool, format: ReasoningFormat, tools: bool) -> Self {
        DeltaSplitter {
            format,
            tools,
            in_think: starts_in_thinking && format != ReasoningFormat::None,
            seen_any: false,
            buf: String::new(),
            holding_tools: false,
            full: String::new(),
        }
    }

    /// Whether text after a tool-call opening is being held.
    pub fn holding_tools(&self) -> bool {
        self.holding_tools
    }

    /// Adds generated text; returns the deltas it releases.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.full.push_str(text);
        if self.holding_tools {
            return Vec::new();
        }
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.format != ReasoningFormat::None && !self.in_think && !self.seen_any {
                let t = self.buf.trim_start();
                if t.starts_with(THINK_OPEN) {
                    let cut = self.buf.len() - t.len() + THINK_OPEN.len();
                    self.buf.drain(..cut);
                    self.in_think = true;
                    self.seen_any = true;
                    continue;
                }
                if THINK_OPEN.starts_with(t) {
                    return out; // maybe the start of <think>
                }
                self.seen_any = true;
            }
            let tag = if self.in_think {
                THINK_CLOSE
            } else if self.tools {
                TOOL_OPEN
            } else {
                ""
            };
            if tag.is_empty() {
                if !self.buf.is_empty() {
                    out.push(Delta::Content(std::mem::take(&mut self.buf)));
                }
                return out;
            }
            if let Some(at) = self.buf.find(tag) {
                let before: String = self.buf[..at].to_owned();
                if self.in_think {
                    if !before.is_empty() {
                        out.push(Delta::Reasoning(before));
                    }
                    self.buf.drain(..at + tag.len());
                    self.in_think = false;
                    self.seen_any = true;
                    let t = self.buf.trim_start().len();
                    let lead = self.buf.len() - t;
                    self.buf.drain(..lead);
                    continue;
                }
                if !before.is_empty() {
                    out.push(Delta::Content(before));
                }
                self.buf.clear();
                self.holding_tools = true;
                return out;
            }
            let hold = (1..tag.len())
                .rev()
                .find(|&k| self.buf.ends_with(&tag[..k]))
                .unwrap_or(0);
            let cut = self.buf.len() - hold;
            if cut > 0 {
                let part: String = self.buf.drain(..cut).collect();
                out.push(if self.in_think {
                    Delta::Reasoning(part)
                } else {
                    Delta::Content(part)
                });
            }
            return out;
        }
    }

    /// The text still held at the end (not part of a tool call).
    pub fn finish(&mut self) -> Vec<Delta> {
        if self.holding_tools || self.buf.is_empty() {
            return Vec::new();
        }
        let part = std::mem::take(&mut self.buf);
        vec![if self.in_think {
            Delta::Reasoning(part)
        } else {
            Delta::Content(part)
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_is_split_out_unless_the_format_says_none() {
        let t = "<think>\nweigh it\n</think>\n\nThe answer.";
        assert_eq!(
            split_reasoning(t, false, ReasoningFormat::Split),
            (Some("weigh it".into()), "The answer.".into())
        );
        assert_eq!(
            split_reasoning(t, false, ReasoningFormat::None),
            (None, t.into())
        );
        assert_eq!(
            split_reasoning("still thinking</think>done", true, ReasoningFormat::Split),
            (Some("still thinking".into()), "done".into())
        );
        assert_eq!(
            split_reasoning("plain", false, ReasoningFormat::Split),
            (None, "plain".into())
        );
    }

    #[test]
    fn hermes_tool_calls_are_parsed_and_bad_blocks_stay_text() {
        let t = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (text, calls) = parse_tool_calls(t, None);
        assert_eq!(text, "Let me check.");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\":\"Paris\"}".into()
            }]
        );
        let (text, calls) = parse_tool_calls("<tool_call>not json</tool_call>", None);
        assert!(calls.is_empty());
        assert!(text.contains("not json"));
    }

    #[test]
    fn xml_tool_calls_are_parsed_with_the_offered_parameter_types() {
        // What Qwen3.5 and Qwen3-Coder write (the format their templates ask for).
        let t =
            "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n\
                 <parameter=days>\n3\n</parameter>\n<parameter=note>\nline one\nline two\n\
                 </parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n\
                 </function>\n</tool_call>";
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": "integer"}, "note": {"type": "string"}}}}}]);
        let (text, calls) = parse_tool_calls(t, Some(&tools));
        assert_eq!(text, "I'll look.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(
            args,
            serde_json::json!({"city": "42", "days": 3, "note": "line one\nline two"})
        );
        assert_eq!(
            (calls[1].name.as_str(), calls[1].arguments.as_str()),
            ("ping", "{}")
        );
        // Without a schema a value that reads as JSON is JSON.
        let (_, calls) = parse_tool_calls(t, None);
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args["city"], 42);
        // An unclosed parameter is not a call: the block stays text.
        let bad = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</tool_call>";
        let (text, calls) = parse_tool_calls(bad, None);
        assert!(calls.is_empty() && text.contains("<function=f>"), "{text}");
    }

    #[test]
    fn calls_the_qwen35_template_writes_parse_back_to_the_same_calls() {
        // llama.cpp's Qwen3.5 template (text/tests/fixtures/PROVENANCE.md) renders an assistant
        // turn's calls; parsing that text must give them back.
        let src = include_str!("../../../text/tests/fixtures/templates/qwen3.5.jinja");
        let tmpl = ChatTemplate::new(src, "", "<|im_end|>").unwrap();
        let args = json!({"city": "Paris", "days": 3, "metric": true, "hours": [6, 12],
                          "where": {"lat": 48.9}});
        let calls = json!([{"type": "function", "function": {"name": "get_weather",
            "arguments": args}}, {"type": "function", "function": {"name": "ping", "arguments": {}}}]);
        let messages = json!([{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": calls}]);
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "hours": {"type": "array"}, "where": {"type": "object"}}}}}]);
        let req = ChatRequest {
            messages: TemplateValue::from(&messages),
            tools: Some(TemplateValue::from(&tools)),
            add_generation_prompt: false,
            kwargs: vec![],
        };
        let text = tmpl.render(&req).unwrap();
        let turn = text.rsplit("<|im_start|>assistant\n").next().unwrap();
        let turn = turn.split("<|im_end|>").next().unwrap();
        let (content, parsed) = parse_tool_calls(turn, Some(&tools));
        assert_eq!(parsed.len(), 2, "{turn}");
        assert_eq!(parsed[0].name, "get_weather");
        let got: Value = serde_json::from_str(&parsed[0].arguments).unwrap();
        assert_eq!(got, args, "{turn}");
        assert_eq!(parsed[1].name, "ping");
        assert!(!content.contains("<tool_call>"), "{content}");
    }

    #[test]
    fn streamed_deltas_hold_split_tags_and_equal_the_whole_parse() {
        let pieces = [
            "<th",
            "ink>",
            "let me ",
            "think</",
            "think>\n\n",
            "Hel",
            "lo <tool",
            "_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>",
        ];
        let mut s = DeltaSplitter::new(false, ReasoningFormat::Split, true);
        let mut deltas = Vec::new();
        for p in pieces {
            deltas.extend(s.push(p));
        }
        deltas.extend(s.finish());
        let reasoning: String = deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Reasoning(r) => Some(r.as_str()),
                _ => None,
            })
            .collect();
        let content: String = deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Content(c) => Some(c.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(reasoning, "let me think");
        assert_eq!(content, "Hello ");
        assert!(s.holding_tools());
        let whole = parse(
            &s.full,
            false,
            ReasoningFormat::Split,
            Some(&serde_json::json!([])),
        );
        assert_eq!(whole.reasoning.as_deref(), Some("let me think"));
        assert_eq!(whole.content, "Hello");
        assert_eq!(whole.tool_calls.len(), 1);
    }
}
