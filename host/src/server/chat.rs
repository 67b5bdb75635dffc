//! Chat requests to prompts and generated text back to messages: OpenAI and Anthropic messages
//! into the template's `messages`/`tools`, `<think>` spans into `reasoning_content`, and tool
//! calls (in the format of the template's family, `tool_parse.rs`) into calls, whole or streamed.

use bloomery_text::{ChatRequest, ChatTemplate, TemplateValue, Tokenizer};
use serde_json::{json, Map, Value};

use super::chat_continue::{self, Continue, TemplateCaps};
use super::error::ApiError;
use super::params::Fields;
use super::tool_parse::{closed_calls, parse_tool_calls, ToolCall};
use super::tools::ToolFormat;
use crate::flags::serve::ReasoningFormat;

/// Opens a thinking span.
pub const THINK_OPEN: &str = "<think>";
/// Closes a thinking span.
pub const THINK_CLOSE: &str = "</think>";

/// The tools a request offers and the format its template writes calls in.
#[derive(Clone, Debug)]
pub struct OfferedTools {
    /// The tools, OpenAI-shaped (their parameter types decide how bare-text arguments read).
    pub list: Value,
    /// The template's format; `None`: one this server does not know (calls are read as Hermes
    /// JSON or Qwen XML, and no grammar can require them).
    pub format: Option<ToolFormat>,
}

impl OfferedTools {
    /// The format calls are parsed in.
    fn parse_format(&self) -> ToolFormat {
        self.format.unwrap_or(ToolFormat::HermesJson)
    }
}

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
    // An empty list is rendered as the template renders it (llama-server b11434 accepts it).
    let list = messages
        .as_array()
        .ok_or_else(|| ApiError::invalid("\"messages\" must be an array"))?;
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

/// Anthropic `system` + `messages` as OpenAI messages, as llama-server b11434 converts them
/// (`server_chat_convert_anthropic_to_oai`): a message's text blocks joined as its content,
/// tool_use blocks as tool calls, thinking blocks as `reasoning_content` (which templates such
/// as Qwen3's render in the history), then its tool_result blocks as tool messages after it;
/// and Anthropic `tools` as OpenAI function tools. An empty `messages` is accepted.
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
        let (mut text, mut reasoning) = (String::new(), String::new());
        let (mut calls, mut results) = (Vec::new(), Vec::new());
        for b in blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("thinking") => {
                    reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
                }
                // Its content is encrypted: nothing a template could show.
                Some("redacted_thinking") => {}
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
                    results.push(json!({
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
        if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
            let mut msg = json!({"role": role, "content": text});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            if !reasoning.is_empty() {
                msg["reasoning_content"] = Value::String(reasoning);
            }
            out.push(msg);
        }
        out.extend(results);
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

/// `chat_template_kwargs` over the server's (`defaults`, `--chat-template-kwargs`): an object of
/// extra template variables, none of them one the request sets through its own fields.
pub fn template_kwargs(
    f: &Fields<'_>,
    defaults: Map<String, Value>,
) -> Result<Map<String, Value>, ApiError> {
    let kwargs = match f.get("chat_template_kwargs") {
        None => return Ok(defaults),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ApiError::invalid(
                "\"chat_template_kwargs\" must be an object",
            ))
        }
    };
    if let Some(k) = crate::flags::serve::RESERVED_KWARGS
        .iter()
        .find(|k| kwargs.contains_key(**k))
    {
        return Err(ApiError::invalid(format!(
            "\"chat_template_kwargs\" may not set \"{k}\": it comes from the request itself"
        )));
    }
    let mut merged = defaults;
    merged.extend(kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(merged)
}

/// A rendered chat prompt.
pub struct ChatPrompt {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// The rendered text.
    pub text: String,
    /// The template opened a thinking span at the end of the prompt.
    pub starts_in_thinking: bool,
    /// The prompt ends with no thinking span opened or closed: the model may open one itself
    /// (Qwen3), so a grammar from the first token lets it.
    pub may_open_thinking: bool,
}

/// The switches a chat's rendering takes besides its messages, tools and kwargs.
#[derive(Clone, Copy, Debug)]
pub struct RenderSwitches<'a> {
    /// `enable_thinking` unless the request's kwargs set it. When it is false in the end, a
    /// thinking block the template leaves open is closed (`--reasoning off`, as llama.cpp).
    pub enable_thinking: bool,
    /// `reasoning_effort` unless the request's kwargs set it (`None`: not given).
    pub reasoning_effort: Option<&'a str>,
    /// End with the opening of the assistant's turn (the request's `add_generation_prompt`).
    pub add_generation_prompt: bool,
    /// Continue the last message instead (`chat_continue::requested`).
    pub continuation: Option<Continue>,
    /// What the template renders (system role, reasoning tags).
    pub caps: &'a TemplateCaps,
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
    switches: RenderSwitches<'_>,
    fits: impl FnOnce(&str) -> Result<(), ApiError>,
) -> Result<ChatPrompt, ApiError> {
    let mut kw: Vec<(String, TemplateValue)> = vec![(
        "enable_thinking".into(),
        TemplateValue::from(&json!(switches.enable_thinking)),
    )];
    if let Some(effort) = switches.reasoning_effort {
        kw.push((
            "reasoning_effort".into(),
            TemplateValue::from(&json!(effort)),
        ));
    }
    let thinking = kwargs
        .get("enable_thinking")
        .and_then(Value::as_bool)
        .unwrap_or(switches.enable_thinking);
    for (k, v) in kwargs {
        kw.retain(|(name, _)| name != k);
        kw.push((k.clone(), TemplateValue::from(v)));
    }
    let s = tok.special();
    let render_text = |messages: &Value, add_generation_prompt: bool| {
        let req = ChatRequest {
            messages: TemplateValue::from(messages),
            tools: tools.map(TemplateValue::from),
            add_generation_prompt,
            kwargs: kw.clone(),
        };
        let rendered = tmpl
            .render(&req)
            .map_err(|e| ApiError::invalid(format!("the chat template failed: {e}")))?;
        Ok::<_, ApiError>(
            tmpl.strip_added_specials(&rendered, s.add_bos, s.add_eos)
                .to_owned(),
        )
    };
    let merged;
    let messages = if switches.caps.system_role {
        messages
    } else {
        merged = chat_continue::without_system_role(messages)?;
        &merged
    };
    let (text, starts_in_thinking, may_open_thinking) = match switches.continuation {
        // The model goes on with the message: no span of its own to open.
        Some(mode) => {
            let (text, in_reasoning) =
                chat_continue::continued(messages, mode, switches.caps, render_text)?;
            (text, in_reasoning, false)
        }
        None => {
            let mut text = render_text(messages, switches.add_generation_prompt)?;
            // Thinking off, and the template opens the thinking block itself (DeepSeek-R1,
            // QwQ): it is closed at once, as llama.cpp does.
            if !thinking && text.trim_end().ends_with(THINK_OPEN) {
                text.push_str(THINK_CLOSE);
            }
            let starts = text.trim_end().ends_with(THINK_OPEN);
            let may_open = !starts && !text.trim_end().ends_with(THINK_CLOSE);
            (text, starts, may_open)
        }
    };
    fits(&text)?;
    let tokens = tok
        .encode(&text, true, true)
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?;
    Ok(ChatPrompt {
        tokens,
        text,
        starts_in_thinking,
        may_open_thinking,
    })
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

/// Generated text to its parts; `tools` are the tools the request offered (tool calls are
/// parsed only then).
pub fn parse(
    text: &str,
    starts_in_thinking: bool,
    format: ReasoningFormat,
    tools: Option<&OfferedTools>,
) -> Parsed {
    let (reasoning, content) = split_reasoning(text, starts_in_thinking, format);
    let Some(tools) = tools else {
        return Parsed {
            reasoning,
            content,
            tool_calls: Vec::new(),
        };
    };
    let (content, tool_calls) = parse_tool_calls(&content, tools.parse_format(), Some(&tools.list));
    Parsed {
        reasoning,
        content,
        tool_calls,
    }
}

/// Streams generated text as reasoning, content and tool-call deltas: tags are held back until
/// they are whole, and from the first tool-call opening on (when tools were offered) the text is
/// held and each call is released once its block has closed.
#[derive(Debug)]
pub struct DeltaSplitter {
    format: ReasoningFormat,
    tools: Option<OfferedTools>,
    in_think: bool,
    seen_any: bool,
    buf: String,
    /// The text from the first tool-call opening on.
    held: Option<String>,
    /// Calls released so far.
    released: usize,
    /// All text generated.
    pub full: String,
}

/// A streamed part.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    /// Thinking text.
    Reasoning(String),
    /// Answer text.
    Content(String),
    /// A whole tool call.
    Call(ToolCall),
}

impl DeltaSplitter {
    /// A splitter for a reply whose prompt ended inside thinking or not; `tools`: the offered
    /// tools (their calls are split out).
    pub fn new(
        starts_in_thinking: bool,
        format: ReasoningFormat,
        tools: Option<OfferedTools>,
    ) -> Self {
        DeltaSplitter {
            format,
            tools,
            in_think: starts_in_thinking && format != ReasoningFormat::None,
            seen_any: false,
            buf: String::new(),
            held: None,
            released: 0,
            full: String::new(),
        }
    }

    /// Whether the reply has called a tool so far.
    pub fn called(&self) -> bool {
        self.released > 0
    }

    /// The texts that open tool calls (none when no tools were offered).
    fn openers(&self) -> &'static [&'static str] {
        self.tools
            .as_ref()
            .map_or(&[], |t| t.parse_format().openers())
    }

    /// Calls of the held text not released yet: the closed ones, or at the end all of them.
    fn release_calls(&mut self, out: &mut Vec<Delta>, at_end: bool) {
        let (Some(held), Some(tools)) = (&self.held, &self.tools) else {
            return;
        };
        let fmt = tools.parse_format();
        let calls = if at_end {
            parse_tool_calls(held, fmt, Some(&tools.list)).1
        } else {
            closed_calls(held, fmt, Some(&tools.list))
        };
        for c in calls.into_iter().skip(self.released) {
            self.released += 1;
            out.push(Delta::Call(c));
        }
    }

    /// Adds generated text; returns the deltas it releases.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.full.push_str(text);
        let mut out = Vec::new();
        if let Some(held) = &mut self.held {
            held.push_str(text);
            self.release_calls(&mut out, false);
            return out;
        }
        self.buf.push_str(text);
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
            let tags: &[&str] = if self.in_think {
                &[THINK_CLOSE]
            } else {
                self.openers()
            };
            if tags.is_empty() {
                if !self.buf.is_empty() {
                    out.push(Delta::Content(std::mem::take(&mut self.buf)));
                }
                return out;
            }
            if let Some((at, tag)) = tags
                .iter()
                .filter_map(|t| self.buf.find(t).map(|at| (at, *t)))
                .min()
            {
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
                self.held = Some(self.buf.split_off(at));
                self.buf.clear();
                self.release_calls(&mut out, false);
                return out;
            }
            let hold = tags
                .iter()
                .filter_map(|tag| {
                    (1..tag.len())
                        .rev()
                        .find(|&k| tag.is_char_boundary(k) && self.buf.ends_with(&tag[..k]))
                })
                .max()
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

    /// What is still held at the end: the held text's remaining calls (an unclosed last block
    /// read as far as it goes) and its text outside them, or the text that was not a tag after
    /// all.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        if let (Some(held), Some(tools)) = (&self.held, &self.tools) {
            let (rest, _) = parse_tool_calls(held, tools.parse_format(), Some(&tools.list));
            self.release_calls(&mut out, true);
            if !rest.is_empty() {
                out.push(Delta::Content(rest));
            }
            return out;
        }
        if !self.buf.is_empty() {
            let part = std::mem::take(&mut self.buf);
            out.push(if self.in_think {
                Delta::Reasoning(part)
            } else {
                Delta::Content(part)
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As llama-server b11434 (`server_chat_convert_anthropic_to_oai`): thinking blocks become
    /// the message's `reasoning_content`, its tool results follow it as tool messages, and an
    /// empty `messages` converts to no messages.
    #[test]
    fn anthropic_messages_convert_as_llama_server_converts_them() {
        let body = json!({"messages": [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "look first", "signature": "x"},
                {"type": "tool_use", "id": "c1", "name": "ls", "input": {"path": "."}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "main.py"},
                {"type": "text", "text": "and now?"},
            ]},
        ]});
        let (msgs, _) = anthropic_to_openai(body.as_object().unwrap()).unwrap();
        assert_eq!(
            msgs,
            json!([
                {"role": "assistant", "content": "", "reasoning_content": "look first",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "ls", "arguments": {"path": "."}}}]},
                {"role": "user", "content": "and now?"},
                {"role": "tool", "tool_call_id": "c1", "content": "main.py"},
            ])
        );
        let empty = json!({"messages": []});
        assert_eq!(
            anthropic_to_openai(empty.as_object().unwrap()).unwrap().0,
            json!([])
        );
        assert_eq!(openai_messages(&json!([])).unwrap(), json!([]));
    }

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
        let tools = OfferedTools {
            list: json!([]),
            format: Some(ToolFormat::HermesJson),
        };
        let mut s = DeltaSplitter::new(false, ReasoningFormat::Split, Some(tools.clone()));
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
        assert!(s.called());
        let whole = parse(&s.full, false, ReasoningFormat::Split, Some(&tools));
        assert_eq!(whole.reasoning.as_deref(), Some("let me think"));
        assert_eq!(whole.content, "Hello");
        assert_eq!(whole.tool_calls.len(), 1);
    }
}
