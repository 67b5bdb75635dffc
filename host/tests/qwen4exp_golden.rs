//! Qwen3.8-Flash-Next (`qwen4exp`) trunk end to end on the CPU, on the synthetic tiny file
//! (`bloomery synth --arch qwen4exp --preset tiny --seed 7`; goldens made by
//! tests/oracle/make_qwen4exp_goldens.sh, see host/tests/fixtures/PROVENANCE.md), against
//! transformers 5.24 (`tiny_hf.json`) and llama.cpp b11434 (`tiny_llamacpp.json`), two sequences
//! of 68 tokens (QSA selects from position 19 on: 49 positions each; the first holds the PLE end
//! id at 20, 41, 42 and 44):
//!
//! - the n-gram table row ids the host hashes ([`bloomery_plugin_api::ngram`]) are the ones
//!   transformers reads, at every position;
//! - logits at every position within 1e-4 relative of each reference, the argmax equal, on each
//!   CPU kernel plugin, the prompt in one pass and token by token;
//! - every layer's experts and every QSA layer's selected blocks per position as transformers';
//! - through the runtime (whose scheduler hashes the row ids from each slot's record, across
//!   prompt chunks) the log-probabilities after prefixes are transformers', and greedy tokens
//!   are the model's run by hand.

mod common;

use common::{fixture, ids, ngram_rows, plugin_dir, same_file, tiny_of, ALL_F32 as F32};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel};
use bloomery_runtime::request::{Event, GenParams, Piece};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::Runtime;

const ARCH: &str = "qwen4exp";

/// The QSA selection node of an attention layer.
const SEL: &str = "indexer_sel_idx";

/// One slot of 128 positions (the sequences have 68), f32 K/V, 2 threads, graphs on.
const OPTS: LoadOptions = LoadOptions {
    ctx_per_slot: 128,
    ..common::GOLDEN_OPTS
};

fn golden() -> serde_json::Value {
    reference("tiny_hf")
}

fn reference(name: &str) -> serde_json::Value {
    fixture(&format!("qwen4exp/{name}.json"))
}

/// The tiny file in `dir`, checked to be the file the golden was made on.
fn tiny(dir: &Path) -> PathBuf {
    let goldens = [reference("tiny_hf"), reference("tiny_llamacpp")];
    same_file(tiny_of(ARCH, dir, F32), &[&goldens[0], &goldens[1]])
}

/// Positions `start..start + n` of `seq` (its tokens from position 0) in slot 0, every row an
/// output, with their n-gram row ids.
fn rows(m: &LoadedModel, seq: &[i32], start: usize, n: usize) -> BatchInputs {
    BatchInputs {
        tokens: seq[start..start + n].to_vec(),
        positions: (start as i32..(start + n) as i32).collect(),
        slots: vec![0; n],
        output_rows: (0..n as i32).collect(),
        ngram_rows: ngram_rows(&m.spec, &seq[..start + n], start),
        logit_rows: vec![],
    }
}

fn load_on_each_cpu(path: &Path) -> Vec<(String, LoadedModel)> {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let cpus: Vec<_> = reg
        .kernels
        .iter()
        .filter(|k| k.name.starts_with("cpu-"))
        .collect();
    assert!(cpus.len() >= 2, "cpu-scalar and cpu-avx2");
    cpus.into_iter()
        .map(|k| {
            let m = LoadedModel::load_on(&reg, path, OPTS, k).unwrap();
            (k.name.to_string(), m)
        })
        .collect()
}

#[test]
fn the_hashed_ngram_rows_are_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    let m = LoadedModel::load(&reg, &tiny(dir.path()), OPTS).unwrap();
    let g = golden();
    let mut compared = 0;
    for (s, seq) in g["sequences"].as_array().unwrap().iter().enumerate() {
        let tokens = ids(&seq["tokens"]);
        let ours = ngram_rows(&m.spec, &tokens, 0);
        let want = seq["ple_rows"].as_array().unwrap();
        assert_eq!(
            ours.len(),
            want.len() * 16,
            "sequence {s}: 16 rows a position"
        );
        for (p, (got, want)) in ours.chunks(16).zip(want).enumerate() {
            assert_eq!(got, &ids(want)[..], "sequence {s}, position {p}");
            compared += 1;
        }
    }
    assert_eq!(compared, 2 * 68);
}

/// Each sequence in one pass, and token by token, against `name`'s logits on every CPU plugin.
fn check_logits(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let g = reference(name);
    let vocab = 272;
    for (plugin, mut m) in load_on_each_cpu(&path) {
        let (mut worst, mut same, mut n) = (0f32, 0, 0);
        let (mut worst_tok, mut same_tok) = (0f32, 0);
        for seq in g["sequences"].as_array().unwrap() {
            let tokens = ids(&seq["tokens"]);
            let batch = m.forward(&rows(&m, &tokens, 0, tokens.len())).unwrap();
            let (rel, s, k) = common::agreement(&batch, vocab, &seq["logits"]);
            worst = worst.max(rel);
            same += s;
            n += k;
            let mut step = Vec::new();
            for p in 0..tokens.len() {
                step.extend(m.forward(&rows(&m, &tokens, p, 1)).unwrap());
            }
            let (rel, s, _) = common::agreement(&step, vocab, &seq["logits"]);
            worst_tok = worst_tok.max(rel);
            same_tok += s;
        }
        eprintln!(
            "{name} on {plugin}: one pass {worst:.2e} (argmax {same}/{n}), token by token \
             {worst_tok:.2e} (argmax {same_tok}/{n})"
        );
        assert_eq!(n, 2 * 68, "positions compared");
        assert!(
            worst < 1e-4,
            "{name} on {plugin}, one pass: max rel {worst}"
        );
        assert!(
            worst_tok < 1e-4,
            "{name} on {plugin}, token by token: max rel {worst_tok}"
        );
        assert_eq!(
            (same, same_tok),
            (n, n),
            "{name} on {plugin}: argmax differs"
        );
    }
}

#[test]
fn logits_match_transformers_within_1e4() {
    check_logits("tiny_hf");
}

#[test]
fn logits_match_llama_cpp_within_1e4() {
    check_logits("tiny_llamacpp");
}

#[test]
fn every_token_is_routed_to_transformers_experts() {
    let dir = tempfile::tempdir().unwrap();
    common::assert_routes_match_with(&tiny(dir.path()), &golden(), ARCH, OPTS);
}

/// Each QSA layer's selection in one pass per sequence: the complete blocks it keeps are
/// transformers', and every position after the last complete block is kept too.
#[test]
fn the_qsa_indexer_keeps_transformers_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    let mut m = LoadedModel::load(&reg, &tiny(dir.path()), OPTS).unwrap();
    let g = golden();
    let ratio = g["compress_ratio"].as_i64().unwrap() as i32;
    let layers = ids(&g["qsa_layers"]);
    let mut compared = 0;
    for (s, seq) in g["sequences"].as_array().unwrap().iter().enumerate() {
        let tokens = ids(&seq["tokens"]);
        let n = tokens.len();
        let taps = m
            .forward_tap_i32(&rows(&m, &tokens, 0, n), None, SEL)
            .unwrap();
        let got_layers: Vec<i32> = taps.iter().map(|(l, _)| *l).collect();
        assert_eq!(got_layers, layers, "QSA layers");
        for (i, (layer, sel)) in taps.iter().enumerate() {
            let want = seq["qsa_blocks"][i].as_array().unwrap();
            for (p, row) in sel.chunks(sel.len() / n).enumerate() {
                let complete = (p as i32 + 1) / ratio;
                let mut blocks: Vec<i32> = row
                    .iter()
                    .filter(|&&q| q >= 0 && q < complete * ratio)
                    .map(|&q| q / ratio)
                    .collect();
                blocks.sort_unstable();
                blocks.dedup();
                let mut tail: Vec<i32> = row
                    .iter()
                    .copied()
                    .filter(|&q| q >= complete * ratio)
                    .collect();
                tail.sort_unstable();
                let at = format!("sequence {s}, layer {layer}, position {p}");
                assert_eq!(blocks, ids(&want[p]), "{at}");
                assert_eq!(
                    tail,
                    (complete * ratio..=p as i32).collect::<Vec<_>>(),
                    "{at}"
                );
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 2 * 2 * 68);
}

fn greedy(n_predict: usize, n_probs: usize) -> GenParams {
    let sampler = SamplerParams {
        temp: 0.0,
        ..SamplerParams::default()
    };
    GenParams {
        n_probs,
        ..common::generation(sampler, n_predict)
    }
}

/// The generated tokens of one request, with each one's log-probabilities of the `n_probs`
/// likeliest tokens (none when 0).
fn generated(rt: &Runtime, prompt: &[u32], n: usize, n_probs: usize) -> Vec<Piece> {
    let params = greedy(n, n_probs);
    let mut rx = rt
        .submit_blocking(prompt.to_vec(), params, Some(0))
        .unwrap();
    let mut pieces = Vec::new();
    loop {
        match rx
            .blocking_recv()
            .expect("the scheduler dropped the request")
        {
            Event::Token(piece) => pieces.push(piece),
            Event::Done(_) => return pieces,
            Event::Failed(f) => panic!("request failed: {}", f.message),
            _ => {}
        }
    }
}

/// The runtime hashes each row's n-gram ids from its slot's record, across prompt chunks (16 rows
/// a pass) and generated tokens: after each prefix of sequence 0 (ending at, just after and past
/// the end ids) the log-probabilities of every token are transformers' within 1e-4 of its largest
/// logit, and 12 greedy tokens after a 30-token prompt are those of the model run token by token
/// here.
#[test]
fn the_runtime_fills_the_ngram_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let reg = Registry::load(&plugin_dir()).unwrap();
    let g = golden();
    let seq = ids(&g["sequences"][0]["tokens"]);
    let mut m = LoadedModel::load(&reg, &path, OPTS).unwrap();
    let mut want = seq[..30].to_vec();
    let mut logits = m.forward(&rows(&m, &want, 0, 30)).unwrap();
    for _ in 0..12 {
        let last = &logits[logits.len() - 272..];
        let next = (0..272)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap();
        want.push(next as i32);
        logits = m.forward(&rows(&m, &want, want.len() - 1, 1)).unwrap();
    }
    let model = LoadedModel::load(&reg, &path, OPTS).unwrap();
    let tok = Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
    let config = common::plain_runtime(128);
    let rt = Runtime::start(model, tok, config).unwrap();
    let prompt: Vec<u32> = seq.iter().map(|&t| t as u32).collect();
    for k in [20, 21, 22, 43, 45, 68] {
        let row = &g["sequences"][0]["logits"][k - 1];
        let row: Vec<f64> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let top = row.iter().fold(f64::MIN, |a, &b| a.max(b));
        let lse = top + row.iter().map(|&x| (x - top).exp()).sum::<f64>().ln();
        let scale = row.iter().fold(0f64, |a, &b| a.max(b.abs()));
        let first = generated(&rt, &prompt[..k], 1, 272).remove(0);
        let probs = first.probs.expect("log-probabilities asked for");
        assert_eq!(probs.top.len(), 272);
        let worst = probs
            .top
            .iter()
            .map(|&(t, lp)| (f64::from(lp) - (row[t as usize] - lse)).abs())
            .fold(0f64, f64::max);
        assert!(
            worst < 1e-4 * scale,
            "prefix of {k}: log-probabilities off by {worst}"
        );
    }
    let got: Vec<u32> = generated(&rt, &prompt[..30], 12, 0)
        .iter()
        .map(|p| p.id)
        .collect();
    let want: Vec<u32> = want[30..].iter().map(|&t| t as u32).collect();
    assert_eq!(got[..12], want[..]);
    rt.shutdown().unwrap();
}
