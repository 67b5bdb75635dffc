//! What the tokenizer-rule tests against llama.cpp share: the fixtures, the synthetic vocabulary
//! of one architecture, and the comparisons of ids, special ids and pieces with a golden file.

use std::path::PathBuf;

use bloomery_text::{Tokenizer, VocabSpec};
use serde_json::Value;

/// The text of fixture `name` (tests/fixtures).
pub fn read(name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::read_to_string(dir.join(name)).unwrap()
}

/// The tokenizer of vocabulary fixture `vocab`, checked to use pre-tokenizer `pre`.
pub fn tokenizer(vocab: &str, pre: &str) -> Tokenizer {
    let spec: VocabSpec = serde_json::from_str(&read(vocab)).unwrap();
    assert_eq!(spec.pre.as_deref(), Some(pre));
    Tokenizer::from_spec(&spec).unwrap()
}

/// The golden JSON fixture `name`.
pub fn goldens(name: &str) -> Value {
    serde_json::from_str(&read(name)).unwrap()
}

/// A golden list of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    let ids = v.as_array().unwrap().iter();
    ids.map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Every case of `texts` in both modes against the golden lists named `<prefix>parse_special` and
/// `<prefix>plain`; returns the differences.
pub fn differences(tok: &Tokenizer, gold: &Value, texts: &[String], prefix: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for (mode, parse_special) in [("parse_special", true), ("plain", false)] {
        for (i, text) in texts.iter().enumerate() {
            let want = ids(&gold[format!("{prefix}{mode}")][i]);
            let got = tok.encode(text, false, parse_special).unwrap();
            if got != want {
                failures.push(format!(
                    "{prefix}{mode} case {i} {text:?}:\n   got {got:?}\n  want {want:?}"
                ));
            }
        }
    }
    failures
}

/// Fails listing `failures` when there are any.
pub fn assert_none(failures: &[String], what: &str) {
    assert!(
        failures.is_empty(),
        "{} {what} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// BOS, EOS, EOT and the end-of-generation ids as the golden's `bos`, `eos`, `eot` and `eog`.
pub fn assert_special_ids(tok: &Tokenizer, gold: &Value) {
    let id = |v: &Value| u32::try_from(v.as_i64().unwrap()).ok();
    assert_eq!(
        (tok.bos(), tok.eos(), tok.eot()),
        (id(&gold["bos"]), id(&gold["eos"]), id(&gold["eot"]))
    );
    assert_eq!(tok.eog_ids(), ids(&gold["eog"]), "end-of-generation ids");
}

/// Every golden `pieces` entry `[id, piece with specials, piece without]` (hex bytes).
pub fn assert_pieces(tok: &Tokenizer, gold: &Value) {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let mut failures = Vec::new();
    for p in gold["pieces"].as_array().unwrap() {
        let i = p[0].as_u64().unwrap() as u32;
        for (special, want) in [(true, &p[1]), (false, &p[2])] {
            let got = hex(tok.token_to_piece(i, special));
            if got != want.as_str().unwrap() {
                failures.push(format!("id {i} special={special}: got {got}, want {want}"));
            }
        }
    }
    assert_none(&failures, "pieces");
}
