//! GLM-5.3's tokenizer rules against mainline llama.cpp on a synthetic byte-level BPE that
//! llama.cpp b11434's converter wrote with GLM-5.3's special tokens and pre-tokenizer `glm4` (no GLM
//! vocabulary is on PyPI): the ids of every corpus case and of GLM's own strings (the GLM-4.7-Flash
//! template's renders, tool calls, thinking, the specials) in both modes, every token's piece, and
//! which ids end generation (`<|endoftext|>`, `<|user|>` as EOT and `<|observation|>` as EOM, as the
//! real file's 154820, 154827 and 154829). Goldens from tests/fixtures/make_glm5_goldens.py; see
//! tests/fixtures/PROVENANCE.md.

mod common;

use common::{assert_none, assert_pieces, assert_special_ids, differences, read};

fn tokenizer() -> bloomery_text::Tokenizer {
    common::tokenizer("glm5.vocab.json", "glm4")
}

fn goldens() -> serde_json::Value {
    common::goldens("glm5_goldens.json")
}

#[test]
fn the_corpus_and_glm_strings_tokenize_as_llama_cpp_does_in_both_modes() {
    let tok = tokenizer();
    let gold = goldens();
    let corpus: Vec<String> = serde_json::from_str(&read("corpus.json")).unwrap();
    let glm: Vec<String> = serde_json::from_value(gold["glm_cases"].clone()).unwrap();
    assert!(
        glm.len() > 15,
        "the GLM cases include the template's renders"
    );
    let mut failures = differences(&tok, &gold, &corpus, "");
    failures.extend(differences(&tok, &gold, &glm, "glm_"));
    assert_none(&failures, "encodings");
}

#[test]
fn endoftext_user_and_observation_end_generation() {
    let tok = tokenizer();
    assert_special_ids(&tok, &goldens());
    let id_of = |t: &str| tok.token_id(t).unwrap();
    // The real file's stop ids 154820, 154827, 154829 are these three, 0, 7 and 9 after the first
    // special token.
    let first = id_of("<|endoftext|>");
    for (t, offset) in [("<|user|>", 7), ("<|observation|>", 9)] {
        assert_eq!(id_of(t), first + offset, "{t}");
    }
    for t in ["<|endoftext|>", "<|user|>", "<|observation|>"] {
        assert_eq!(
            tok.encode(t, false, true).unwrap(),
            [id_of(t)],
            "{t} is one token"
        );
        assert!(tok.is_eog(id_of(t)), "{t} ends generation");
    }
    for t in [
        "<|assistant|>",
        "[gMASK]",
        "<sop>",
        "</think>",
        "</tool_call>",
    ] {
        assert!(!tok.is_eog(id_of(t)), "{t} does not end generation");
    }
    assert_eq!(tok.bos(), Some(id_of("[gMASK]")));
}

#[test]
fn pieces_match_llama_cpp() {
    assert_pieces(&tokenizer(), &goldens());
}
