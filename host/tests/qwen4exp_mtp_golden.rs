//! The Qwen3.8-Flash-Next (`qwen4exp`) MTP block from its separate MTP-only file (issue 47 item
//! 6), through the host's draft pass on the CPU: the synthetic trunk `bloomery synth --arch
//! qwen4exp --preset tiny --seed 7` and its MTP file `--preset tiny-mtp --seed 7` (golden made
//! by tests/oracle/make_qwen4exp_mtp_goldens.sh, see host/tests/fixtures/PROVENANCE.md: f64 numpy
//! written from llama.cpp b11434's `graph_mtp`, on transformers' trunk rows):
//!
//! - row `i` pairs the trunk's hc-wide residual row `i` (its `h_nextn`, read here from our trunk)
//!   with the token after it at position `i`: logits at every position within 1e-4 relative of
//!   the numpy reference, the argmax equal, the block's experts and QSA blocks the reference's,
//!   on each CPU kernel plugin;
//! - the greedy draft chain of 4 tokens after the rows, each step pairing its draft with the
//!   block's own residual (`h_nextn` of the draft graph): the drafts and each step's logits are
//!   the reference's;
//! - the rows in one pass equal them row by row (the block's caches carried across passes);
//! - refusals by name: a draft pass on the trunk file (no block), hidden rows of the wrong
//!   width, and a draft file of another model or of another width, vocabulary or depth
//!   ([`bloomery_runtime::spec::check_draft_model`]).

mod common;

use common::{fixture, ids, plugin_dir, same_file, tiny_of, ALL_F32 as F32};

use std::path::{Path, PathBuf};

use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel};
use bloomery_plugin_api::graph::NEXTN_HIDDEN;
use bloomery_runtime::spec::check_draft_model;

const ARCH: &str = "qwen4exp";

/// The QSA selection node of an attention layer.
const SEL: &str = "indexer_sel_idx";

/// One slot of 128 positions (the sequences have 68, the chains 3 more), f32 K/V.
const OPTS: LoadOptions = LoadOptions {
    ctx_per_slot: 128,
    ..common::GOLDEN_OPTS
};

fn golden() -> serde_json::Value {
    fixture("qwen4exp/tiny_mtp_np.json")
}

/// The MTP-only file `tiny-mtp` (seed 7, every tensor F32) in `dir`, checked to be the golden's.
fn mtp_file(dir: &Path) -> PathBuf {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let presets = reg.model_for(ARCH).unwrap().module.synth_presets()();
    let p = presets
        .iter()
        .find(|p| p.name.as_str() == "tiny-mtp")
        .unwrap();
    let path = dir.join("tiny-mtp.gguf");
    bloomery::synth::write(p, F32, 7, &path).unwrap();
    same_file(path, &[&golden()])
}

/// `tokens` of slot 0 from position `start`, every row an output, with n-gram row ids when the
/// model declares a table (`history`: the tokens from position 0).
fn rows(m: &LoadedModel, history: &[i32], start: usize) -> BatchInputs {
    let tokens = &history[start..];
    let n = tokens.len() as i32;
    BatchInputs {
        tokens: tokens.to_vec(),
        positions: (start as i32..start as i32 + n).collect(),
        slots: vec![0; tokens.len()],
        output_rows: (0..n).collect(),
        ngram_rows: common::ngram_rows(&m.spec, history, start),
        logit_rows: vec![],
    }
}

/// The `h_nextn` rows of a pass (the node and its views, all outside any layer and equal).
fn tap_rows(m: &mut LoadedModel, batch: &BatchInputs, hidden: Option<&[f32]>) -> Vec<f32> {
    let mut taps = m.forward_tap_f32(batch, hidden, NEXTN_HIDDEN).unwrap();
    let (layer, rows) = taps.remove(0);
    assert_eq!(layer, -1);
    assert!(
        taps.iter().all(|t| t == &(-1, rows.clone())),
        "{NEXTN_HIDDEN} views differ"
    );
    rows
}

/// The trunk's `h_nextn` rows of a whole sequence.
fn trunk_rows(trunk: &mut LoadedModel, tokens: &[i32]) -> Vec<f32> {
    let batch = rows(trunk, tokens, 0);
    tap_rows(trunk, &batch, None)
}

fn argmax(v: &[f32]) -> i32 {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as i32
}

/// The complete blocks a QSA selection row keeps (sorted), given `complete` blocks of `ratio`.
fn blocks(row: &[i32], complete: i32, ratio: i32) -> Vec<i32> {
    let mut b: Vec<i32> = row
        .iter()
        .filter(|&&q| q >= 0 && q < complete * ratio)
        .map(|&q| q / ratio)
        .collect();
    b.sort_unstable();
    b.dedup();
    b
}

/// The block's experts and QSA blocks of `batch` (rows from position `start`) are `want`'s.
fn check_choices(
    m: &mut LoadedModel,
    batch: &BatchInputs,
    hidden: &[f32],
    want: &serde_json::Value,
    start: usize,
) {
    let n = batch.tokens.len();
    let layer = golden()["layer"].as_i64().unwrap() as i32;
    let taps = m
        .forward_tap_i32(batch, Some(hidden), "ffn_moe_topk")
        .unwrap();
    assert_eq!(taps.len(), 1, "ffn_moe_topk: one in the draft graph");
    assert_eq!(taps[0].0, layer);
    for (p, got) in taps[0].1.chunks(taps[0].1.len() / n).enumerate() {
        let mut got = got.to_vec();
        got.sort_unstable();
        assert_eq!(
            got,
            ids(&want["router_ids"][p]),
            "router ids, row {}",
            start + p
        );
    }
    let taps = m.forward_tap_i32(batch, Some(hidden), SEL).unwrap();
    assert_eq!(taps.len(), 1, "{SEL}: one in the draft graph");
    for (p, row) in taps[0].1.chunks(taps[0].1.len() / n).enumerate() {
        let complete = (start + p + 1) as i32 / 4;
        let got = blocks(row, complete, 4);
        assert_eq!(
            got,
            ids(&want["qsa_blocks"][p]),
            "QSA blocks, row {}",
            start + p
        );
    }
}

/// The trunk and the MTP file, on each CPU kernel plugin.
fn pairs(dir: &Path) -> Vec<(String, LoadedModel, LoadedModel)> {
    let trunk = tiny_of(ARCH, dir, F32);
    let mtp = mtp_file(dir);
    let reg = Registry::load(&plugin_dir()).unwrap();
    let cpus: Vec<_> = reg
        .kernels
        .iter()
        .filter(|k| k.name.starts_with("cpu-"))
        .collect();
    assert!(cpus.len() >= 2, "cpu-scalar and cpu-avx2");
    cpus.into_iter()
        .map(|k| {
            let t = LoadedModel::load_on(&reg, &trunk, OPTS, k).unwrap();
            let d = LoadedModel::load_on(&reg, &mtp, OPTS, k).unwrap();
            (k.name.to_string(), t, d)
        })
        .collect()
}

/// Row `i` pairs the trunk's row `i` with the token after it; then the chain of drafts.
#[test]
fn the_mtp_block_and_its_draft_chain_match_the_numpy_reference_within_1e4() {
    let dir = tempfile::tempdir().unwrap();
    let g = golden();
    for (plugin, mut trunk, mut mtp) in pairs(dir.path()) {
        check_draft_model(&trunk.spec, &mtp.spec).unwrap();
        let vocab = mtp.spec.hparams.n_vocab as usize;
        let (mut worst, mut same, mut n) = (0f32, 0, 0);
        let (mut worst_chain, mut drafted) = (0f32, 0);
        for seq in g["sequences"].as_array().unwrap() {
            let tokens = ids(&seq["tokens"]);
            let next = ids(&seq["next_tokens"]);
            let h = trunk_rows(&mut trunk, &tokens);
            let batch = rows(&mtp, &next, 0);
            let logits = mtp.forward_draft(&batch, &h).unwrap();
            let (rel, s, k) = common::agreement(&logits, vocab, &seq["logits"]);
            (worst, same, n) = (worst.max(rel), same + s, n + k);
            check_choices(&mut mtp, &batch, &h, seq, 0);
            // The chain: d_1 from the last row; each step pairs its draft with the block's own
            // residual of the row before.
            let chain = &seq["chain"];
            let want = ids(&chain["drafts"]);
            let mut x = tap_rows(&mut mtp, &batch, Some(&h));
            let w = x.len() / tokens.len();
            let mut draft = vec![argmax(&logits[logits.len() - vocab..])];
            let mut history = next.clone();
            for k in 1..want.len() {
                history.push(*draft.last().unwrap());
                let step = rows(&mtp, &history, history.len() - 1);
                let prev = x[x.len() - w..].to_vec();
                let logits = mtp.forward_draft(&step, &prev).unwrap();
                let want_row = serde_json::json!([chain["logits"][k - 1]]);
                let (rel, _, _) = common::agreement(&logits, vocab, &want_row);
                worst_chain = worst_chain.max(rel);
                let mut one = chain.clone();
                for key in ["router_ids", "qsa_blocks"] {
                    one[key] = serde_json::json!([chain[key][k - 1]]);
                }
                check_choices(&mut mtp, &step, &prev, &one, history.len() - 1);
                x = tap_rows(&mut mtp, &step, Some(&prev));
                draft.push(argmax(&logits));
            }
            assert_eq!(draft, want, "{plugin}: the draft chain");
            drafted += draft.len();
        }
        eprintln!(
            "qwen4exp MTP on {plugin}: rows max rel {worst:.2e} (argmax {same}/{n}), chain max rel \
             {worst_chain:.2e} ({drafted} drafts equal)"
        );
        assert_eq!((n, drafted), (2 * 68, 2 * 4));
        assert!(worst < 1e-4, "{plugin}: rows max rel {worst}");
        assert!(worst_chain < 1e-4, "{plugin}: chain max rel {worst_chain}");
        assert_eq!(same, n, "{plugin}: argmax differs");
    }
}

/// The draft pass over a sequence row by row equals it in one pass (the block's K/V and indexer
/// caches carried across passes: the QSA selection starts at position 19).
#[test]
fn the_draft_pass_in_one_pass_equals_row_by_row() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut trunk = LoadedModel::load(&reg, &tiny_of(ARCH, dir.path(), F32), OPTS).unwrap();
    let mut mtp = LoadedModel::load(&reg, &mtp_file(dir.path()), OPTS).unwrap();
    let seq = &golden()["sequences"][1];
    let (tokens, next) = (ids(&seq["tokens"]), ids(&seq["next_tokens"]));
    let h = trunk_rows(&mut trunk, &tokens);
    let w = h.len() / tokens.len();
    // Row by row first, on the block's fresh caches: each pass reads what the earlier ones kept.
    let mut steps = Vec::new();
    for i in 0..next.len() {
        let one = rows(&mtp, &next[..=i], i);
        steps.extend(mtp.forward_draft(&one, &h[i * w..(i + 1) * w]).unwrap());
    }
    let whole = mtp.forward_draft(&rows(&mtp, &next, 0), &h).unwrap();
    let scale = whole.iter().fold(0f32, |s, v| s.max(v.abs()));
    let diff = steps
        .iter()
        .zip(&whole)
        .fold(0f32, |s, (a, b)| s.max((a - b).abs()));
    eprintln!("row by row vs one pass: max rel {:.2e}", diff / scale);
    assert!(diff / scale < 1e-5, "max rel {}", diff / scale);
}

#[test]
fn a_wrong_file_or_wrong_rows_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut trunk = LoadedModel::load(&reg, &tiny_of(ARCH, dir.path(), F32), OPTS).unwrap();
    let mut mtp = LoadedModel::load(&reg, &mtp_file(dir.path()), OPTS).unwrap();
    let (n, w) = (128usize, 4 * 128usize);
    // The trunk file has no block.
    let one = rows(&trunk, &[5], 0);
    let e = trunk
        .forward_draft(&one, &vec![0.0; w])
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds no MTP (nextn) block"), "{e}");
    // Rows n_embd wide (a final-norm row) where the block reads the hc-wide residual.
    let one = rows(&mtp, &[5], 0);
    let e = mtp
        .forward_draft(&one, &vec![0.0; n])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("needs {w} hidden values ({w} a row)")),
        "{e}"
    );
    // The pairing check: the trunk as its own draft file, another model's MTP file, and the
    // MTP file of another depth, width or vocabulary.
    let e = check_draft_model(&trunk.spec, &trunk.spec).unwrap_err();
    assert!(e.contains("holds no MTP (nextn) block"), "{e}");
    let presets = reg.model_for("qwen35moe").unwrap().module.synth_presets()();
    let p = presets
        .iter()
        .find(|p| {
            p.name.as_str() == "tiny-mtp"
                && p.metadata.iter().any(|e| {
                    e.key.as_str() == "general.architecture"
                        && e.value.as_str() == Some("qwen35moe")
                })
        })
        .unwrap();
    let path = dir.path().join("qwen35moe-tiny-mtp.gguf");
    bloomery::synth::write(p, F32, 7, &path).unwrap();
    let qwen35 = LoadedModel::load(&reg, &path, OPTS).unwrap();
    assert_eq!(qwen35.spec.caps.n_mtp_layers, 1);
    let e = check_draft_model(&trunk.spec, &qwen35.spec).unwrap_err();
    assert!(
        e.contains("another model's") && e.contains("`qwen35moe`"),
        "{e}"
    );
    for what in ["trunk layers", "width", "vocabulary"] {
        let mut d = mtp.spec.clone();
        let h = &mut d.hparams;
        match what {
            "trunk layers" => h.n_layer += 1,
            "width" => h.n_embd *= 2,
            _ => h.n_vocab -= 1,
        }
        let e = check_draft_model(&trunk.spec, &d).unwrap_err();
        assert!(e.contains(what), "{what}: {e}");
    }
    check_draft_model(&trunk.spec, &mtp.spec).unwrap();
}
