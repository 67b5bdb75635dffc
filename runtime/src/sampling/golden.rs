//! The chain against llama.cpp's own samplers: candidates kept and their probabilities for fixed
//! logits (goldens from `tests/oracle/sampling_llama_cpp.py`, see
//! `runtime/tests/fixtures/sampling_PROVENANCE.md`).

use super::{Sampler, SamplerParams};

const GOLDENS: &str = include_str!("../../tests/fixtures/sampling_goldens.json");

/// One golden: its name, parameters, logits, penalty history, and llama.cpp's kept ids with
/// their probabilities, best first.
struct Case {
    name: String,
    params: SamplerParams,
    logits: Vec<f32>,
    history: Vec<u32>,
    want_ids: Vec<u32>,
    want_p: Vec<f64>,
}

fn cases() -> Vec<Case> {
    let doc: serde_json::Value = serde_json::from_str(GOLDENS).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    cases
        .iter()
        .map(|case| {
            let name = case["name"].as_str().unwrap().to_owned();
            let p = &case["params"];
            let f = |k: &str| p[k].as_f64().unwrap() as f32;
            let params = SamplerParams {
                top_k: p["top_k"].as_i64().unwrap() as i32,
                typ_p: f("typ_p"),
                top_p: f("top_p"),
                min_p: f("min_p"),
                temp: f("temp"),
                penalty_last_n: p["penalty_last_n"].as_u64().unwrap() as usize,
                penalty_repeat: f("penalty_repeat"),
                penalty_freq: f("penalty_freq"),
                penalty_present: f("penalty_present"),
                min_keep: p["min_keep"].as_u64().unwrap() as usize,
                ..SamplerParams::default()
            };
            let logits: Vec<f32> = case["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let history = case["history"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            let want_ids: Vec<u32> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let want_p: Vec<f64> = case["probs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            Case {
                name,
                params,
                logits,
                history,
                want_ids,
                want_p,
            }
        })
        .collect()
}

fn sampler(case: &Case) -> Sampler {
    let mut s = Sampler::new(case.params.clone(), case.logits.len());
    for &t in &case.history {
        s.accept(t);
    }
    s
}

#[test]
fn kept_candidates_and_probabilities_match_llama_cpp() {
    for case in cases() {
        let Case {
            name,
            params,
            logits,
            want_ids,
            want_p,
            ..
        } = &case;
        let mut s = sampler(&case);
        let got = s.candidates(logits);
        let kept: Vec<_> = got.data.iter().filter(|t| t.p > 0.0).collect();
        let ids: Vec<u32> = kept.iter().map(|t| t.id).collect();
        assert_eq!(&ids, want_ids, "{name}: kept ids");
        for (t, w) in kept.iter().zip(want_p) {
            assert!(
                (f64::from(t.p) - w).abs() < 1e-6,
                "{name}: token {} p {} vs llama.cpp {}",
                t.id,
                t.p,
                w
            );
        }
        if params.temp <= 0.0 {
            assert_eq!(s.sample(logits), want_ids[0], "{name}: greedy token");
        }
    }
}

/// llama-server's `post_sampling_probs` reads the candidates the draw left: after a draw, the
/// probabilities reported are llama.cpp's kept candidates, greedy included.
#[test]
fn drawn_probabilities_match_llama_cpp() {
    for case in cases() {
        let Case {
            name,
            want_ids,
            want_p,
            ..
        } = &case;
        let mut s = sampler(&case);
        s.keep_candidates();
        let id = s.sample(&case.logits);
        let n = 10;
        let (p, top) = s.drawn_probs(id, n);
        let at = want_ids
            .iter()
            .position(|&w| w == id)
            .expect("drawn a kept token");
        assert!(
            (f64::from(p) - want_p[at]).abs() < 1e-6,
            "{name}: drawn p {p} vs {}",
            want_p[at]
        );
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, want_ids[..want_ids.len().min(n)], "{name}: top ids");
        for ((_, p), w) in top.iter().zip(want_p) {
            assert!(
                (f64::from(*p) - w).abs() < 1e-6,
                "{name}: p {p} vs llama.cpp {w}"
            );
        }
    }
}
