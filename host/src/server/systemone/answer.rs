//! A decision's answers from its option scores, as llama-server b11434 writes them: `p =
//! softmax(score / T)` per question with the file's temperature for the question's type and
//! option count (1 without one); noul `{noul: p(true)}`, choice `{choice, probabilities,
//! confidence}`, score `{score: Σ i·pᵢ, legend, probabilities, confidence}`.
//!
//! Confidence is llama.cpp's (the formulas it attributes to TypeSafe): a choice's `(p_max − 1/n) /
//! (1 − 1/n)`, a score's `1 − E|i − mode| / E_uniform|i − centre|`, each at least 0. Two other
//! conventions exist: the seed release's `max p`, and Ollama's `1 − H/ln n`.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::request::{Kind, Question};

/// `{arch}.decision.temperature.<type>[.<bucket>]` values by `<type>[.<bucket>]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Temperatures(pub HashMap<String, f32>);

impl Temperatures {
    /// The temperature of `q`: its type and option-count bucket (`2`, `3_5`, `6_10`, `11`), else
    /// its type, else 1.
    pub fn of(&self, q: &Question) -> f32 {
        let n = q.options.len();
        let bucket = match n {
            0..=2 => "2",
            3..=5 => "3_5",
            6..=10 => "6_10",
            _ => "11",
        };
        let ty = q.kind.name();
        self.0
            .get(&format!("{ty}.{bucket}"))
            .or_else(|| self.0.get(ty))
            .copied()
            .unwrap_or(1.0)
    }
}

/// Softmax of `scores / t` in f64.
pub fn probabilities(scores: &[f32], t: f32) -> Vec<f64> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = scores
        .iter()
        .map(|&s| (f64::from(s - max) / f64::from(t)).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

fn argmax(p: &[f64]) -> usize {
    // The first of equal maxima, as std::max_element picks.
    let mut best = 0;
    for (i, &x) in p.iter().enumerate() {
        if x > p[best] {
            best = i;
        }
    }
    best
}

fn confidence_choice(p: &[f64]) -> f64 {
    if p.len() < 2 {
        return 1.0;
    }
    let uniform = 1.0 / p.len() as f64;
    ((p[argmax(p)] - uniform) / (1.0 - uniform)).max(0.0)
}

fn confidence_score(p: &[f64]) -> f64 {
    let n = p.len();
    if n < 2 {
        return 1.0;
    }
    let mode = argmax(p) as f64;
    let centre = (n as f64 - 1.0) / 2.0;
    let dist: f64 = p
        .iter()
        .enumerate()
        .map(|(i, x)| x * (i as f64 - mode).abs())
        .sum();
    let uniform: f64 = (0..n).map(|i| (i as f64 - centre).abs() / n as f64).sum();
    (1.0 - dist / uniform).max(0.0)
}

/// The answer to `q` from its options' scores.
pub fn answer(q: &Question, scores: &[f32], temps: &Temperatures) -> Value {
    let p = probabilities(scores, temps.of(q));
    let mut out = Map::new();
    out.insert("type".into(), json!(q.kind.name()));
    if q.kind == Kind::Noul {
        let yes = q.options.iter().position(|o| o.key == "true").unwrap_or(0);
        out.insert("noul".into(), json!(p[yes]));
        return Value::Object(out);
    }
    let probs: Map<String, Value> = q
        .options
        .iter()
        .zip(&p)
        .map(|(o, x)| (o.key.clone(), json!(x)))
        .collect();
    if q.kind == Kind::Choice {
        out.insert("choice".into(), json!(q.options[argmax(&p)].key));
        out.insert("probabilities".into(), Value::Object(probs));
        out.insert("confidence".into(), json!(confidence_choice(&p)));
    } else {
        let expected: f64 = p.iter().enumerate().map(|(i, x)| i as f64 * x).sum();
        let legend: Map<String, Value> = q
            .options
            .iter()
            .map(|o| (o.key.clone(), o.description.clone()))
            .collect();
        out.insert("score".into(), json!(expected));
        out.insert("legend".into(), Value::Object(legend));
        out.insert("probabilities".into(), Value::Object(probs));
        out.insert("confidence".into(), json!(confidence_score(&p)));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_is_zero_when_uniform_and_one_when_certain() {
        assert_eq!(confidence_choice(&[0.5, 0.5]), 0.0);
        assert!((confidence_choice(&[1.0, 0.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!((confidence_score(&[0.0, 1.0, 0.0]) - 1.0).abs() < 1e-12);
        let p = probabilities(&[1.0, 1.0], 2.0);
        assert_eq!(p, vec![0.5, 0.5]);
    }
}
