//! llama.cpp's built-in chat templates (`bloomery_text::builtin`) against libllama b11434's own
//! `llama_chat_apply_template` (fixtures/builtin_templates.json, written by
//! tests/oracle/make_builtin_templates_golden.sh): every name on every conversation with and
//! without the generation prompt, the detection of marker texts, and (with BLOOMERY_LLAMA_SRC)
//! the detection of every template file of the sdist; each render byte for byte.

use bloomery_text::builtin::{self, Builtin};
use serde_json::Value;

/// The golden file.
fn golden() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/builtin_templates.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The golden conversations as (role, content) pairs.
fn conversations(gold: &Value) -> Vec<Vec<(String, String)>> {
    let convs = gold["conversations"].as_array().unwrap();
    let pair = |m: &Value| {
        let s = |k: &str| m[k].as_str().unwrap().to_owned();
        (s("role"), s("content"))
    };
    convs
        .iter()
        .map(|c| c.as_array().unwrap().iter().map(pair).collect())
        .collect()
}

/// What bloomery renders for template text (or name) `text`: `None` where detection finds none.
fn render_detected(text: &str, conv: &[(String, String)], add: bool) -> Option<String> {
    builtin::detect(text).map(|b| b.render(conv, add))
}

/// The cases of golden list `key` whose render differs, as "label: want … got …".
fn differences(
    gold: &Value,
    key: &str,
    label: &str,
    text_of: impl Fn(&Value) -> String,
) -> Vec<String> {
    let convs = conversations(gold);
    let mut bad = Vec::new();
    for case in gold[key].as_array().unwrap() {
        let text = text_of(case);
        let conv = &convs[case["conversation"].as_u64().unwrap() as usize];
        let add = case["add_generation_prompt"].as_bool().unwrap_or(true);
        let want = case["prompt"].as_str().map(str::to_owned);
        let got = render_detected(&text, conv, add);
        if got != want {
            let at = case[label].as_str().unwrap_or_default();
            bad.push(format!(
                "{at:?} conversation {} add {add}: want {want:?}, got {got:?}",
                case["conversation"]
            ));
        }
    }
    bad
}

#[test]
fn the_names_are_llama_cpps() {
    let gold = golden();
    let want: Vec<&str> = gold["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let ours: Vec<&str> = builtin::NAMES.iter().map(|(n, _)| *n).collect();
    assert_eq!(ours, want);
    for (name, b) in builtin::NAMES {
        assert_eq!(b.name(), Some(*name));
    }
    assert_eq!(Builtin::Dots1.name(), None);
}

#[test]
fn every_name_renders_every_conversation_as_llama_cpp() {
    let gold = golden();
    let n = gold["renders"].as_array().unwrap().len();
    assert!(n >= 1000, "only {n} renders");
    let bad = differences(&gold, "renders", "name", |c| {
        c["name"].as_str().unwrap().to_owned()
    });
    assert!(
        bad.is_empty(),
        "{} of {n} differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn marker_texts_are_detected_as_llama_cpp_detects_them() {
    let gold = golden();
    let bad = differences(&gold, "detect", "text", |c| {
        c["text"].as_str().unwrap().to_owned()
    });
    assert!(bad.is_empty(), "{} differ:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn the_sdists_template_files_are_detected_as_llama_cpp_detects_them() {
    let Some(root) = std::env::var_os("BLOOMERY_LLAMA_SRC") else {
        eprintln!("BLOOMERY_LLAMA_SRC is not set (cargo xtask test sets it): skipped");
        return;
    };
    let dir = std::path::Path::new(&root).join("models/templates");
    let gold = golden();
    assert!(gold["files"].as_array().unwrap().len() > 60);
    let bad = differences(&gold, "files", "file", |c| {
        let path = dir.join(c["file"].as_str().unwrap());
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    });
    assert!(bad.is_empty(), "{} differ:\n{}", bad.len(), bad.join("\n"));
}
