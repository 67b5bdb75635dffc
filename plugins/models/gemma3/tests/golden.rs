//! gemma-3-270m Q4_K_M on the CPU plugins against llama.cpp's logits and greedy continuations
//! (tests/fixtures/gemma3_270m_golden.json, made by make_gemma3_golden.py; see PROVENANCE.md).
//! Runs when `BLOOMERY_GEMMA3` names the model file; the plugin folder comes from
//! `BLOOMERY_TEST_PLUGIN_DIR` (else `target/debug/plugins`).

use std::path::{Path, PathBuf};

use bloomery::engine::executor::BatchInputs;
use bloomery::model::{LoadOptions, LoadedModel};
use bloomery::plugins::Registry;
use bloomery_plugin_api::DType;
use serde_json::Value;

/// Largest |ours − llama.cpp| allowed on any compared logit (top-20 and fixed ids, every position).
const MAX_ABS: f32 = 0.5;
/// Largest |ours − llama.cpp| relative to the row's largest |logit|.
const MAX_REL: f32 = 0.02;

fn plugin_dir() -> PathBuf {
    std::env::var_os("BLOOMERY_TEST_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../target/debug/plugins")
        })
}

fn golden() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3_270m_golden.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<i32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap() as i32)
        .collect()
}

fn load(model: &Path) -> LoadedModel {
    let reg = Registry::load(&plugin_dir()).expect("plugin folder (run `cargo xtask plugins`)");
    let opts = LoadOptions {
        n_slots: 1,
        ctx_per_slot: 256,
        kv_type: DType::F16,
        threads: 0,
    };
    LoadedModel::load(&reg, model, opts).unwrap()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Logits of `tokens` at positions `start..`, every row an output.
fn forward(m: &mut LoadedModel, tokens: &[i32], start: i32) -> Vec<f32> {
    let n = tokens.len() as i32;
    m.forward(&BatchInputs {
        tokens: tokens.to_vec(),
        positions: (start..start + n).collect(),
        slots: vec![0; tokens.len()],
        output_rows: (0..n).collect(),
        history: vec![],
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
    let g = golden();
    let mut m = load(&path);
    let vocab = m.spec.hparams.n_vocab as usize;
    assert_eq!(vocab as u64, g["n_vocab"].as_u64().unwrap());
    let fixed = ids(&g["fixed_ids"]);
    let (mut worst_abs, mut worst_rel, mut n_pos, mut n_argmax) = (0f32, 0f32, 0, 0);
    let mut failures = Vec::new();
    for (si, s) in g["sequences"].as_array().unwrap().iter().enumerate() {
        let toks = ids(&s["ids"]);
        let out = forward(&mut m, &toks, 0);
        for (p, want) in s["positions"].as_array().unwrap().iter().enumerate() {
            let row = &out[p * vocab..(p + 1) * vocab];
            n_pos += 1;
            let want_arg = want["argmax"].as_u64().unwrap() as usize;
            if argmax(row) == want_arg {
                n_argmax += 1;
            } else {
                failures.push(format!(
                    "seq {si} pos {p}: argmax {} ({}), llama.cpp {want_arg} ({})",
                    argmax(row),
                    row[argmax(row)],
                    row[want_arg]
                ));
            }
            let mut pairs: Vec<(usize, f32)> = want["top"]
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
            for (id, v) in fixed.iter().zip(want["fixed"].as_array().unwrap()) {
                pairs.push((*id as usize, v.as_f64().unwrap() as f32));
            }
            let scale = pairs.iter().fold(1e-6f32, |a, &(_, v)| a.max(v.abs()));
            for (id, v) in pairs {
                let d = (row[id] - v).abs();
                worst_abs = worst_abs.max(d);
                worst_rel = worst_rel.max(d / scale);
            }
        }
    }
    println!(
        "gemma3 vs llama.cpp: argmax {n_argmax}/{n_pos}, max abs {worst_abs:.4}, max rel {worst_rel:.5}"
    );
    assert!(
        failures.is_empty(),
        "argmax mismatches:\n{}",
        failures.join("\n")
    );
    assert!(
        worst_abs <= MAX_ABS,
        "max abs logit difference {worst_abs} > {MAX_ABS}"
    );
    assert!(
        worst_rel <= MAX_REL,
        "max rel logit difference {worst_rel} > {MAX_REL}"
    );
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    let Some(path) = model_path() else { return };
    let g = golden();
    let mut m = load(&path);
    let vocab = m.spec.hparams.n_vocab as usize;
    let mut matched = 0;
    let mut report = Vec::new();
    let cases = g["greedy"].as_array().unwrap();
    for (ci, c) in cases.iter().enumerate() {
        let prompt = ids(&c["ids"]);
        let want = ids(&c["continuation"]);
        let out = forward(&mut m, &prompt, 0);
        let mut next = argmax(&out[(prompt.len() - 1) * vocab..]) as i32;
        let mut got = Vec::with_capacity(want.len());
        let mut pos = prompt.len() as i32;
        loop {
            got.push(next);
            if got.len() == want.len() {
                break;
            }
            next = argmax(&forward(&mut m, &[next], pos)) as i32;
            pos += 1;
        }
        if got == want {
            matched += 1;
        } else {
            report.push(format!(
                "case {ci}: ours {got:?}\n        llama.cpp {want:?}"
            ));
        }
    }
    println!("greedy continuations matched: {matched}/{}", cases.len());
    assert!(report.is_empty(), "{}", report.join("\n"));
}
