//! The parsers against hand-written replies, and against what each family's real template writes
//! (Python jinja2's renders, `host/tests/fixtures/tool_calls/`): parse(render(calls)) = calls,
//! whole and streamed in pieces.

use bloomery_text::{ChatRequest, ChatTemplate, TemplateValue};
use serde_json::{json, Value};

use super::*;
use crate::flags::serve::ReasoningFormat;
use crate::server::chat::{parse, Delta, DeltaSplitter, OfferedTools};

#[test]
fn hermes_tool_calls_are_parsed_and_bad_blocks_stay_text() {
    let t = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (text, calls) = parse_tool_calls(t, ToolFormat::HermesJson, None);
    assert_eq!(text, "Let me check.");
    assert_eq!(
        calls,
        vec![ToolCall {
            id: None,
            name: "get_weather".into(),
            arguments: "{\"city\":\"Paris\"}".into()
        }]
    );
    let (text, calls) = parse_tool_calls(
        "<tool_call>not json</tool_call>",
        ToolFormat::HermesJson,
        None,
    );
    assert!(calls.is_empty());
    assert!(text.contains("not json"));
}

#[test]
fn xml_tool_calls_are_parsed_with_the_offered_parameter_types() {
    // What Qwen3.5 and Qwen3-Coder write (the format their templates ask for).
    let t = "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n\
             <parameter=days>\n3\n</parameter>\n<parameter=note>\nline one\nline two\n\
             </parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n\
             </function>\n</tool_call>";
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
        "days": {"type": "integer"}, "note": {"type": "string"}}}}}]);
    let (text, calls) = parse_tool_calls(t, ToolFormat::QwenXml, Some(&tools));
    assert_eq!(text, "I'll look.");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].name, "get_weather");
    let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
    assert_eq!(
        args,
        json!({"city": "42", "days": 3, "note": "line one\nline two"})
    );
    assert_eq!(
        (calls[1].name.as_str(), calls[1].arguments.as_str()),
        ("ping", "{}")
    );
    // Without a schema a value that reads as JSON is JSON.
    let (_, calls) = parse_tool_calls(t, ToolFormat::HermesJson, None);
    let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
    assert_eq!(args["city"], 42);
    // An unclosed parameter is not a call: the block stays text.
    let bad = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</tool_call>";
    let (text, calls) = parse_tool_calls(bad, ToolFormat::QwenXml, None);
    assert!(calls.is_empty() && text.contains("<function=f>"), "{text}");
}

#[test]
fn calls_the_qwen35_template_writes_parse_back_to_the_same_calls() {
    // llama.cpp's Qwen3.5 template (text/tests/fixtures/PROVENANCE.md) renders an assistant
    // turn's calls; parsing that text must give them back.
    let src = include_str!("../../../../text/tests/fixtures/templates/qwen3.5.jinja");
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
    let (content, parsed) = parse_tool_calls(turn, ToolFormat::QwenXml, Some(&tools));
    assert_eq!(parsed.len(), 2, "{turn}");
    assert_eq!(parsed[0].name, "get_weather");
    let got: Value = serde_json::from_str(&parsed[0].arguments).unwrap();
    assert_eq!(got, args, "{turn}");
    assert_eq!(parsed[1].name, "ping");
    assert!(!content.contains("<tool_call>"), "{content}");
}

/// One rendered reply of a case: which template, which case, the text, the calls it holds.
pub(crate) struct Rendered {
    pub(crate) template: String,
    pub(crate) case: String,
    pub(crate) format: ToolFormat,
    pub(crate) starts_in_thinking: bool,
    /// The reply up to the end-of-turn token (which ends generation, so is never in the text).
    pub(crate) reply: String,
    pub(crate) content: String,
    pub(crate) calls: Vec<Value>,
    pub(crate) tools: Value,
}

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/tool_calls/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every case as each of the five templates writes it.
pub(crate) fn rendered() -> Vec<Rendered> {
    let cases = fixture("cases.json");
    let renders = fixture("tool_call_renders.json");
    let mut out = Vec::new();
    for (template, per) in renders["renders"].as_object().unwrap() {
        let src = std::fs::read_to_string(format!(
            "{}/../text/tests/fixtures/templates/{template}.jinja",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let format = ToolFormat::of_template(&src).unwrap();
        let eos = per["eos_token"].as_str().unwrap();
        for case in cases["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let r = &per["replies"][name];
            let reply = r["reply"].as_str().unwrap();
            let reply = reply.split(eos).next().unwrap().to_owned();
            let content = case["content"].as_str().unwrap();
            out.push(Rendered {
                template: template.clone(),
                case: name.to_owned(),
                format,
                starts_in_thinking: r["starts_in_thinking"].as_bool().unwrap(),
                // Solar's template drops the text beside calls.
                content: if reply.contains(content) {
                    content.to_owned()
                } else {
                    String::new()
                },
                reply,
                calls: case["calls"].as_array().unwrap().clone(),
                tools: cases["tools"].clone(),
            });
        }
    }
    assert_eq!(out.len(), 50, "5 templates × 10 cases");
    out
}

impl Rendered {
    fn offered(&self) -> OfferedTools {
        OfferedTools {
            list: self.tools.clone(),
            format: Some(self.format),
        }
    }

    /// The calls, as the case wrote them, checked against `got`.
    fn check(&self, got: &[ToolCall], what: &str) {
        let at = format!("{}/{} ({what})", self.template, self.case);
        assert_eq!(got.len(), self.calls.len(), "{at}: {got:?}\n{}", self.reply);
        for (g, want) in got.iter().zip(&self.calls) {
            assert_eq!(g.name, want["name"], "{at}");
            let args: Value = serde_json::from_str(&g.arguments).unwrap();
            assert_eq!(args, want["arguments"], "{at}: {}", self.reply);
            if self.format == ToolFormat::Solar {
                assert_eq!(g.id.as_deref(), want["id"].as_str(), "{at}");
            }
        }
    }
}

#[test]
fn every_family_reads_back_the_calls_its_template_writes() {
    let formats: Vec<ToolFormat> = rendered().iter().map(|r| r.format).collect();
    for f in [
        ToolFormat::HermesJson,
        ToolFormat::QwenXml,
        ToolFormat::GlmXml,
        ToolFormat::DeepSeekDsml,
        ToolFormat::Solar,
    ] {
        assert!(formats.contains(&f), "{f:?} has no template");
    }
    for r in rendered() {
        let p = parse(
            &r.reply,
            r.starts_in_thinking,
            ReasoningFormat::Split,
            Some(&r.offered()),
        );
        r.check(&p.tool_calls, "whole");
        assert_eq!(p.content, r.content, "{}/{}", r.template, r.case);
    }
}

/// The deltas of `pieces` fed one by one, joined: reasoning, content and calls.
fn streamed(r: &Rendered, pieces: &[&str]) -> (String, String, Vec<ToolCall>) {
    let mut s = DeltaSplitter::new(
        r.starts_in_thinking,
        ReasoningFormat::Split,
        Some(r.offered()),
    );
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.extend(s.push(p));
    }
    deltas.extend(s.finish());
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
    for d in deltas {
        match d {
            Delta::Reasoning(t) => reasoning.push_str(&t),
            Delta::Content(t) => content.push_str(&t),
            Delta::Call(c) => calls.push(c),
        }
    }
    (reasoning, content, calls)
}

#[test]
fn streamed_deltas_join_to_the_whole_reply_at_every_split() {
    let mut splits = 0;
    for r in rendered() {
        let whole = parse(
            &r.reply,
            r.starts_in_thinking,
            ReasoningFormat::Split,
            Some(&r.offered()),
        );
        let bounds: Vec<usize> = (0..=r.reply.len())
            .filter(|&i| r.reply.is_char_boundary(i))
            .collect();
        let chars: Vec<&str> = bounds.windows(2).map(|w| &r.reply[w[0]..w[1]]).collect();
        let mut ways: Vec<Vec<&str>> = vec![chars];
        for &at in &bounds {
            ways.push(vec![&r.reply[..at], &r.reply[at..]]);
        }
        for pieces in ways {
            let (reasoning, content, calls) = streamed(&r, &pieces);
            let at = format!("{}/{} split {:?}", r.template, r.case, &pieces[0]);
            assert_eq!(calls, whole.tool_calls, "{at}");
            assert_eq!(content.trim(), whole.content, "{at}");
            assert_eq!(
                reasoning.trim(),
                whole.reasoning.as_deref().unwrap_or(""),
                "{at}"
            );
            splits += 1;
        }
    }
    assert!(splits > 5_000, "{splits}");
}

#[test]
fn a_stream_releases_each_call_when_its_block_closes() {
    let r = rendered()
        .into_iter()
        .find(|r| r.template == "qwen3" && r.case == "several")
        .unwrap();
    let mut s = DeltaSplitter::new(false, ReasoningFormat::Split, Some(r.offered()));
    let first_end = r.reply.find("</tool_call>").unwrap() + "</tool_call>".len();
    let d = s.push(&r.reply[..first_end - 1]);
    assert!(!d.iter().any(|d| matches!(d, Delta::Call(_))), "{d:?}");
    let d = s.push(&r.reply[first_end - 1..first_end]);
    assert!(
        matches!(&d[..], [Delta::Call(c)] if c.name == "get_weather"),
        "{d:?}"
    );
    let d = s.push(&r.reply[first_end..]);
    assert_eq!(d.len(), 2, "{d:?}");
    assert!(s.finish().is_empty());
}

#[test]
fn a_reply_cut_short_keeps_its_whole_calls() {
    for r in rendered().into_iter().filter(|r| r.case == "several") {
        // Inside the third call's name.
        let cut = r.reply.rfind("ping").unwrap() + 2;
        let (_, calls) = parse_tool_calls(&r.reply[..cut], r.format, Some(&r.tools));
        assert_eq!(calls.len(), 2, "{}: {}", r.template, &r.reply[..cut]);
    }
}

#[test]
fn a_dsml_reply_cut_inside_its_closing_tag_keeps_its_calls() {
    for r in rendered()
        .into_iter()
        .filter(|r| r.format == ToolFormat::DeepSeekDsml)
    {
        let Some(end) = r.reply.rfind("</｜DSML｜") else {
            continue;
        };
        let whole = parse_tool_calls(&r.reply, r.format, Some(&r.tools)).1;
        // Every cut inside the block's closing tag (a random model ran out of tokens there).
        for (i, _) in r.reply[end..].char_indices().skip(1) {
            let (_, calls) = parse_tool_calls(&r.reply[..end + i], r.format, Some(&r.tools));
            assert_eq!(
                calls.len(),
                whole.len(),
                "{}: {}",
                r.case,
                &r.reply[..end + i]
            );
        }
    }
}

#[test]
fn blocks_that_are_not_calls_stay_text_in_every_format() {
    for (format, text) in [
        (
            ToolFormat::GlmXml,
            "<tool_call>not a name<arg_key>k</arg_key></tool_call>",
        ),
        (
            ToolFormat::GlmXml,
            "<tool_call>f<arg_key>k</arg_key>v</tool_call>",
        ),
        (
            ToolFormat::DeepSeekDsml,
            "<｜DSML｜tool_calls>\nhello\n</｜DSML｜tool_calls>",
        ),
        (
            ToolFormat::Solar,
            "<|tool_call:begin|>x<|tool_call:name|>f<|tool_call:args|>{oops<|tool_call:end|>",
        ),
    ] {
        let (content, calls) = parse_tool_calls(text, format, None);
        assert!(calls.is_empty(), "{format:?}: {calls:?}");
        assert!(!content.is_empty(), "{format:?}");
    }
}
