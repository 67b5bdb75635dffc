//! A chat whose final message is continued rather than answered, as llama-server b11434 does it:
//! its assistant prefill (on by default, `--no-prefill-assistant` turns it off) and the request's
//! `continue_final_message` (`common/chat.cpp`, `chat-auto-parser-generator.cpp`,
//! `tools/server/server-common.cpp`). What this needs to know of the template is probed once at
//! load ([`TemplateCaps`]): whether it renders a system role, and how it wraps reasoning.

use bloomery_text::{ChatRequest, ChatTemplate, TemplateValue};
use serde_json::{json, Value};

use super::chat::{THINK_CLOSE, THINK_OPEN};
use super::error::ApiError;
use super::params::Fields;

/// What a continued message continues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continue {
    /// The answer when the message has one, else its reasoning (`true`, and the prefill).
    Auto,
    /// The answer (`"content"`): reasoning written and closed before it.
    Content,
    /// The reasoning (`"reasoning_content"`): the reasoning span left open.
    Reasoning,
}

/// The continuation a request asks for, and its `add_generation_prompt`, checked as
/// llama-server checks them: the prefill when the chat ends with an assistant message (and
/// `prefill` is on) and the request names none; both a continuation and a generation prompt, two
/// assistant messages at the end to prefill, or a continued message with tool calls is a 400.
pub fn requested(
    f: &Fields<'_>,
    prefill: bool,
    messages: &Value,
) -> Result<(Option<Continue>, bool), ApiError> {
    let mut cont = match f.get("continue_final_message") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(Continue::Auto),
        Some(Value::String(s)) if s == "content" => Some(Continue::Content),
        Some(Value::String(s)) if s == "reasoning_content" => Some(Continue::Reasoning),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "\"continue_final_message\": expected true, false, \"content\" or \
                 \"reasoning_content\", got {other}"
            )))
        }
    };
    let mut add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
    let list = messages.as_array().map(Vec::as_slice).unwrap_or_default();
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
    let last_is_assistant = list.last().and_then(role).as_deref() == Some("assistant");
    if cont.is_none() && prefill && last_is_assistant {
        if list.len() >= 2 && role(&list[list.len() - 2]).as_deref() == Some("assistant") {
            return Err(ApiError::invalid(
                "Cannot have 2 or more assistant messages at the end of the list.",
            ));
        }
        cont = Some(Continue::Auto);
        add_generation_prompt = false;
    }
    if cont.is_some() && add_generation_prompt {
        return Err(ApiError::invalid(
            "Cannot set both add_generation_prompt and continue_final_message to true.",
        ));
    }
    let has_calls = list
        .last()
        .and_then(|m| m.get("tool_calls"))
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty());
    if cont.is_some() && last_is_assistant && has_calls {
        return Err(ApiError::invalid(
            "Cannot continue an assistant message that contains tool calls.",
        ));
    }
    Ok((cont, add_generation_prompt))
}

/// How the template wraps an assistant turn's reasoning: the text before it and between it and
/// the answer (Qwen3: `<think>\n` and `\n</think>\n\n`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningTags {
    /// Opens the reasoning.
    pub start: String,
    /// Closes it, up to the answer.
    pub end: String,
}

/// How a template's assistant turn is continued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContinueStyle {
    /// The generation prompt, cut before the reasoning tag when the template has one
    /// (`None`: it writes no reasoning), as llama.cpp's generated parsers do.
    Generic(Option<ReasoningTags>),
    /// DeepSeek V3.2 and V4 (templates with DSML tool calls), whose llama.cpp handler writes
    /// the assistant tag and the think tags itself; V4 closes an empty reasoning at once.
    DeepSeekDsml {
        /// V4 (its tool block is `tool_calls`, V3.2's `function_calls`).
        v4: bool,
    },
}

/// What the chat code needs to know of a template, probed by rendering small chats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateCaps {
    /// A system message is rendered; without it (Gemma 2) the system text is merged into the
    /// next message, as llama.cpp's `system_message_not_supported` does.
    pub system_role: bool,
    /// How a final message is continued.
    pub style: ContinueStyle,
}

const SYSTEM_PROBE: &str = "bloomery-system-probe";
const REASONING_PROBE: &str = "bloomery-reasoning-probe";
const CONTENT_PROBE: &str = "bloomery-content-probe";

impl TemplateCaps {
    /// Probes `tmpl` (compiled from `source`): a system message followed by a user message
    /// (does the system text appear?), and a user message with an answer carrying reasoning
    /// (what surrounds it?). Reasoning is recognised by the `<think>` / `</think>` pair around
    /// it; a template that drops the last answer's reasoning but holds both tags (DeepSeek
    /// V3.1) wraps it in the bare tags. DeepSeek's DSML templates are told by their source,
    /// as llama.cpp tells them.
    pub fn probe(tmpl: &ChatTemplate, source: &str) -> TemplateCaps {
        let render = |messages: Value| {
            tmpl.render(&ChatRequest {
                messages: TemplateValue::from(&messages),
                tools: None,
                add_generation_prompt: false,
                kwargs: vec![("enable_thinking".into(), TemplateValue::from(&json!(true)))],
            })
            .ok()
        };
        let system_role = render(json!([
            {"role": "system", "content": SYSTEM_PROBE},
            {"role": "user", "content": "hi"},
        ]))
        .is_some_and(|t| t.contains(SYSTEM_PROBE));
        let dsml = source.contains("dsml_token")
            && source.contains("DSML")
            && (source.contains("function_calls") || source.contains("tool_calls"));
        let style = if dsml {
            ContinueStyle::DeepSeekDsml {
                v4: !source.contains("function_calls"),
            }
        } else {
            let probed = render(json!([
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": CONTENT_PROBE, "reasoning_content": REASONING_PROBE},
            ]))
            .and_then(|t| reasoning_tags(&t));
            let bare = (source.contains(THINK_OPEN) && source.contains(THINK_CLOSE)).then(|| {
                ReasoningTags {
                    start: THINK_OPEN.to_owned(),
                    end: THINK_CLOSE.to_owned(),
                }
            });
            ContinueStyle::Generic(probed.or(bare))
        };
        TemplateCaps { system_role, style }
    }
}

/// The reasoning tags of a render that holds the reasoning probe then the content probe: from
/// the last `<think>` before the reasoning to it, and from it to the answer (holding `</think>`).
fn reasoning_tags(text: &str) -> Option<ReasoningTags> {
    let r = text.find(REASONING_PROBE)?;
    let after = r + REASONING_PROBE.len();
    let c = after + text[after..].find(CONTENT_PROBE)?;
    let open = text[..r].rfind(THINK_OPEN)?;
    let end = &text[after..c];
    end.contains(THINK_CLOSE).then(|| ReasoningTags {
        start: text[open..r].to_owned(),
        end: end.to_owned(),
    })
}

/// `messages` with a leading system message merged into the next one (its text, a newline,
/// the next one's) or dropped when alone, for a template without a system role; unchanged
/// otherwise.
pub fn without_system_role(messages: &Value) -> Result<Value, ApiError> {
    let Some(list) = messages.as_array() else {
        return Ok(messages.clone());
    };
    let is_system = list
        .first()
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        == Some("system");
    if !is_system {
        return Ok(messages.clone());
    }
    let mut rest = list[1..].to_vec();
    if let Some(next) = rest.first_mut() {
        let text = |m: &Value, which: &str| match m.get("content") {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(ApiError::invalid(format!(
                "the chat template has no system role, so the system message is merged into the \
                 {which} message: both must have text content"
            ))),
        };
        let merged = format!("{}\n{}", text(&list[0], "system")?, text(next, "next")?);
        next["content"] = json!(merged);
    }
    Ok(Value::Array(rest))
}

/// A continued chat's text: the messages before the last rendered without a generation prompt,
/// then the generation prompt (what rendering with one adds; DeepSeek DSML: the assistant tag),
/// cut before the reasoning tag when the template has one and followed by the last message's
/// reasoning (and, continuing the answer, the closing tag), then its answer when that is what
/// continues. Returns the text and
/// whether it ends inside the reasoning span. `render(messages, add_generation_prompt)` renders.
pub fn continued(
    messages: &Value,
    mode: Continue,
    caps: &TemplateCaps,
    render: impl Fn(&Value, bool) -> Result<String, ApiError>,
) -> Result<(String, bool), ApiError> {
    let list = messages.as_array().map(Vec::as_slice).unwrap_or_default();
    let Some((last, head)) = list.split_last() else {
        return Ok((render(messages, false)?, false));
    };
    let head = Value::Array(head.to_vec());
    let bare = render(&head, false)?;
    let reasoning = field_text(last, "reasoning_content")?;
    let content = field_text(last, "content")?;
    let mode = match mode {
        Continue::Auto if !reasoning.is_empty() && content.is_empty() => Continue::Reasoning,
        Continue::Auto => Continue::Content,
        m => m,
    };
    let answer = mode == Continue::Content;
    let (generation, in_reasoning) = match &caps.style {
        ContinueStyle::DeepSeekDsml { v4 } => {
            const ASSISTANT: &str = "<｜Assistant｜>";
            if *v4 && reasoning.is_empty() {
                let tail = if answer { content.as_str() } else { "" };
                (format!("{ASSISTANT}{THINK_CLOSE}{tail}"), false)
            } else if answer {
                let g = format!("{ASSISTANT}{THINK_OPEN}{reasoning}{THINK_CLOSE}{content}");
                (g, false)
            } else {
                (format!("{ASSISTANT}{THINK_OPEN}{reasoning}"), true)
            }
        }
        ContinueStyle::Generic(tags) => {
            let mut g = generation_prompt(&bare, &render(&head, true)?).to_owned();
            let mut in_reasoning = false;
            if let Some(tags) = tags {
                if let Some(at) = g.find(&tags.start) {
                    g.truncate(at);
                }
                g.push_str(&tags.start);
                g.push_str(&reasoning);
                if answer {
                    g.push_str(&tags.end);
                } else {
                    in_reasoning = true;
                }
            }
            if answer {
                g.push_str(&content);
            }
            (g, in_reasoning)
        }
    };
    Ok((bare + &generation, in_reasoning))
}

/// `messages` with the last one's content as the request wrote it (`raw`: the request's own
/// last message) when that was a list of parts: a continued message's parts are joined by
/// blank lines, as llama.cpp joins them, where the chat's rendering had concatenated them.
pub fn with_parts_joined(messages: &Value, raw: Option<&Value>) -> Result<Value, ApiError> {
    let mut out = messages.clone();
    let parts = raw.and_then(|m| m.get("content")).filter(|c| c.is_array());
    if let (Some(_), Some(last)) = (parts, out.as_array_mut().and_then(|l| l.last_mut())) {
        last["content"] = json!(field_text(raw.unwrap_or(&Value::Null), "content")?);
    }
    Ok(out)
}

/// What rendering with a generation prompt (`prompted`) adds to rendering without (`bare`):
/// `prompted` past their common prefix (backed off to a character boundary).
fn generation_prompt<'a>(bare: &str, prompted: &'a str) -> &'a str {
    let common = bare
        .bytes()
        .zip(prompted.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let common = (0..=common)
        .rev()
        .find(|&i| prompted.is_char_boundary(i))
        .unwrap_or(0);
    &prompted[common..]
}

/// A message field's text: a string, the `text` parts of a list joined by blank lines (as
/// llama.cpp's `render_content`), or empty.
fn field_text(m: &Value, key: &str) -> Result<String, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n\n")),
        Some(_) => Err(ApiError::invalid(format!(
            "the continued message's \"{key}\" must be a string or a list of text parts"
        ))),
    }
}
