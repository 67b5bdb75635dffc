//! gemma-3-270m Q4_K_M on the CPU plugins against llama.cpp's logits and greedy continuations
//! (tests/fixtures/gemma3_270m_golden*.json, made by make_gemma3_golden.py; see PROVENANCE.md).
//! Runs when `BLOOMERY_GEMMA3` names the model file; the plugin folder comes from
//! `BLOOMERY_TEST_PLUGIN_DIR` (else `target/debug/plugins`).
//!
//! Bit-exact agreement is out of reach: llama.cpp's CPU backend rounds differently from our
//! kernels in three places (Q8_0 activations quantized with `127/amax` and ties-to-even, GELU read
//! from an f16 table, flash-attention V sums kept in f16), and gemma-3-270m's residual stream
//! (|x| up to ~1e5) turns single rounding flips into visible logit moves. llama.cpp itself moves
//! by up to 1.36 (6.4 % of the row's largest logit), flips 4 of 90 argmaxes and changes 4 of 5
//! greedy continuations when only its K/V cache goes from f16 to f32. The bands below are set
//! from that and from what we measure (see PROVENANCE.md).

use std::path::{Path, PathBuf};

use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;
use serde_json::Value;

/// Largest |ours − llama.cpp| allowed on any compared logit (top-20 and fixed ids, every position).
const MAX_ABS: f32 = 2.5;
/// Largest |ours − llama.cpp| relative to the row's largest compared |logit|.
const MAX_REL: f32 = 0.12;
/// Largest mean |ours − llama.cpp| over all compared logits.
const MAX_MEAN_ABS: f32 = 0.35;
/// A differing top token is accepted only at a near tie: the two candidates' logits differ by
/// less than this on the side that chose the other one. llama.cpp's own argmax flips between an
/// f16 and an f32 K/V cache happen at gaps up to 0.37.
const NEAR_TIE: f32 = 0.5;

fn plugin_dir() -> PathBuf {
    std::env::var_os("BLOOMERY_TEST_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../target/debug/plugins")
        })
}

/// The fixtures: llama.cpp with its default f16 K/V cache, with an f32 one, and with a Q8_0 one
/// (`-ctk q8_0 -ctv q8_0`); ours runs with the same cache type. (The Q4_0 fixture beside them is
/// not checked yet: ours lies outside these bands there, see PROVENANCE.md.)
const CASES: [(&str, DType); 3] = [
    ("gemma3_270m_golden.json", DType::F16),
    ("gemma3_270m_golden_kvf32.json", DType::F32),
    ("gemma3_270m_golden_kvq8_0.json", DType::Q8_0),
];

/// The fixtures this build runs: a debug build (about 7 minutes per fixture on two cores) runs
/// only llama.cpp's default, f16; a release build (seconds) runs them all.
fn cases() -> &'static [(&'static str, DType)] {
    if cfg!(debug_assertions) {
        println!("debug build: the f32 and quantized K/V fixtures run in release builds only");
        &CASES[..1]
    } else {
        &CASES
    }
}

fn golden(file: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<i32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap() as i32)
        .collect()
}

fn load(model: &Path, kv_type: DType) -> LoadedModel {
    let reg = Registry::load(&plugin_dir()).expect("plugin folder (run `cargo xtask plugins`)");
    let opts = LoadOptions {
        n_slots: 1,
        ctx_per_slot: 256,
        kv_type_k: kv_type,
        kv_type_v: kv_type,
        threads: 0,
        graphs: true,
        mlock: false,
        overrides: &[],
        check_tensors: false,
        draft_n_max: 0,
        draft_history: false,
    };
    LoadedModel::load(&reg, model, opts).unwrap()
}

/// The best and second-best ids of a row.
fn top2(row: &[f32]) -> (usize, usize) {
    let (mut a, mut b) = (0, 1);
    if row[b] > row[a] {
        (a, b) = (b, a);
    }
    for (i, &v) in row.iter().enumerate().skip(2) {
        if v > row[a] {
            (a, b) = (i, a);
        } else if v > row[b] {
            b = i;
        }
    }
    (a, b)
}

/// Logits of `tokens` at positions `start..`, every row an output.
fn forward(m: &mut LoadedModel, tokens: &[i32], start: i32) -> Vec<f32> {
    let n = tokens.len() as i32;
    m.forward(&BatchInputs {
        tokens: tokens.to_vec(),
        positions: (start..start + n).collect(),
        slots: vec![0; tokens.len()],
        output_rows: (0..n).collect(),
        ngram_rows: vec![],
        logit_rows: vec![],
    })
    .unwrap()
}

fn model_path() -> Option<PathBuf> {
    let p = std::env::var_os("BLOOMERY_GEMMA3").map(PathBuf::from);
    if p.is_none() {
        println!("skipped: BLOOMERY_GEMMA3 not set");
    }
    p
}

#[test]
fn logits_match_llama_cpp_at_every_position() {
    let Some(path) = model_path() else { return };
    let mut failures = Vec::new();
    for &(file, kv) in cases() {
        let g = golden(file);
        let mut m = load(&path, kv);
        let vocab = m.spec.hparams.n_vocab as usize;
        assert_eq!(vocab as u64, g["n_vocab"].as_u64().unwrap());
        let fixed = ids(&g["fixed_ids"]);
        let (mut worst_abs, mut worst_rel, mut sum_abs, mut n_vals) = (0f32, 0f32, 0f64, 0usize);
        let (mut n_pos, mut n_argmax) = (0, 0);
        for (si, s) in g["sequences"].as_array().unwrap().iter().enumerate() {
            let out = forward(&mut m, &ids(&s["ids"]), 0);
            for (p, want) in s["positions"].as_array().unwrap().iter().enumerate() {
                let row = &out[p * vocab..(p + 1) * vocab];
                let top: Vec<(usize, f32)> = want["top"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| {
                        (
                            t[0].as_u64().unwrap() as usize,
                            t[1].as_f64().unwrap() as f32,
                        )
                    })
                    .collect();
                n_pos += 1;
                let ours = top2(row).0;
                let theirs = want["argmax"].as_u64().unwrap() as usize;
                if ours == theirs {
                    n_argmax += 1;
                } else {
                    // A near tie on llama.cpp's side: our pick is within NEAR_TIE of its best.
                    let their_best = top[0].1;
                    let their_ours = top.iter().find(|t| t.0 == ours).map(|t| t.1);
                    let near = their_ours.is_some_and(|v| their_best - v < NEAR_TIE);
                    println!(
                        "{file} seq {si} pos {p}: argmax {ours} ({:.3}), llama.cpp {theirs} \
                         ({their_best:.3}, gives ours {their_ours:?}); near tie: {near}",
                        row[ours]
                    );
                    if !near {
                        failures.push(format!("{file} seq {si} pos {p}: argmax differs"));
                    }
                }
                let mut pairs = top;
                for (id, v) in fixed.iter().zip(want["fixed"].as_array().unwrap()) {
                    pairs.push((*id as usize, v.as_f64().unwrap() as f32));
                }
                let scale = pairs.iter().fold(1e-6f32, |a, &(_, v)| a.max(v.abs()));
                for (id, v) in pairs {
                    let d = (row[id] - v).abs();
                    worst_abs = worst_abs.max(d);
                    worst_rel = worst_rel.max(d / scale);
                    sum_abs += f64::from(d);
                    n_vals += 1;
                }
            }
        }
        let mean_abs = (sum_abs / n_vals as f64) as f32;
        println!(
            "{file} (kv {kv}): argmax {n_argmax}/{n_pos}, max abs {worst_abs:.4}, max rel \
             {worst_rel:.5}, mean abs {mean_abs:.4}"
        );
        if worst_abs > MAX_ABS || worst_rel > MAX_REL || mean_abs > MAX_MEAN_ABS {
            failures.push(format!(
                "{file}: max abs {worst_abs} (band {MAX_ABS}), max rel {worst_rel} (band \
                 {MAX_REL}), mean abs {mean_abs} (band {MAX_MEAN_ABS})"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    let Some(path) = model_path() else { return };
    let mut failures = Vec::new();
    for &(file, kv) in cases() {
        let g = golden(file);
        let mut m = load(&path, kv);
        let vocab = m.spec.hparams.n_vocab as usize;
        let cases = g["greedy"].as_array().unwrap();
        let mut matched = 0;
        for (ci, c) in cases.iter().enumerate() {
            let prompt = ids(&c["ids"]);
            let want = ids(&c["continuation"]);
            let out = forward(&mut m, &prompt, 0);
            let mut row = out[(prompt.len() - 1) * vocab..].to_vec();
            let mut pos = prompt.len() as i32;
            let mut diverged = None;
            for (step, &theirs) in want.iter().enumerate() {
                let (a, b) = top2(&row);
                if a as i32 != theirs {
                    // Accepted only at a near tie: llama.cpp's token is within NEAR_TIE of ours.
                    let gap = row[a] - row[theirs as usize];
                    diverged = Some((step, a, b, theirs, gap, gap < NEAR_TIE));
                    break;
                }
                if step + 1 < want.len() {
                    row = forward(&mut m, &[theirs], pos);
                    pos += 1;
                }
            }
            match diverged {
                None => matched += 1,
                Some((step, ours, runner_up, theirs, gap, near)) => {
                    println!(
                        "{file} case {ci}: diverges at step {step}: ours {ours} (runner-up \
                         {runner_up}), llama.cpp {theirs}, our logit gap {gap:.3}; near tie: {near}"
                    );
                    if !near {
                        failures.push(format!("{file} case {ci}: greedy diverges at step {step}"));
                    }
                }
            }
        }
        println!(
            "{file} (kv {kv}): greedy continuations matched {matched}/{}",
            cases.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
