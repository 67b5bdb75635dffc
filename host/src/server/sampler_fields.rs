//! The request fields of the samplers beyond the basic ones, as llama-server reads them (b11434's
//! completion schema): `dynatemp_range`, `dynatemp_exponent`, `top_n_sigma`, `xtc_probability`,
//! `xtc_threshold`, `dry_multiplier`, `dry_base`, `dry_allowed_length`, `dry_penalty_last_n`,
//! `dry_sequence_breakers`, `mirostat`, `mirostat_tau`, `mirostat_eta`, `adaptive_target`,
//! `adaptive_decay`, `logit_bias` and `samplers`. Soft limits clamp, hard ones are a 400; a
//! malformed `logit_bias` entry or an unknown sampler name is a 400 that names it (llama-server
//! skips them with a log line).

use serde_json::Value;

use super::error::ApiError;
use super::params::{Defaults, Fields, I32_MAX};
use crate::flags::sampling::dry_breakers;
use bloomery_runtime::sampling::order::{from_letters, from_names};
use bloomery_runtime::sampling::{MirostatVersion, SamplerParams};

/// Sets the fields present in the request on `s` (which holds the server's defaults).
pub fn apply(f: &Fields<'_>, d: &Defaults, s: &mut SamplerParams) -> Result<(), ApiError> {
    let num = |key: &str, v: &mut f32, min: f64, max: f64| -> Result<(), ApiError> {
        if let Some(x) = f.f64(key)? {
            *v = x.clamp(min, max) as f32;
        }
        Ok(())
    };
    let any = f64::MAX;
    num("dynatemp_range", &mut s.dynatemp_range, -any, any)?;
    num("dynatemp_exponent", &mut s.dynatemp_exponent, -any, any)?;
    num("top_n_sigma", &mut s.top_n_sigma, -any, any)?;
    num("xtc_probability", &mut s.xtc_probability, 0.0, 1.0)?;
    num("xtc_threshold", &mut s.xtc_threshold, 0.0, 1.0)?;
    num("dry_multiplier", &mut s.dry_multiplier, -any, any)?;
    if let Some(b) = f.f64("dry_base")? {
        // Below 1, the server's default (llama-server's rule).
        s.dry_base = if b < 1.0 {
            d.sampler.dry_base
        } else {
            b as f32
        };
    }
    if let Some(n) = f.int_in("dry_allowed_length", 0, I32_MAX)? {
        s.dry_allowed_length = n as usize;
    }
    if let Some(n) = f.int_in("dry_penalty_last_n", 0, I32_MAX)? {
        s.dry_penalty_last_n = n as usize;
    }
    if let Some(m) = f.i64("mirostat")? {
        s.mirostat = match m.clamp(0, 2) {
            0 => None,
            1 => Some(MirostatVersion::V1),
            _ => Some(MirostatVersion::V2),
        };
    }
    num("mirostat_tau", &mut s.mirostat_tau, -any, any)?;
    num("mirostat_eta", &mut s.mirostat_eta, -any, any)?;
    num("adaptive_target", &mut s.adaptive_target, -any, 1.0)?;
    if let Some(x) = f.f64("adaptive_decay")? {
        if !(0.0..=0.99).contains(&x) {
            return Err(ApiError::invalid(format!(
                "\"adaptive_decay\" must be between 0 and 0.99, got {x}"
            )));
        }
        s.adaptive_decay = x as f32;
    }
    if let Some(v) = f.get("dry_sequence_breakers") {
        let list: Option<Vec<String>> = v
            .as_array()
            .and_then(|a| a.iter().map(|b| b.as_str().map(str::to_owned)).collect());
        match list {
            Some(list) if !list.is_empty() => {
                if s.dry_multiplier != 0.0 {
                    s.dry_breakers = dry_breakers(&d.tok, d.n_vocab, &list);
                }
            }
            _ => {
                return Err(ApiError::invalid(
                    "\"dry_sequence_breakers\" must be a non-empty array of strings",
                ))
            }
        }
    }
    if let Some(v) = f.get("logit_bias") {
        s.logit_bias = logit_bias(v, d)?;
    }
    match f.get("samplers") {
        None => {}
        Some(Value::String(letters)) => {
            s.order = from_letters(letters)
                .map_err(|e| ApiError::invalid(format!("\"samplers\": {e}")))?;
        }
        Some(Value::Array(names)) => {
            let names: Option<Vec<&str>> = names.iter().map(Value::as_str).collect();
            let names = names.ok_or_else(|| {
                ApiError::invalid("\"samplers\" must be an array of names or a string of letters")
            })?;
            s.order =
                from_names(&names).map_err(|e| ApiError::invalid(format!("\"samplers\": {e}")))?;
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "\"samplers\" must be an array of names or a string of letters",
            ))
        }
    }
    Ok(())
}

/// `logit_bias` as llama-server reads it: `[[token, bias], ...]` or `{"token": bias, ...}`,
/// a token given by id or as text (every token of its tokenization, no special tokens), a bias
/// a number or `false` (banned).
fn logit_bias(v: &Value, d: &Defaults) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |why: String| ApiError::invalid(format!("\"logit_bias\": {why}"));
    let bias_of = |b: &Value| match b {
        Value::Bool(false) => Ok(f32::NEG_INFINITY),
        _ => b
            .as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| bad(format!("bias {b} must be a number or false"))),
    };
    let id = |t: i64| {
        u32::try_from(t)
            .ok()
            .filter(|&t| (t as usize) < d.n_vocab)
            .ok_or_else(|| {
                bad(format!(
                    "token {t} is outside the vocabulary of {}",
                    d.n_vocab
                ))
            })
    };
    let text = |t: &str| {
        d.tok
            .encode(t, false, false)
            .map_err(|e| bad(format!("{t:?}: {e}")))
    };
    let mut out = Vec::new();
    match v {
        Value::Array(pairs) => {
            for pair in pairs {
                let (token, b) = match pair.as_array().map(Vec::as_slice) {
                    Some([token, b]) => (token, b),
                    _ => return Err(bad(format!("{pair} is not a [token, bias] pair"))),
                };
                let bias = bias_of(b)?;
                match token {
                    Value::String(t) => out.extend(text(t)?.into_iter().map(|t| (t, bias))),
                    _ => {
                        let t = token
                            .as_i64()
                            .ok_or_else(|| bad(format!("token {token} must be an id or a text")))?;
                        out.push((id(t)?, bias));
                    }
                }
            }
        }
        Value::Object(map) => {
            for (key, b) in map {
                let bias = bias_of(b)?;
                match key.parse::<i64>() {
                    Ok(t) => out.push((id(t)?, bias)),
                    Err(_) => out.extend(text(key)?.into_iter().map(|t| (t, bias))),
                }
            }
        }
        _ => {
            return Err(bad(
                "must be an array of [token, bias] pairs or an object".into()
            ))
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::params::tests::toy_tokenizer;
    use super::*;
    use bloomery_runtime::sampling::{Stage, DEFAULT_ORDER};
    use serde_json::json;
    use std::sync::Arc;

    fn defaults() -> Defaults {
        Defaults {
            sampler: SamplerParams::default(),
            seed: Some(1),
            n_predict: None,
            ignore_eos: false,
            special: false,
            stop: Vec::new(),
            cache_prompt: true,
            n_keep: 0,
            n_cache_reuse: 0,
            no_shift: None,
            tok: Arc::new(toy_tokenizer()),
            grammar: None,
            sse_ping_interval: 30,
            n_vocab: 300,
            budget: Default::default(),
        }
    }

    fn parsed(body: Value) -> Result<SamplerParams, ApiError> {
        let d = defaults();
        let mut s = d.sampler.clone();
        apply(&Fields::of(&body).unwrap(), &d, &mut s)?;
        Ok(s)
    }

    #[test]
    fn every_field_reaches_the_sampler() {
        let s = parsed(json!({
            "dynatemp_range": 0.5, "dynatemp_exponent": 2, "top_n_sigma": 1.5,
            "xtc_probability": 0.3, "xtc_threshold": 0.2, "dry_multiplier": 0.8, "dry_base": 2,
            "dry_allowed_length": 3, "dry_penalty_last_n": 32, "mirostat": 2, "mirostat_tau": 4,
            "mirostat_eta": 0.2, "adaptive_target": 0.4, "adaptive_decay": 0.5,
            "samplers": ["top_k", "temperature"]
        }))
        .unwrap();
        assert_eq!(
            (
                s.dynatemp_range,
                s.dynatemp_exponent,
                s.top_n_sigma,
                s.xtc_probability,
                s.xtc_threshold
            ),
            (0.5, 2.0, 1.5, 0.3, 0.2)
        );
        assert_eq!(
            (
                s.dry_multiplier,
                s.dry_base,
                s.dry_allowed_length,
                s.dry_penalty_last_n
            ),
            (0.8, 2.0, 3, 32)
        );
        assert_eq!(
            (
                s.mirostat,
                s.mirostat_tau,
                s.mirostat_eta,
                s.adaptive_target,
                s.adaptive_decay
            ),
            (Some(MirostatVersion::V2), 4.0, 0.2, 0.4, 0.5)
        );
        assert_eq!(s.order, [Stage::TopK, Stage::Temperature]);
        assert_eq!(
            parsed(json!({"samplers": "kt"})).unwrap().order,
            [Stage::TopK, Stage::Temperature]
        );
        assert_eq!(parsed(json!({})).unwrap().order, DEFAULT_ORDER);
    }

    #[test]
    fn limits_clamp_or_refuse_as_llama_server_does() {
        let s = parsed(json!({"mirostat": 7, "xtc_probability": 3, "dry_base": 0.5,
                              "adaptive_target": 4}))
        .unwrap();
        assert_eq!(s.mirostat, Some(MirostatVersion::V2));
        assert_eq!(
            (s.xtc_probability, s.dry_base, s.adaptive_target),
            (1.0, 1.75, 1.0)
        );
        for (body, name) in [
            (json!({"adaptive_decay": 1.5}), "adaptive_decay"),
            (json!({"dry_allowed_length": -1}), "dry_allowed_length"),
            (json!({"dry_penalty_last_n": -1}), "dry_penalty_last_n"),
            (json!({"dry_multiplier": "x"}), "dry_multiplier"),
            (
                json!({"dry_sequence_breakers": []}),
                "dry_sequence_breakers",
            ),
            (
                json!({"dry_sequence_breakers": "\n"}),
                "dry_sequence_breakers",
            ),
            (json!({"samplers": ["top_k", "nope"]}), "nope"),
            (json!({"samplers": "kz"}), "samplers"),
            (json!({"samplers": 3}), "samplers"),
            (json!({"logit_bias": [[1]]}), "logit_bias"),
            (json!({"logit_bias": [[1, true]]}), "logit_bias"),
            (json!({"logit_bias": {"300": 1}}), "300"),
            (json!({"logit_bias": [[-1, 1]]}), "-1"),
            (json!({"logit_bias": 5}), "logit_bias"),
        ] {
            let e = parsed(body.clone()).unwrap_err();
            assert!(
                e.status.as_u16() == 400 && e.message.contains(name),
                "{body}: {}",
                e.message
            );
        }
    }

    #[test]
    fn logit_bias_takes_ids_texts_and_false() {
        let s = parsed(json!({"logit_bias": [[5, 1.5], ["ab", -2], [7, false]]})).unwrap();
        assert_eq!(
            s.logit_bias,
            [(5, 1.5), (256, -2.0), (7, f32::NEG_INFINITY)]
        );
        // OpenAI's form: token ids as keys; a key that is no number is a text.
        let s = parsed(json!({"logit_bias": {"12": -100, "ab": 3}})).unwrap();
        assert_eq!(s.logit_bias, [(12, -100.0), (256, 3.0)]);
    }

    #[test]
    fn request_breakers_are_processed_when_dry_is_on() {
        let s = parsed(json!({"dry_multiplier": 1, "dry_sequence_breakers": ["b"]})).unwrap();
        // `b` (98) breaks alone, and `ab` (256) holds it.
        let d = defaults();
        let want = dry_breakers(&d.tok, 300, &["b".to_owned()]);
        assert_eq!(s.dry_breakers, want);
        assert!(!want.is_empty());
    }
}
