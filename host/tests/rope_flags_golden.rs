//! llama-server's rope flags and `--override-kv` against llama.cpp b11434 given the same settings
//! through its own context and model parameters, on the tiny qwen3moe F32 file (goldens made by
//! `tests/oracle/make_rope_goldens.sh`; see host/tests/fixtures/PROVENANCE.md).

mod common;

use std::path::Path;

use bloomery::flags::metadata::MetadataArgs;
use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;
use clap::Parser;
use common::{golden_agreement, plugin_dir, tiny_qwen3moe, GOLDEN_OPTS};
use sha2::{Digest, Sha256};

/// The flags as a command line gives them.
#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    metadata: MetadataArgs,
}

fn golden(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/rope_flags/{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// (largest relative difference, positions whose argmax agrees, positions) of the tiny file
/// loaded under `flags` against golden `name`.
fn agreement(name: &str, flags: &[&str]) -> (f32, usize, usize) {
    let g = golden(name);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_qwen3moe(&dir, F32);
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha,
        g["file_sha256"].as_str().unwrap(),
        "synth output changed: rerun the script"
    );
    let parsed = Flags::try_parse_from(std::iter::once("t").chain(flags.iter().copied())).unwrap();
    let (_, overrides) = parsed.metadata.open(&path).unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = LoadOptions {
        overrides,
        ..GOLDEN_OPTS
    };
    let mut m = LoadedModel::load(&reg, &path, opts).unwrap();
    golden_agreement(&mut m, &g)
}

/// The tiny file under `flags` within 1e-5 of golden `name` with every argmax equal, while under
/// `without` (the same file without the flags under test) it is more than 1e-3 away: the flags
/// are what the golden checks.
fn matches_llama_cpp(name: &str, flags: &[&str], without: &[&str]) {
    let (rel, same, n) = agreement(name, flags);
    assert!(
        rel < 1e-5 && same == n,
        "{name}: {rel:.2e} relative, argmax {same}/{n}"
    );
    let (plain, _, _) = agreement(name, without);
    assert!(
        plain > 1e-3,
        "{name}: without the flags only {plain:.2e} from the golden"
    );
}

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

const YARN: &[&str] = &[
    "--rope-scaling",
    "yarn",
    "--rope-scale",
    "4",
    "--yarn-orig-ctx",
    "8",
    "--rope-freq-base",
    "50000",
];
const LINEAR_KV: &[&str] = &["--override-kv", "qwen3moe.rope.scaling.factor=float:2"];

#[test]
fn yarn_flags_match_llama_cpp() {
    matches_llama_cpp("yarn", YARN, &[]);
}

/// YaRN's mix flags over [`YARN`]: the attention factor is replaced under YaRN.
const YARN_MIX: &[&str] = &[
    "--rope-scaling",
    "yarn",
    "--rope-scale",
    "4",
    "--yarn-orig-ctx",
    "8",
    "--rope-freq-base",
    "50000",
    "--yarn-ext-factor",
    "0.5",
    "--yarn-beta-fast",
    "8",
    "--yarn-beta-slow",
    "2",
    "--yarn-attn-factor",
    "0.7",
];

/// Linear scaling, where the attention factor scales the rotated values.
const LINEAR_ATTN: &[&str] = &[
    "--rope-scaling",
    "linear",
    "--rope-scale",
    "2",
    "--yarn-attn-factor",
    "0.7",
];

#[test]
fn yarn_mix_flags_match_llama_cpp() {
    matches_llama_cpp("yarn_mix", YARN_MIX, YARN);
}

#[test]
fn the_attention_factor_scales_linear_rope_as_in_llama_cpp() {
    matches_llama_cpp("linear_attn", LINEAR_ATTN, &LINEAR_ATTN[..4]);
}

#[test]
fn a_scale_override_without_a_type_is_linear_as_in_llama_cpp() {
    matches_llama_cpp("linear_kv", LINEAR_KV, &[]);
}

#[test]
fn an_override_of_the_wrong_type_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_qwen3moe(&dir, F32);
    let parsed =
        Flags::try_parse_from(["t", "--override-kv", "qwen3moe.rope.freq_base=int:5"]).unwrap();
    let e = parsed.metadata.open(&path).unwrap_err().to_string();
    assert!(
        e.contains("qwen3moe.rope.freq_base") && e.contains("f32"),
        "{e}"
    );
}
