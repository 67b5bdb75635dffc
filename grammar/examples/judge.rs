//! The grammar oracle's view of this crate: converts schemas, judges strings, draws samples.
//!
//! ```text
//! judge convert SCHEMA.json         our GBNF for a JSON schema (exit 3 and the error if refused)
//! judge gbnf GRAMMAR.gbnf  < LINES  one 1/0 per line: whether the grammar accepts the line
//! judge schema SCHEMA.json < LINES  the same with the schema's grammar
//! judge sample GRAMMAR.gbnf N       N random sentences, one JSON string per line
//! ```
//! Lines in and out are JSON strings, so newlines travel inside them.

use std::io::{BufRead, Write};
use std::sync::Arc;

use bloomery_grammar::{schema, Grammar, Matcher, TokenTrie};

fn grammar_text(mode: &str, path: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    if mode == "gbnf" || mode == "sample" {
        return text;
    }
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    match schema::to_gbnf(&value) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(3);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, path) = (args[1].as_str(), args[2].as_str());
    let text = grammar_text(mode, path);
    if mode == "convert" {
        print!("{text}");
        return;
    }
    let g = Grammar::parse(&text, None).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let mut out = std::io::BufWriter::new(std::io::stdout());
    if mode == "sample" {
        let n: u64 = args[3].parse().unwrap_or(10);
        for seed in 0..n {
            if let Some(s) = g.sample(seed) {
                writeln!(out, "{}", serde_json::Value::String(s)).unwrap_or(());
            }
        }
        return;
    }
    let vocab = Arc::new(TokenTrie::new(0, |_| &[][..], &[]));
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap_or_default();
        let s: String = serde_json::from_str(&line).unwrap_or_default();
        let mut m = Matcher::new(&g, vocab.clone());
        let ok = m.accept_text(&s) && m.accepts_end();
        writeln!(out, "{}", u8::from(ok)).unwrap_or(());
    }
}
