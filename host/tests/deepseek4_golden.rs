//! DeepSeek-V4-Flash (`deepseek4`) end to end on the CPU against transformers 5.24
//! `DeepseekV4ForCausalLM` (`tests/oracle/hf_deepseek4.py`) on the synthetic tiny file (`bloomery
//! synth --arch deepseek4 --preset tiny --seed 7`, refused when its sha256 is not the golden's;
//! golden `fixtures/deepseek4/synth_tiny_hf.json`, see fixtures/deepseek4/PROVENANCE.md): two
//! sequences of 260 tokens, one pass each, crossing the window (128) and both ratios (4, 128):
//! logits within 1e-4 relative at the 14 kept positions, the argmax at all 260, every layer's
//! experts and both ratio-4 layers' indexer picks identical at every position. And a prompt of
//! P ∈ {1, 2, 127, 128, 129, 511, 512, 513} tokens in one pass equals it token by token.

mod common;

use common::{fixture, ids, plugin_dir, same_file, tiny_of, ALL_F32};

use std::path::{Path, PathBuf};

use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel};

/// Room for the 260 positions (the compressed caches hold `ctx / ratio` rows).
const OPTS: LoadOptions = LoadOptions {
    ctx_per_slot: 512,
    ..common::GOLDEN_OPTS
};

fn golden() -> serde_json::Value {
    fixture("deepseek4/synth_tiny_hf.json")
}

/// The tiny file in `dir`, checked to be the file the golden was made on.
fn tiny(dir: &Path, g: &serde_json::Value) -> PathBuf {
    same_file(tiny_of("deepseek4", dir, ALL_F32), &[g])
}

/// One pass of `tokens` from position 0 in slot 0, every row an output.
fn batch(tokens: &[i32]) -> BatchInputs {
    let n = tokens.len() as i32;
    BatchInputs {
        tokens: tokens.to_vec(),
        positions: (0..n).collect(),
        slots: vec![0; tokens.len()],
        output_rows: (0..n).collect(),
        ngram_rows: vec![],
        logit_rows: vec![],
    }
}

/// Per tapped layer, each row's i32 values without −1 entries, ascending.
fn tapped(m: &mut LoadedModel, tokens: &[i32], name: &'static str) -> Vec<(i32, Vec<Vec<i32>>)> {
    let taps = m.forward_tap_i32(&batch(tokens), None, name).unwrap();
    taps.into_iter()
        .map(|(layer, v)| {
            let rows = v
                .chunks(v.len() / tokens.len())
                .map(|r| {
                    let mut r: Vec<i32> = r.iter().copied().filter(|&x| x >= 0).collect();
                    r.sort_unstable();
                    r
                })
                .collect();
            (layer, rows)
        })
        .collect()
}

#[test]
fn the_tiny_file_matches_transformers() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), &g);
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut m = LoadedModel::load(&reg, &path, OPTS).unwrap();
    let vocab = m.spec.hparams.n_vocab as usize;
    let kept = ids(&g["positions"]);
    for (s, seq) in g["sequences"].as_array().unwrap().iter().enumerate() {
        let tokens = ids(&seq["tokens"]);
        let logits = m.forward(&batch(&tokens)).unwrap();
        assert_eq!(logits.len(), vocab * tokens.len());
        let want: Vec<Vec<f32>> = seq["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect()
            })
            .collect();
        let scale = want.iter().flatten().fold(0f32, |a, v| a.max(v.abs()));
        let mut worst = 0f32;
        for (i, &p) in kept.iter().enumerate() {
            let ours = &logits[p as usize * vocab..(p as usize + 1) * vocab];
            for (a, b) in ours.iter().zip(&want[i]) {
                worst = worst.max((a - b).abs() / scale);
            }
        }
        let argmax = ids(&seq["argmax"]);
        let same = (0..tokens.len())
            .filter(|&p| {
                let row = &logits[p * vocab..(p + 1) * vocab];
                let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
                best as i32 == argmax[p]
            })
            .count();
        eprintln!(
            "sequence {s}: max rel {worst:.2e}, argmax {same}/{}",
            tokens.len()
        );
        assert!(worst < 1e-4, "sequence {s}: logits {worst:.2e} off");
        assert_eq!(same, tokens.len(), "sequence {s}: argmax");
        let experts = tapped(&mut m, &tokens, "ffn_moe_topk");
        assert_eq!(experts.len(), 6, "MoE layers");
        for (layer, rows) in experts {
            let want = &seq["experts"][layer.to_string()];
            for (p, got) in rows.iter().enumerate() {
                assert_eq!(
                    got,
                    &ids(&want[p]),
                    "sequence {s}, layer {layer}, position {p}"
                );
            }
        }
        let picks = tapped(&mut m, &tokens, "indexer_sel_idx");
        assert_eq!(picks.len(), 2, "ratio-4 layers");
        for (layer, rows) in picks {
            let want = &seq["indexer"][layer.to_string()];
            for (p, got) in rows.iter().enumerate() {
                assert_eq!(
                    got,
                    &ids(&want[p]),
                    "sequence {s}, layer {layer}, position {p}"
                );
            }
        }
    }
}

/// A prompt of `P` tokens in one pass equals the same tokens one per call (the window ring, the
/// compressors' raw rows and the compressed rows carried across calls), at every `P` the issue
/// names: around the window (128) and the ratios (4, 128).
#[test]
fn one_pass_equals_token_by_token_across_the_boundaries() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), &g);
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = LoadOptions {
        ctx_per_slot: 1024,
        ..OPTS
    };
    let mut m = LoadedModel::load(&reg, &path, opts).unwrap();
    let vocab = m.spec.hparams.n_vocab as usize;
    let seqs: Vec<i32> = g["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| ids(&s["tokens"]))
        .collect();
    let tokens: Vec<i32> = seqs.iter().copied().cycle().take(513).collect();
    let mut single = Vec::with_capacity(tokens.len() * vocab);
    for (p, &t) in tokens.iter().enumerate() {
        let one = BatchInputs {
            tokens: vec![t],
            positions: vec![p as i32],
            slots: vec![0],
            output_rows: vec![0],
            ngram_rows: vec![],
            logit_rows: vec![],
        };
        single.extend(m.forward(&one).unwrap());
    }
    for n in [1usize, 2, 127, 128, 129, 511, 512, 513] {
        let ours = m.forward(&batch(&tokens[..n])).unwrap();
        let want = &single[..n * vocab];
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let worst = ours
            .iter()
            .zip(want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()))
            / scale;
        eprintln!("P = {n}: one pass vs token by token {worst:.2e}");
        assert!(worst < 1e-5, "P = {n}: {worst:.2e}");
    }
}
