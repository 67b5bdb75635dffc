//! GLM-5.3 (`glm5-next`) end to end on the CPU, on the synthetic tiny file (`bloomery synth
//! --arch glm5-next --preset tiny --seed 7`; goldens made by tests/oracle/make_glm5next_goldens.sh,
//! see host/tests/fixtures/PROVENANCE.md):
//!
//! - logits at every position of two 44-token sequences within 1e-4 relative of transformers 5.24
//!   (`tiny_hf.json`) and of llama.cpp b11434 (`tiny_llamacpp.json`), the argmax equal;
//! - every MoE layer's experts and every MLA layer's DSA selection per position as transformers'
//!   (the sequences were drawn outside the tie bands);
//! - the NextN layer through the host's draft pass (`LoadedModel::forward_draft` on the trunk's
//!   final-norm rows): logits within 1e-4 of the f64 numpy reference (`tiny_nextn_np.json`), its
//!   experts and DSA selection as the reference's;
//! - against itself: a prompt in one pass equals the same tokens in chunks and token by token (the
//!   trunk and the NextN layer), two sequences in one pass in two slots equal each alone, a
//!   restored checkpoint equals the prefix evaluated again, and below the dense threshold
//!   (`top_k + kpool − 1` positions) the indexer selects every position.

mod common;

use common::{plugin_dir, tiny_of};

use std::path::{Path, PathBuf};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadedModel};
use bloomery_plugin_api::DType;
use sha2::{Digest, Sha256};

const ARCH: &str = "glm5-next";

/// The indexer's selection node of a full-indexer MLA layer.
const SEL: &str = "indexer_sel_idx";

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

fn golden(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/glm5next")
        .join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// The tiny file in `dir`, checked to be the file the goldens were made on.
fn tiny(dir: &Path) -> PathBuf {
    let path = tiny_of(ARCH, dir, F32);
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    for name in ["tiny_hf", "tiny_llamacpp", "tiny_nextn_np"] {
        assert_eq!(
            sha,
            golden(name)["file_sha256"].as_str().unwrap(),
            "{name}: synth output changed: remake the goldens (host/tests/fixtures/PROVENANCE.md)"
        );
    }
    path
}

fn load(path: &Path) -> LoadedModel {
    let reg = Registry::load(&plugin_dir()).unwrap();
    LoadedModel::load(&reg, path, common::GOLDEN_OPTS).unwrap()
}

fn tokens(seq: &serde_json::Value) -> Vec<i32> {
    ids(&seq["tokens"])
}

fn ids(v: &serde_json::Value) -> Vec<i32> {
    let v = v.as_array().unwrap();
    v.iter().map(|x| x.as_i64().unwrap() as i32).collect()
}

/// Each row of `[n, rows]` i32 values without its −1 entries, ascending.
fn sorted_rows(values: &[i32], rows: usize) -> Vec<Vec<i32>> {
    values
        .chunks(values.len() / rows)
        .map(|r| {
            let mut r: Vec<i32> = r.iter().copied().filter(|&p| p >= 0).collect();
            r.sort_unstable();
            r
        })
        .collect()
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

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |s, v| s.max(v.abs()));
    a.iter().zip(b).fold(0f32, |s, (x, y)| s.max((x - y).abs())) / scale
}

/// The logits of both sequences on each CPU kernel plugin against `reference`.
fn check(reference: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let g = golden(reference);
    let reg = Registry::load(&plugin_dir()).unwrap();
    let cpus: Vec<_> = reg
        .kernels
        .iter()
        .filter(|k| k.name.starts_with("cpu-"))
        .collect();
    assert!(cpus.len() >= 2, "cpu-scalar and cpu-avx2");
    for k in cpus {
        let mut m = LoadedModel::load_on(&reg, &path, common::GOLDEN_OPTS, k).unwrap();
        let (rel, same, n) = common::golden_agreement(&mut m, &g);
        eprintln!(
            "{reference} on {}: max rel {rel:.2e}, argmax {same}/{n}",
            k.name
        );
        assert_eq!(n, 88, "{reference}: positions compared");
        assert!(rel < 1e-4, "{reference} on {}: max rel {rel}", k.name);
        assert_eq!(same, n, "{reference} on {}: argmax differs", k.name);
    }
}

#[test]
fn logits_match_transformers_within_1e4() {
    check("tiny_hf");
}

#[test]
fn logits_match_llama_cpp_within_1e4() {
    check("tiny_llamacpp");
}

#[test]
fn every_token_is_routed_to_transformers_experts() {
    let dir = tempfile::tempdir().unwrap();
    common::assert_routes_match(&tiny(dir.path()), &golden("tiny_hf"), ARCH);
}

/// Each full-indexer layer's selection (`layer`, positions per row, ascending), over one pass of
/// `tokens` from position 0.
fn picks(m: &mut LoadedModel, tokens: &[i32]) -> Vec<(i32, Vec<Vec<i32>>)> {
    let taps = m.forward_tap_i32(&rows(tokens, 0), None, SEL).unwrap();
    taps.into_iter()
        .map(|(layer, sel)| (layer, sorted_rows(&sel, tokens.len())))
        .collect()
}

#[test]
fn the_dsa_indexer_picks_transformers_positions() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load(&tiny(dir.path()));
    let g = golden("tiny_hf");
    let layers = ids(&g["mla_layers"]);
    let mut compared = 0;
    for (s, seq) in g["sequences"].as_array().unwrap().iter().enumerate() {
        let ours = picks(&mut m, &tokens(seq));
        let got_layers: Vec<i32> = ours.iter().map(|(l, _)| *l).collect();
        assert_eq!(got_layers, layers, "full-indexer layers");
        for (i, (layer, rows)) in ours.iter().enumerate() {
            let want = seq["dsa_picks"][i].as_array().unwrap();
            assert_eq!(rows.len(), want.len());
            for (p, (got, want)) in rows.iter().zip(want).enumerate() {
                assert_eq!(got, &ids(want), "sequence {s}, layer {layer}, position {p}");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 2 * 2 * 44);
}

/// The tiny preset's indexer keeps `top_k` 8 positions in pools of `kpool` 4 plus the tail: below
/// position 11 every row sees all of `0..=p`, from there on at most 11 positions (8 and a tail
/// of up to 3).
#[test]
fn below_the_dense_threshold_every_position_is_selected() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load(&tiny(dir.path()));
    let g = golden("tiny_hf");
    let seq = tokens(&g["sequences"][1]);
    let threshold = 8 + 4 - 1;
    for (layer, rows) in picks(&mut m, &seq) {
        for (p, got) in rows.iter().enumerate() {
            if p < threshold {
                let all: Vec<i32> = (0..=p as i32).collect();
                assert_eq!(got, &all, "layer {layer}, position {p}");
            } else {
                assert!(
                    got.len() <= threshold,
                    "layer {layer}, position {p}: {got:?}"
                );
            }
        }
    }
}

/// The tiny preset with `attention.indexer.top_k` 64 (every pool of a 64-position context kept:
/// dense everywhere) written into `dir`.
fn dense_tiny(dir: &Path) -> PathBuf {
    use bloomery_plugin_api::meta::{MetaEntry, MetaValue};
    let reg = Registry::load(&plugin_dir()).unwrap();
    let presets = reg.model_for(ARCH).unwrap().module.synth_presets()();
    let mut p = presets
        .into_iter()
        .find(|p| p.name.as_str() == "tiny")
        .unwrap();
    let key = format!("{ARCH}.attention.indexer.top_k");
    let e = p.metadata.iter_mut().find(|e| e.key.as_str() == key);
    *e.unwrap() = MetaEntry::new(&key, MetaValue::U32(64));
    let path = dir.join("dense.gguf");
    bloomery::synth::write(&p, F32, 7, &path).unwrap();
    path
}

/// Below the threshold the sparse model's logits are the dense model's (the same weights with
/// `top_k` 64): the same positions attended, only listed in another order; from position 11 on
/// they differ.
#[test]
fn below_the_dense_threshold_the_logits_are_the_dense_models() {
    let dir = tempfile::tempdir().unwrap();
    let mut sparse = load(&tiny(dir.path()));
    let mut dense = load(&dense_tiny(dir.path()));
    let g = golden("tiny_hf");
    let seq = tokens(&g["sequences"][0]);
    let (a, b) = (
        sparse.forward(&rows(&seq, 0)).unwrap(),
        dense.forward(&rows(&seq, 0)).unwrap(),
    );
    let vocab = sparse.spec.hparams.n_vocab as usize;
    let cut = 11 * vocab;
    let below = max_rel(&a[..cut], &b[..cut]);
    let above = max_rel(&a[cut..], &b[cut..]);
    eprintln!("sparse vs dense: below the threshold {below:.2e}, above {above:.2e}");
    assert!(below < 1e-6, "below the threshold: max rel {below}");
    assert!(above > 1e-3, "above the threshold: max rel {above}");
}

/// One sequence's logits run as `chunks` passes (lengths), from position 0.
fn in_chunks(m: &mut LoadedModel, tokens: &[i32], chunks: &[usize]) -> Vec<f32> {
    let mut out = Vec::new();
    let mut at = 0;
    for &n in chunks {
        out.extend(m.forward(&rows(&tokens[at..at + n], at as i32)).unwrap());
        at += n;
    }
    assert_eq!(at, tokens.len());
    out
}

/// The chunked KDA form against its step form, the indexer's pools completed in a later pass than
/// the one that started them, and the latent cache read across passes.
#[test]
fn a_prompt_in_one_pass_equals_chunks_and_token_by_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load(&tiny(dir.path()));
    let g = golden("tiny_hf");
    let seq = tokens(&g["sequences"][0]);
    let whole = in_chunks(&mut m, &seq, &[44]);
    for chunks in [vec![5, 13, 26], vec![1; 44]] {
        let parts = in_chunks(&mut m, &seq, &chunks);
        let r = max_rel(&parts, &whole);
        eprintln!("chunks {:?}…: max rel {r:.2e}", &chunks[..3]);
        assert!(r < 1e-5, "chunks {chunks:?}: max rel {r}");
    }
}

/// A checkpoint taken after 13 positions, with the positional caches of a later save, brings the
/// slot back to the prefix: the rest of the sequence then gives the logits of a fresh run.
#[test]
fn a_restored_checkpoint_equals_the_prefix_evaluated_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load(&tiny(dir.path()));
    assert!(m.rewind().per_sequence);
    let g = golden("tiny_hf");
    let seq = tokens(&g["sequences"][0]);
    let other = tokens(&g["sequences"][1]);
    let fresh = m.forward(&rows(&seq, 0)).unwrap();
    let (head, tail) = seq.split_at(13);
    let n = head.len() as u32;
    m.forward(&rows(head, 0)).unwrap();
    let ck = m.read_checkpoint(0).unwrap();
    m.forward(&rows(tail, n as i32)).unwrap();
    let all = seq.len() as u32;
    let saved = m.read_slot(0, all).unwrap();
    // Another sequence overwrites the slot; the saved state brings back the prefix.
    m.forward(&rows(&other, 0)).unwrap();
    let wrong = m.read_checkpoint(0).unwrap();
    m.write_slot(0, n, all, &saved, Some(&ck)).unwrap();
    let again = m.forward(&rows(tail, n as i32)).unwrap();
    let vocab = m.spec.hparams.n_vocab as usize;
    let r = max_rel(&again, &fresh[head.len() * vocab..]);
    eprintln!("restored vs fresh: max rel {r:.2e}");
    assert!(r < 1e-5, "max rel {r}");
    // The other sequence's recurrent state in its place gives other logits.
    m.write_slot(0, n, all, &saved, Some(&wrong)).unwrap();
    let off = m.forward(&rows(tail, n as i32)).unwrap();
    assert!(max_rel(&off, &fresh[head.len() * vocab..]) > 1e-3);
}

/// The NextN layer (8) of each sequence: the trunk's final-norm rows of the sequence, row `i`
/// paired with token `i + 1` (the last with the first, as the reference pairs them) at position
/// `i` of the layer's own caches, in one draft pass; its logits within 1e-4 of the numpy
/// reference's (which ran on transformers' trunk rows), its experts and its DSA selection (a full
/// indexer over its own cache) as the reference's.
#[test]
fn the_nextn_layer_matches_the_numpy_reference_within_1e4() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load(&tiny(dir.path()));
    let g = golden("tiny_nextn_np");
    let layer = g["layer"].as_i64().unwrap() as i32;
    let vocab = m.spec.hparams.n_vocab as usize;
    let (mut max, mut same, mut n) = (0f32, 0, 0);
    for (s, seq) in g["sequences"].as_array().unwrap().iter().enumerate() {
        let (t, next) = (tokens(seq), ids(&seq["next_tokens"]));
        let h = m.forward_hidden(&rows(&t, 0)).unwrap();
        let draft = rows(&next, 0);
        let ours = m.forward_draft(&draft, &h).unwrap();
        let (rel, sm, k) = common::agreement(&ours, vocab, &seq["logits"]);
        eprintln!("NextN, sequence {s}: max rel {rel:.2e}, argmax {sm}/{k}");
        (max, same, n) = (max.max(rel), same + sm, n + k);
        for (name, key) in [("ffn_moe_topk", "router_ids"), (SEL, "dsa_picks")] {
            let taps = m.forward_tap_i32(&draft, Some(&h), name).unwrap();
            assert_eq!(taps.len(), 1, "{name}: one in the draft graph");
            assert_eq!(taps[0].0, layer, "{name}");
            let got = sorted_rows(&taps[0].1, next.len());
            let want = seq[key].as_array().unwrap();
            assert_eq!(got.len(), want.len());
            for (p, (got, want)) in got.iter().zip(want).enumerate() {
                let mut want = ids(want);
                want.sort_unstable();
                assert_eq!(got, &want, "{key}: sequence {s}, position {p}");
            }
        }
    }
    eprintln!("NextN against numpy: max rel {max:.2e}, argmax {same}/{n}");
    assert_eq!(n, 88);
    assert!(max < 1e-4, "NextN: max rel {max}");
    assert_eq!(same, n, "NextN: argmax differs");
}

/// Both sequences interleaved row by row in one pass, in slots 0 and 1, against each run alone:
/// every cache (latent, indexer with its pooled keys, KDA states) kept per slot.
#[test]
fn two_sequences_in_one_pass_equal_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = bloomery_exec::LoadOptions {
        n_slots: 2,
        ..common::GOLDEN_OPTS
    };
    let mut m = LoadedModel::load(&reg, &path, opts).unwrap();
    let g = golden("tiny_hf");
    let seqs = [tokens(&g["sequences"][0]), tokens(&g["sequences"][1])];
    let alone: Vec<Vec<f32>> = seqs
        .iter()
        .map(|t| m.forward(&rows(t, 0)).unwrap())
        .collect();
    let n = seqs[0].len();
    let mut both = BatchInputs {
        tokens: vec![],
        positions: vec![],
        slots: vec![],
        output_rows: (0..2 * n as i32).collect(),
        ngram_rows: vec![],
        logit_rows: vec![],
    };
    for p in 0..n {
        for (s, t) in seqs.iter().enumerate() {
            both.tokens.push(t[p]);
            both.positions.push(p as i32);
            both.slots.push(s as i32);
        }
    }
    let mixed = m.forward(&both).unwrap();
    let vocab = m.spec.hparams.n_vocab as usize;
    for (s, alone) in alone.iter().enumerate() {
        let rows: Vec<f32> = (0..n)
            .flat_map(|p| mixed[(2 * p + s) * vocab..][..vocab].iter().copied())
            .collect();
        let r = max_rel(&rows, alone);
        eprintln!("slot {s}: interleaved vs alone: max rel {r:.2e}");
        assert!(r < 1e-5, "slot {s}: max rel {r}");
    }
}

/// The draft pass over a sequence's rows in one pass equals it row by row (the NextN layer's
/// caches and pooled keys carried across passes).
#[test]
fn the_nextn_draft_in_one_pass_equals_row_by_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load(&tiny(dir.path()));
    let g = golden("tiny_nextn_np");
    let seq = &g["sequences"][0];
    let (t, next) = (tokens(seq), ids(&seq["next_tokens"]));
    let h = m.forward_hidden(&rows(&t, 0)).unwrap();
    let whole = m.forward_draft(&rows(&next, 0), &h).unwrap();
    let n_embd = m.spec.hparams.n_embd as usize;
    let mut steps = Vec::new();
    for (i, &tok) in next.iter().enumerate() {
        let hi = &h[i * n_embd..(i + 1) * n_embd];
        steps.extend(m.forward_draft(&rows(&[tok], i as i32), hi).unwrap());
    }
    let r = max_rel(&steps, &whole);
    eprintln!("NextN draft row by row vs one pass: max rel {r:.2e}");
    assert!(r < 1e-5, "max rel {r}");
}
