//! What every integration test of the host shares.

use std::path::PathBuf;

/// The plugin folder the tests load: `BLOOMERY_TEST_PLUGIN_DIR`, else the workspace's debug build
/// (`cargo xtask plugins`).
pub fn plugin_dir() -> PathBuf {
    std::env::var_os("BLOOMERY_TEST_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/plugins")
        })
}

/// Writes the synthetic tiny qwen3moe (seed 7) with `types` into `dir`; returns its path.
#[allow(dead_code)] // not every test crate that shares this module writes models
pub fn tiny_qwen3moe(
    dir: &tempfile::TempDir,
    types: bloomery::synth::ClassTypes,
) -> std::path::PathBuf {
    let reg = bloomery::plugins::Registry::load(&plugin_dir())
        .expect("plugin folder (run `cargo xtask plugins` first)");
    let plugin = reg.model_for("qwen3moe").unwrap();
    let presets = plugin.module.synth_presets()();
    let preset = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
    let path = dir.path().join("tiny.gguf");
    bloomery::synth::write(preset, types, 7, &path).unwrap();
    path
}

/// Writes the `tiny` preset of architecture `arch` (seed 7) with `types` into `dir` as
/// `{arch}.gguf`; returns its path. A plugin serving several architectures names each preset's
/// in its `general.architecture`.
#[allow(dead_code)] // not every test crate that shares this module writes models
pub fn tiny_of(
    arch: &str,
    dir: &std::path::Path,
    types: bloomery::synth::ClassTypes,
) -> std::path::PathBuf {
    let reg = bloomery::plugins::Registry::load(&plugin_dir())
        .expect("plugin folder (run `cargo xtask plugins` first)");
    let plugin = reg.model_for(arch).unwrap();
    let presets = plugin.module.synth_presets()();
    let preset = presets
        .iter()
        .find(|p| {
            p.name.as_str() == "tiny"
                && p.metadata.iter().any(|e| {
                    e.key.as_str() == "general.architecture" && e.value.as_str() == Some(arch)
                })
        })
        .unwrap();
    let path = dir.join(format!("{arch}.gguf"));
    bloomery::synth::write(preset, types, 7, &path).unwrap();
    path
}
