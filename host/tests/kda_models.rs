//! The Kimi Delta Attention hybrids on the CPU (`solar-open2`, all-KDA `kimi-linear`):
//!
//! - logits of the synthetic tiny files against independent references (goldens made by the
//!   commands in host/tests/fixtures/PROVENANCE.md): `kimi-linear` against transformers 5.24's
//!   `KimiLinearForCausalLM` (the file is, tensor for tensor, what llama.cpp's converter makes of
//!   that model), `solar-open2` against an f64 numpy reference of its semantics; within 1e-4 with
//!   the argmax equal, and every token routed to the reference's experts;
//! - against themselves where the recurrent state matters: a prompt in one pass (the chunked KDA
//!   form) equals the tokens one by one (the step form), and restoring a checkpoint equals
//!   evaluating the prefix again.

mod common;

use common::{plugin_dir, tiny_of};

use std::path::Path;

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadedModel};
use bloomery_plugin_api::DType;
use sha2::{Digest, Sha256};

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

fn golden(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// `arch`'s tiny file in `dir`, checked to be the file golden `g` was made on.
fn tiny_for(arch: &str, dir: &Path, g: &serde_json::Value) -> std::path::PathBuf {
    let path = tiny_of(arch, dir, F32);
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha,
        g["file_sha256"].as_str().unwrap(),
        "synth output changed: remake the goldens (host/tests/fixtures/PROVENANCE.md)"
    );
    path
}

fn check(arch: &str, file: &str) {
    let g = golden(file);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_for(arch, dir.path(), &g);
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    let (rel, same, n) = common::golden_agreement(&mut m, &g);
    eprintln!("{file}: max rel {rel:.2e}, argmax {same}/{n}");
    assert!(rel < 1e-4, "{file}: max rel {rel}");
    assert_eq!(same, n, "{file}: argmax differs");
}

#[test]
fn kimi_linear_matches_transformers_within_1e4() {
    check("kimi-linear", "kimi_linear_tiny_f32_hf");
}

#[test]
fn solar_open2_matches_the_numpy_reference_within_1e4() {
    check("solar-open2", "solar_open2_tiny_f32_np");
}

/// The experts each MoE layer picks for each token, against the reference's.
fn routes_as_the_reference(arch: &str, file: &str) {
    let g = golden(file);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_for(arch, dir.path(), &g);
    common::assert_routes_match(&path, &g, arch);
}

#[test]
fn kimi_linear_routes_each_token_as_transformers_does() {
    routes_as_the_reference("kimi-linear", "kimi_linear_tiny_f32_hf");
}

#[test]
fn solar_open2_routes_each_token_as_the_numpy_reference_does() {
    routes_as_the_reference("solar-open2", "solar_open2_tiny_f32_np");
}

const SEQ: [i32; 21] = [
    5, 77, 300, 12, 509, 256, 1, 42, 8, 3, 4, 5, 6, 100, 200, 300, 400, 450, 257, 258, 259,
];

fn load(arch: &str, dir: &tempfile::TempDir) -> LoadedModel {
    let path = tiny_of(arch, dir.path(), F32);
    let reg = Registry::load(&plugin_dir()).unwrap();
    LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap()
}

/// Rows `tokens` of slot `slot` from position `start`, every row an output.
fn rows(tokens: &[i32], slot: i32, start: i32) -> BatchInputs {
    let n = tokens.len() as i32;
    BatchInputs {
        tokens: tokens.to_vec(),
        positions: (start..start + n).collect(),
        slots: vec![slot; tokens.len()],
        output_rows: (0..n).collect(),
        ngram_rows: vec![],
        logit_rows: vec![],
    }
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |s, v| s.max(v.abs()));
    a.iter().zip(b).fold(0f32, |s, (x, y)| s.max((x - y).abs())) / scale
}

#[test]
fn a_prompt_in_one_pass_equals_token_by_token() {
    for arch in ["solar-open2", "kimi-linear"] {
        let dir = tempfile::tempdir().unwrap();
        let mut m = load(arch, &dir);
        // 21 rows: one whole chunk of the chunked KDA form and a partial one.
        let whole = m.forward(&rows(&SEQ, 0, 0)).unwrap();
        let mut steps = Vec::new();
        for (i, &t) in SEQ.iter().enumerate() {
            steps.extend(m.forward(&rows(&[t], 0, i as i32)).unwrap());
        }
        let r = max_rel(&steps, &whole);
        eprintln!("{arch}: prompt vs token by token: max rel {r:.2e}");
        assert!(r < 1e-5, "{arch}: max rel {r}");
    }
}

#[test]
fn a_checkpoint_restores_the_state_it_was_taken_at() {
    for arch in ["solar-open2", "kimi-linear"] {
        let dir = tempfile::tempdir().unwrap();
        let mut m = load(arch, &dir);
        assert!(m.rewind().per_sequence);
        let (head, tail) = SEQ.split_at(11);
        let n = head.len() as u32;
        m.forward(&rows(head, 0, 0)).unwrap();
        let ck = m.read_checkpoint(0).unwrap();
        let first = m.forward(&rows(tail, 0, n as i32)).unwrap();
        let all = SEQ.len() as u32;
        let saved = m.read_slot(0, all).unwrap();
        // Another sequence overwrites the slot; the checkpoint brings back the prefix's state.
        m.forward(&rows(&SEQ[..9], 0, 0)).unwrap();
        let other = m.read_checkpoint(0).unwrap();
        m.write_slot(0, n, all, &saved, Some(&ck)).unwrap();
        let again = m.forward(&rows(tail, 0, n as i32)).unwrap();
        let r = max_rel(&again, &first);
        assert!(r < 1e-6, "{arch}: max rel {r}");
        m.write_slot(0, n, all, &saved, Some(&other)).unwrap();
        let wrong = m.forward(&rows(tail, 0, n as i32)).unwrap();
        assert!(max_rel(&wrong, &first) > 1e-3, "{arch}");
    }
}

/// `synth --arch solar-open2 --preset 250b --layers 12` (the speed file, too big to write
/// here): Solar-Open2's real widths, layers 0, 4 and 8 gated GQA with 8 KV heads, the other nine
/// KDA, 320 experts a layer.
#[test]
fn the_250b_preset_cut_to_12_layers_is_3_gqa_and_9_kda_layers() {
    use bloomery_plugin_api::meta::MetaValue;
    let reg = Registry::load(&plugin_dir()).unwrap();
    let presets = reg.model_for("solar-open2").unwrap().module.synth_presets()();
    let full = presets.iter().find(|p| p.name.as_str() == "250b").unwrap();
    let p = bloomery::synth::depth::first_layers(full, 12).unwrap();
    let meta = |k: &str| {
        let e = p.metadata.iter().find(|e| e.key.as_str() == k);
        e.unwrap_or_else(|| panic!("no {k}")).value.clone()
    };
    assert_eq!(meta("solar-open2.block_count").as_u64(), Some(12));
    assert_eq!(meta("solar-open2.expert_count").as_u64(), Some(320));
    let kv: Vec<u64> = match meta("solar-open2.attention.head_count_kv") {
        MetaValue::Array(v) => v.iter().map(|x| x.as_u64().unwrap()).collect(),
        v => panic!("head_count_kv {v:?}"),
    };
    assert_eq!(kv, [8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0]);
    let has = |il: u32, t: &str| {
        let name = format!("blk.{il}.{t}.weight");
        p.tensors.iter().any(|x| x.name.as_str() == name)
    };
    for il in 0..12 {
        let gqa = il % 4 == 0;
        assert_eq!(has(il, "attn_gate"), gqa, "layer {il}");
        assert_eq!(has(il, "ssm_f_a"), !gqa, "layer {il}");
        assert!(has(il, "ffn_gate_exps"), "layer {il}");
    }
    assert!(!p.tensors.iter().any(|x| x.name.starts_with("blk.12.")));
    let gate = p
        .tensors
        .iter()
        .find(|x| x.name.as_str() == "blk.1.ffn_gate_exps.weight");
    assert_eq!(gate.unwrap().ne, [4096, 1280, 320, 1]);
}

/// A quantized synth writes matrices in their class's type and one-row tensors (the output-gate
/// biases of the tiny solar-open2 file) in f32, as llama.cpp's quantizer does: the card's Add
/// takes f32 operands only, so a Q8_0 bias made the file unrunnable there.
#[test]
fn a_quantized_synth_keeps_one_row_tensors_f32() {
    let dir = tempfile::tempdir().unwrap();
    let q8 = ClassTypes {
        attention: DType::Q8_0,
        dense: DType::Q8_0,
        ..F32
    };
    let path = tiny_of("solar-open2", dir.path(), q8);
    let file = bloomery_gguf::GgufFile::open(&path).unwrap();
    let dtype = |name: &str| file.tensor(name).unwrap().dtype;
    assert_eq!(dtype("blk.0.attn_gate.weight"), DType::Q8_0);
    for bias in ["blk.0.attn_gate.bias", "blk.4.attn_gate.bias"] {
        assert_eq!(dtype(bias), DType::F32, "{bias}");
    }
    let quantized_vectors: Vec<&str> = file
        .tensors()
        .iter()
        .filter(|t| t.shape.iter().filter(|&&n| n != 1).count() < 2 && t.dtype != DType::F32)
        .map(|t| t.name.as_str())
        .collect();
    assert!(quantized_vectors.is_empty(), "{quantized_vectors:?}");
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    let logits = m.forward(&rows(&[1, 2, 3], 0, 0)).unwrap();
    assert!(logits.iter().all(|v| v.is_finite()));
}
