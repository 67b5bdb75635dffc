//! The chain against llama.cpp's own samplers: candidates kept and their probabilities for fixed
//! logits (goldens from `tests/oracle/sampling_llama_cpp.py`, see `host/tests/fixtures/sampling_PROVENANCE.md`).

use super::{Sampler, SamplerParams};

const GOLDENS: &str = include_str!("../../tests/fixtures/sampling_goldens.json");

#[test]
fn kept_candidates_and_probabilities_match_llama_cpp() {
    let doc: serde_json::Value = serde_json::from_str(GOLDENS).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let name = case["name"].as_str().unwrap();
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
        let mut s = Sampler::new(params.clone(), logits.len());
        for t in case["history"].as_array().unwrap() {
            s.accept(t.as_u64().unwrap() as u32);
        }
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
        let got = s.candidates(&logits);
        let kept: Vec<_> = got.data.iter().filter(|t| t.p > 0.0).collect();
        let ids: Vec<u32> = kept.iter().map(|t| t.id).collect();
        assert_eq!(ids, want_ids, "{name}: kept ids");
        for (t, w) in kept.iter().zip(&want_p) {
            assert!(
                (f64::from(t.p) - w).abs() < 1e-6,
                "{name}: token {} p {} vs llama.cpp {}",
                t.id,
                t.p,
                w
            );
        }
        if params.temp <= 0.0 {
            assert_eq!(s.sample(&logits), want_ids[0], "{name}: greedy token");
        }
    }
}
