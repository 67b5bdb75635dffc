//! Solar-Open's tokenizer rules against mainline llama.cpp on a synthetic byte-level BPE that
//! llama.cpp's converter wrote with Solar's special tokens and pre-tokenizer `solar-open` (no Solar
//! vocabulary is on PyPI): the ids of every corpus case in both modes, every token's piece, and
//! which ids end generation (`<|flush|>` and `<|calls|>` do, `<|end|>` does not). Goldens from
//! tests/fixtures/make_solar_goldens.py; see tests/fixtures/PROVENANCE.md.

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
    let spec: VocabSpec = serde_json::from_str(&read("solar-open.vocab.json")).unwrap();
    assert_eq!(spec.pre.as_deref(), Some("solar-open"));
    Tokenizer::from_spec(&spec).unwrap()
}

fn goldens() -> Value {
    serde_json::from_str(&read("solar_goldens.json")).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    let ids = v.as_array().unwrap().iter();
    ids.map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn the_corpus_tokenizes_as_llama_cpp_does_in_both_modes() {
    let tok = tokenizer();
    let gold = goldens();
    let corpus: Vec<String> = serde_json::from_str(&read("corpus.json")).unwrap();
    let mut failures = Vec::new();
    for (mode, parse_special) in [("parse_special", true), ("plain", false)] {
        for (i, text) in corpus.iter().enumerate() {
            let want = ids(&gold[mode][i]);
            let got = tok.encode(text, false, parse_special).unwrap();
            if got != want {
                failures.push(format!(
                    "{mode} case {i} {text:?}:\n   got {got:?}\n  want {want:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn flush_and_calls_end_generation_and_end_does_not() {
    let tok = tokenizer();
    let gold = goldens();
    let id = |v: &Value| u32::try_from(v.as_i64().unwrap()).ok();
    assert_eq!(
        (tok.bos(), tok.eos(), tok.eot()),
        (id(&gold["bos"]), id(&gold["eos"]), id(&gold["eot"]))
    );
    assert_eq!(tok.eog_ids(), ids(&gold["eog"]), "end-of-generation ids");
    let id_of = |t: &str| tok.token_id(t).unwrap();
    for t in ["<|flush|>", "<|calls|>", "<|end|>"] {
        assert_eq!(
            tok.encode(t, false, true).unwrap(),
            [id_of(t)],
            "{t} is one token"
        );
    }
    assert!(tok.is_eog(id_of("<|flush|>")) && tok.is_eog(id_of("<|calls|>")));
    assert!(!tok.is_eog(id_of("<|end|>")));
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
