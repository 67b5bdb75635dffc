//! End-to-end forward passes of a synthetic qwen3moe on the CPU plugins: batching invariants.

use std::path::PathBuf;

use bloomery::engine::executor::BatchInputs;
use bloomery::model::{LoadOptions, LoadedModel};
use bloomery::plugins::Registry;
use bloomery::synth::{self, ClassTypes};
use bloomery_plugin_api::DType;

fn plugin_dir() -> PathBuf {
    std::env::var_os("BLOOMERY_TEST_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/plugins")
        })
}

fn tiny(dir: &tempfile::TempDir, types: ClassTypes) -> PathBuf {
    let reg =
        Registry::load(&plugin_dir()).expect("plugin folder (run `cargo xtask plugins` first)");
    let plugin = reg.model_for("qwen3moe").unwrap();
    let presets = plugin.module.synth_presets()();
    let preset = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
    let path = dir.path().join("tiny.gguf");
    synth::write(preset, types, 7, &path).unwrap();
    path
}

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

fn load(path: &std::path::Path, n_slots: u32) -> LoadedModel {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = LoadOptions {
        n_slots,
        ctx_per_slot: 64,
        kv_type: DType::F32,
        threads: 2,
    };
    LoadedModel::load(&reg, path, opts).unwrap()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn a_batched_prompt_equals_token_by_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, F32);
    let tokens = [5, 77, 300, 12, 509, 256, 1];
    let n = tokens.len();
    let mut m = load(&path, 1);
    let batch = BatchInputs {
        tokens: tokens.to_vec(),
        positions: (0..n as i32).collect(),
        slots: vec![0; n],
        output_rows: (0..n as i32).collect(),
        history: vec![],
    };
    let all = m.forward(&batch).unwrap();
    let vocab = m.spec.hparams.n_vocab as usize;
    assert_eq!(all.len(), vocab * n);
    let mut m2 = load(&path, 1);
    for (i, &t) in tokens.iter().enumerate() {
        let one = m2
            .forward(&BatchInputs {
                tokens: vec![t],
                positions: vec![i as i32],
                slots: vec![0],
                output_rows: vec![0],
                history: vec![],
            })
            .unwrap();
        let rel = max_rel(&one, &all[i * vocab..(i + 1) * vocab]);
        assert!(rel < 1e-5, "position {i}: rel {rel}");
    }
}

#[test]
fn sequences_in_one_batch_equal_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, F32);
    let a = [3, 4, 5, 6];
    let b = [400, 401, 17];
    let mut both = load(&path, 2);
    let batch = BatchInputs {
        tokens: a.iter().chain(&b).copied().collect(),
        positions: vec![0, 1, 2, 3, 0, 1, 2],
        slots: vec![0, 0, 0, 0, 1, 1, 1],
        output_rows: vec![3, 6],
        history: vec![],
    };
    let out = both.forward(&batch).unwrap();
    let vocab = both.spec.hparams.n_vocab as usize;
    for (seq, want_row) in [(&a[..], 0usize), (&b[..], 1)] {
        let mut alone = load(&path, 1);
        let n = seq.len();
        let logits = alone
            .forward(&BatchInputs {
                tokens: seq.to_vec(),
                positions: (0..n as i32).collect(),
                slots: vec![0; n],
                output_rows: vec![n as i32 - 1],
                history: vec![],
            })
            .unwrap();
        let rel = max_rel(&out[want_row * vocab..(want_row + 1) * vocab], &logits);
        assert!(rel < 1e-5, "sequence {want_row}: rel {rel}");
    }
}

#[test]
fn a_position_past_the_context_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, F32);
    let mut m = load(&path, 1);
    let e = m
        .forward(&BatchInputs {
            tokens: vec![1],
            positions: vec![64],
            slots: vec![0],
            output_rows: vec![0],
            history: vec![],
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the context of 64"), "{e}");
}
