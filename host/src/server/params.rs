//! Request fields shared by every route: sampling, limits, stop strings, probabilities and the
//! grammar (`structured.rs`), under
//! llama-server's native names and their OpenAI and Anthropic spellings. A field of the wrong type
//! is a 400 that names it; numbers are held to llama-server's limits (b11434's completion
//! schema): some are clamped into range, the others are a 400 outside it.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::budget::BudgetDefaults;
use super::error::ApiError;
use bloomery_runtime::request::{GenParams, GrammarSpec, ShiftParams};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_text::Tokenizer;

/// Server-wide defaults a request starts from (from the command line).
#[derive(Clone, Debug)]
pub struct Defaults {
    /// Sampler settings; `seed` is unused (see `seed`).
    pub sampler: SamplerParams,
    /// Default seed (`None`: random per request).
    pub seed: Option<u64>,
    /// Default generation limit (`None`: unbounded).
    pub n_predict: Option<usize>,
    /// Special tokens' text in the output (`--special`).
    pub special: bool,
    /// The stop strings of requests that bring none (`-r`).
    pub stop: Vec<String>,
    /// Default of `ignore_eos`.
    pub ignore_eos: bool,
    /// Default of `cache_prompt`.
    pub cache_prompt: bool,
    /// Default of `n_keep` (`--keep`).
    pub n_keep: i32,
    /// Default of `n_cache_reuse` (`--cache-reuse`).
    pub n_cache_reuse: usize,
    /// Why the model's cached positions cannot move, if they cannot (`n_cache_reuse` > 0 is
    /// then refused).
    pub no_shift: Option<String>,
    /// Seconds between the keep-alive comments of a silent stream (`--sse-ping-interval`; 0 or
    /// -1: none).
    pub sse_ping_interval: i64,
    /// The grammar of requests that bring none (`--grammar`, `-j`, …): its GBNF text (for
    /// `/props`) and the parsed grammar.
    pub grammar: Option<(String, GrammarSpec)>,
    /// The model's tokenizer (`logit_bias` texts, `dry_sequence_breakers`).
    pub tok: Arc<Tokenizer>,
    /// The model's vocabulary size (`logit_bias` ids are checked against it).
    pub n_vocab: usize,
    /// The reasoning budget's settings.
    pub budget: BudgetDefaults,
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

    /// An integer field that must lie in `min..=max` (one of llama-server's hard limits), or
    /// a 400 naming it and the range.
    pub fn int_in(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        match self.i64(key)? {
            Some(v) if v < min || v > max => Err(ApiError::invalid(format!(
                "\"{key}\" must be between {min} and {max}, got {v}"
            ))),
            v => Ok(v),
        }
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

/// The largest value llama-server's integer fields take.
pub const I32_MAX: i64 = i32::MAX as i64;

/// The generation settings of a request body over the server's defaults. `n_probs` comes from
/// the caller (its spelling differs per API).
pub fn gen_params(f: &Fields<'_>, d: &Defaults, n_probs: usize) -> Result<GenParams, ApiError> {
    let mut s = d.sampler.clone();
    // Clamped into `min..=max`, as llama-server's soft limits are.
    let num = |key: &str, v: &mut f32, min: f64, max: f64| -> Result<(), ApiError> {
        if let Some(x) = f.f64(key)? {
            *v = x.clamp(min, max) as f32;
        }
        Ok(())
    };
    let any = f64::MAX;
    num("temperature", &mut s.temp, 0.0, any)?;
    num("top_p", &mut s.top_p, 0.0, 1.0)?;
    num("min_p", &mut s.min_p, 0.0, 1.0)?;
    num("typical_p", &mut s.typ_p, -any, any)?;
    num("repeat_penalty", &mut s.penalty_repeat, -any, any)?;
    num("presence_penalty", &mut s.penalty_present, -any, any)?;
    num("frequency_penalty", &mut s.penalty_freq, -any, any)?;
    if let Some(k) = f.i64("top_k")? {
        s.top_k = k.clamp(0, I32_MAX) as i32;
    }
    if let Some(n) = f.int_in("repeat_last_n", 0, I32_MAX)? {
        s.penalty_last_n = n as usize;
    }
    if let Some(n) = f.int_in("min_keep", 0, I32_MAX)? {
        s.min_keep = n as usize;
    }
    super::sampler_fields::apply(f, d, &mut s)?;
    s.seed = match f.i64("seed")? {
        Some(seed) if seed >= 0 => seed as u64,
        _ => d.seed.unwrap_or_else(|| u64::from(rand::random::<u32>())),
    };
    // llama-server reads `n_predict`, then its aliases in this order.
    let limit = match (
        f.int_in("n_predict", -1, I32_MAX)?,
        f.int_in("max_completion_tokens", -1, I32_MAX)?,
        f.int_in("max_tokens", -1, I32_MAX)?,
    ) {
        (Some(n), _, _) | (None, Some(n), _) | (None, None, Some(n)) => {
            (n >= 0).then_some(n as usize)
        }
        (None, None, None) => d.n_predict,
    };
    // `n_keep` and `n_discard` matter only to context shift (`--context-shift`).
    let shift = ShiftParams {
        n_keep: f
            .int_in("n_keep", -1, I32_MAX)?
            .map_or(d.n_keep, |n| n as i32),
        n_discard: f.int_in("n_discard", 0, I32_MAX)?.map_or(0, |n| n as usize),
        n_cache_reuse: f
            .int_in("n_cache_reuse", 0, I32_MAX)?
            .map_or(d.n_cache_reuse, |n| n as usize),
    };
    if let (true, Some(why)) = (shift.n_cache_reuse > 0, &d.no_shift) {
        return Err(ApiError::invalid(format!("\"n_cache_reuse\": {why}")));
    }
    let t_max_predict_ms = f
        .int_in("t_max_predict_ms", -1, i64::MAX)?
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|&ms| ms > 0);
    refuse_unbuilt(f)?;
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(d.ignore_eos);
    if ignore_eos {
        ban_eog(&mut s, &d.tok);
    }
    let mut stop = f.strings("stop")?;
    stop.extend(f.strings("stop_sequences")?);
    stop.retain(|s| !s.is_empty());
    if stop.is_empty() {
        // llama-server's reverse prompts stand in when a request brings no stop string.
        stop.clone_from(&d.stop);
    }
    Ok(GenParams {
        sampler: s,
        n_predict: limit,
        stop,
        n_probs,
        post_sampling_probs: f.bool("post_sampling_probs")?.unwrap_or(false),
        // Only a stream shows it, as llama-server sends progress only in a stream.
        return_progress: f.bool("return_progress")?.unwrap_or(false)
            && f.bool("stream")?.unwrap_or(false),
        ignore_eos,
        cache_prompt: f.bool("cache_prompt")?.unwrap_or(d.cache_prompt),
        forced: Vec::new(),
        prompt_only: false,
        // llama-server's default applies unless the request brings `grammar` or `json_schema`.
        grammar: match super::structured::grammar(f)? {
            None => d.grammar.as_ref().map(|(_, g)| g.clone()),
            given => given,
        },
        t_max_predict_ms,
        preserved: Vec::new(),
        special: d.special,
        shift,
        reasoning_budget: None,
    })
}

/// `ignore_eos` as llama-server applies it: every end-of-generation token banned by a logit
/// bias of negative infinity, after the request's own biases (`generation_settings` lists them).
pub fn ban_eog(s: &mut SamplerParams, tok: &Tokenizer) {
    s.logit_bias
        .extend(tok.eog_ids().into_iter().map(|id| (id, f32::NEG_INFINITY)));
}

/// Why the chat routes' own parser fields are refused on a request.
const PARSER_FIELDS: &str = "llama-server's chat parser settings, which its chat routes set for \
     themselves: here the chat routes parse tool calls and reasoning by the template's family \
     (send the request to /v1/chat/completions with `tools`)";

/// Why the lazy grammar's fields are refused.
const LAZY_GRAMMAR: &str = "a lazy grammar opened by triggers is built for the chat routes' \
     tool calls only (`tool_choice` auto); send `grammar` or `json_schema` alone";

/// llama-server b11434's request fields (tools/server/server-schema.cpp) that ask for what
/// bloomery has not built: a value other than the one asking for what bloomery does is a 400
/// naming the field, never accepted and ignored.
fn refuse_unbuilt(f: &Fields<'_>) -> Result<(), ApiError> {
    let refuse = |key: &str, what: &str| Err(ApiError::invalid(format!("\"{key}\": {what}")));
    // Numbers whose 0 asks for what bloomery does.
    for (key, what) in [
        (
            "n_indent",
            "the minimum indentation of code completions is not implemented",
        ),
        ("chat_format", PARSER_FIELDS),
    ] {
        if f.int_in(key, 0, I32_MAX)?.is_some_and(|n| n > 0) {
            return refuse(key, what);
        }
    }
    // Switches whose `false` asks for what bloomery does.
    for (key, what) in [
        (
            "backend_sampling",
            "sampling runs on the host (llama-server's --backend-sampling)",
        ),
        ("parse_tool_calls", PARSER_FIELDS),
        (
            "echo",
            "a continued message's earlier text is not repeated in the output",
        ),
        ("grammar_lazy", LAZY_GRAMMAR),
    ] {
        if f.bool(key)? == Some(true) {
            return refuse(key, what);
        }
    }
    // Texts whose empty value asks for what bloomery does.
    for key in ["chat_parser", "generation_prompt"] {
        if f.str(key)?.is_some_and(|s| !s.is_empty()) {
            return refuse(key, PARSER_FIELDS);
        }
    }
    // Lists whose empty value asks for what bloomery does.
    for (key, what) in [
        (
            "lora",
            "LoRA adapters are not supported (llama-server's --lora)",
        ),
        ("grammar_triggers", LAZY_GRAMMAR),
        ("preserved_tokens", LAZY_GRAMMAR),
    ] {
        match f.get(key) {
            None => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(Value::Array(_)) => return refuse(key, what),
            Some(_) => return refuse(key, "must be an array"),
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> Defaults {
        Defaults {
            sampler: SamplerParams::default(),
            seed: Some(7),
            n_predict: Some(16),
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
            budget: BudgetDefaults::default(),
        }
    }

    /// A byte-level vocabulary of the 256 byte characters and `ab` (id 256), padded to 300.
    pub(crate) fn toy_tokenizer() -> Tokenizer {
        // GPT-2's byte characters: printable Latin-1 bytes stand for themselves, the others
        // for 256 + n in order.
        let mut shifted = 0;
        let mut tokens: Vec<String> = (0..256u32)
            .map(|b| {
                let printable = (0x21..=0x7e).contains(&b)
                    || (0xa1..=0xac).contains(&b)
                    || (0xae..=0xff).contains(&b);
                let c = if printable {
                    b
                } else {
                    shifted += 1;
                    255 + shifted
                };
                char::from_u32(c).unwrap().to_string()
            })
            .collect();
        tokens.push("ab".into());
        tokens.extend((257..300).map(|i| format!("<unused{i}>")));
        let mut types = vec![1; 257];
        types.extend(std::iter::repeat_n(3, 43));
        Tokenizer::from_spec(&bloomery_text::VocabSpec {
            model: "gpt2".into(),
            pre: Some("qwen2".into()),
            tokens,
            token_types: Some(types),
            merges: Some(vec!["a b".into()]),
            ..bloomery_text::VocabSpec::default()
        })
        .unwrap()
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
    fn n_predict_then_max_completion_tokens_then_max_tokens() {
        let limit = |body: Value| {
            gen_params(&Fields::of(&body).unwrap(), &defaults(), 0)
                .unwrap()
                .n_predict
        };
        assert_eq!(
            limit(json!({"max_tokens": 3, "max_completion_tokens": 5})),
            Some(5)
        );
        assert_eq!(
            limit(json!({"n_predict": 2, "max_tokens": 3, "max_completion_tokens": 5})),
            Some(2)
        );
        assert_eq!(limit(json!({"max_tokens": 3})), Some(3));
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

    #[test]
    fn numbers_are_held_to_llama_servers_limits() {
        for (body, name) in [
            (json!({"repeat_last_n": -1}), "repeat_last_n"),
            (json!({"repeat_last_n": 1e12}), "repeat_last_n"),
            (json!({"min_keep": -3}), "min_keep"),
            (json!({"n_predict": -2}), "n_predict"),
            (json!({"max_tokens": 1e300}), "max_tokens"),
        ] {
            let e = gen_params(&Fields::of(&body).unwrap(), &defaults(), 0).unwrap_err();
            assert!(
                e.status.as_u16() == 400 && e.message.contains(name),
                "{body}: {e}"
            );
        }
        let body = json!({"temperature": -2, "top_p": 7, "min_p": -1, "top_k": -5,
                          "repeat_last_n": 2147483647, "seed": 1e300});
        let p = gen_params(&Fields::of(&body).unwrap(), &defaults(), 0).unwrap();
        let s = p.sampler;
        assert_eq!(
            (s.temp, s.top_p, s.min_p, s.top_k, s.penalty_last_n),
            (0.0, 1.0, 0.0, 0, 2147483647)
        );
    }
}
