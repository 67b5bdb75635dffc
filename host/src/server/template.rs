//! Which chat template serves (`--chat-template`, `--chat-template-file`, the model's own), and
//! llama.cpp's built-in (non-Jinja) templates as llama-server b11434 uses them: only under
//! `--no-jinja`, where the template's text, a built-in name or any text its detection knows
//! (`bloomery_text::builtin::detect`), picks one; the prompt is then each message's role and
//! text in its fixed layout, with no tools, no template variables and no reasoning parsing.

use std::path::Path;

use anyhow::Context;
use bloomery_text::builtin::{self, Builtin};
use bloomery_text::ChatTemplate;
use serde_json::Value;

use super::error::ApiError;
use super::params::Fields;
use crate::flags::serve::ServeArgs;

/// The serving template: compiled, its source (what `/props` reports as `chat_template`), and
/// the built-in layout that renders instead under `--no-jinja`.
pub struct Choice {
    /// The Jinja template (under `--no-jinja` llama.cpp still parses the text as Jinja at load).
    pub template: ChatTemplate,
    /// Its text, or the name given.
    pub source: String,
    /// Under `--no-jinja`: the built-in template that renders the prompt.
    pub builtin: Option<Builtin>,
}

/// The template flags of `serve` and `run` (llama.cpp's `--chat-template`,
/// `--chat-template-file`, `--jinja`/`--no-jinja`).
#[derive(Clone, Copy, Debug)]
pub struct Flags<'a> {
    /// `--chat-template`: Jinja source or a name.
    pub text: Option<&'a str>,
    /// `--chat-template-file`.
    pub file: Option<&'a Path>,
    /// `--jinja` (the default) rather than `--no-jinja`.
    pub jinja: bool,
}

impl<'a> Flags<'a> {
    /// The template flags of `serve`.
    pub fn of_serve(a: &'a ServeArgs) -> Flags<'a> {
        Flags {
            text: a.chat_template.as_deref(),
            file: a.chat_template_file.as_deref(),
            jinja: a.jinja(),
        }
    }
}

/// The template `flags` ask for; `model_source` is the model's `tokenizer.chat_template`
/// (`None`: the file has none, and ChatML serves).
pub fn choose(
    flags: Flags<'_>,
    model_source: Option<&str>,
    bos: &str,
    eos: &str,
) -> anyhow::Result<Choice> {
    let chatml = crate::text::CHATML_FALLBACK;
    let (source, given) = match (flags.text, flags.file) {
        (Some(_), Some(_)) => {
            anyhow::bail!("give --chat-template or --chat-template-file, not both")
        }
        (Some("chatml"), None) => (chatml.to_owned(), true),
        (Some(t), None) => (t.to_owned(), true),
        (None, Some(path)) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("reading --chat-template-file {}", path.display()))?,
            true,
        ),
        (None, None) => {
            if model_source.is_none() {
                tracing::warn!("the model file has no tokenizer.chat_template; using ChatML");
            }
            (model_source.unwrap_or(chatml).to_owned(), false)
        }
    };
    let builtin = if flags.jinja {
        if let Some(t) = flags.text {
            jinja_text(t)?;
        }
        None
    } else {
        Some(builtin::detect(&source).ok_or_else(|| unsupported(&source, given))?)
    };
    let template = ChatTemplate::new(&source, bos, eos)?;
    Ok(Choice {
        template,
        source,
        builtin,
    })
}

/// Under `--jinja`, `--chat-template`'s text must be Jinja source (or `chatml`).
fn jinja_text(t: &str) -> anyhow::Result<()> {
    if t == "chatml" || t.contains("{%") || t.contains("{{") {
        return Ok(());
    }
    if Builtin::by_name(t).is_some() {
        anyhow::bail!(
            "--chat-template {t:?} is one of llama.cpp's built-in templates, which llama-server \
             b11434 uses only with --no-jinja (with --jinja, its default, it reads the name as \
             Jinja text and the whole prompt would be the name itself): add --no-jinja"
        );
    }
    anyhow::bail!(
        "--chat-template {t:?}: not Jinja source; with --no-jinja, one of llama.cpp's built-in \
         names: {}",
        builtin::names_list()
    )
}

/// llama.cpp's refusal of a template it cannot render without Jinja.
fn unsupported(source: &str, given: bool) -> anyhow::Error {
    if given {
        anyhow::anyhow!(
            "the supplied chat template is not supported: {source}\nnote: llama.cpp was started \
             without --jinja, we only support commonly used templates (built in: {})",
            builtin::names_list()
        )
    } else {
        anyhow::anyhow!(
            "--no-jinja: the model's chat template is none of llama.cpp's built-in templates \
             (this custom template is not supported, try using --jinja)"
        )
    }
}

/// llama-server's refusals of a chat request under `--no-jinja`: a non-empty `tools` list, a
/// `tool_choice` string other than `auto`.
pub fn refuse_tools(f: &Fields<'_>) -> Result<(), ApiError> {
    if f.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
    {
        return Err(ApiError::invalid("tools param requires --jinja flag"));
    }
    match f.get("tool_choice") {
        Some(Value::String(s)) if s != "auto" => {
            Err(ApiError::invalid("tool_choice param requires --jinja flag"))
        }
        _ => Ok(()),
    }
}

/// The prompt of `messages` (normalised, content as text) in built-in template `b`. Where the
/// request's own message (`raw`, when it lists as many) holds a list of content parts, their
/// texts are joined by newlines, as llama.cpp's legacy path joins them.
pub fn builtin_prompt(
    b: Builtin,
    messages: &Value,
    raw: Option<&Value>,
    add_generation_prompt: bool,
) -> String {
    let list = messages.as_array().map(Vec::as_slice).unwrap_or_default();
    let raw = raw
        .and_then(Value::as_array)
        .filter(|r| r.len() == list.len());
    let chat: Vec<(String, String)> = list
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
            let parts = raw
                .and_then(|r| r[i].get("content"))
                .and_then(Value::as_array);
            let content = match parts {
                Some(parts) => joined(parts),
                None => text(m.get("content")),
            };
            (text(m.get("role")), content)
        })
        .collect();
    b.render(&chat, add_generation_prompt)
}

/// The `text` parts' texts, a newline between a non-empty start and the next part.
fn joined(parts: &[Value]) -> String {
    let mut out = String::new();
    for p in parts {
        if p.get("type").and_then(Value::as_str) != Some("text") {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parts_are_joined_by_newlines_after_non_empty_text() {
        let parts = json!([
            {"type": "text", "text": ""},
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b"},
            {"type": "text", "text": ""}
        ]);
        assert_eq!(joined(parts.as_array().unwrap()), "a\nb\n");
    }

    #[test]
    fn a_chat_renders_in_the_builtin_layout() {
        let msgs = json!([
            {"role": "system", "content": " You are a test. "},
            {"role": "user", "content": "Hi therejoined"}
        ]);
        let raw = json!([
            {"role": "system", "content": " You are a test. "},
            {"role": "user", "content": [
                {"type": "text", "text": "Hi there"},
                {"type": "text", "text": "joined"}
            ]}
        ]);
        let got = builtin_prompt(Builtin::CommandR, &msgs, Some(&raw), true);
        assert_eq!(
            got,
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>\
             <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there\njoined<|END_OF_TURN_TOKEN|>\
             <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
        );
    }
}
