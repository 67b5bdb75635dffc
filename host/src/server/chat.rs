//! Chat requests to prompts and generated text back to messages: OpenAI and Anthropic messages
//! into the template's `messages`/`tools`, `<think>` spans into `reasoning_content`, and Hermes
//! `<tool_call>` blocks (Qwen3's format) into tool calls.

use bloomery_text::{ChatRequest, ChatTemplate, TemplateValue, Tokenizer};
use serde_json::{json, Map, Value};

use super::args::ReasoningFormat;
use super::error::ApiError;

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

/// A rendered chat prompt.
pub struct ChatPrompt {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// The rendered text.
    pub text: String,
    /// The template opened a thinking span at the end of the prompt.
    pub starts_in_thinking: bool,
}

/// Renders `messages` (OpenAI shape) and `tools` with the template and tokenizes the result.
pub fn render(
    tmpl: &ChatTemplate,
    tok: &Tokenizer,
    messages: &Value,
    tools: Option<&Value>,
    kwargs: &Map<String, Value>,
    enable_thinking: bool,
) -> Result<ChatPrompt, ApiError> {
    let mut kw: Vec<(String, TemplateValue)> = vec![(
        "enable_thinking".into(),
        TemplateValue::from(&json!(enable_thinking)),
    )];
    for (k, v) in kwargs {
        kw.retain(|(name, _)| name != k);
        kw.push((k.clone(), TemplateValue::from(v)));
    }
    let req = ChatRequest {
        messages: TemplateValue::from(messages),
        tools: tools.map(TemplateValue::from),
        add_generation_prompt: true,
        kwargs: kw,
    };
    let rendered = tmpl
        .render(&req)
        .map_err(|e| ApiError::invalid(format!("the chat template failed: {e}")))?;
    let s = tok.special();
    let text = tmpl
        .strip_added_specials(&rendered, s.add_bos, s.add_eos)
        .to_owned();
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

/// Parses Hermes `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks out of `content`;
/// the text outside them stays content. A block that is not valid JSON stays text.
pub fn parse_tool_calls(content: &str) -> (String, Vec<ToolCall>) {
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
            });
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

/// Generated text to its parts.
pub fn parse(text: &str, starts_in_thinking: bool, format: ReasoningFormat, tools: bool) -> Parsed {
    let (reasoning, content) = split_reasoning(text, starts_in_thinking, format);
    if !tools {
        return Parsed {
            reasoning,
            content,
            tool_calls: Vec::new(),
        };
    }
    let (content, tool_calls) = parse_tool_calls(&content);
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
        let (text, calls) = parse_tool_calls(t);
        assert_eq!(text, "Let me check.");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\":\"Paris\"}".into()
            }]
        );
        let (text, calls) = parse_tool_calls("<tool_call>not json</tool_call>");
        assert!(calls.is_empty());
        assert!(text.contains("not json"));
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
        let whole = parse(&s.full, false, ReasoningFormat::Split, true);
        assert_eq!(whole.reasoning.as_deref(), Some("let me think"));
        assert_eq!(whole.content, "Hello");
        assert_eq!(whole.tool_calls.len(), 1);
    }
}
