//! Every sampler against llama.cpp's own on fixed logits: logit bias, DRY, XTC, top-n-sigma,
//! Mirostat v1 and v2, dynamic temperature, adaptive-p and the stage order, over several steps
//! (goldens from `tests/oracle/sampling_stages_llama_cpp.py`, see
//! `runtime/tests/fixtures/sampling_PROVENANCE.md`). Each step must leave the same candidates
//! with the same probabilities (within 1e-6) and draw the same token: the random numbers are
//! llama.cpp's.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::order::from_names;
use super::{DryBreakers, MirostatVersion, Sampler, SamplerParams};

const GOLDENS: &str = include_str!("../../tests/fixtures/sampling_stages.json");

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| match x.as_str() {
            Some("-inf") => f32::NEG_INFINITY,
            _ => x.as_f64().unwrap() as f32,
        })
        .collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn breakers(case: &Value, pieces: &[Vec<u8>]) -> DryBreakers {
    let tails: HashMap<String, Vec<u32>> = case["dry"]["tails"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), u32s(v)))
        .collect();
    let list: Vec<String> = case["params"]["dry_sequence_breakers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap().to_owned())
        .collect();
    DryBreakers::new(
        pieces.len(),
        |id| &pieces[id as usize],
        |s| {
            tails
                .get(s)
                .unwrap_or_else(|| panic!("no tail {s:?}"))
                .clone()
        },
        &list,
    )
}

fn params(case: &Value, pieces: &[Vec<u8>]) -> SamplerParams {
    let p = &case["params"];
    let f = |k: &str| p[k].as_f64().unwrap() as f32;
    let u = |k: &str| p[k].as_u64().unwrap() as usize;
    let names: Vec<&str> = p["samplers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let logit_bias = p["logit_bias"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            let b = f32s(&Value::Array(vec![pair[1].clone()]))[0];
            (pair[0].as_u64().unwrap() as u32, b)
        })
        .collect();
    SamplerParams {
        top_k: p["top_k"].as_i64().unwrap() as i32,
        typ_p: f("typ_p"),
        top_p: f("top_p"),
        min_p: f("min_p"),
        temp: f("temp"),
        dynatemp_range: f("dynatemp_range"),
        dynatemp_exponent: f("dynatemp_exponent"),
        penalty_last_n: u("penalty_last_n"),
        penalty_repeat: f("penalty_repeat"),
        penalty_freq: f("penalty_freq"),
        penalty_present: f("penalty_present"),
        dry_multiplier: f("dry_multiplier"),
        dry_base: f("dry_base"),
        dry_allowed_length: u("dry_allowed_length"),
        dry_penalty_last_n: u("dry_penalty_last_n"),
        dry_breakers: Arc::new(if case["dry"].is_null() {
            DryBreakers::default()
        } else {
            breakers(case, pieces)
        }),
        top_n_sigma: f("top_n_sigma"),
        xtc_probability: f("xtc_probability"),
        xtc_threshold: f("xtc_threshold"),
        mirostat: match u("mirostat") {
            0 => None,
            1 => Some(MirostatVersion::V1),
            _ => Some(MirostatVersion::V2),
        },
        mirostat_tau: f("mirostat_tau"),
        mirostat_eta: f("mirostat_eta"),
        adaptive_target: f("adaptive_target"),
        adaptive_decay: f("adaptive_decay"),
        logit_bias,
        order: from_names(&names).unwrap(),
        min_keep: u("min_keep"),
        seed: p["seed"].as_u64().unwrap(),
    }
}

#[test]
fn every_sampler_keeps_and_draws_as_llama_cpp_does() {
    let doc: Value = serde_json::from_str(GOLDENS).unwrap();
    let pieces: Vec<Vec<u8>> = doc["meta"]["dry_pieces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p.as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
                .collect()
        })
        .collect();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 30);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mut s = Sampler::new(
            params(case, &pieces),
            case["n_vocab"].as_u64().unwrap() as usize,
        );
        for t in u32s(&case["history"]) {
            s.accept(t);
        }
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let logits = f32s(&step["logits"]);
            let want_sel = step["selected"].as_u64().unwrap() as u32;
            let got_sel = s.sample(&logits);
            let want: HashMap<u32, f32> = u32s(&step["ids"])
                .into_iter()
                .zip(f32s(&step["probs"]))
                .collect();
            let got: HashMap<u32, f32> = s
                .cands
                .data
                .iter()
                .filter(|t| t.p > 0.0)
                .map(|t| (t.id, t.p))
                .collect();
            let mut ids: Vec<&u32> = want.keys().collect();
            ids.sort();
            let mut got_ids: Vec<&u32> = got.keys().collect();
            got_ids.sort();
            if ids != got_ids {
                failures.push(format!(
                    "{name} step {i}: kept {} tokens, llama.cpp {} ({:?} vs {:?})",
                    got.len(),
                    want.len(),
                    &got_ids[..got_ids.len().min(8)],
                    &ids[..ids.len().min(8)]
                ));
            } else if let Some((id, p)) = want.iter().find(|(id, p)| (got[id] - **p).abs() > 1e-6) {
                failures.push(format!(
                    "{name} step {i}: token {id} p {} vs llama.cpp {p}",
                    got[id]
                ));
            }
            if got_sel != want_sel {
                failures.push(format!(
                    "{name} step {i}: drew {got_sel}, llama.cpp {want_sel}"
                ));
            }
            s.accept(want_sel);
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
