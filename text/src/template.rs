//! Chat-template rendering (`tokenizer.chat_template`) with minijinja, configured to render exactly as
//! Python jinja2 does under Hugging Face transformers: sandboxed, `trim_blocks` and `lstrip_blocks`,
//! loop controls, Python string/dict methods, Python printing of values, and transformers' `tojson`,
//! `raise_exception` and `strftime_now`.

use std::fmt;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use crate::error::TextError;
use crate::pyfmt::{json_dumps, py_str, JsonStyle};
use crate::strftime::CivilTime;
use crate::template_value::TemplateValue;

/// What a chat template is rendered with.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// `messages`: the conversation, a list of `{role, content, ...}` objects (content may be a string or a
    /// list of content parts; assistant messages may carry `tool_calls` and `reasoning_content`).
    pub messages: TemplateValue,
    /// `tools`: JSON-schema tool list; left undefined in the template when `None`.
    pub tools: Option<TemplateValue>,
    /// `add_generation_prompt`: end with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Extra variables (`chat_template_kwargs`), e.g. `enable_thinking: false`. llama-server always sets
    /// `enable_thinking` (true unless reasoning is turned off); the host should do the same.
    pub kwargs: Vec<(String, TemplateValue)>,
}

/// A compiled chat template with the model's BOS/EOS strings.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The fixed time `strftime_now`, `datetime` and `date_string` read (`None`: the UTC clock).
    now: Option<CivilTime>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut style = JsonStyle::default();
    if let Some(b) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        style.ensure_ascii = b;
    }
    if let Some(n) = kwargs.get::<Option<Value>>("indent")? {
        if n.is_integer() {
            style.indent = Some(usize::try_from(n.as_i64().unwrap_or(0)).unwrap_or(0));
            style.separators.0 = ",".into();
        } else if let Some(s) = n.as_str() {
            // Python accepts a string indent; only runs of spaces are supported here.
            style.indent = Some(s.len());
            style.separators.0 = ",".into();
        }
    }
    if let Some(sep) = kwargs.get::<Option<Value>>("separators")? {
        if !sep.is_none() {
            let parts: Vec<Value> = sep.try_iter()?.collect();
            if let [a, b] = parts.as_slice() {
                style.separators = (py_str(a), py_str(b));
            } else {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair",
                ));
            }
        }
    }
    if let Some(b) = kwargs.get::<Option<bool>>("sort_keys")? {
        style.sort_keys = b;
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(json_dumps(value, &style)?))
}

/// llama.cpp's `from_json` filter (DeepSeek-V4's template parses string tool arguments with it).
fn from_json(text: &str) -> Result<Value, Error> {
    TemplateValue::from_json_str("from_json input", text)
        .map(TemplateValue::into_value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
}

/// Python `str()` as the `string` filter.
fn string_filter(value: &Value) -> Value {
    match value.kind() {
        ValueKind::String => value.clone(),
        _ => Value::from(py_str(value)),
    }
}

impl ChatTemplate {
    /// Compiles `source` (the `tokenizer.chat_template` text) with the model's BOS and EOS token strings.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TextError> {
        Self::with_clock(source, bos_token, eos_token, None)
    }

    /// Like [`ChatTemplate::new`], with `strftime_now` reading a fixed time instead of the UTC clock.
    pub fn with_clock(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        now: Option<CivilTime>,
    ) -> Result<Self, TextError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TextError::TemplateSyntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            if value.kind() == ValueKind::String {
                out.write_str(value.as_str().unwrap_or_default())
                    .map_err(Error::from)
            } else {
                out.write_str(&py_str(value)).map_err(Error::from)
            }
        });
        env.add_filter("tojson", tojson);
        env.add_filter("from_json", from_json);
        env.add_filter("string", string_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |fmt: &str| {
            now.unwrap_or_else(CivilTime::now_utc).format(fmt)
        });
        env.add_template_owned("chat_template", source.to_string())
            .map_err(|e| TextError::TemplateSyntax(e.to_string()))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            now,
        })
    }

    /// Renders the template for `req`. A `raise_exception(...)` call in the template comes back as
    /// [`TextError::TemplateRender`] holding its message.
    pub fn render(&self, req: &ChatRequest) -> Result<String, TextError> {
        let mut ctx: Vec<(String, Value)> = vec![("messages".into(), req.messages.value().clone())];
        if let Some(tools) = &req.tools {
            ctx.push(("tools".into(), tools.value().clone()));
        }
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(req.add_generation_prompt),
        ));
        ctx.push(("bos_token".into(), Value::from(self.bos_token.as_str())));
        ctx.push(("eos_token".into(), Value::from(self.eos_token.as_str())));
        // The dates llama.cpp's chat code puts beside every template's variables (Llama 3.x
        // templates print `date_string`, falling back to a fixed date without it).
        let now = self.now.unwrap_or_else(CivilTime::now_utc);
        ctx.push(("datetime".into(), Value::from(now.format("%b %d %Y"))));
        ctx.push(("date_string".into(), Value::from(now.format("%d %b %Y"))));
        for (k, v) in &req.kwargs {
            ctx.push((k.clone(), v.value().clone()));
        }
        let tmpl = self
            .env
            .get_template("chat_template")
            .map_err(|e| TextError::TemplateSyntax(e.to_string()))?;
        tmpl.render(Value::from_pairs(ctx))
            .map_err(|e| TextError::TemplateRender(render_error(&e)))
    }
}

impl ChatTemplate {
    /// Removes a leading BOS string when the tokenizer will add BOS itself, and a trailing EOS string when
    /// it will add EOS, as llama-server does after rendering (so that the prompt does not get them twice).
    pub fn strip_added_specials<'r>(
        &self,
        rendered: &'r str,
        add_bos: bool,
        add_eos: bool,
    ) -> &'r str {
        let mut out = rendered;
        if add_bos && !self.bos_token.is_empty() {
            out = out.strip_prefix(self.bos_token.as_str()).unwrap_or(out);
        }
        if add_eos && !self.eos_token.is_empty() {
            out = out.strip_suffix(self.eos_token.as_str()).unwrap_or(out);
        }
        out
    }
}

/// The error's message with its causes, so that a template's own exception text is kept.
fn render_error(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_json_keeps_key_order_and_fields() {
        let v = TemplateValue::from_json_str(
            "t",
            r#"[{"z": 1, "a": {"y": true, "b": null}, "m": [1.5, "x"]}]"#,
        )
        .unwrap();
        let first = &v.elements()[0];
        let keys: Vec<String> = first.entries().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["z", "a", "m"]);
        assert_eq!(
            first.field("a").unwrap().field("y").unwrap().as_bool(),
            Some(true)
        );
        assert_eq!(
            py_str(first.value()),
            "{'z': 1, 'a': {'y': True, 'b': None}, 'm': [1.5, 'x']}"
        );
    }
}

#[cfg(test)]
mod python_printing {
    use super::*;

    fn render(src: &str, messages: &str) -> String {
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let req = ChatRequest {
            messages: TemplateValue::from_json_str("messages", messages).unwrap(),
            ..ChatRequest::default()
        };
        t.render(&req).unwrap()
    }

    #[test]
    fn values_print_as_python_str() {
        let out = render(
            "{{ messages[0] }}|{{ messages[1] }}|{{ messages[2] }}|{{ messages[3] }}|{{ messages[1] | string }}|{{ messages }}",
            r#"[1.0, true, null, {"a": [1, "x'y"]}]"#,
        );
        assert_eq!(
            out,
            r#"1.0|True|None|{'a': [1, "x'y"]}|True|[1.0, True, None, {'a': [1, "x'y"]}]"#
        );
    }

    #[test]
    fn dates_beside_the_variables_as_llama_cpp_puts_them() {
        let now = CivilTime {
            year: 2026,
            month: 12,
            day: 6,
            hour: 7,
            minute: 0,
            second: 0,
        };
        let src = "{% if not date_string is defined %}26 Jul 2024{% else %}{{ date_string }}{% endif %}|{{ datetime }}";
        let t = ChatTemplate::with_clock(src, "", "", Some(now)).unwrap();
        let req = ChatRequest {
            messages: TemplateValue::from_json_str("messages", "[]").unwrap(),
            tools: None,
            add_generation_prompt: true,
            kwargs: Vec::new(),
        };
        assert_eq!(t.render(&req).unwrap(), "06 Dec 2026|Dec 06 2026");
    }

    #[test]
    fn globals_kwargs_and_errors() {
        let src = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
{{ bos_token }}{{ strftime_now('%d %b %Y') }}|{{ enable_thinking }}|{{ tools | tojson(indent=2) }}|{{ messages[0].content.strip().startswith('hi') }}{{ eos_token }}";
        let now = CivilTime {
            year: 2026,
            month: 11,
            day: 30,
            hour: 19,
            minute: 5,
            second: 9,
        };
        let t = ChatTemplate::with_clock(src, "<s>", "</s>", Some(now)).unwrap();
        let mut req = ChatRequest {
            messages: TemplateValue::from_json_str(
                "messages",
                r#"[{"role": "user", "content": "  hi there "}]"#,
            )
            .unwrap(),
            tools: Some(TemplateValue::from_json_str("tools", r#"[{"b": 1, "a": []}]"#).unwrap()),
            add_generation_prompt: true,
            kwargs: vec![(
                "enable_thinking".into(),
                TemplateValue::from_json_str("kwarg", "false").unwrap(),
            )],
        };
        assert_eq!(
            t.render(&req).unwrap(),
            "<s>30 Nov 2026|False|[\n  {\n    \"b\": 1,\n    \"a\": []\n  }\n]|True</s>"
        );
        req.messages =
            TemplateValue::from_json_str("messages", r#"[{"role": "system", "content": "x"}]"#)
                .unwrap();
        let e = t.render(&req).unwrap_err().to_string();
        assert!(e.contains("System role not supported"), "{e}");
        assert!(matches!(
            ChatTemplate::new("{% if %}", "", ""),
            Err(TextError::TemplateSyntax(_))
        ));
        assert!(TemplateValue::from_json_str("tools", "[1,")
            .unwrap_err()
            .to_string()
            .starts_with("tools is not valid JSON"));
    }
}
