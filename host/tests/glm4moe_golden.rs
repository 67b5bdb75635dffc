//! Logits of tiny `glm4moe` files that llama.cpp's own converter wrote from random transformers
//! models (Solar-Open-100B's and GLM-4.x's shapes) against transformers' and llama.cpp's on the
//! same files, and the experts each token is routed to against transformers' router (goldens and
//! files made by `tests/oracle/make_glm4moe_goldens.sh`; see host/tests/fixtures/PROVENANCE.md).

mod common;

use std::path::{Path, PathBuf};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::LoadedModel;
use bloomery_plugin_api::DType;
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/glm4moe")
        .join(name)
}

fn golden(name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture(&format!("{name}.json"))).unwrap()).unwrap()
}

/// The file `{file}.gguf`, checked against the sha256 golden `g` recorded.
fn model_file(file: &str, g: &serde_json::Value) -> PathBuf {
    let path = fixture(&format!("{file}.gguf"));
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha,
        g["file_sha256"].as_str().unwrap(),
        "{file}: the golden is of another file"
    );
    path
}

/// Largest |Δ| over the largest |logit|, and positions whose argmax agrees of all compared, of
/// `{file}.gguf` against the golden `{golden}.json`.
fn compare(file: &str, golden_name: &str) -> (f32, usize, usize) {
    let g = golden(golden_name);
    let path = model_file(file, &g);
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let mut m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    let (rel, same, n) = common::golden_agreement(&mut m, &g);
    eprintln!("{file} against {golden_name}: max rel {rel:.2e}, argmax {same}/{n}");
    (rel, same, n)
}

fn check(file: &str, golden_name: &str, band: f32) {
    let (rel, same, n) = compare(file, golden_name);
    assert!(
        rel < band,
        "{golden_name}: max rel {rel} over the band {band}"
    );
    assert_eq!(same, n, "{golden_name}: argmax differs");
}

#[test]
fn solar_open_with_full_rotary_matches_llama_cpp_within_1e4() {
    check("solar_tiny_rot_full", "solar_tiny_rot_full", 1e-4);
}

#[test]
fn solar_open_with_full_rotary_matches_transformers_within_1e4() {
    check("solar_tiny_rot_full", "solar_tiny_rot_full_hf", 1e-4);
}

/// A file converted without `partial_rotary_factor` rotates half of each head: followed as
/// llama.cpp follows it, so the logits leave transformers' (which rotates all of it) by far more
/// than the band.
#[test]
fn solar_open_with_the_converters_half_rotary_matches_llama_cpp_not_transformers() {
    check("solar_tiny_rot_half", "solar_tiny_rot_half", 1e-4);
    let (gap, _, _) = compare("solar_tiny_rot_half", "solar_tiny_rot_half_hf");
    assert!(
        gap > 1e-2,
        "half rotary against transformers' full rotary: {gap}"
    );
}

#[test]
fn glm_with_bias_qk_norm_partial_rotary_and_a_dense_lead_matches_llama_cpp_within_1e4() {
    check("glm_tiny", "glm_tiny", 1e-4);
}

#[test]
fn glm_with_bias_qk_norm_partial_rotary_and_a_dense_lead_matches_transformers_within_1e4() {
    check("glm_tiny", "glm_tiny_hf", 1e-4);
}

/// The experts each MoE layer's router picks for each token, against transformers' top-k.
fn routes_as_transformers_does(file: &str) {
    let g = golden(&format!("{file}_hf"));
    common::assert_routes_match(&model_file(file, &g), &g, file);
}

#[test]
fn solar_open_routes_each_token_as_transformers_does() {
    routes_as_transformers_does("solar_tiny_rot_full");
}

#[test]
fn glm_routes_each_token_as_transformers_does() {
    routes_as_transformers_does("glm_tiny");
}

/// The plugin's own preset `preset` (seed 7) written with every class in `t` into `dir`, checked
/// against the sha256 the golden `g` recorded.
fn synth_file(preset: &str, t: DType, dir: &Path, g: &serde_json::Value) -> PathBuf {
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let presets = reg.model_for("glm4moe").unwrap().module.synth_presets()();
    let p = presets.iter().find(|p| p.name.as_str() == preset).unwrap();
    let types = ClassTypes {
        experts: t,
        attention: t,
        embedding: t,
        output: t,
        dense: t,
    };
    let path = dir.join(format!("{preset}.gguf"));
    bloomery::synth::write(p, types, 7, &path).unwrap();
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    let msg = "synth output changed: rerun the synth step of tests/oracle/make_glm4moe_goldens.sh";
    assert_eq!(sha, g["file_sha256"].as_str().unwrap(), "{msg}");
    path
}

/// llama.cpp's logits on the plugin's tiny presets (`tiny`: the GLM dialect, trunk-only MTP;
/// `tiny-solar`), F32 and with every product Q8_0 (biases and norms stay F32). With Q8_0 experts
/// llama.cpp's CPU backend repacks the stacks and rounds activations its own way (see
/// qwen3moe_golden.rs): the same 1e-2 band as qwen3moe's all-Q8_0 mix.
#[test]
fn synthetic_presets_match_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    for (preset, t, band) in [
        ("tiny", DType::F32, 1e-4),
        ("tiny", DType::Q8_0, 1e-2),
        ("tiny-solar", DType::F32, 1e-4),
        ("tiny-solar", DType::Q8_0, 1e-2),
    ] {
        let name = format!(
            "synth_{}_{}",
            preset.replace('-', "_"),
            t.to_string().to_lowercase()
        );
        let g = golden(&name);
        let path = synth_file(preset, t, dir.path(), &g);
        let mut m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
        let (rel, same, n) = common::golden_agreement(&mut m, &g);
        eprintln!("{name}: max rel {rel:.2e}, argmax {same}/{n}");
        assert!(rel < band, "{name}: max rel {rel} over the band {band}");
        assert_eq!(same, n, "{name}: argmax differs");
    }
}

/// `bloomery info` on a `solar-open` vocabulary: a file that rotates half the head is named with
/// its key and both widths; the file that rotates all of it gets no warning.
#[test]
fn info_warns_by_name_when_a_solar_file_rotates_less_than_the_head() {
    let info = |file: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bloomery"))
            .arg("--plugin-dir")
            .arg(common::plugin_dir())
            .args(["info", "-m"])
            .arg(fixture(&format!("{file}.gguf")))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let half = info("solar_tiny_rot_half");
    let warning = "warning: `glm4moe.rope.dimension_count` is 8, below the head width 16";
    assert!(half.contains(warning), "{half}");
    assert!(half.contains("partial_rotary_factor"), "{half}");
    let full = info("solar_tiny_rot_full");
    assert!(!full.contains("warning:"), "{full}");
}
