//! Moving cached positions (context shift, cache reuse) on the CPU: after a slot's positions
//! move down, the next token's logits equal those of a slot that evaluated the kept tokens
//! afresh at their new positions; models whose state cannot move are refused by name.

mod common;

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;
use bloomery_runtime::request::{Event, Finish, GenParams, ShiftParams};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::{Runtime, RuntimeConfig};
use std::sync::Arc;

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

fn load(path: &std::path::Path, kv: DType) -> LoadedModel {
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let opts = LoadOptions {
        n_slots: 2,
        ctx_per_slot: 64,
        kv_type_k: kv,
        kv_type_v: kv,
        threads: 2,
        graphs: true,
        mlock: false,
        overrides: &[],
        check_tensors: false,
        draft_n_max: 0,
        draft_history: false,
    };
    LoadedModel::load(&reg, path, opts).unwrap()
}

/// The logits of the last of `tokens`, evaluated in `slot` from position `start`.
fn last_logits(m: &mut LoadedModel, slot: i32, start: i32, tokens: &[i32]) -> Vec<f32> {
    let n = tokens.len() as i32;
    m.forward(&BatchInputs {
        tokens: tokens.to_vec(),
        positions: (start..start + n).collect(),
        slots: vec![slot; n as usize],
        output_rows: vec![n - 1],
        ngram_rows: vec![],
        logit_rows: vec![],
    })
    .unwrap()
}

/// The largest |a - b| over the largest |b|, of f32 or f16 bytes.
fn max_rel(a: &[u8], b: &[u8], kv: DType) -> f32 {
    let vals = |x: &[u8]| -> Vec<f32> {
        match kv {
            DType::F32 => x
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            _ => x
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    };
    let (a, b) = (vals(a), vals(b));
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Slot 0 evaluates 20 tokens and drops positions 4..12 by moving 12..20 down to 4; slot 1
/// evaluates tokens 0..4 and 12..20 afresh at positions 0..12. A first layer's keys and values
/// depend only on each token and its position (later layers' also on the dropped tokens), so
/// its cache rows must agree: returns their largest relative difference.
fn shifted_against_fresh(m: &mut LoadedModel, kv: DType) -> f32 {
    let vocab = m.spec.hparams.n_vocab as i32;
    let toks: Vec<i32> = (0..20).map(|i| (i * 37 + 5) % vocab).collect();
    last_logits(m, 0, 0, &toks);
    m.move_positions(0, 12, 4, 8).unwrap();
    let mut kept: Vec<i32> = toks[..4].to_vec();
    kept.extend_from_slice(&toks[12..]);
    last_logits(m, 1, 0, &kept);
    let (shifted, fresh) = (m.read_slot(0, 12).unwrap(), m.read_slot(1, 12).unwrap());
    let first = m.spec.state.iter().map(|s| s.layer).min().unwrap();
    let mut worst = 0f32;
    for (i, s) in m.spec.state.iter().enumerate() {
        if s.layer == first {
            worst = worst.max(max_rel(&shifted[i], &fresh[i], kv));
        }
    }
    worst
}

#[test]
fn moved_keys_are_rotated_to_their_new_positions() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen3moe", "gemma3", "glm4moe"] {
        let path = common::tiny_of(arch, dir.path(), F32);
        for (kv, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-3)] {
            let mut m = load(&path, kv);
            assert_eq!(m.shift_refusal(), None, "{arch}");
            let d = shifted_against_fresh(&mut m, kv);
            assert!(
                d < tol,
                "{arch} with a {kv} cache: first layer's rows differ by {d}"
            );
        }
    }
}

#[test]
fn a_cache_that_cannot_move_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("qwen35", dir.path(), F32);
    let mut m = load(&path, DType::F16);
    let why = m.shift_refusal().expect("recurrent state cannot shift");
    assert!(why.contains("cannot shift"), "{why}");
    assert!(m.move_positions(0, 12, 4, 8).is_err());
    let path = common::tiny_of("qwen3moe", dir.path(), F32);
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let opts = LoadOptions {
        n_slots: 1,
        ctx_per_slot: 64,
        kv_type_k: DType::Q8_0,
        ..LoadOptions::default()
    };
    let m = LoadedModel::load(&reg, &path, opts).unwrap();
    let why = m.shift_refusal().expect("a quantized key cache is refused");
    assert!(why.contains("-ctk f16"), "{why}");
}

/// Greedy generation of `n_predict` tokens after a 4-token prompt in a runtime of 32-position
/// slots: the tokens and how the request ended.
fn generate(context_shift: bool, n_predict: usize) -> (Vec<u32>, Finish) {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("qwen3moe", dir.path(), F32);
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let opts = LoadOptions {
        n_slots: 1,
        ctx_per_slot: 32,
        ..LoadOptions::default()
    };
    let model = LoadedModel::load(&reg, &path, opts).unwrap();
    let tok = Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
    let cfg = RuntimeConfig {
        n_ctx_slot: 32,
        n_batch: 64,
        cache_ram: None,
        queue_depth: 4,
        max_checkpoints: 0,
        checkpoint_every: 0,
        schemajump: true,
        context_shift,
        spec: bloomery_runtime::spec::SpecConfig::OFF,
        slot_similarity: bloomery_runtime::DEFAULT_SLOT_SIMILARITY,
    };
    let runtime = Runtime::start(model, tok, cfg).unwrap();
    let params = GenParams {
        n_predict: Some(n_predict),
        ignore_eos: true,
        cache_prompt: false,
        sampler: SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        shift: ShiftParams {
            n_keep: 2,
            ..ShiftParams::default()
        },
        ..GenParams::embedding()
    };
    let params = GenParams {
        prompt_only: false,
        ..params
    };
    let mut rx = runtime
        .submit_blocking(vec![5, 77, 300, 12], params, None)
        .unwrap();
    let mut ids = Vec::new();
    loop {
        match rx.blocking_recv().expect("the scheduler answers") {
            Event::Token(p) => ids.push(p.id),
            Event::Done(f) => {
                runtime.shutdown().unwrap();
                return (ids, f);
            }
            Event::Failed(f) => panic!("{}", f.message),
            _ => {}
        }
    }
}

#[test]
fn generation_goes_past_the_context_with_context_shift() {
    // Without it, generation stops at the context's end, truncated.
    let (ids, f) = generate(false, 60);
    assert_eq!((ids.len(), f.n_predicted, f.truncated), (28, 28, true));
    // With it, all 60 tokens come, the first ones as before, and the answer says truncated.
    let (shifted, f) = generate(true, 60);
    assert_eq!((shifted.len(), f.n_predicted, f.truncated), (60, 60, true));
    assert_eq!(shifted[..28], ids[..]);
}
