//! The example architecture plugin (`examples/model-plugin`: dense `qwen3`, built outside the
//! workspace against plugin-api alone) loaded from a second plugin folder beside the workspace's
//! plugins. The real binary writes its tiny file and generates with it; the logits on that file
//! match llama.cpp's (goldens made by `tests/oracle/make_qwen3_goldens.sh`; see
//! host/tests/fixtures/PROVENANCE.md).

mod common;

use common::plugin_dir;

use std::path::{Path, PathBuf};
use std::process::Command;

use bloomery_devices::Registry;
use bloomery_exec::LoadedModel;
use sha2::{Digest, Sha256};

/// Where `cargo xtask test` builds the example (its own cargo invocation and target folder).
fn example_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/model-plugin/target/debug");
    assert!(
        dir.join("libbloomery_model_qwen3.so").is_file(),
        "build the example first: cargo build --manifest-path examples/model-plugin/Cargo.toml"
    );
    dir
}

/// The binary with both plugin folders.
fn bloomery(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .arg("--plugin-dir")
        .arg(example_dir())
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text.into_owned())
}

fn golden(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/qwen3_tiny_{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// Writes the tiny file of type `t` (every class but norms) through the binary, as the golden
/// script did, and checks its hash against the golden's.
fn tiny(dir: &Path, t: &str, g: &serde_json::Value) -> PathBuf {
    let path = dir.join(format!("qwen3_{t}.gguf"));
    let out = path.to_str().unwrap();
    let (ok, text) = bloomery(&[
        "synth",
        "--arch",
        "qwen3",
        "--preset",
        "tiny",
        "--seed",
        "7",
        "--attn",
        t,
        "--embd",
        t,
        "--output-type",
        t,
        "--dense",
        t,
        "-o",
        out,
    ]);
    assert!(ok, "{text}");
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha,
        g["file_sha256"].as_str().unwrap(),
        "synth output changed: rerun tests/oracle/make_qwen3_goldens.sh"
    );
    path
}

fn check(t: &str, band: f32) {
    let g = golden(&t.to_lowercase());
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), t, &g);
    let reg = Registry::load_all(&[plugin_dir(), example_dir()]).unwrap();
    let mut m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    let (rel, same, n) = common::golden_agreement(&mut m, &g);
    eprintln!("qwen3 {t}: max rel {rel:.2e}, argmax {same}/{n}");
    assert!(rel < band, "{t}: max rel {rel} over the band {band}");
    assert_eq!(same, n, "{t}: argmax differs");
}

#[test]
fn f32_weights_match_llama_cpp_within_1e4() {
    check("F32", 1e-4);
}

#[test]
fn q8_0_weights_match_llama_cpp_within_1e4() {
    check("Q8_0", 1e-4);
}

#[test]
fn the_binary_lists_serves_and_runs_the_plugin_from_the_second_folder() {
    let (ok, text) = bloomery(&["plugins"]);
    assert!(ok, "{text}");
    assert!(text.contains("architectures: qwen3\n"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), "F32", &golden("f32"));
    let model = path.to_str().unwrap();
    let (ok, text) = bloomery(&["run", "-m", model, "-p", "hello", "-n", "4", "--temp", "0"]);
    assert!(ok, "{text}");
}
