//! Schemajump against decoding every token: the same tokens with it on and off, greedy and
//! seeded, over several schemas and grammars, on the tiny synthetic qwen3moe (a small
//! vocabulary), the real gemma-3-270m file (262,144 tokens; `cargo xtask test` sets
//! BLOOMERY_GEMMA3) and the tiny qwen35 (recurrent state: no drafts); drafts refused mid-way
//! leave the slot's cache as decoding would (a follow-up that reuses the prefix answers the
//! same); the drafted and accepted counts are reported.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_grammar::{schema, Grammar};
use bloomery_plugin_api::DType;
use bloomery_runtime::request::{Event, Finish, GenParams, GrammarSpec};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::{Runtime, RuntimeConfig};
use bloomery_text::Tokenizer;
use serde_json::json;

fn f32_types() -> ClassTypes {
    ClassTypes {
        experts: DType::F32,
        attention: DType::F32,
        embedding: DType::F32,
        output: DType::F32,
        dense: DType::F32,
    }
}

/// The model at `path` behind a runtime with schemajump `on` or off, and its tokenizer.
fn start(path: &Path, on: bool) -> (Runtime, Arc<Tokenizer>) {
    let reg = Registry::load(&common::plugin_dir()).expect("plugin folder (`cargo xtask plugins`)");
    let options = LoadOptions {
        n_slots: 2,
        ctx_per_slot: 1024,
        threads: 2,
        ..LoadOptions::default()
    };
    let model = LoadedModel::load(&reg, path, options).unwrap();
    let tok = Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
    let cfg = RuntimeConfig {
        n_ctx_slot: 1024,
        n_batch: 256,
        cache_ram: None,
        queue_depth: 8,
        max_checkpoints: bloomery_runtime::DEFAULT_MAX_CHECKPOINTS,
        checkpoint_every: bloomery_runtime::DEFAULT_CHECKPOINT_EVERY,
        schemajump: on,
        context_shift: false,
        spec: bloomery_runtime::spec::SpecConfig::OFF,
        slot_similarity: bloomery_runtime::DEFAULT_SLOT_SIMILARITY,
    };
    (Runtime::start(model, tok.clone(), cfg).unwrap(), tok)
}

/// The issue's benchmark shape, shortened: objects of fixed keys with enum and number values.
fn records(n: usize) -> serde_json::Value {
    json!({
        "type": "array", "minItems": n, "maxItems": n,
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 999},
                "kind": {"enum": ["alpha", "beta", "gamma"]},
                "score": {"type": "number"},
                "status": {"enum": ["active", "inactive", "pending"]},
                "flag": {"enum": ["yes", "no"]}
            },
            "required": ["id", "kind", "score", "status", "flag"],
            "additionalProperties": false
        }
    })
}

/// Free strings, a boolean, an optional array, and long keys.
fn person() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "occupation_description": {"enum": ["engineer", "engineering manager", "doctor"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "is_currently_employed": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}
        },
        "required": ["name", "occupation_description", "age", "is_currently_employed"],
        "additionalProperties": false
    })
}

/// The grammars the tests walk: two schemas and a GBNF of long fixed phrases.
fn grammars() -> Vec<(&'static str, Arc<Grammar>)> {
    let from_schema = |s: serde_json::Value| {
        Arc::new(Grammar::parse(&schema::to_gbnf(&s).unwrap(), None).unwrap())
    };
    let phrases = r#"root ::= "The answer is " ("yes" | "no" | "maybe") ", and the reason is " [a-z ]{1,12} ". Thank you for asking." "#;
    vec![
        ("records", from_schema(records(3))),
        ("person", from_schema(person())),
        ("phrases", Arc::new(Grammar::parse(phrases, None).unwrap())),
    ]
}

fn params(grammar: &Arc<Grammar>, seed: Option<u32>, n_predict: usize) -> GenParams {
    GenParams {
        sampler: SamplerParams {
            temp: if seed.is_some() { 1.0 } else { 0.0 },
            seed: u64::from(seed.unwrap_or(0)),
            ..SamplerParams::default()
        },
        n_predict: Some(n_predict),
        stop: Vec::new(),
        n_probs: 0,
        post_sampling_probs: false,
        return_progress: false,
        ignore_eos: false,
        cache_prompt: false,
        forced: Vec::new(),
        prompt_only: false,
        grammar: Some(GrammarSpec {
            grammar: grammar.clone(),
            after: None,
            lazy: None,
        }),
        t_max_predict_ms: None,
        preserved: Vec::new(),
        special: false,
        shift: bloomery_runtime::request::ShiftParams::default(),
        reasoning_budget: None,
    }
}

/// The token ids and text a request generated, and its counts.
fn answer(rt: &Runtime, prompt: &[u32], p: GenParams) -> (Vec<u32>, String, Finish) {
    let mut rx = rt.submit_blocking(prompt.to_vec(), p, None).unwrap();
    let (mut ids, mut text) = (Vec::new(), String::new());
    loop {
        match rx
            .blocking_recv()
            .expect("the scheduler dropped the request")
        {
            Event::Token(piece) => {
                ids.push(piece.id);
                text.push_str(&piece.text);
            }
            Event::Started { .. } | Event::PromptProgress(_) => {}
            Event::Done(f) => return (ids, text, f),
            Event::Failed(f) => panic!("request failed: {}", f.message),
            Event::Embedded(_) | Event::Decided(_) => {
                panic!("a generation answered with embeddings or a decision")
            }
        }
    }
}

/// Drafted and accepted tokens, summed.
#[derive(Default)]
struct Tally {
    tokens: usize,
    forced: usize,
    drafted: usize,
    accepted: usize,
}

/// Every grammar with greedy sampling and `seeds`, schemajump on against off: the same tokens
/// and text; the off side drafts and forces nothing.
fn on_and_off_agree(path: &Path, seeds: &[u32], n_predict: usize) -> Tally {
    let (on, tok) = start(path, true);
    let (off, _) = start(path, false);
    let prompt = tok
        .encode("List the records as JSON.\n", true, false)
        .unwrap();
    let mut tally = Tally::default();
    for (name, g) in grammars() {
        let samplings = std::iter::once(None).chain(seeds.iter().map(|&s| Some(s)));
        for seed in samplings {
            let (a_ids, a_text, a) = answer(&on, &prompt, params(&g, seed, n_predict));
            let (b_ids, b_text, b) = answer(&off, &prompt, params(&g, seed, n_predict));
            assert_eq!(a_ids, b_ids, "{name}, seed {seed:?}: tokens differ");
            assert_eq!(a_text, b_text, "{name}, seed {seed:?}");
            assert_eq!((b.n_forced, b.n_drafted, b.n_accepted), (0, 0, 0));
            assert!(a.n_accepted <= a.n_drafted);
            eprintln!(
                "{name} seed {seed:?}: {} tokens, {} forced, {} of {} drafted accepted",
                a.n_predicted, a.n_forced, a.n_accepted, a.n_drafted
            );
            tally.tokens += a.n_predicted;
            tally.forced += a.n_forced;
            tally.drafted += a.n_drafted;
            tally.accepted += a.n_accepted;
        }
    }
    on.shutdown().unwrap();
    off.shutdown().unwrap();
    eprintln!(
        "{}: {} tokens, {} forced, {} of {} drafted accepted: {:.1}% without a pass of their own",
        path.display(),
        tally.tokens,
        tally.forced,
        tally.accepted,
        tally.drafted,
        100.0 * (tally.forced + tally.accepted) as f64 / tally.tokens.max(1) as f64
    );
    tally
}

#[test]
fn tiny_qwen3moe_gives_the_same_tokens_with_schemajump_on_and_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_qwen3moe(&dir, f32_types());
    let t = on_and_off_agree(&path, &[1, 2, 3, 4], 160);
    assert!(t.accepted > 0, "no drafted token was accepted");
}

#[test]
fn gemma3_gives_the_same_tokens_with_schemajump_on_and_off() {
    let path = PathBuf::from(std::env::var_os("BLOOMERY_GEMMA3").expect(
        "BLOOMERY_GEMMA3 names the gemma-3-270m Q4_K_M file (`cargo xtask test` installs it)",
    ));
    let t = on_and_off_agree(&path, &[1], 60);
    assert!(t.accepted > 0, "no drafted token was accepted");
}

#[test]
fn a_recurrent_model_drafts_nothing_and_answers_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("qwen35", dir.path(), f32_types());
    let t = on_and_off_agree(&path, &[1], 60);
    assert_eq!(t.drafted, 0);
}

/// Requests that end inside a draft (a token limit, a stop string), and a follow-up that
/// reuses the slot's cache: refused drafted tokens must have left it.
#[test]
fn drafts_cut_short_leave_the_cache_as_decoding_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_qwen3moe(&dir, f32_types());
    let (on, tok) = start(&path, true);
    let (off, _) = start(&path, false);
    // The fixed phrases: the tiny vocabulary drafts them (its schemas' fixed parts are forced).
    let g = grammars().remove(2).1;
    let prompt = tok.encode("records:", true, false).unwrap();
    let mut drafted = 0;
    for n_predict in [3, 9, 17, 40] {
        for seed in [None, Some(5)] {
            let mut p = params(&g, seed, n_predict);
            p.stop = vec!["reason is".into()];
            let (a, a_text, fa) = answer(&on, &prompt, p.clone());
            let (b, b_text, _) = answer(&off, &prompt, p);
            assert_eq!(
                (a, a_text),
                (b, b_text),
                "n_predict {n_predict}, seed {seed:?}"
            );
            drafted += fa.n_drafted;
        }
    }
    assert!(drafted > 0);
    // A first answer with drafts, then the same prompt and that answer plus more text,
    // reusing the slot's cache: a refused draft left in the cache would change its logits.
    for seed in [None, Some(7)] {
        let mut p = params(&g, seed, 120);
        p.cache_prompt = true;
        let (first, _, f) = answer(&on, &prompt, p.clone());
        assert!(f.n_drafted > f.n_accepted, "no draft was refused");
        let (first_off, _, _) = answer(&off, &prompt, p.clone());
        assert_eq!(first, first_off);
        let mut follow = prompt.clone();
        follow.extend(&first);
        follow.extend(tok.encode(" and again:", false, false).unwrap());
        let (a, _, fa) = answer(&on, &follow, p.clone());
        let (b, _, fb) = answer(&off, &follow, p);
        assert!(fa.n_cached > prompt.len(), "the follow-up reused no cache");
        assert_eq!(fa.n_cached, fb.n_cached);
        assert_eq!(a, b, "seed {seed:?}");
    }
    on.shutdown().unwrap();
    off.shutdown().unwrap();
}
