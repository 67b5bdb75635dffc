//! A synthetic byte-level BPE vocabulary of any size: the 256 byte tokens (GPT-2 byte-to-unicode
//! alphabet), deterministic merges of lowercase letters and space-prefixed words, and the ChatML
//! special tokens. Loadable by llama.cpp (`tokenizer.ggml.model = gpt2`, pre-tokenizer `qwen2`).

use std::collections::HashSet;

use bloomery_gguf::{Array, Value};

/// Special tokens at the end of the vocabulary: end of text, turn start, turn end.
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// A minimal ChatML template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The GPT-2 byte-to-unicode map: printable bytes map to themselves, the rest to U+0100 upwards.
pub fn byte_char(b: u8) -> char {
    let printable = |x: u8| (33..=126).contains(&x) || (161..=172).contains(&x) || x >= 174;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// The vocabulary: tokens, token types and merges.
pub struct Vocab {
    /// Token strings, id order.
    pub tokens: Vec<String>,
    /// Token types (1 normal, 3 control).
    pub types: Vec<i32>,
    /// Merges `"a b"`, rank order.
    pub merges: Vec<String>,
}

/// Builds a vocabulary of exactly `n_vocab` tokens (at least 256 + the specials).
pub fn build(n_vocab: usize) -> Result<Vocab, String> {
    let n_normal = n_vocab
        .checked_sub(SPECIALS.len())
        .filter(|&n| n >= 256)
        .ok_or_else(|| {
            format!(
                "a synthetic vocabulary needs at least {} tokens, not {n_vocab}",
                256 + SPECIALS.len()
            )
        })?;
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut seen: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    let letters: Vec<String> = ('a'..='z').map(|c| c.to_string()).collect();
    let space = byte_char(b' ').to_string();
    let mut push = |a: &str, b: &str, tokens: &mut Vec<String>, merges: &mut Vec<String>| {
        let t = format!("{a}{b}");
        if tokens.len() < n_normal && seen.insert(t.clone()) {
            tokens.push(t);
            merges.push(format!("{a} {b}"));
        }
    };
    for l in &letters {
        push(&space, l, &mut tokens, &mut merges);
    }
    let mut next = 256;
    while tokens.len() < n_normal && next < tokens.len() {
        let base = tokens[next].clone();
        for l in &letters {
            push(&base, l, &mut tokens, &mut merges);
        }
        next += 1;
    }
    if tokens.len() < n_normal {
        return Err(format!("could not build {n_normal} distinct tokens"));
    }
    let mut types = vec![1; tokens.len()];
    for s in SPECIALS {
        tokens.push(s.to_owned());
        types.push(3);
    }
    Ok(Vocab {
        tokens,
        types,
        merges,
    })
}

/// The `tokenizer.*` metadata of the vocabulary.
pub fn metadata(v: &Vocab) -> Vec<(String, Value)> {
    let id = |s: &str| v.tokens.iter().position(|t| t == s).unwrap_or(0) as u32;
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("qwen2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(v.tokens.clone())),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(v.types.clone())),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::String(v.merges.clone())),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            Value::U32(id("<|im_end|>")),
        ),
        (
            "tokenizer.ggml.padding_token_id".into(),
            Value::U32(id("<|endoftext|>")),
        ),
        (
            "tokenizer.ggml.bos_token_id".into(),
            Value::U32(id("<|endoftext|>")),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Value::String(CHATML_TEMPLATE.into()),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_a_bijection_onto_256_chars() {
        let chars: HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), '\u{120}');
    }

    #[test]
    fn vocab_has_the_exact_size_and_valid_merges() {
        let v = build(512).unwrap();
        assert_eq!(v.tokens.len(), 512);
        let set: HashSet<&String> = v.tokens.iter().collect();
        assert_eq!(set.len(), 512);
        for m in &v.merges {
            let (a, b) = m.split_once(' ').unwrap();
            assert!(
                set.contains(&a.to_string()) && set.contains(&b.to_string()),
                "{m}"
            );
            assert!(set.contains(&format!("{a}{b}")));
        }
        assert!(build(100).is_err());
        assert_eq!(build(151_936).unwrap().tokens.len(), 151_936);
    }
}
