//! Times what a request's grammar costs per generated token, on the CPU and with no model: the
//! answers of `scripts/schema_bench.py`'s schema (10 objects × 8 fixed keys, enum and number
//! values) replayed through the runtime's own `Constraint` over a real vocabulary, calling it as
//! the scheduler's step does (`token::step`): the chain's pick and the grammar's check (`choose`:
//! the mask, `allows`, the masked re-sample on a refusal), `accept`, schemajump's forced tokens
//! (`only`) and its draft of the fixed text (`draft`), whose tokens the next rows verify.
//!
//! ```text
//! cargo run --release -p bloomery-runtime --example grammar_bench -- \
//!     VOCAB.vocab.json [--n-vocab N] [--tokens 600] [--reps 5] [--no-drafts]
//! ```
//! VOCAB is a `bloomery_text::VocabSpec` as JSON (`cargo xtask test` writes qwen2's and qwen35's
//! into `target/test-data/`); `--n-vocab` is the model's row length (151,936 for Qwen3-30B-A3B,
//! 248,320 for Qwen3.6-35B-A3B; default the tokenizer's size); `--no-drafts` as the scheduler
//! runs a model with per-sequence state (qwen35moe: no drafts). Three answers, greedy:
//! - `random`: what a random-weight model writes (schema_bench's synth files): each row is random
//!   logits, so the chain's first pick is refused nearly always and the grammar's masked re-sample
//!   picks among the admitted tokens (whitespace runs the grammar bounds, long numbers);
//! - `spaced`: a sentence of the grammar with its random whitespace, in its canonical tokens;
//! - `compact`: the same JSON without whitespace, in its canonical tokens.
//!
//! In `spaced` and `compact` each row makes a refused token the chain's first pick and the
//! answer's token the best admitted one, as a random model's rows do. Each rep is a fresh
//! request (a new `Constraint`: masks are cached per request); the figures are the median rep's
//! (by grammar time), with the fastest rep's grammar time beside it (on a busy machine the
//! least disturbed).
//! "pick" is the chain's greedy pick over the whole row, timed apart: what a token costs without
//! a grammar.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bloomery_grammar::{schema, Grammar};
use bloomery_runtime::grammar::{token_trie, Constraint};
use bloomery_runtime::request::GrammarSpec;
use bloomery_runtime::sampling::{Sampler, SamplerParams};
use bloomery_text::{Tokenizer, VocabSpec};

/// schema_bench.py's schema.
const SCHEMA: &str = r#"{"type": "array", "minItems": 10, "maxItems": 10, "items": {
  "type": "object",
  "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "kind": {"enum": ["alpha", "beta", "gamma"]},
    "score": {"type": "number"},
    "status": {"enum": ["active", "inactive", "pending"]},
    "weight": {"type": "number"},
    "level": {"enum": ["low", "medium", "high"]},
    "ratio": {"type": "number"},
    "flag": {"enum": ["yes", "no"]}
  },
  "required": ["id", "kind", "score", "status", "weight", "level", "ratio", "flag"],
  "additionalProperties": false}}"#;

/// Most tokens drafted after one sampled token (the scheduler's `MAX_DRAFT`).
const MAX_DRAFT: usize = 16;

/// A small deterministic generator (xorshift) for the random rows.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A logit in [-4, 4).
    fn logit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
    }
}

/// Time per kind of call, and what happened.
#[derive(Default, Clone)]
struct Tally {
    tokens: usize,
    forced: usize,
    drafted: usize,
    accepted: usize,
    choose: Duration,
    accept: Duration,
    only: Duration,
    draft: Duration,
    pick: Duration,
    /// FNV-1a of the answer's tokens (equal across builds: the grammar must not change them).
    hash: u64,
}

impl Tally {
    fn grammar(&self) -> Duration {
        self.choose + self.accept + self.only + self.draft
    }
}

/// Where the answer's tokens come from.
enum Source<'a> {
    /// Random rows: the chain and the grammar choose.
    Random(Rng),
    /// These tokens, in order.
    Tokens(&'a [u32]),
}

struct Bench<'a> {
    tok: &'a Tokenizer,
    spec: GrammarSpec,
    trie: Arc<bloomery_grammar::TokenTrie>,
    n_vocab: usize,
    drafts: bool,
    /// A token no state of the grammar admits (the refused first pick of `spaced`/`compact`).
    refused: u32,
}

impl Bench<'_> {
    /// One request: at most `n` tokens of `source`.
    fn run(&self, mut source: Source<'_>, n: usize) -> Tally {
        let mut t = Tally {
            hash: 0xcbf2_9ce4_8422_2325,
            ..Tally::default()
        };
        let params = SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        };
        let mut sampler = Sampler::new(params, self.n_vocab);
        let mut c = Constraint::new(&self.spec, self.trie.clone());
        let mut row = vec![0f32; self.n_vocab];
        let mut base = Rng(0x2545_f491_4f6c_dd1d);
        for l in row.iter_mut() {
            *l = base.logit();
        }
        // Tokens drafted for the rows to come, in order.
        let mut pending: Vec<u32> = Vec::new();
        let mut next: Vec<u32> = Vec::new();
        while t.tokens < n {
            // The row.
            let target = match &mut source {
                Source::Random(rng) => {
                    for l in row.iter_mut() {
                        *l = rng.logit();
                    }
                    None
                }
                Source::Tokens(ids) => match ids.get(t.tokens) {
                    Some(&id) => Some(id),
                    None => break,
                },
            };
            if let Some(id) = target {
                row[id as usize] = 10.0;
                row[self.refused as usize] = 20.0;
            }
            let started = Instant::now();
            std::hint::black_box(sampler.sample(&row));
            t.pick += started.elapsed();
            // The step: choose, then take the token.
            let started = Instant::now();
            let id = c.choose(&row, &mut sampler).expect("a token");
            t.choose += started.elapsed();
            if let Some(want) = target {
                assert_eq!(id, want, "the row's token is chosen");
                row[want as usize] = base.logit();
                row[self.refused as usize] = base.logit();
            }
            if self.tok.is_eog(id) {
                break;
            }
            self.take(&mut c, &mut sampler, id, &mut t);
            let drafted = (!pending.is_empty()).then(|| pending.remove(0));
            if drafted == Some(id) {
                t.accepted += 1;
                continue;
            }
            pending.clear();
            // Schemajump: the tokens the grammar admits alone.
            loop {
                let started = Instant::now();
                let only = c.only();
                t.only += started.elapsed();
                let Some(f) = only.filter(|&f| !self.tok.is_eog(f)) else {
                    break;
                };
                if let Source::Tokens(ids) = &source {
                    assert_eq!(ids.get(t.tokens), Some(&f), "forced token off the answer");
                }
                sampler.skip_draw();
                t.forced += 1;
                self.take(&mut c, &mut sampler, f, &mut t);
                if t.tokens >= n {
                    break;
                }
            }
            if self.drafts {
                next.clear();
                let max = MAX_DRAFT.min(n.saturating_sub(t.tokens));
                let started = Instant::now();
                c.draft(self.tok, max, &mut next);
                t.draft += started.elapsed();
                t.drafted += next.len();
                pending.extend_from_slice(&next);
            }
        }
        t
    }

    fn take(&self, c: &mut Constraint, sampler: &mut Sampler, id: u32, t: &mut Tally) {
        sampler.accept(id);
        let started = Instant::now();
        c.accept(id, self.tok).expect("an admitted token");
        t.accept += started.elapsed();
        t.tokens += 1;
        for b in id.to_le_bytes() {
            t.hash = (t.hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

fn ms(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e3 / n.max(1) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: grammar_bench VOCAB.vocab.json [--n-vocab N] [--tokens 600] [--reps 5] [--no-drafts]");
        std::process::exit(2);
    };
    let spec: VocabSpec = serde_json::from_str(
        &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}")),
    )
    .expect("a VocabSpec");
    let tok = Tokenizer::from_spec(&spec).expect("a tokenizer");
    let n_vocab = arg(&args, "--n-vocab").unwrap_or(tok.vocab_size());
    let n: usize = arg(&args, "--tokens").unwrap_or(600);
    let reps: usize = arg(&args, "--reps").unwrap_or(5);
    let drafts = !args.iter().any(|a| a == "--no-drafts");

    let schema: serde_json::Value = serde_json::from_str(SCHEMA).expect("the schema");
    let grammar = Arc::new(Grammar::parse(&schema::to_gbnf(&schema).expect("GBNF"), None).unwrap());
    let spaced = grammar.sample(7).expect("a sentence");
    let value: serde_json::Value = serde_json::from_str(&spaced).expect("JSON");
    let compact = serde_json::to_string(&value).expect("JSON");
    let trie = token_trie(&tok, n_vocab);
    let refused = tok.encode("@", false, false).expect("@")[0];
    let bench = Bench {
        tok: &tok,
        spec: GrammarSpec {
            grammar,
            after: None,
            lazy: None,
        },
        trie,
        n_vocab,
        drafts,
        refused,
    };
    println!(
        "vocabulary {} tokens (rows of {n_vocab}), {} trie nodes; drafts {}; {reps} reps, median",
        tok.vocab_size(),
        bench.trie.n_nodes(),
        if drafts { "on" } else { "off" }
    );
    println!("| answer | tokens | tokens' hash | forced | drafted accepted | grammar ms/token (fastest rep) | choose | accept | only | draft | pick (no grammar) |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let encode = |text: &str| tok.encode(text, false, false).expect("tokens");
    let streams = [
        ("random", None),
        ("spaced", Some(encode(&spaced))),
        ("compact", Some(encode(&compact))),
    ];
    for (name, ids) in &streams {
        let mut runs: Vec<Tally> = (0..reps)
            .map(|_| match ids {
                None => bench.run(Source::Random(Rng(0x9e37_79b9_7f4a_7c15)), n),
                Some(ids) => bench.run(Source::Tokens(ids), n),
            })
            .collect();
        runs.sort_by_key(Tally::grammar);
        let t = &runs[runs.len() / 2];
        let k = t.tokens;
        println!(
            "| {name} | {k} | {:016x} | {} | {}/{} | {:.4} ({:.4}) | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} |",
            t.hash,
            t.forced,
            t.accepted,
            t.drafted,
            ms(t.grammar(), k),
            ms(runs[0].grammar(), runs[0].tokens),
            ms(t.choose, k),
            ms(t.accept, k),
            ms(t.only, k),
            ms(t.draft, k),
            ms(t.pick, k),
        );
    }
}
