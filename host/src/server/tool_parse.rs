//! Tool calls read back out of generated text, in the format the template's family writes them
//! (`tools::ToolFormat`): Hermes JSON and Qwen XML inside `<tool_call>` blocks, GLM's
//! `<arg_key>`/`<arg_value>` pairs, DeepSeek's DSML `invoke` blocks and Solar's
//! `<|tool_call:begin|>` calls. Text outside the calls stays content; a block that is not a
//! call stays text. Parameters that formats write as bare text are typed by the offered tool's
//! schema (a `string` parameter keeps its text, others are read as JSON).

use serde_json::{Map, Value};

use super::tools::ToolFormat;

/// A tool call parsed from generated text.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The call's id when the format writes one (Solar); `None`: the server makes one up.
    pub id: Option<String>,
    /// Function name.
    pub name: String,
    /// Arguments as JSON text.
    pub arguments: String,
}

/// Calls found in a text: the text outside them, and each call with whether its block closed.
struct Scan {
    content: String,
    calls: Vec<(ToolCall, bool)>,
}

/// Parses the calls out of `content` as `format` writes them; `tools` (the offered tools,
/// OpenAI-shaped) type bare-text parameters. Returns the remaining text, trimmed, and the calls.
pub fn parse_tool_calls(
    content: &str,
    format: ToolFormat,
    tools: Option<&Value>,
) -> (String, Vec<ToolCall>) {
    let scan = scan(content, format, tools);
    (
        scan.content.trim().to_owned(),
        scan.calls.into_iter().map(|(c, _)| c).collect(),
    )
}

/// The calls of `text` whose blocks have closed (a stream's calls so far; a block still being
/// written is left for later).
pub fn closed_calls(text: &str, format: ToolFormat, tools: Option<&Value>) -> Vec<ToolCall> {
    scan(text, format, tools)
        .calls
        .into_iter()
        .take_while(|(_, closed)| *closed)
        .map(|(c, _)| c)
        .collect()
}

fn scan(content: &str, format: ToolFormat, tools: Option<&Value>) -> Scan {
    match format {
        ToolFormat::HermesJson | ToolFormat::QwenXml => {
            blocks(content, "<tool_call>", "</tool_call>", |b, closed| {
                json_call(b)
                    .or_else(|| {
                        (closed || b.contains("</function>")).then(|| xml_call(b, tools))?
                    })
                    .map(|c| vec![c])
            })
        }
        ToolFormat::GlmXml => blocks(content, "<tool_call>", "</tool_call>", |b, closed| {
            closed.then(|| glm_call(b, tools))?.map(|c| vec![c])
        }),
        ToolFormat::DeepSeekDsml => {
            let open = if content.contains(DSML_V32_OPEN) {
                DSML_V32_OPEN
            } else {
                DSML_OPEN
            };
            let close = format!("</{}", &open[1..]);
            blocks(content, open, &close, |b, _| dsml_calls(b))
        }
        ToolFormat::GenericJson => {
            let (content, calls) = super::tool_generic::parse(content);
            Scan {
                content,
                calls: calls.into_iter().map(|c| (c, true)).collect(),
            }
        }
        ToolFormat::Solar => {
            let mut s = blocks(content, SOLAR_OPEN, SOLAR_CLOSE, |b, _| {
                solar_call(b).map(|c| vec![c])
            });
            for marker in SOLAR_FRAME {
                s.content = s.content.replace(marker, "");
            }
            s
        }
    }
}

/// The blocks between `open` and `close` (an unclosed last block runs to the end): each one
/// that `body(text, closed)` reads as calls is replaced by them, others stay text. An unclosed
/// block is a call only where its own syntax ends it (a whole JSON object, a closed function).
fn blocks(
    content: &str,
    open: &str,
    close: &str,
    body: impl Fn(&str, bool) -> Option<Vec<ToolCall>>,
) -> Scan {
    let mut calls = Vec::new();
    let mut text = String::new();
    let mut rest = content;
    while let Some(at) = rest.find(open) {
        let after = &rest[at + open.len()..];
        let (inner, next, closed) = match after.find(close) {
            Some(end) => (&after[..end], &after[end + close.len()..], true),
            None => (after, "", false),
        };
        text.push_str(&rest[..at]);
        match body(inner, closed) {
            Some(found) => calls.extend(found.into_iter().map(|c| (c, closed))),
            None => {
                text.push_str(&rest[at..at + open.len() + inner.len()]);
                if closed {
                    text.push_str(close);
                }
            }
        }
        rest = next;
    }
    text.push_str(rest);
    Scan {
        content: text,
        calls,
    }
}

/// Hermes JSON: `{"name": …, "arguments": {…}}` (arguments may be a JSON string).
fn json_call(body: &str) -> Option<ToolCall> {
    let v = serde_json::from_str::<Value>(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_owned();
    let arguments = match v.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
        None => "{}".into(),
    };
    Some(ToolCall {
        id: None,
        name,
        arguments,
    })
}

/// The schema's `type` of a tool's parameter, when the tool is offered and says.
fn param_type<'a>(tools: Option<&'a Value>, tool: &str, param: &str) -> Option<&'a str> {
    tools?
        .as_array()?
        .iter()
        .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(tool))?
        .pointer("/function/parameters/properties")?
        .get(param)?
        .get("type")?
        .as_str()
}

/// A parameter written as bare text: kept as text when the schema says `string`, else read as
/// JSON (Jinja's `| string` writes booleans as Python does), else text.
fn typed_value(raw: &str, kind: Option<&str>) -> Value {
    match (kind, raw.trim()) {
        (Some("string"), _) => Value::String(raw.to_owned()),
        (Some(_), "True") => Value::Bool(true),
        (Some(_), "False") => Value::Bool(false),
        (_, t) => serde_json::from_str(t).unwrap_or_else(|_| Value::String(raw.to_owned())),
    }
}

/// A function name as the XML-like formats write it: not empty, no markup or line breaks.
fn plain_name(name: &str) -> Option<&str> {
    let name = name.trim();
    let bad = |c: char| c == '<' || c == '>' || c == '\n' || c == '"';
    (!name.is_empty() && !name.contains(bad)).then_some(name)
}

/// Qwen XML: `<function=NAME>` then `<parameter=P>value</parameter>` pairs (a value's one leading
/// and trailing newline belong to the format) up to `</function>`.
fn xml_call(body: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let rest = body.trim_start().strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = plain_name(name)?;
    let mut args = Map::new();
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
        let param = param.trim();
        args.insert(
            param.to_owned(),
            typed_value(raw, param_type(tools, name, param)),
        );
        rest = &value_and_rest[end + "</parameter>".len()..];
    }
    Some(ToolCall {
        id: None,
        name: name.to_owned(),
        arguments: Value::Object(args).to_string(),
    })
}

/// GLM: `NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs (whitespace between
/// the tags allowed, a value kept whole).
fn glm_call(body: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let (name, mut rest) = body.split_at(body.find("<arg_key>").unwrap_or(body.len()));
    let name = plain_name(name)?;
    let mut args = Map::new();
    loop {
        let t = rest.trim_start();
        if t.is_empty() {
            break;
        }
        let (key, after) = t.strip_prefix("<arg_key>")?.split_once("</arg_key>")?;
        let (value, after) = after
            .trim_start()
            .strip_prefix("<arg_value>")?
            .split_once("</arg_value>")?;
        let key = key.trim();
        args.insert(
            key.to_owned(),
            typed_value(value, param_type(tools, name, key)),
        );
        rest = after;
    }
    Some(ToolCall {
        id: None,
        name: name.to_owned(),
        arguments: Value::Object(args).to_string(),
    })
}

/// DeepSeek V4's block opening (V3.2 names it `function_calls`).
pub(crate) const DSML_OPEN: &str = "<｜DSML｜tool_calls>";
pub(crate) const DSML_V32_OPEN: &str = "<｜DSML｜function_calls>";
const DSML_INVOKE: &str = "<｜DSML｜invoke name=\"";
const DSML_INVOKE_END: &str = "</｜DSML｜invoke>";
const DSML_PARAM: &str = "<｜DSML｜parameter name=\"";
const DSML_PARAM_END: &str = "</｜DSML｜parameter>";

/// DeepSeek DSML: `<｜DSML｜invoke name="N">` blocks of `<｜DSML｜parameter name="K"
/// string="true|false">V</｜DSML｜parameter>` (a `true` value is text, a `false` one JSON).
/// An invoke not closed yet is left out (the block is still being written, or was cut short).
fn dsml_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = body;
    loop {
        let t = rest.trim_start();
        let closing = |open: &str| format!("</{}", &open[1..]).starts_with(t);
        if t.is_empty()
            || DSML_INVOKE.starts_with(t)
            || closing(DSML_OPEN)
            || closing(DSML_V32_OPEN)
        {
            break; // the end, an invoke still being opened, or the block's close being written
        }
        let Some((name, after)) = t.strip_prefix(DSML_INVOKE)?.split_once("\">") else {
            break; // a name still being written
        };
        let name = plain_name(name)?;
        let Some(end) = after.find(DSML_INVOKE_END) else {
            break; // an invoke still being written
        };
        let mut params = &after[..end];
        let mut args = Map::new();
        loop {
            let p = params.trim_start();
            if p.is_empty() {
                break;
            }
            let (key, after_key) = p.strip_prefix(DSML_PARAM)?.split_once('"')?;
            let after_key = after_key.trim_start().strip_prefix("string=\"")?;
            let (is_string, after_attr) = after_key.split_once("\">")?;
            let (raw, next) = after_attr.split_once(DSML_PARAM_END)?;
            let value = match is_string {
                "true" => Value::String(raw.to_owned()),
                _ => serde_json::from_str(raw.trim())
                    .unwrap_or_else(|_| Value::String(raw.to_owned())),
            };
            args.insert(key.to_owned(), value);
            params = next;
        }
        calls.push(ToolCall {
            id: None,
            name: name.to_owned(),
            arguments: Value::Object(args).to_string(),
        });
        rest = &after[end + DSML_INVOKE_END.len()..];
    }
    (!calls.is_empty()).then_some(calls)
}

/// Solar's call opening and end.
pub(crate) const SOLAR_OPEN: &str = "<|tool_call:begin|>";
const SOLAR_CLOSE: &str = "<|tool_call:end|>";
/// The markers around Solar's calls (a reply of calls opens with the first and ends with the
/// second); they are not content.
pub(crate) const SOLAR_FRAME: [&str; 2] = ["<|tool_calls|>", "<|calls|>"];

/// Solar: `ID<|tool_call:name|>NAME<|tool_call:args|>{json}`.
fn solar_call(body: &str) -> Option<ToolCall> {
    let (id, rest) = body.split_once("<|tool_call:name|>")?;
    let (name, args) = rest.split_once("<|tool_call:args|>")?;
    let name = plain_name(name)?;
    let args: Value = serde_json::from_str(args.trim()).ok()?;
    let arguments = match args {
        Value::String(s) => s,
        a => a.to_string(),
    };
    let id = id.trim();
    Some(ToolCall {
        id: (!id.is_empty()).then(|| id.to_owned()),
        name: name.to_owned(),
        arguments,
    })
}

#[cfg(test)]
pub(crate) mod tests;
