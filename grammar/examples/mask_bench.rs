//! Times the vocabulary mask on a real vocabulary: a grammar's sentence is tokenized and walked
//! token by token, the mask computed at each state (cold: a fresh matcher, every state new) and
//! again over the same states (warm: the per-state cache), and the tokens schemajump would force
//! are counted.
//!
//! ```text
//! cargo run --release -p bloomery-grammar --example mask_bench -- VOCAB.vocab.json SCHEMA.json [N] [--compact]
//! ```
//! VOCAB is a `bloomery_text::VocabSpec` as JSON (text/tests/fixtures/fetch.sh writes qwen2's
//! 151,665 and qwen35's 248,320 tokens); SCHEMA a JSON schema; N sentences (default 3);
//! `--compact` drops the whitespace llama.cpp's grammar allows between JSON tokens (a what-if for
//! the forced fraction). With `MASK_BENCH_SENTENCES=FILE` the sentences are appended to FILE as
//! JSON lines, for `scripts/grammar_oracle/llama_mask_bench.py` (llama.cpp's side).

use std::sync::Arc;
use std::time::Instant;

use bloomery_grammar::{schema, Grammar, Matcher, TokenTrie};
use bloomery_text::{Tokenizer, VocabSpec};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let spec: VocabSpec =
        serde_json::from_str(&std::fs::read_to_string(&args[1]).unwrap()).unwrap();
    let tok = Tokenizer::from_spec(&spec).unwrap();
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&args[2]).unwrap()).unwrap();
    let n: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let mut gbnf = schema::to_gbnf(&schema).unwrap();
    if args.iter().any(|a| a == "--compact") {
        // What-if: no whitespace between JSON tokens (not llama.cpp's language).
        gbnf = gbnf
            .lines()
            .map(|l| {
                if l.starts_with("space ::=") {
                    "space ::= \"\""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
    }
    let g = Grammar::parse(&gbnf, None).unwrap();
    let n_vocab = tok.vocab_size();
    let t = Instant::now();
    let trie = Arc::new(TokenTrie::new(
        n_vocab,
        |id| tok.token_to_piece(id, true),
        &tok.eog_ids(),
    ));
    println!(
        "vocabulary {n_vocab} tokens, trie {} nodes, built in {:.0} ms",
        trie.n_nodes(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let (mut cold, mut warm, mut worst, mut tokens, mut forced) =
        (0f64, 0f64, 0f64, 0usize, 0usize);
    for seed in 0..n {
        let text = g.sample(seed).unwrap();
        if let Ok(path) = std::env::var("MASK_BENCH_SENTENCES") {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap();
            writeln!(f, "{}", serde_json::Value::String(text.clone())).unwrap();
        }
        let ids = tok.encode(&text, false, false).unwrap();
        let mut m = Matcher::new(&g, trie.clone());
        for &id in &ids {
            let t = Instant::now();
            let mask = m.mask();
            let dt = t.elapsed().as_secs_f64();
            cold += dt;
            worst = worst.max(dt);
            tokens += 1;
            forced += usize::from(mask.only().is_some());
            assert!(mask.allows(id), "token {id} of a sentence refused");
            m.accept(id, tok.token_to_piece(id, true), false).unwrap();
        }
        // The same states again: every mask comes from the cache.
        m.restart();
        for &id in &ids {
            let t = Instant::now();
            m.mask();
            warm += t.elapsed().as_secs_f64();
            m.accept(id, tok.token_to_piece(id, true), false).unwrap();
        }
    }
    println!(
        "{tokens} tokens: cold mask {:.3} ms per token (worst {:.1} ms), cached {:.4} ms; {forced} ({:.0}%) admit one token",
        1e3 * cold / tokens as f64,
        1e3 * worst,
        1e3 * warm / tokens as f64,
        100.0 * forced as f64 / tokens as f64
    );
}
