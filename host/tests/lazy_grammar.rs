//! A lazy grammar (llama.cpp's `grammar_lazy`, `tool_choice: auto`) through the real runtime on
//! the tiny random-weight model: the text is free until the trigger word, then held to the
//! grammar from the word on; the same grammar from the first token refuses the free text. And a
//! format's tags that the vocabulary holds as control tokens reach the reply's text.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_grammar::Grammar;
use bloomery_runtime::request::{Event, GenParams, GrammarSpec, LazyOpening};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::{Runtime, RuntimeConfig};
use bloomery_text::{StreamDecoder, Tokenizer};

const CALL: &str = "root ::= \"<tool_call>\" [a-z]{1,6} \"</tool_call>\"";

fn runtime() -> (Runtime, Arc<Tokenizer>, tempfile::TempDir) {
    let f32 = bloomery_plugin_api::DType::F32;
    let types = ClassTypes {
        experts: f32,
        attention: f32,
        embedding: f32,
        output: f32,
        dense: f32,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_qwen3moe(&dir, types);
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let options = LoadOptions {
        n_slots: 1,
        ctx_per_slot: 256,
        ..LoadOptions::default()
    };
    let model = LoadedModel::load(&reg, &path, options).unwrap();
    let tok = Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
    let cfg = RuntimeConfig {
        n_ctx_slot: 256,
        n_batch: 64,
        cache_ram: None,
        queue_depth: 8,
        max_checkpoints: bloomery_runtime::DEFAULT_MAX_CHECKPOINTS,
        checkpoint_every: bloomery_runtime::DEFAULT_CHECKPOINT_EVERY,
        schemajump: true,
        context_shift: false,
        spec: bloomery_runtime::spec::SpecConfig::OFF,
        slot_similarity: bloomery_runtime::DEFAULT_SLOT_SIMILARITY,
    };
    (
        Runtime::start(model, Arc::clone(&tok), cfg).unwrap(),
        tok,
        dir,
    )
}

/// Settings that force `written` (as if the model wrote it), then sample at temperature 1.
fn free_params(tok: &Tokenizer, written: &str, seed: u32) -> GenParams {
    GenParams {
        sampler: SamplerParams {
            temp: 1.0,
            seed: seed.into(),
            ..SamplerParams::default()
        },
        n_predict: Some(60),
        stop: Vec::new(),
        n_probs: 0,
        post_sampling_probs: false,
        return_progress: false,
        ignore_eos: false,
        cache_prompt: false,
        forced: tok.encode(written, false, true).unwrap(),
        prompt_only: false,
        grammar: None,
        t_max_predict_ms: None,
        preserved: Vec::new(),
        special: false,
        shift: bloomery_runtime::request::ShiftParams::default(),
        reasoning_budget: None,
    }
}

/// The text of a request, or why it failed.
fn run(rt: &Runtime, params: GenParams) -> Result<String, String> {
    let mut rx = rt
        .submit_blocking(vec![5, 77, 300, 12], params, None)
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut text = String::new();
    while Instant::now() < deadline {
        match rx.try_recv() {
            Ok(Event::Token(p)) => text.push_str(&p.text),
            Ok(Event::Started { .. } | Event::PromptProgress(_)) => {}
            Ok(Event::Done(_)) => return Ok(text),
            Ok(Event::Failed(f)) => return Err(f.message),
            Ok(Event::Embedded(_) | Event::Decided(_)) => {
                return Err("a generation answered with embeddings or a decision".into())
            }
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("no answer within 60 s".into())
}

/// Generates after `written` with `grammar`.
fn generate(
    rt: &Runtime,
    tok: &Tokenizer,
    written: &str,
    grammar: GrammarSpec,
    seed: u32,
) -> Result<String, String> {
    let params = GenParams {
        grammar: Some(grammar),
        ..free_params(tok, written, seed)
    };
    run(rt, params)
}

fn spec(lazy: bool) -> GrammarSpec {
    GrammarSpec {
        grammar: Arc::new(Grammar::parse(CALL, None).unwrap()),
        after: None,
        lazy: lazy.then(|| {
            Box::new(LazyOpening {
                triggers: vec!["<tool_call>".into()],
                optional_span: None,
            })
        }),
    }
}

#[test]
fn a_formats_control_tokens_stay_in_the_reply_text() {
    let (rt, tok, _dir) = runtime();
    // The tiny vocabulary's ChatML tags are control tokens, as GLM's and Solar's tool-call tags
    // are in theirs.
    let ids = bloomery::server::tools::control_ids(&tok, &["<|im_start|>", "<|im_end|>", "plain"]);
    assert_eq!(ids.len(), 2, "{ids:?}");
    let plain = StreamDecoder::new(&tok, false).push(ids[0]);
    assert_eq!(plain, "");
    assert_eq!(
        StreamDecoder::new(&tok, false)
            .preserving(&ids)
            .push(ids[0]),
        "<|im_start|>"
    );
    // Through the runtime: a preserved tag the model writes reaches the text.
    let mut params = free_params(&tok, "x<|im_start|>y", 0);
    params.n_predict = Some(3);
    let kept = run(
        &rt,
        GenParams {
            preserved: ids.clone(),
            shift: bloomery_runtime::request::ShiftParams::default(),
            ..params.clone()
        },
    )
    .unwrap();
    assert_eq!(kept, "x<|im_start|>y");
    assert_eq!(run(&rt, params).unwrap(), "xy");
    rt.shutdown().unwrap();
}

#[test]
fn a_lazy_grammar_holds_the_text_from_its_trigger_on() {
    let (rt, tok, _dir) = runtime();
    let written = "Let me look: <tool_call>";
    for seed in 0..4 {
        // Free text, then the trigger: from it on only a call fits, and the request ends when
        // the call does.
        let text = generate(&rt, &tok, written, spec(true), seed).unwrap();
        let name = text
            .strip_prefix(written)
            .and_then(|c| c.strip_suffix("</tool_call>"))
            .unwrap_or_else(|| panic!("seed {seed}: {text:?}"));
        assert!(
            (1..=6).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase()),
            "{text:?}"
        );
        // Half a trigger opens nothing: the model goes on freely (random text, to the limit).
        let free = generate(&rt, &tok, "Let me look: <tool_", spec(true), seed).unwrap();
        assert!(!free.contains("</tool_call>"), "{free:?}");
    }
    // From the first token, the same grammar refuses the free text before the trigger.
    assert!(generate(&rt, &tok, written, spec(false), 0).is_err());
    rt.shutdown().unwrap();
}
