//! `--check-tensors` at load: a tiny file whose tensor holds a NaN (an F32 weight) or an infinite
//! block scale (a Q8_0 expert stack) is refused naming the tensor, the fault and where; without
//! the check the same files load; an intact file loads with it.

mod common;

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_gguf::GgufFile;
use bloomery_plugin_api::DType;
use common::{plugin_dir, tiny_qwen3moe, GOLDEN_OPTS};

const TYPES: ClassTypes = ClassTypes {
    experts: DType::Q8_0,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

/// The tiny file with `word` written `at` bytes into tensor `name`'s data.
fn corrupted(dir: &tempfile::TempDir, name: &str, at: u64, word: &[u8]) -> std::path::PathBuf {
    let path = tiny_qwen3moe(dir, TYPES);
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensor(name).unwrap();
    let start = t.range().start + at;
    drop(f);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[start as usize..start as usize + word.len()].copy_from_slice(word);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn load(path: &std::path::Path, check: bool) -> Result<(), String> {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = LoadOptions {
        check_tensors: check,
        ..GOLDEN_OPTS
    };
    LoadedModel::load(&reg, path, opts)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn a_nan_weight_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // The 10th f32 of the first layer's query projection.
    let path = corrupted(&dir, "blk.0.attn_q.weight", 36, &f32::NAN.to_le_bytes());
    let e = load(&path, true).unwrap_err();
    assert!(
        e.contains("blk.0.attn_q.weight") && e.contains("NaN") && e.contains("element 9"),
        "{e}"
    );
    load(&path, false).unwrap();
}

#[test]
fn an_infinite_block_scale_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // The f16 scale of the third Q8_0 block (34 bytes each) of layer 1's expert down stack.
    let path = corrupted(&dir, "blk.1.ffn_down_exps.weight", 68, &[0x00, 0x7c]);
    let e = load(&path, true).unwrap_err();
    assert!(
        e.contains("blk.1.ffn_down_exps.weight") && e.contains("infinity") && e.contains("block 2"),
        "{e}"
    );
    load(&path, false).unwrap();
}

#[test]
fn an_intact_file_passes_the_check() {
    let dir = tempfile::tempdir().unwrap();
    load(&tiny_qwen3moe(&dir, TYPES), true).unwrap();
}
