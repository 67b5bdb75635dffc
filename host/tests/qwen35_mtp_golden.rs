//! The Qwen3.5 MTP (nextn) block through the host's draft pass, on the synthetic tiny files with
//! one (`bloomery synth --arch qwen35moe|qwen35 --preset tiny-mtp --seed 7`; goldens made by
//! tests/oracle/make_qwen35_mtp_goldens.sh, see host/tests/fixtures/PROVENANCE.md):
//!
//! - `LoadedModel::forward_draft` over a sequence paired as llama.cpp b11434's draft-mtp pairs a
//!   prompt (token `p` with the trunk's final-norm row of position `p − 1`, position 0 with a
//!   zero row): logits at every position within 1e-4 relative of the f64 numpy reference (written
//!   from llama.cpp's `graph_mtp`, run on transformers' trunk rows) and of llama.cpp's own MTP
//!   context fed the same way, the argmax equal, and on `qwen35moe` the block's experts per
//!   position as the numpy reference's;
//! - the draft pass over a sequence in one pass equals it row by row (the block's K/V caches
//!   carried across passes), and leaves the trunk's state alone;
//! - a file without the block refuses a draft pass by name.

mod common;

use common::plugin_dir;

use std::path::{Path, PathBuf};

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

/// `arch`'s golden from `reference`: `np` (numpy) or `llamacpp`.
fn golden_of(arch: &str, reference: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/qwen35mtp")
        .join(format!("{arch}_tiny_mtp_{reference}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// `arch`'s synthetic file of preset `preset` (seed 7, every tensor F32) in `dir`.
fn synth(arch: &str, preset: &str, dir: &Path) -> PathBuf {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let presets = reg.model_for(arch).unwrap().module.synth_presets()();
    let p = presets
        .iter()
        .find(|p| {
            p.name.as_str() == preset
                && p.metadata.iter().any(|e| {
                    e.key.as_str() == "general.architecture" && e.value.as_str() == Some(arch)
                })
        })
        .unwrap();
    let path = dir.join(format!("{arch}-{preset}.gguf"));
    bloomery::synth::write(p, F32, 7, &path).unwrap();
    path
}

fn golden(arch: &str) -> serde_json::Value {
    golden_of(arch, "np")
}

/// The tiny file with an MTP block, checked to be the file the goldens were made on.
fn tiny_mtp_file(arch: &str, dir: &Path) -> PathBuf {
    let path = synth(arch, "tiny-mtp", dir);
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    for reference in ["np", "llamacpp"] {
        assert_eq!(
            sha,
            golden_of(arch, reference)["file_sha256"].as_str().unwrap(),
            "{arch} {reference}: synth output changed: remake the goldens \
             (host/tests/fixtures/PROVENANCE.md)"
        );
    }
    path
}

/// [`tiny_mtp_file`] loaded on the default kernel plugin.
fn tiny_mtp(arch: &str, dir: &Path) -> LoadedModel {
    let reg = Registry::load(&plugin_dir()).unwrap();
    LoadedModel::load(&reg, &tiny_mtp_file(arch, dir), common::GOLDEN_OPTS).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<i32> {
    let v = v.as_array().unwrap();
    v.iter().map(|x| x.as_i64().unwrap() as i32).collect()
}

/// Rows `tokens` of slot 0 from position `start`, every row an output.
fn rows(tokens: &[i32], start: i32) -> BatchInputs {
    let n = tokens.len() as i32;
    BatchInputs {
        tokens: tokens.to_vec(),
        positions: (start..start + n).collect(),
        slots: vec![0; tokens.len()],
        output_rows: (0..n).collect(),
        ngram_rows: vec![],
        logit_rows: vec![],
    }
}

/// The draft pass's hidden rows for `tokens` from the trunk's final-norm rows `h` of the same
/// tokens: row `p` is the trunk's row `p − 1`, row 0 zeros (draft-mtp's `pending_h` of a new
/// sequence).
fn shifted(h: &[f32], n_embd: usize) -> Vec<f32> {
    let mut rows = vec![0f32; n_embd];
    rows.extend_from_slice(&h[..h.len() - n_embd]);
    rows
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |s, v| s.max(v.abs()));
    a.iter().zip(b).fold(0f32, |s, (x, y)| s.max((x - y).abs())) / scale
}

/// The block's logits (and, with experts, the numpy reference's router ids) for every golden
/// sequence of `reference` (`np` or `llamacpp`), on each CPU kernel plugin; returns the
/// positions compared on each.
fn check_against(arch: &str, reference: &str) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp_file(arch, dir.path());
    let reg = Registry::load(&plugin_dir()).unwrap();
    let cpus: Vec<_> = reg
        .kernels
        .iter()
        .filter(|k| k.name.starts_with("cpu-"))
        .collect();
    assert!(cpus.len() >= 2, "cpu-scalar and cpu-avx2");
    let mut n = 0;
    for k in cpus {
        eprintln!("{arch} on {}:", k.name);
        let mut m = LoadedModel::load_on(&reg, &path, common::GOLDEN_OPTS, k).unwrap();
        n = check_model(arch, &golden_of(arch, reference), &mut m);
    }
    n
}

/// [`check_against`] on one loaded model.
fn check_model(arch: &str, g: &serde_json::Value, m: &mut LoadedModel) -> usize {
    assert_eq!(m.spec.caps.n_mtp_layers, 1);
    let layer = golden(arch)["layer"].as_i64().unwrap() as i32;
    let vocab = m.spec.hparams.n_vocab as usize;
    let n_embd = m.spec.hparams.n_embd as usize;
    let (mut max, mut same, mut n) = (0f32, 0, 0);
    for (s, seq) in g["sequences"].as_array().unwrap().iter().enumerate() {
        let t = ids(&seq["tokens"]);
        let h = shifted(&m.forward_hidden(&rows(&t, 0)).unwrap(), n_embd);
        let draft = rows(&t, 0);
        let ours = m.forward_draft(&draft, &h).unwrap();
        let (rel, sm, k) = common::agreement(&ours, vocab, &seq["logits"]);
        eprintln!("{arch} MTP, sequence {s}: max rel {rel:.2e}, argmax {sm}/{k}");
        (max, same, n) = (max.max(rel), same + sm, n + k);
        let Some(want) = seq.get("router_ids") else {
            continue;
        };
        let taps = m.forward_tap_i32(&draft, Some(&h), "ffn_moe_topk").unwrap();
        assert_eq!(taps.len(), 1, "ffn_moe_topk: one in the draft graph");
        assert_eq!(taps[0].0, layer, "ffn_moe_topk's layer");
        let values = &taps[0].1;
        let want = want.as_array().unwrap();
        assert_eq!(values.len() % t.len(), 0);
        for (p, (got, want)) in values.chunks(values.len() / t.len()).zip(want).enumerate() {
            let mut got = got.to_vec();
            got.sort_unstable();
            assert_eq!(got, ids(want), "router ids: sequence {s}, position {p}");
        }
    }
    eprintln!("{arch} MTP against the reference: max rel {max:.2e}, argmax {same}/{n}");
    assert!(max < 1e-4, "{arch} MTP: max rel {max}");
    assert_eq!(same, n, "{arch} MTP: argmax differs");
    n
}

#[test]
fn the_qwen35moe_mtp_block_matches_the_numpy_reference_within_1e4() {
    assert_eq!(check_against("qwen35moe", "np"), 48);
}

#[test]
fn the_qwen35_mtp_block_matches_the_numpy_reference_within_1e4() {
    assert_eq!(check_against("qwen35", "np"), 48);
}

#[test]
fn the_qwen35moe_mtp_block_matches_llama_cpp_within_1e4() {
    assert_eq!(check_against("qwen35moe", "llamacpp"), 48);
}

#[test]
fn the_qwen35_mtp_block_matches_llama_cpp_within_1e4() {
    assert_eq!(check_against("qwen35", "llamacpp"), 48);
}

/// The draft pass over a sequence's rows in one pass equals it row by row.
#[test]
fn the_mtp_draft_in_one_pass_equals_row_by_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = tiny_mtp("qwen35moe", dir.path());
    let g = golden("qwen35moe");
    let t = ids(&g["sequences"][0]["tokens"]);
    let n_embd = m.spec.hparams.n_embd as usize;
    let h = shifted(&m.forward_hidden(&rows(&t, 0)).unwrap(), n_embd);
    let whole = m.forward_draft(&rows(&t, 0), &h).unwrap();
    let mut steps = Vec::new();
    for (i, &tok) in t.iter().enumerate() {
        let hi = &h[i * n_embd..(i + 1) * n_embd];
        steps.extend(m.forward_draft(&rows(&[tok], i as i32), hi).unwrap());
    }
    let r = max_rel(&steps, &whole);
    eprintln!("MTP draft row by row vs one pass: max rel {r:.2e}");
    assert!(r < 1e-5, "max rel {r}");
}

/// A draft pass between two trunk passes leaves the trunk's state alone: the trunk's logits after
/// it equal those of the whole sequence in one pass (the block's caches its own).
#[test]
fn a_draft_pass_leaves_the_trunks_state_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = tiny_mtp("qwen35moe", dir.path());
    let g = golden("qwen35moe");
    let t = ids(&g["sequences"][1]["tokens"]);
    let (vocab, n_embd) = (
        m.spec.hparams.n_vocab as usize,
        m.spec.hparams.n_embd as usize,
    );
    let whole = m.forward(&rows(&t, 0)).unwrap();
    let k = t.len() / 2;
    let h = shifted(&m.forward_hidden(&rows(&t[..k], 0)).unwrap(), n_embd);
    m.forward_draft(&rows(&t[..k], 0), &h).unwrap();
    let rest = m.forward(&rows(&t[k..], k as i32)).unwrap();
    let r = max_rel(&rest, &whole[k * vocab..]);
    eprintln!("trunk after a draft pass vs one pass: max rel {r:.2e}");
    assert!(r < 1e-5, "max rel {r}");
}

/// The plain tiny file has no MTP block: its draft pass is refused, naming the block.
#[test]
fn a_file_without_the_block_refuses_a_draft_pass_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth("qwen35moe", "tiny", dir.path());
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    assert_eq!(m.spec.caps.n_mtp_layers, 0);
    let h = vec![0f32; m.spec.hparams.n_embd as usize];
    let e = m.forward_draft(&rows(&[1], 0), &h).unwrap_err().to_string();
    assert!(e.contains("MTP (nextn) block"), "{e}");
}
