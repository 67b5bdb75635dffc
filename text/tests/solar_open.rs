//! Solar-Open's tokenizer rules against mainline llama.cpp on a synthetic byte-level BPE that
//! llama.cpp's converter wrote with Solar's special tokens and pre-tokenizer `solar-open` (no Solar
//! vocabulary is on PyPI): the ids of every corpus case in both modes, every token's piece, and
//! which ids end generation (`<|flush|>` and `<|calls|>` do, `<|end|>` does not). Goldens from
//! tests/fixtures/make_solar_goldens.py; see tests/fixtures/PROVENANCE.md.

mod common;

use common::{assert_none, assert_pieces, assert_special_ids, differences, read};

fn tokenizer() -> bloomery_text::Tokenizer {
    common::tokenizer("solar-open.vocab.json", "solar-open")
}

fn goldens() -> serde_json::Value {
    common::goldens("solar_goldens.json")
}

#[test]
fn the_corpus_tokenizes_as_llama_cpp_does_in_both_modes() {
    let tok = tokenizer();
    let gold = goldens();
    let corpus: Vec<String> = serde_json::from_str(&read("corpus.json")).unwrap();
    assert_none(&differences(&tok, &gold, &corpus, ""), "encodings");
}

#[test]
fn flush_and_calls_end_generation_and_end_does_not() {
    let tok = tokenizer();
    assert_special_ids(&tok, &goldens());
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
    assert_pieces(&tokenizer(), &goldens());
}
