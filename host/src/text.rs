//! Glue between a GGUF file and the `bloomery-text` crate: fills a [`VocabSpec`] from the
//! `tokenizer.ggml.*` keys and builds the tokenizer and the chat template (`tokenizer.chat_template`).

use bloomery_gguf::{Array, GgufModel, Metadata, Value};
use bloomery_text::{ChatTemplate, TextError, Tokenizer, VocabSpec};

/// Why the text side of a model could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TextGlueError {
    /// A required key is absent.
    #[error("{key} is missing; a model needs it to tokenize text")]
    MissingKey {
        /// The GGUF key.
        key: &'static str,
    },
    /// A key holds a value of another type.
    #[error("{key} holds {found}; expected {expected}")]
    WrongType {
        /// The GGUF key.
        key: &'static str,
        /// The type found.
        found: String,
        /// The type expected.
        expected: &'static str,
    },
    /// The text crate refused the vocabulary or the template.
    #[error(transparent)]
    Text(#[from] TextError),
}

fn wrong(key: &'static str, v: &Value, expected: &'static str) -> TextGlueError {
    let found = match v {
        Value::Array(a) => format!("an array of {}", a.elem_type().name()),
        other => other.value_type().name().to_owned(),
    };
    TextGlueError::WrongType {
        key,
        found,
        expected,
    }
}

fn string(meta: &Metadata, key: &'static str) -> Result<Option<String>, TextGlueError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(wrong(key, v, "a string")),
    }
}

fn id(meta: &Metadata, key: &'static str) -> Result<Option<u32>, TextGlueError> {
    match meta.get(key) {
        None => Ok(None),
        // llama.cpp writes "no such token" as -1 in some converters.
        Some(Value::I32(-1)) | Some(Value::I64(-1)) => Ok(None),
        Some(v) => v
            .as_uint()
            .and_then(|u| u32::try_from(u).ok())
            .map(Some)
            .ok_or_else(|| wrong(key, v, "a token id")),
    }
}

fn flag(meta: &Metadata, key: &'static str) -> Result<Option<bool>, TextGlueError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong(key, v, "a bool")),
    }
}

fn array<'m>(meta: &'m Metadata, key: &'static str) -> Result<Option<&'m Array>, TextGlueError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(v) => Err(wrong(key, v, "an array")),
    }
}

fn strings(meta: &Metadata, key: &'static str) -> Result<Option<Vec<String>>, TextGlueError> {
    match array(meta, key)? {
        None => Ok(None),
        Some(Array::String(v)) => Ok(Some(v.clone())),
        Some(a) => Err(wrong(key, &Value::Array(a.clone()), "an array of strings")),
    }
}

/// The vocabulary keys of `meta` as a [`VocabSpec`]; absent optional keys stay `None`.
pub fn vocab_spec_from_metadata(meta: &Metadata) -> Result<VocabSpec, TextGlueError> {
    const MODEL: &str = "tokenizer.ggml.model";
    const TOKENS: &str = "tokenizer.ggml.tokens";
    let model = string(meta, MODEL)?.ok_or(TextGlueError::MissingKey { key: MODEL })?;
    let tokens = strings(meta, TOKENS)?.ok_or(TextGlueError::MissingKey { key: TOKENS })?;
    let scores = match array(meta, "tokenizer.ggml.scores")? {
        None => None,
        Some(Array::F32(v)) => Some(v.clone()),
        Some(a) => {
            return Err(wrong(
                "tokenizer.ggml.scores",
                &Value::Array(a.clone()),
                "an array of f32",
            ))
        }
    };
    let token_types = match array(meta, "tokenizer.ggml.token_type")? {
        None => None,
        Some(Array::I32(v)) => Some(v.clone()),
        Some(Array::U32(v)) => Some(v.iter().map(|&x| x as i32).collect()),
        Some(a) => {
            return Err(wrong(
                "tokenizer.ggml.token_type",
                &Value::Array(a.clone()),
                "an array of i32",
            ))
        }
    };
    Ok(VocabSpec {
        model,
        pre: string(meta, "tokenizer.ggml.pre")?,
        tokens,
        scores,
        token_types,
        merges: strings(meta, "tokenizer.ggml.merges")?,
        bos_id: id(meta, "tokenizer.ggml.bos_token_id")?,
        eos_id: id(meta, "tokenizer.ggml.eos_token_id")?,
        eot_id: id(meta, "tokenizer.ggml.eot_token_id")?,
        eom_id: id(meta, "tokenizer.ggml.eom_token_id")?,
        unk_id: id(meta, "tokenizer.ggml.unknown_token_id")?,
        sep_id: id(meta, "tokenizer.ggml.seperator_token_id")?,
        pad_id: id(meta, "tokenizer.ggml.padding_token_id")?,
        add_bos: flag(meta, "tokenizer.ggml.add_bos_token")?,
        add_eos: flag(meta, "tokenizer.ggml.add_eos_token")?,
        add_space_prefix: flag(meta, "tokenizer.ggml.add_space_prefix")?,
    })
}

/// The vocabulary of a model file as a [`VocabSpec`].
pub fn vocab_spec(file: &GgufModel) -> Result<VocabSpec, TextGlueError> {
    vocab_spec_from_metadata(file.metadata())
}

/// The tokenizer of a model file.
pub fn tokenizer(file: &GgufModel) -> Result<Tokenizer, TextGlueError> {
    Ok(Tokenizer::from_spec(&vocab_spec(file)?)?)
}

/// ChatML, the template llama.cpp falls back to when a file has none.
pub const CHATML_FALLBACK: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// The chat template of `meta` (`tokenizer.chat_template`) with the vocabulary's BOS/EOS texts;
/// ChatML when the file has none, as llama.cpp does.
pub fn chat_template_from_metadata(
    meta: &Metadata,
    tokenizer: &Tokenizer,
) -> Result<ChatTemplate, TextGlueError> {
    let src = match string(meta, "tokenizer.chat_template")? {
        Some(s) => s,
        None => {
            tracing::warn!("the model file has no tokenizer.chat_template; using ChatML");
            CHATML_FALLBACK.to_owned()
        }
    };
    let text = |id: Option<u32>| {
        id.and_then(|i| tokenizer.token_text(i))
            .unwrap_or_default()
            .to_owned()
    };
    Ok(ChatTemplate::new(
        &src,
        &text(tokenizer.bos()),
        &text(tokenizer.eos()),
    )?)
}

/// The chat template of a model file.
pub fn chat_template(
    file: &GgufModel,
    tokenizer: &Tokenizer,
) -> Result<ChatTemplate, TextGlueError> {
    chat_template_from_metadata(file.metadata(), tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::vocab;
    use bloomery_gguf::Entry;
    use bloomery_text::{ChatRequest, TemplateValue};

    fn synthetic() -> Metadata {
        let v = vocab::build(512).unwrap();
        let mut meta = Metadata::new("synthetic");
        for (key, value) in vocab::metadata(&v) {
            meta.push(Entry {
                key,
                value,
                offset: 0,
            })
            .unwrap();
        }
        meta
    }

    #[test]
    fn the_synthetic_vocabulary_fills_the_spec() {
        let spec = vocab_spec_from_metadata(&synthetic()).unwrap();
        assert_eq!(spec.model, "gpt2");
        assert_eq!(spec.pre.as_deref(), Some("qwen2"));
        assert_eq!(spec.tokens.len(), 512);
        assert_eq!(spec.eos_id, Some(511));
        assert_eq!(spec.bos_id, Some(509));
        assert_eq!(spec.add_bos, Some(false));
        assert!(spec.merges.as_ref().is_some_and(|m| !m.is_empty()));
        assert_eq!(spec.scores, None);
    }

    #[test]
    fn the_synthetic_vocabulary_tokenizes_and_renders_chatml() {
        let meta = synthetic();
        let tok = Tokenizer::from_spec(&vocab_spec_from_metadata(&meta).unwrap()).unwrap();
        let ids = tok.encode("hello world", true, true).unwrap();
        assert_eq!(tok.decode(&ids, false), "hello world");
        assert!(tok.is_eog(511));
        let tmpl = chat_template_from_metadata(&meta, &tok).unwrap();
        let messages = TemplateValue::from(&serde_json::json!([{"role": "user", "content": "hi"}]));
        let out = tmpl
            .render(&ChatRequest {
                messages,
                add_generation_prompt: true,
                ..ChatRequest::default()
            })
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let ids = tok.encode(&out, true, true).unwrap();
        assert_eq!(ids[0], 510);
    }

    #[test]
    fn a_file_without_a_template_gets_chatml() {
        let mut meta = Metadata::new("no template");
        for e in synthetic().entries() {
            if e.key != "tokenizer.chat_template" {
                meta.push(e.clone()).unwrap();
            }
        }
        let tok = Tokenizer::from_spec(&vocab_spec_from_metadata(&meta).unwrap()).unwrap();
        let tmpl = chat_template_from_metadata(&meta, &tok).unwrap();
        let messages = TemplateValue::from(&serde_json::json!([{"role": "user", "content": "hi"}]));
        let out = tmpl
            .render(&ChatRequest {
                messages,
                add_generation_prompt: true,
                ..ChatRequest::default()
            })
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn a_missing_model_key_is_named() {
        let err = vocab_spec_from_metadata(&Metadata::new("empty")).unwrap_err();
        assert!(err.to_string().contains("tokenizer.ggml.model"), "{err}");
    }
}
