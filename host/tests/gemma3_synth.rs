//! End-to-end forward passes of a synthetic gemma3 (tiny preset: five sliding layers with a
//! window of 4, one global layer) on the CPU plugins: a prompt longer than the window gives the
//! same logits batched as token by token, and sequences batched together equal each alone.

mod common;

use common::plugin_dir;

use std::path::{Path, PathBuf};

use bloomery::synth::{self, ClassTypes};
use bloomery_devices::Registry;
use bloomery_exec::BatchInputs;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

fn tiny(dir: &tempfile::TempDir) -> PathBuf {
    let reg =
        Registry::load(&plugin_dir()).expect("plugin folder (run `cargo xtask plugins` first)");
    let plugin = reg.model_for("gemma3").unwrap();
    let presets = plugin.module.synth_presets()();
    let preset = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
    let path = dir.path().join("tiny-gemma3.gguf");
    synth::write(preset, F32, 11, &path).unwrap();
    path
}

fn load(path: &Path, n_slots: u32) -> LoadedModel {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = LoadOptions {
        n_slots,
        ctx_per_slot: 64,
        kv_type_k: DType::F32,
        kv_type_v: DType::F32,
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

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn batch(tokens: &[i32], start: i32, slot: i32, outputs: Vec<i32>) -> BatchInputs {
    let n = tokens.len() as i32;
    BatchInputs {
        tokens: tokens.to_vec(),
        positions: (start..start + n).collect(),
        slots: vec![slot; tokens.len()],
        output_rows: outputs,
        ngram_rows: vec![],
        logit_rows: vec![],
    }
}

#[test]
fn a_prompt_longer_than_the_window_batched_equals_token_by_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir);
    let tokens = [2, 77, 300, 12, 509, 256, 1, 40, 41, 42, 7];
    let n = tokens.len() as i32;
    let mut m = load(&path, 1);
    let all = m.forward(&batch(&tokens, 0, 0, (0..n).collect())).unwrap();
    let vocab = m.spec.hparams.n_vocab as usize;
    assert_eq!(all.len(), vocab * tokens.len());
    let mut m2 = load(&path, 1);
    for (i, &t) in tokens.iter().enumerate() {
        let one = m2.forward(&batch(&[t], i as i32, 0, vec![0])).unwrap();
        let rel = max_rel(&one, &all[i * vocab..(i + 1) * vocab]);
        assert!(rel < 1e-5, "position {i}: rel {rel}");
    }
}

#[test]
fn sequences_in_one_batch_equal_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir);
    let a = [2, 4, 5, 6, 8, 9, 10];
    let b = [2, 401, 17];
    let mut both = load(&path, 2);
    let out = both
        .forward(&BatchInputs {
            tokens: a.iter().chain(&b).copied().collect(),
            positions: (0..7).chain(0..3).collect(),
            slots: [0; 7].into_iter().chain([1; 3]).collect(),
            output_rows: vec![6, 9],
            ngram_rows: vec![],
            logit_rows: vec![],
        })
        .unwrap();
    let vocab = both.spec.hparams.n_vocab as usize;
    for (seq, want_row) in [(&a[..], 0usize), (&b[..], 1)] {
        let mut alone = load(&path, 1);
        let n = seq.len() as i32;
        let logits = alone.forward(&batch(seq, 0, 0, vec![n - 1])).unwrap();
        let rel = max_rel(&out[want_row * vocab..(want_row + 1) * vocab], &logits);
        assert!(rel < 1e-5, "sequence {want_row}: rel {rel}");
    }
}
