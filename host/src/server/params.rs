//! Request fields shared by every route: sampling, limits, stop strings, probabilities and the
//! grammar (`structured.rs`), under
//! llama-server's native names and their OpenAI and Anthropic spellings. A field of the wrong type
//! is a 400 that names it.

use serde_json::{Map, Value};

use super::error::ApiError;
use bloomery_runtime::request::GenParams;
use bloomery_runtime::sampling::SamplerParams;

/// Server-wide defaults a request starts from (from the command line).
#[derive(Clone, Debug)]
pub struct Defaults {
    /// Sampler settings; `seed` is unused (see `seed`).
    pub sampler: SamplerParams,
    /// Default seed (`None`: random per request).
    pub seed: Option<u64>,
    /// Default generation limit (`None`: unbounded).
    pub n_predict: Option<usize>,
}

/// A JSON object's fields with typed, named access.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl<'a> Fields<'a> {
    /// The body as an object, or a 400.
    pub fn of(body: &'a Value) -> Result<Self, ApiError> {
        body.as_object()
            .map(Fields)
            .ok_or_else(|| ApiError::invalid("the request body must be a JSON object"))
    }

    /// The raw value of `key` (absent and null are the same).
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn wrong(key: &str, want: &str) -> ApiError {
        ApiError::invalid(format!("\"{key}\" must be {want}"))
    }

    /// A number field.
    pub fn f64(&self, key: &str) -> Result<Option<f64>, ApiError> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| Self::wrong(key, "a number")))
            .transpose()
    }

    /// An integer field.
    pub fn i64(&self, key: &str) -> Result<Option<i64>, ApiError> {
        self.get(key)
            .map(|v| {
                v.as_i64()
                    .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
                    .ok_or_else(|| Self::wrong(key, "an integer"))
            })
            .transpose()
    }

    /// A boolean field.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| Self::wrong(key, "true or false")))
            .transpose()
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| Self::wrong(key, "a string")))
            .transpose()
    }

    /// A string or an array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<String>, ApiError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| Self::wrong(key, "a string or an array of strings"))
                })
                .collect(),
            Some(_) => Err(Self::wrong(key, "a string or an array of strings")),
        }
    }
}

/// The generation settings of a request body over the server's defaults. `n_probs` comes from
/// the caller (its spelling differs per API).
pub fn gen_params(f: &Fields<'_>, d: &Defaults, n_probs: usize) -> Result<GenParams, ApiError> {
    let mut s = d.sampler;
    let num = |key: &str, v: &mut f32| -> Result<(), ApiError> {
        if let Some(x) = f.f64(key)? {
            *v = x as f32;
        }
        Ok(())
    };
    num("temperature", &mut s.temp)?;
    num("top_p", &mut s.top_p)?;
    num("min_p", &mut s.min_p)?;
    num("typical_p", &mut s.typ_p)?;
    num("repeat_penalty", &mut s.penalty_repeat)?;
    num("presence_penalty", &mut s.penalty_present)?;
    num("frequency_penalty", &mut s.penalty_freq)?;
    if let Some(k) = f.i64("top_k")? {
        s.top_k = k.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
    }
    if let Some(n) = f.i64("repeat_last_n")? {
        s.penalty_last_n = if n < 0 { usize::MAX } else { n as usize };
    }
    if let Some(n) = f.i64("min_keep")? {
        s.min_keep = n.max(0) as usize;
    }
    s.seed = match f.i64("seed")? {
        Some(seed) if seed >= 0 => seed as u64,
        _ => d.seed.unwrap_or_else(|| u64::from(rand::random::<u32>())),
    };
    let limit = match (
        f.i64("n_predict")?,
        f.i64("max_tokens")?,
        f.i64("max_completion_tokens")?,
    ) {
        (Some(n), _, _) | (None, Some(n), _) | (None, None, Some(n)) => {
            (n >= 0).then_some(n as usize)
        }
        (None, None, None) => d.n_predict,
    };
    let mut stop = f.strings("stop")?;
    stop.extend(f.strings("stop_sequences")?);
    Ok(GenParams {
        sampler: s,
        n_predict: limit,
        stop,
        n_probs,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        cache_prompt: f.bool("cache_prompt")?.unwrap_or(true),
        forced: Vec::new(),
        prompt_only: false,
        grammar: super::structured::grammar(f)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> Defaults {
        Defaults {
            sampler: SamplerParams::default(),
            seed: Some(7),
            n_predict: Some(16),
        }
    }

    #[test]
    fn native_and_openai_spellings_set_the_same_settings() {
        let body = json!({"temperature": 0, "top_k": 5, "max_tokens": 3, "stop": "\n", "seed": 42});
        let p = gen_params(&Fields::of(&body).unwrap(), &defaults(), 0).unwrap();
        assert_eq!(
            (
                p.sampler.temp,
                p.sampler.top_k,
                p.n_predict,
                p.stop,
                p.sampler.seed
            ),
            (0.0, 5, Some(3), vec!["\n".to_owned()], 42)
        );
        let body = json!({"n_predict": -1, "stop_sequences": ["a", "b"]});
        let p = gen_params(&Fields::of(&body).unwrap(), &defaults(), 0).unwrap();
        assert_eq!((p.n_predict, p.stop.len(), p.sampler.seed), (None, 2, 7));
        let p = gen_params(&Fields::of(&json!({})).unwrap(), &defaults(), 0).unwrap();
        assert_eq!(p.n_predict, Some(16));
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        for (body, name) in [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"n_predict": 1.5}), "n_predict"),
            (json!({"stop": [1]}), "stop"),
            (json!({"cache_prompt": 1}), "cache_prompt"),
        ] {
            let e = gen_params(&Fields::of(&body).unwrap(), &defaults(), 0).unwrap_err();
            assert_eq!(e.status.as_u16(), 400);
            assert!(e.message.contains(name), "{}", e.message);
        }
        assert!(Fields::of(&json!([1])).is_err());
    }
}
