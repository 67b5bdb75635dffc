//! A chat's final message continued (llama-server's assistant prefill and
//! `continue_final_message`) renders as llama.cpp b11434's own chat code renders it: the goldens
//! in `fixtures/chat_continue.jsonl` were made by `tests/oracle/make_chat_continue_golden.sh`
//! (llama.cpp's `common_chat_templates_apply` over the templates of
//! `text/tests/fixtures/templates`: content, reasoning and automatic continuation, thinking on
//! and off, and the same chats answered normally as the baseline). A system message on a
//! template without a system role (Gemma 2) is merged into the next message, as llama.cpp does.

use bloomery::server::chat_continue::{
    continued, without_system_role, Continue, ContinueStyle, ReasoningTags, TemplateCaps,
};
use bloomery::server::error::ApiError;
use bloomery_text::{ChatRequest, ChatTemplate, CivilTime, TemplateValue};
use serde_json::{json, Value};

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Noon of a golden's `date` (YYYY-MM-DD): the day llama.cpp's `strftime_now` read.
fn day(date: &str) -> CivilTime {
    let n: Vec<u32> = date.split('-').map(|x| x.parse().unwrap()).collect();
    CivilTime {
        year: n[0] as i32,
        month: n[1],
        day: n[2],
        hour: 12,
        minute: 0,
        second: 0,
    }
}

#[test]
fn continued_chats_render_as_llama_cpp_renders_them() {
    let lines = std::fs::read_to_string(root().join("host/tests/fixtures/chat_continue.jsonl"))
        .expect("the goldens");
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in lines.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let path = case["template"].as_str().unwrap();
        let src = std::fs::read_to_string(root().join(path)).unwrap();
        let tmpl = ChatTemplate::with_clock(
            &src,
            case["bos"].as_str().unwrap(),
            case["eos"].as_str().unwrap(),
            Some(day(case["date"].as_str().unwrap())),
        )
        .unwrap();
        let caps = TemplateCaps::probe(&tmpl, &src);
        let thinking = case["enable_thinking"].as_bool().unwrap();
        let render = |messages: &Value, add_generation_prompt: bool| {
            tmpl.render(&ChatRequest {
                messages: TemplateValue::from(messages),
                tools: None,
                add_generation_prompt,
                kwargs: vec![(
                    "enable_thinking".into(),
                    TemplateValue::from(&json!(thinking)),
                )],
            })
            .map_err(|e| ApiError::invalid(e.to_string()))
        };
        let mut messages = case["messages"].clone();
        if !caps.system_role {
            messages = without_system_role(&messages).unwrap();
        }
        let mode = match &case["continue_final_message"] {
            Value::Null => None,
            Value::Bool(true) => Some(Continue::Auto),
            Value::String(s) if s == "content" => Some(Continue::Content),
            Value::String(s) if s == "reasoning_content" => Some(Continue::Reasoning),
            other => panic!("case's continue_final_message {other}"),
        };
        let got = match mode {
            None => render(&messages, case["add_generation_prompt"].as_bool().unwrap()),
            Some(mode) => continued(&messages, mode, &caps, render).map(|(text, _)| text),
        };
        let want = case["prompt"]
            .as_str()
            .expect("the oracle rendered every case");
        checked += 1;
        match got {
            Ok(text) if text == want => {}
            Ok(text) => failures.push(format!(
                "{path} thinking={thinking} {:?} last={}:\n  llama.cpp {want:?}\n  bloomery  {text:?}",
                case["continue_final_message"],
                case["messages"].as_array().unwrap().last().unwrap()
            )),
            Err(e) => failures.push(format!("{path}: bloomery failed: {}", e.message)),
        }
    }
    assert_eq!(checked, 352, "every golden case read");
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_probe_finds_each_family_s_reasoning_tags_and_system_role() {
    let caps = |name: &str| {
        let src = std::fs::read_to_string(root().join("text/tests/fixtures/templates").join(name))
            .unwrap();
        TemplateCaps::probe(&ChatTemplate::new(&src, "", "").unwrap(), &src)
    };
    let qwen3 = caps("qwen3.jinja");
    assert!(qwen3.system_role);
    let tags = |start: &str, end: &str| {
        ContinueStyle::Generic(Some(ReasoningTags {
            start: start.into(),
            end: end.into(),
        }))
    };
    assert_eq!(qwen3.style, tags("<think>\n", "\n</think>\n\n"));
    // DeepSeek V3.1 drops the last answer's reasoning: the bare tags.
    assert_eq!(
        caps("deepseek-v3.1.jinja").style,
        tags("<think>", "</think>")
    );
    assert_eq!(
        caps("deepseek-v4.jinja").style,
        ContinueStyle::DeepSeekDsml { v4: true }
    );
    assert_eq!(
        caps("deepseek-v3.2.jinja").style,
        ContinueStyle::DeepSeekDsml { v4: false }
    );
    let gemma = caps("gemma-2.jinja");
    assert!(!gemma.system_role && gemma.style == ContinueStyle::Generic(None));
    assert_eq!(
        caps("qwen3-coder.jinja").style,
        ContinueStyle::Generic(None)
    );
}
