//! The grammar oracle's verdicts, checked in CI: for each JSON schema of
//! `scripts/grammar_oracle/schemas.py`, the strings llama.cpp b11434's own converter and grammar
//! engine accepted or refused (`fixtures/oracle_verdicts.json`, made by the command in
//! `fixtures/PROVENANCE.md`) must get the same verdicts from our converter's grammar and our
//! matcher; likewise the sdist's `grammars/*.gbnf` (read from the sdist `BLOOMERY_LLAMA_SRC`
//! names, which `cargo xtask test` unpacks).

use std::sync::Arc;

use bloomery_grammar::{schema, Grammar, Matcher, TokenTrie};
use serde_json::Value;

fn verdicts() -> Vec<Value> {
    let text = include_str!("fixtures/oracle_verdicts.json");
    serde_json::from_str(text).unwrap()
}

/// How many of `strings` get another verdict from `gbnf` under our matcher than `want`, with the
/// first of them.
fn disagreements(gbnf: &str, strings: &[Value], want: &[Value]) -> (usize, Option<String>) {
    let g = Grammar::parse(gbnf, None).unwrap();
    let vocab = Arc::new(TokenTrie::new(0, |_| &[][..], &[]));
    let mut bad = (0, None);
    for (s, w) in strings.iter().zip(want) {
        let s = s.as_str().unwrap();
        let mut m = Matcher::new(&g, vocab.clone());
        let ours = m.accept_text(s) && m.accepts_end();
        if Some(ours) != w.as_bool() {
            bad.0 += 1;
            bad.1
                .get_or_insert_with(|| format!("{s:?}: llama.cpp {w}, ours {ours}"));
        }
    }
    bad
}

#[test]
fn our_schema_grammars_accept_what_llama_cpps_accept() {
    let mut checked = 0;
    for v in verdicts() {
        let Some(schema_value) = v.get("schema") else {
            continue;
        };
        let gbnf = schema::to_gbnf(schema_value)
            .unwrap_or_else(|e| panic!("{schema_value}: we refuse it: {e}"));
        let strings = v["strings"].as_array().unwrap();
        let (n, first) = disagreements(&gbnf, strings, v["llama"].as_array().unwrap());
        assert_eq!(n, 0, "{schema_value}: {n} disagreements, e.g. {first:?}");
        checked += strings.len();
    }
    assert!(checked > 9000, "only {checked} strings checked");
}

#[test]
fn our_matcher_judges_the_sdists_grammars_as_llama_cpp_does() {
    let Some(root) = std::env::var_os("BLOOMERY_LLAMA_SRC") else {
        eprintln!("BLOOMERY_LLAMA_SRC is not set (cargo xtask test sets it): skipped");
        return;
    };
    let mut checked = 0;
    for v in verdicts() {
        let Some(name) = v.get("gbnf").and_then(Value::as_str) else {
            continue;
        };
        let path = std::path::Path::new(&root).join("grammars").join(name);
        let gbnf = std::fs::read_to_string(&path).unwrap();
        let strings = v["strings"].as_array().unwrap();
        let (n, first) = disagreements(&gbnf, strings, v["llama"].as_array().unwrap());
        assert_eq!(n, 0, "{name}: {n} disagreements, e.g. {first:?}");
        checked += 1;
    }
    assert_eq!(checked, 8, "the sdist's grammars with samples");
}
