//! The runtime against requests and files no front end should let through: a request whose
//! settings would panic or allocate without bound fails or runs alone while the next request
//! gets the answer it always gets; slot files tell apart weights of one shape; a file whose
//! layer count its tensors contradict is a named error, not an abort.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel, ModelError};
use bloomery_runtime::request::{Event, GenParams};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::{Runtime, RuntimeConfig};

/// Every weight in f32 (as `bloomery synth` writes by default).
fn f32_types() -> ClassTypes {
    let f32 = bloomery_plugin_api::DType::F32;
    ClassTypes {
        experts: f32,
        attention: f32,
        embedding: f32,
        output: f32,
        dense: f32,
    }
}

fn load(path: &Path) -> LoadedModel {
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let options = LoadOptions {
        n_slots: 2,
        ctx_per_slot: 256,
        ..LoadOptions::default()
    };
    LoadedModel::load(&reg, path, options).unwrap()
}

fn greedy(n_predict: usize) -> GenParams {
    common::generation(
        SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        n_predict,
    )
}

/// What a request produced: its token ids and the alternatives reported with its first token,
/// or why it failed.
fn outcome(runtime: &Runtime, params: GenParams) -> Result<(Vec<u32>, usize), String> {
    let mut rx = runtime
        .submit_blocking(vec![5, 77, 300, 12], params, None)
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut ids, mut alternatives) = (Vec::new(), 0);
    while Instant::now() < deadline {
        match rx.try_recv() {
            Ok(Event::Token(p)) => {
                if ids.is_empty() {
                    alternatives = p.probs.as_ref().map_or(0, |pr| pr.top.len());
                }
                ids.push(p.id);
            }
            Ok(Event::Started { .. } | Event::PromptProgress(_)) => {}
            Ok(Event::Done(_)) => return Ok((ids, alternatives)),
            Ok(Event::Failed(f)) => return Err(f.message),
            Ok(Event::Embedded(_) | Event::Decided(_)) => {
                return Err("a generation answered with embeddings or a decision".into())
            }
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                return Err("the scheduler dropped the request".into())
            }
        }
    }
    Err("no answer within 60 s".into())
}

#[test]
fn hostile_settings_run_alone_and_the_next_request_answers_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_qwen3moe(&dir, f32_types());
    let model = load(&path);
    let n_vocab = model.spec.hparams.n_vocab as usize;
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
    let runtime = Runtime::start(model, tok, cfg).unwrap();
    let want = outcome(&runtime, greedy(6)).unwrap();
    // A penalty window of usize::MAX (a client's -1 read as "all") was allocated whole while
    // the request was set up, outside any guard: the scheduler thread died.
    let mut p = greedy(6);
    p.sampler.penalty_last_n = usize::MAX;
    p.sampler.penalty_repeat = 1.1;
    assert!(outcome(&runtime, p).is_ok());
    assert_eq!(outcome(&runtime, greedy(6)).unwrap(), want);
    // 10^12 tokens of window asked for 4 TB and aborted the process.
    let mut p = greedy(6);
    p.sampler.penalty_last_n = 1_000_000_000_000;
    p.sampler.penalty_repeat = 1.1;
    assert!(outcome(&runtime, p).is_ok());
    // 2^62 alternatives overflowed a capacity on the scheduler thread, failing every running
    // request; the vocabulary is all there is to report.
    let mut p = greedy(6);
    p.n_probs = 1 << 62;
    assert_eq!(outcome(&runtime, p).unwrap().1, n_vocab);
    assert_eq!(outcome(&runtime, greedy(6)).unwrap(), want);
    runtime.shutdown().unwrap();
}

#[test]
fn the_identity_tells_apart_weights_of_one_shape() {
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let plugin = reg.model_for("qwen3moe").unwrap();
    let presets = plugin.module.synth_presets()();
    let preset = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    bloomery::synth::write(preset, f32_types(), 7, &a).unwrap();
    bloomery::synth::write(preset, f32_types(), 8, &b).unwrap();
    let id_a = load(&a).identity();
    assert_eq!(load(&a).identity(), id_a);
    assert_ne!(load(&b).identity(), id_a);
}

/// `path` with the u32 metadata value `key` set to `value`.
fn with_u32(path: &Path, key: &str, value: u32, out: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut named = (key.len() as u64).to_le_bytes().to_vec();
    named.extend_from_slice(key.as_bytes());
    let at = bytes
        .windows(named.len())
        .position(|w| w == named.as_slice())
        .unwrap()
        + named.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes(), "{key} is a u32");
    bytes[at + 4..at + 8].copy_from_slice(&value.to_le_bytes());
    std::fs::write(out, bytes).unwrap();
}

#[test]
fn a_layer_count_the_tensors_contradict_is_named_before_the_plugin_allocates() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    for (arch, layers) in [("gemma3", 6), ("qwen3moe", 4)] {
        let good = common::tiny_of(arch, dir.path(), f32_types());
        let bad = dir.path().join(format!("{arch}-bad.gguf"));
        with_u32(&good, &format!("{arch}.block_count"), i32::MAX as u32, &bad);
        let e = LoadedModel::load(&reg, &bad, LoadOptions::default())
            .err()
            .expect("the file was loaded");
        assert!(matches!(e, ModelError::Hyperparameter { .. }), "{e}");
        let shown = e.to_string();
        assert!(
            shown.contains(&format!("`{arch}.block_count` is 2147483647"))
                && shown.contains(&format!("{layers} layers")),
            "{shown}"
        );
    }
}
