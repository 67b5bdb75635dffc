//! Chat templates rendered by minijinja, compared with Python jinja2's renders of the same real templates
//! and conversations (tests/fixtures/template_goldens.json, made by render_templates.py).

use std::path::PathBuf;

use bloomery_text::{ChatRequest, ChatTemplate, CivilTime, TemplateValue};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

/// The conversations, read with key order kept (Python dicts keep it, and `tojson` shows it).
fn conversations() -> Vec<(String, ChatRequest)> {
    let all =
        TemplateValue::from_json_str("conversations.json", &read("conversations.json")).unwrap();
    all.elements()
        .into_iter()
        .map(|c| {
            let req = ChatRequest {
                messages: c.field("messages").unwrap(),
                tools: c.field("tools"),
                add_generation_prompt: c
                    .field("add_generation_prompt")
                    .and_then(|v| v.as_bool())
                    .unwrap(),
                kwargs: c.field("kwargs").map(|k| k.entries()).unwrap_or_default(),
            };
            (c.field("name").unwrap().as_str().unwrap().to_string(), req)
        })
        .collect()
}

#[test]
fn templates_render_like_python_jinja2() {
    let goldens: Value = serde_json::from_str(&read("template_goldens.json")).unwrap();
    let now = CivilTime {
        year: 2026,
        month: 11,
        day: 30,
        hour: 19,
        minute: 5,
        second: 9,
    };
    let convs = conversations();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (tname, per) in goldens["renders"].as_object().unwrap() {
        let src = read(&format!("templates/{tname}.jinja"));
        let tmpl = ChatTemplate::with_clock(
            &src,
            per["bos_token"].as_str().unwrap(),
            per["eos_token"].as_str().unwrap(),
            Some(now),
        )
        .unwrap_or_else(|e| panic!("{tname}: {e}"));
        for (cname, req) in &convs {
            let want = &per["cases"][cname];
            let got = tmpl.render(req);
            checked += 1;
            match (want.get("ok").and_then(Value::as_str), got) {
                (Some(w), Ok(g)) if w == g => {}
                (Some(w), Ok(g)) => failures.push(format!(
                    "{tname}/{cname}: differs\n--- python\n{w}\n--- rust\n{g}"
                )),
                (Some(_), Err(e)) => failures.push(format!(
                    "{tname}/{cname}: python rendered, rust failed: {e}"
                )),
                (None, Ok(g)) => failures.push(format!(
                    "{tname}/{cname}: python failed ({}), rust rendered:\n{g}",
                    want["error"]
                )),
                (None, Err(e)) => {
                    // Both fail; a raise_exception message must come through unchanged.
                    let w = want["error"].as_str().unwrap();
                    if let Some(msg) = w.strip_prefix("TemplateError: ") {
                        if !e.to_string().contains(msg) {
                            failures.push(format!(
                                "{tname}/{cname}: python raised {msg:?}, rust said {e}"
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} renders differ:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    println!(
        "{checked} template renders identical to jinja2 {}",
        goldens["jinja2"]
    );
}
