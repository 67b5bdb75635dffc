//! GLM-5.3's tokenizer rules against mainline llama.cpp on a synthetic byte-level BPE that
//! llama.cpp b11434's converter wrote with GLM-5.3's special tokens and pre-tokenizer `glm4` (no GLM
//! vocabulary is on PyPI): the ids of every corpus case and of GLM's own strings (the GLM-4.7-Flash
//! template's renders, tool calls, thinking, the specials) in both modes, every token's piece, and
//! which ids end generation (`<|endoftext|>`, `<|user|>` as EOT and `<|observation|>` as EOM, as the
//! real file's 154820, 154827 and 154829). Goldens from tests/fixtures/make_glm5_goldens.py; see
//! tests/fixtures/PROVENANCE.md.

use std::path::PathBuf;

use bloomery_text::{Tokenizer, VocabSpec};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

fn tokenizer() -> Tokenizer {
    let spec: VocabSpec = serde_json::from_str(&read("glm5.vocab.json")).unwrap();
    assert_eq!(spec.pre.as_deref(), Some("glm4"));
    Tokenizer::from_spec(&spec).unwrap()
}

fn goldens() -> Value {
    serde_json::from_str(&read("glm5_goldens.json")).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    let ids = v.as_array().unwrap().iter();
    ids.map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Every case of `texts` in both modes against the golden lists named `<prefix>parse_special` and
/// `<prefix>plain`; returns the differences.
fn differences(tok: &Tokenizer, gold: &Value, texts: &[String], prefix: &str) -> Vec<String> {
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

#[test]
fn the_corpus_and_glm_strings_tokenize_as_llama_cpp_does_in_both_modes() {
    let tok = tokenizer();
    let gold = goldens();
    let corpus: Vec<String> = serde_json::from_str(&read("corpus.json")).unwrap();
    let glm: Vec<String> = serde_json::from_value(gold["glm_cases"].clone()).unwrap();
    assert!(glm.len() > 15, "the GLM cases include the template's renders");
    let mut failures = differences(&tok, &gold, &corpus, "");
    failures.extend(differences(&tok, &gold, &glm, "glm_"));
    assert!(
        failures.is_empty(),
        "{} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn endoftext_user_and_observation_end_generation() {
    let tok = tokenizer();
    let gold = goldens();
    let id = |v: &Value| u32::try_from(v.as_i64().unwrap()).ok();
    assert_eq!(
        (tok.bos(), tok.eos(), tok.eot()),
        (id(&gold["bos"]), id(&gold["eos"]), id(&gold["eot"]))
    );
    assert_eq!(tok.eog_ids(), ids(&gold["eog"]), "end-of-generation ids");
    let id_of = |t: &str| tok.token_id(t).unwrap();
    // The real file's stop ids 154820, 154827, 154829 are these three, 0, 7 and 9 after the first
    // special token.
    let first = id_of("<|endoftext|>");
    for (t, offset) in [("<|user|>", 7), ("<|observation|>", 9)] {
        assert_eq!(id_of(t), first + offset, "{t}");
    }
    for t in ["<|endoftext|>", "<|user|>", "<|observation|>"] {
        assert_eq!(tok.encode(t, false, true).unwrap(), [id_of(t)], "{t} is one token");
        assert!(tok.is_eog(id_of(t)), "{t} ends generation");
    }
    for t in ["<|assistant|>", "[gMASK]", "<sop>", "</think>", "</tool_call>"] {
        assert!(!tok.is_eog(id_of(t)), "{t} does not end generation");
    }
    assert_eq!(tok.bos(), Some(id_of("[gMASK]")));
}

#[test]
fn pieces_match_llama_cpp() {
    let tok = tokenizer();
    let gold = goldens();
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
    assert!(
        failures.is_empty(),
        "{} pieces differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
