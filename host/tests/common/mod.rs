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

/// Every tensor class in f32: the golden files' types.
#[allow(dead_code)] // not every test crate that shares this module writes models
pub const ALL_F32: bloomery::synth::ClassTypes = bloomery::synth::ClassTypes {
    experts: bloomery_plugin_api::DType::F32,
    attention: bloomery_plugin_api::DType::F32,
    embedding: bloomery_plugin_api::DType::F32,
    output: bloomery_plugin_api::DType::F32,
    dense: bloomery_plugin_api::DType::F32,
};

/// The JSON fixture `host/tests/fixtures/{rel}`.
#[allow(dead_code)] // not every test crate that shares this module reads a golden
pub fn fixture(rel: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// `path`, checked to be the file each golden of `goldens` was made on (its `file_sha256`).
#[allow(dead_code)] // not every test crate that shares this module reads a golden
pub fn same_file(path: PathBuf, goldens: &[&serde_json::Value]) -> PathBuf {
    use sha2::{Digest, Sha256};
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    for g in goldens {
        assert_eq!(
            sha,
            g["file_sha256"].as_str().unwrap(),
            "{}: synth output changed: remake the golden (see host/tests/fixtures/ and its \
             PROVENANCE.md)",
            path.display()
        );
    }
    path
}

/// A JSON array of integers as ids.
#[allow(dead_code)] // not every test crate that shares this module reads a golden
pub fn ids(v: &serde_json::Value) -> Vec<i32> {
    let v = v.as_array().unwrap();
    v.iter().map(|x| x.as_i64().unwrap() as i32).collect()
}

/// Writes the synthetic tiny qwen3moe (seed 7) with `types` into `dir`; returns its path.
#[allow(dead_code)] // not every test crate that shares this module writes models
pub fn tiny_qwen3moe(
    dir: &tempfile::TempDir,
    types: bloomery::synth::ClassTypes,
) -> std::path::PathBuf {
    let reg = bloomery_devices::Registry::load(&plugin_dir())
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
    preset_of(arch, "tiny", &dir.join(format!("{arch}.gguf")), types)
}

/// Writes preset `preset` of architecture `arch` (seed 7) with `types` to `path`; returns it.
#[allow(dead_code)] // not every test crate that shares this module writes models
pub fn preset_of(
    arch: &str,
    preset: &str,
    path: &std::path::Path,
    types: bloomery::synth::ClassTypes,
) -> std::path::PathBuf {
    let reg = bloomery_devices::Registry::load(&plugin_dir())
        .expect("plugin folder (run `cargo xtask plugins` first)");
    let plugin = reg.model_for(arch).unwrap();
    let presets = plugin.module.synth_presets()();
    let found = presets
        .iter()
        .find(|p| {
            p.name.as_str() == preset
                && p.metadata.iter().any(|e| {
                    e.key.as_str() == "general.architecture" && e.value.as_str() == Some(arch)
                })
        })
        .unwrap();
    bloomery::synth::write(found, types, 7, path).unwrap();
    path.to_path_buf()
}

/// The n-gram table row ids of positions `start..` of a sequence whose tokens from position 0
/// are `seq`, for a model that declares an n-gram spec (none for any other).
#[allow(dead_code)] // not every test crate that shares this module runs an n-gram model
pub fn ngram_rows(
    spec: &bloomery_plugin_api::model::ModelSpec,
    seq: &[i32],
    start: usize,
) -> Vec<i32> {
    match &spec.ngram {
        bloomery_plugin_api::abi_stable::std_types::ROption::RSome(n) => {
            let tokens: Vec<u32> = seq.iter().map(|&t| t as u32).collect();
            let mut rows = Vec::new();
            n.extend_rows(&tokens[..start], &tokens[start..], &mut rows);
            rows
        }
        bloomery_plugin_api::abi_stable::std_types::ROption::RNone => Vec::new(),
    }
}

/// How `ours` (`[vocab, positions]` logits) agrees with a golden sequence's `logits` (one array
/// per position): the largest |Δ| over the largest |logit| of any position, the positions whose
/// argmax agrees, and the positions compared.
#[allow(dead_code)] // not every test crate that shares this module compares goldens
pub fn agreement(ours: &[f32], vocab: usize, golden: &serde_json::Value) -> (f32, usize, usize) {
    let (mut max_rel, mut same, mut n) = (0f32, 0, 0);
    for (i, row) in golden.as_array().unwrap().iter().enumerate() {
        let want: Vec<f32> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let got = &ours[i * vocab..(i + 1) * vocab];
        let scale = want.iter().fold(0f32, |s, v| s.max(v.abs()));
        let diff = got
            .iter()
            .zip(&want)
            .fold(0f32, |s, (x, y)| s.max((x - y).abs()));
        max_rel = max_rel.max(diff / scale);
        let am = |v: &[f32]| (0..v.len()).max_by(|&x, &y| v[x].total_cmp(&v[y])).unwrap();
        same += usize::from(am(got) == am(&want));
        n += 1;
    }
    (max_rel, same, n)
}

/// One slot of 64 positions, f32 K/V, 2 threads, graphs on: every golden sequence fits.
#[allow(dead_code)] // not every test crate that shares this module compares goldens
pub const GOLDEN_OPTS: bloomery_exec::LoadOptions = bloomery_exec::LoadOptions {
    n_slots: 1,
    ctx_per_slot: 64,
    kv_type_k: bloomery_plugin_api::DType::F32,
    kv_type_v: bloomery_plugin_api::DType::F32,
    threads: 2,
    graphs: true,
    mlock: false,
    overrides: &[],
    check_tensors: false,
    draft_n_max: 0,
    draft_history: false,
};

/// How `m`'s logits agree with a golden file's (`{sequences: [{tokens, logits}]}`), each
/// sequence run as one batch from position 0 in slot 0: as [`agreement`] says, over all of them.
#[allow(dead_code)] // not every test crate that shares this module compares goldens
pub fn golden_agreement(
    m: &mut bloomery_exec::LoadedModel,
    golden: &serde_json::Value,
) -> (f32, usize, usize) {
    let vocab = m.spec.hparams.n_vocab as usize;
    let (mut max_rel, mut same, mut positions) = (0f32, 0, 0);
    for seq in golden["sequences"].as_array().unwrap() {
        let tokens: Vec<i32> = seq["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect();
        let n = tokens.len() as i32;
        let ours = m
            .forward(&bloomery_exec::BatchInputs {
                ngram_rows: ngram_rows(&m.spec, &tokens, 0),
                logit_rows: vec![],
                tokens,
                positions: (0..n).collect(),
                slots: vec![0; n as usize],
                output_rows: (0..n).collect(),
            })
            .unwrap();
        let (rel, s, n) = agreement(&ours, vocab, &seq["logits"]);
        max_rel = max_rel.max(rel);
        same += s;
        positions += n;
    }
    (max_rel, same, positions)
}

/// Loads `path` with cpu-scalar standing in for the card (so that CI runs tiering without a GPU)
/// and the routed experts placed as `request` asks.
#[allow(dead_code)] // only the test crates that tier experts load this way
pub fn load_on_scalar_card(
    path: &std::path::Path,
    opts: bloomery_exec::LoadOptions,
    request: &bloomery_tiering::plan::TierRequest,
) -> Result<bloomery_exec::LoadedModel, String> {
    let reg = bloomery_devices::Registry::load(&plugin_dir()).unwrap();
    let scalar = reg
        .kernels
        .iter()
        .find(|k| k.name == "cpu-scalar")
        .expect("the cpu-scalar plugin");
    bloomery_exec::LoadedModel::load_placed(&reg, path, opts, scalar, request)
        .map_err(|e| e.to_string())
}

/// Checks the experts each MoE layer's router picks for each token of `golden`'s sequences
/// (`router_ids`: per sequence, MoE layer and position) against the model file at `path`. Every
/// routed expert is placed on the host (`-cmoe`, cpu-scalar standing in for the card), whose
/// routing counts record each pass's ids; one token a pass gives each position's set of experts.
#[allow(dead_code)] // only the MoE golden test crates check routes
pub fn assert_routes_match(path: &std::path::Path, golden: &serde_json::Value, label: &str) {
    assert_routes_match_with(path, golden, label, GOLDEN_OPTS);
}

/// [`assert_routes_match`] with the model loaded with `opts` (a longer context).
#[allow(dead_code)] // only the MoE golden test crates check routes
pub fn assert_routes_match_with(
    path: &std::path::Path,
    golden: &serde_json::Value,
    label: &str,
    opts: bloomery_exec::LoadOptions,
) {
    let request = bloomery_tiering::plan::TierRequest {
        cpu_moe: true,
        no_residency: true,
        bus_experts: Some(0),
        no_decode_staging: true,
        ..Default::default()
    };
    let mut compared = 0;
    for seq in golden["sequences"].as_array().unwrap() {
        let want = seq["router_ids"].as_array().unwrap();
        let mut m = load_on_scalar_card(path, opts, &request).unwrap();
        let tokens: Vec<i32> = seq["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect();
        let mut before = m.routing_counts().unwrap();
        assert_eq!(
            before.len(),
            want.len(),
            "{label}: layers with routed experts"
        );
        for (i, &tok) in tokens.iter().enumerate() {
            m.forward(&bloomery_exec::BatchInputs {
                tokens: vec![tok],
                positions: vec![i as i32],
                slots: vec![0],
                output_rows: vec![0],
                ngram_rows: ngram_rows(&m.spec, &tokens[..=i], i),
                logit_rows: vec![],
            })
            .unwrap();
            let after = m.routing_counts().unwrap();
            for (layer, (a, b)) in after.iter().zip(&before).enumerate() {
                let ours: Vec<u64> = (0..a.len())
                    .filter(|&e| a[e] != b[e])
                    .map(|e| e as u64)
                    .collect();
                let theirs: Vec<u64> = want[layer][i]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                assert_eq!(ours, theirs, "{label}: MoE layer {layer}, position {i}");
                compared += 1;
            }
            before = after;
        }
    }
    assert!(compared > 0, "{label}: no routes compared");
}

/// A generation of `n_predict` tokens with `sampler`, end of generation ignored, nothing else
/// asked (no stop strings, probabilities, grammar, budget or prompt cache).
#[allow(dead_code)] // not every test crate that shares this module generates
pub fn generation(
    sampler: bloomery_runtime::sampling::SamplerParams,
    n_predict: usize,
) -> bloomery_runtime::request::GenParams {
    bloomery_runtime::request::GenParams {
        sampler,
        n_predict: Some(n_predict),
        stop: Vec::new(),
        n_probs: 0,
        post_sampling_probs: false,
        return_progress: false,
        ignore_eos: true,
        cache_prompt: false,
        forced: Vec::new(),
        prompt_only: false,
        grammar: None,
        t_max_predict_ms: None,
        preserved: Vec::new(),
        special: false,
        shift: bloomery_runtime::request::ShiftParams::default(),
        reasoning_budget: None,
    }
}

/// `path` loaded on the CPU with one slot of `ctx` positions and two threads, with its
/// tokenizer.
#[allow(dead_code)] // not every test crate that shares this module runs a runtime
pub fn one_slot(
    path: &std::path::Path,
    ctx: u32,
) -> (
    bloomery_exec::LoadedModel,
    std::sync::Arc<bloomery_text::Tokenizer>,
) {
    let reg = bloomery_devices::Registry::load(&plugin_dir()).unwrap();
    let options = bloomery_exec::LoadOptions {
        n_slots: 1,
        ctx_per_slot: ctx,
        threads: 2,
        ..bloomery_exec::LoadOptions::default()
    };
    let model = bloomery_exec::LoadedModel::load(&reg, path, options).unwrap();
    let tok = std::sync::Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
    (model, tok)
}

/// A runtime of `n_ctx_slot` positions a slot, 16-row prompt passes, no drafting, no schemajump,
/// no context shift, no prompt cache: the plain setup the runtime tests decode with.
#[allow(dead_code)] // not every test crate that shares this module starts a runtime
pub fn plain_runtime(n_ctx_slot: usize) -> bloomery_runtime::RuntimeConfig {
    bloomery_runtime::RuntimeConfig {
        n_ctx_slot,
        n_batch: 16,
        cache_ram: None,
        queue_depth: 8,
        max_checkpoints: bloomery_runtime::DEFAULT_MAX_CHECKPOINTS,
        checkpoint_every: bloomery_runtime::DEFAULT_CHECKPOINT_EVERY,
        schemajump: false,
        context_shift: false,
        spec: bloomery_runtime::spec::SpecConfig::OFF,
        slot_similarity: bloomery_runtime::DEFAULT_SLOT_SIMILARITY,
    }
}
