//! The real binary's plugin loader: the listing, and a short named error for every bad plugin.

mod common;

use common::plugin_dir;

use std::path::Path;
use std::process::Command;

use bloomery::synth::{self, ClassTypes};
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;

fn bloomery(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A folder holding copies of the built plugins named `names` (file names in the plugin folder).
fn folder_with(names: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (src, dst) in names {
        std::fs::copy(plugin_dir().join(src), dir.path().join(dst)).unwrap();
    }
    dir
}

/// Compiles a C shared library exporting the two plugin symbols with the given values.
fn c_plugin(dir: &Path, file: &str, abi: u32, kind: u32) {
    let src = dir.join(format!("{file}.c"));
    std::fs::write(
        &src,
        format!(
            "unsigned bloomery_abi_version(void) {{ return {abi}; }}\nunsigned bloomery_plugin_kind(void) {{ return {kind}; }}\n"
        ),
    )
    .unwrap();
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(file))
        .arg(&src)
        .status()
        .expect("a C compiler (cc) to build test plugins");
    assert!(status.success());
    std::fs::remove_file(src).unwrap();
}

#[test]
fn the_listing_names_every_plugin_with_its_kind_abi_and_probe() {
    let (ok, out, _) = bloomery(&plugin_dir(), &["plugins"]);
    assert!(ok);
    let abi = bloomery_plugin_api::ABI_VERSION;
    assert!(
        out.contains(&format!("qwen3moe       model   ABI {abi}  runs here: yes")),
        "{out}"
    );
    assert!(out.contains("architectures: qwen3moe"), "{out}");
    assert!(
        out.contains(&format!(
            "cpu-scalar     kernel  ABI {abi}  runs here: yes (score 1)"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("cpu-avx2       kernel  ABI {abi}")),
        "{out}"
    );
    assert!(out.contains("MatMul: F32 F16 Q4_0"), "{out}");
    assert!(out.contains("chosen:\n  cpu: cpu-"), "{out}");
}

#[test]
fn a_missing_folder_is_a_named_error() {
    let (ok, _, err) = bloomery(Path::new("/nonexistent/plugins"), &["plugins"]);
    assert!(!ok);
    assert!(err.contains("plugin folder /nonexistent/plugins"), "{err}");
    assert!(err.lines().count() <= 3, "{err}");
}

#[test]
fn bad_files_get_one_line_each_and_the_rest_still_load() {
    let dir = folder_with(&[("kernel-cpu-scalar.so", "kernel-cpu-scalar.so")]);
    std::fs::write(dir.path().join("random.so"), b"this is not an ELF file").unwrap();
    c_plugin(dir.path(), "future.so", 999, 2);
    c_plugin(dir.path(), "hollow.so", bloomery_plugin_api::ABI_VERSION, 2);
    c_plugin(
        dir.path(),
        "strange.so",
        bloomery_plugin_api::ABI_VERSION,
        7,
    );
    let (ok, out, _) = bloomery(dir.path(), &["plugins"]);
    assert!(ok, "{out}");
    assert!(out.contains("cpu-scalar     kernel"), "{out}");
    let section = out
        .split("not loaded:")
        .nth(1)
        .expect("a not-loaded section");
    let lines: Vec<&str> = section.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 4, "one line per bad file: {section}");
    assert!(
        section.contains("random.so: not a loadable shared library"),
        "{section}"
    );
    assert!(
        section.contains(&format!(
            "future.so: plugin ABI 999, but this host speaks ABI {}",
            bloomery_plugin_api::ABI_VERSION
        )),
        "{section}"
    );
    assert!(
        section.contains("hollow.so: no abi_stable root module"),
        "{section}"
    );
    assert!(
        section.contains("strange.so: unknown plugin kind 7"),
        "{section}"
    );
}

#[test]
fn two_claims_on_one_architecture_or_name_keep_the_first() {
    let dir = folder_with(&[
        ("model-qwen3moe.so", "a-qwen3moe.so"),
        ("model-qwen3moe.so", "b-qwen3moe.so"),
        ("kernel-cpu-scalar.so", "a-scalar.so"),
        ("kernel-cpu-scalar.so", "b-scalar.so"),
    ]);
    let (ok, out, _) = bloomery(dir.path(), &["plugins"]);
    assert!(ok);
    assert!(
        out.contains("architecture `qwen3moe` is claimed by both"),
        "{out}"
    );
    assert!(
        out.contains("qwen3moe (claimed by another plugin)"),
        "{out}"
    );
    assert!(
        out.contains("kernel plugin `cpu-scalar` is found twice"),
        "{out}"
    );
}

#[test]
fn plugin_folders_named_several_times_all_load_and_the_first_claim_wins() {
    let first = folder_with(&[
        ("model-qwen3moe.so", "model-qwen3moe.so"),
        ("kernel-cpu-scalar.so", "kernel-cpu-scalar.so"),
    ]);
    let second = folder_with(&[
        ("model-gemma3.so", "model-gemma3.so"),
        ("model-qwen3moe.so", "model-qwen3moe.so"),
    ]);
    let out = Command::new(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(first.path())
        .arg("--plugin-dir")
        .arg(second.path())
        .arg("plugins")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let folders = format!(
        "plugin folder: {}, {}",
        first.path().display(),
        second.path().display()
    );
    assert!(stdout.contains(&folders), "{stdout}");
    assert!(stdout.contains("architectures: gemma3"), "{stdout}");
    assert!(stdout.contains("cpu-scalar     kernel"), "{stdout}");
    assert!(
        stdout.contains("qwen3moe (claimed by another plugin)"),
        "{stdout}"
    );
    let claim = format!(
        "architecture `qwen3moe` is claimed by both {}",
        first.path().join("model-qwen3moe.so").display()
    );
    assert!(stdout.contains(&claim), "{stdout}");
}

fn tiny_preset() -> bloomery_plugin_api::model::SynthPreset {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let presets = reg.model_for("qwen3moe").unwrap().module.synth_presets()();
    presets
        .into_iter()
        .find(|p| p.name.as_str() == "tiny")
        .unwrap()
}

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

fn load_err(preset: &bloomery_plugin_api::model::SynthPreset) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    synth::write(preset, F32, 1, &path).unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    match LoadedModel::load(&reg, &path, LoadOptions::default()) {
        Ok(_) => panic!("the model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn an_unknown_architecture_is_named_with_what_is_served() {
    let mut p = tiny_preset();
    for e in p.metadata.iter_mut() {
        if e.key.as_str() == "general.architecture" {
            e.value = bloomery_plugin_api::meta::MetaValue::String("nosuch".into());
        }
    }
    let e = load_err(&p);
    assert!(
        e.contains("no model plugin serves architecture `nosuch`"),
        "{e}"
    );
    assert!(e.contains("\"qwen3moe\""), "{e}");
}

#[test]
fn a_missing_tensor_or_key_is_named() {
    let mut p = tiny_preset();
    p.tensors
        .retain(|t| t.name.as_str() != "blk.2.ffn_down_exps.weight");
    let e = load_err(&p);
    assert!(
        e.contains("missing tensor `blk.2.ffn_down_exps.weight`"),
        "{e}"
    );
    let mut p = tiny_preset();
    p.metadata
        .retain(|m| m.key.as_str() != "qwen3moe.expert_count");
    let e = load_err(&p);
    assert!(
        e.contains("missing metadata key `qwen3moe.expert_count`"),
        "{e}"
    );
}
