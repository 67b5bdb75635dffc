//! Logits of the synthetic tiny Qwen3.5 hybrids (`qwen35moe`, `qwen35`) against llama.cpp's and
//! HF transformers' on the same files (goldens made by `tests/oracle/make_qwen35_goldens.sh`; see
//! host/tests/fixtures/PROVENANCE.md). Every prompt runs as one batch, so the DeltaNet layers'
//! prompt form is what is compared; `qwen35_cpu.rs` ties it to the step form. The experts each
//! token is routed to are compared with transformers' router too.

mod common;

use common::{plugin_dir, tiny_of};

use std::path::Path;

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::BatchInputs;
use bloomery_exec::LoadedModel;
use bloomery_plugin_api::DType;
use bloomery_tiering::plan::TierRequest;
use sha2::{Digest, Sha256};

fn golden(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn types(t: DType) -> ClassTypes {
    ClassTypes {
        experts: t,
        attention: t,
        embedding: t,
        output: t,
        dense: t,
    }
}

/// Largest |Δ| over the largest |logit| of any position, and how many positions agree on the
/// argmax, of `arch`'s tiny file in `t` against golden `file`.
fn compare(arch: &str, t: DType, file: &str) -> (f32, usize, usize) {
    let g = golden(file);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_of(arch, dir.path(), types(t));
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha,
        g["file_sha256"].as_str().unwrap(),
        "synth output changed: rerun tests/oracle/make_qwen35_goldens.sh"
    );
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    let (max_rel, same, n_pos) = common::golden_agreement(&mut m, &g);
    eprintln!("{file}: max rel {max_rel:.2e}, argmax {same}/{n_pos}");
    (max_rel, same, n_pos)
}

fn check(arch: &str, t: DType, file: &str, band: f32) {
    let (rel, same, n) = compare(arch, t, file);
    assert!(rel < band, "{file}: max rel {rel} over the band {band}");
    assert_eq!(same, n, "{file}: argmax differs");
}

#[test]
fn qwen35moe_f32_matches_llama_cpp_within_1e4() {
    check("qwen35moe", DType::F32, "qwen35moe_tiny_f32", 1e-4);
}

#[test]
fn qwen35moe_f32_matches_transformers_within_1e4() {
    check("qwen35moe", DType::F32, "qwen35moe_tiny_f32_hf", 1e-4);
}

#[test]
fn qwen35_f32_matches_llama_cpp_within_1e4() {
    check("qwen35", DType::F32, "qwen35_tiny_f32", 1e-4);
}

#[test]
fn qwen35_f32_matches_transformers_within_1e4() {
    check("qwen35", DType::F32, "qwen35_tiny_f32_hf", 1e-4);
}

#[test]
fn q8_0_weights_match_llama_cpp_within_1e4() {
    // Activations of Q8_0 products are quantized as ggml's CPU backend does: measured 2e-7.
    check("qwen35moe", DType::Q8_0, "qwen35moe_tiny_q8_0", 1e-4);
    check("qwen35", DType::Q8_0, "qwen35_tiny_q8_0", 1e-4);
}

/// The experts each layer's router picks for each token of the golden sequences, against the
/// top-k of transformers' router logits (`router_ids` in the golden: per sequence, layer and
/// position). Every routed expert is placed on the host (`-cmoe`, cpu-scalar standing in for the
/// card, residency off, no layer lent to the staging sets), whose routing counts record each
/// pass's ids; one token a pass gives each position's set of experts.
#[test]
fn qwen35moe_routes_each_token_as_transformers_does() {
    let g = golden("qwen35moe_tiny_f32_hf");
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_of("qwen35moe", dir.path(), types(DType::F32));
    let request = TierRequest {
        cpu_moe: true,
        no_residency: true,
        bus_experts: Some(0),
        no_decode_staging: true,
        ..Default::default()
    };
    let mut compared = 0;
    for seq in g["sequences"].as_array().unwrap() {
        let want = seq["router_ids"]
            .as_array()
            .expect("router_ids in the golden (tests/oracle/hf_qwen35.py)");
        let mut m = common::load_on_scalar_card(&path, common::GOLDEN_OPTS, &request).unwrap();
        let mut before = m.routing_counts().unwrap();
        assert_eq!(before.len(), want.len(), "layers with routed experts");
        for (i, tok) in seq["tokens"].as_array().unwrap().iter().enumerate() {
            m.forward(&BatchInputs {
                tokens: vec![tok.as_i64().unwrap() as i32],
                positions: vec![i as i32],
                slots: vec![0],
                output_rows: vec![0],
                ngram_rows: vec![],
                logit_rows: vec![],
            })
            .unwrap();
            let after = m.routing_counts().unwrap();
            for (layer, (a, b)) in after.iter().zip(&before).enumerate() {
                let ours: Vec<u64> = (0..a.len())
                    .filter(|&e| a[e] != b[e])
                    .map(|e| e as u64)
                    .collect();
                let mut theirs: Vec<u64> = want[layer][i]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                theirs.sort_unstable();
                assert_eq!(ours, theirs, "layer {layer}, position {i}");
                compared += 1;
            }
            before = after;
        }
    }
    assert!(compared > 0);
}

/// The final-norm rows of the tiny dense `qwen35` (Clef's backbone: what a decision head reads)
/// against transformers' `Qwen3_5ForCausalLM` (its last hidden state) and llama.cpp b11434's
/// `llama-embedding --pooling none` on the same file and token ids, every row of each prompt
/// read in one pass (golden by `tests/oracle/final_norm_rows.py`; fixtures/PROVENANCE.md).
#[test]
fn qwen35_final_norm_rows_match_transformers_and_llama_cpp_within_1e4() {
    let g = golden("qwen35_tiny_f32_rows");
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_of("qwen35", dir.path(), types(DType::F32));
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha,
        g["file_sha256"].as_str().unwrap(),
        "synth output changed: rerun tests/oracle/final_norm_rows.py"
    );
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    let n_embd = m.spec.hparams.n_embd as usize;
    for seq in g["sequences"].as_array().unwrap() {
        let tokens: Vec<i32> = seq["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap() as i32)
            .collect();
        let n = tokens.len() as i32;
        let rows = m
            .forward_hidden(&BatchInputs {
                tokens,
                positions: (0..n).collect(),
                slots: vec![0; n as usize],
                output_rows: (0..n).collect(),
                ngram_rows: vec![],
                logit_rows: vec![],
            })
            .unwrap();
        for oracle in ["transformers", "llamacpp"] {
            let want: Vec<f64> = seq[oracle]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect();
            assert_eq!(want.len(), rows.len(), "{oracle}: {n} rows of {n_embd}");
            let d = rows
                .iter()
                .zip(&want)
                .map(|(a, b)| (f64::from(*a) - b).abs())
                .fold(0.0, f64::max);
            eprintln!("qwen35 final-norm rows, {n} positions, against {oracle}: max |d| {d:.2e}");
            assert!(d < 1e-4, "{oracle}: max |d| {d} over 1e-4");
        }
    }
}
