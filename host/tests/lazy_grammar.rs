//! A lazy grammar (llama.cpp's `grammar_lazy`, `tool_choice: auto`) through the real runtime on
//! the tiny random-weight model: the text is free until the trigger word, then held to the
//! grammar from the word on; the same grammar from the first token refuses the free text.

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
use bloomery_text::Tokenizer;

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
    };
    (
        Runtime::start(model, Arc::clone(&tok), cfg).unwrap(),
        tok,
        dir,
    )
}

/// Generates after `written` (tokens forced first, as if the model wrote them) with `grammar`;
/// returns the text, or why the request failed.
fn generate(
    rt: &Runtime,
    tok: &Tokenizer,
    written: &str,
    grammar: GrammarSpec,
    seed: u32,
) -> Result<String, String> {
    let params = GenParams {
        sampler: SamplerParams {
            temp: 1.0,
            seed: seed.into(),
            ..SamplerParams::default()
        },
        n_predict: Some(60),
        stop: Vec::new(),
        n_probs: 0,
        ignore_eos: false,
        cache_prompt: false,
        forced: tok.encode(written, false, false).unwrap(),
        prompt_only: false,
        grammar: Some(grammar),
    };
    let mut rx = rt
        .submit_blocking(vec![5, 77, 300, 12], params, None)
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut text = String::new();
    while Instant::now() < deadline {
        match rx.try_recv() {
            Ok(Event::Token(p)) => text.push_str(&p.text),
            Ok(Event::Started { .. }) => {}
            Ok(Event::Done(_)) => return Ok(text),
            Ok(Event::Failed(f)) => return Err(f.message),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("no answer within 60 s".into())
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
