//! Vocabulary metadata as stored under the GGUF `tokenizer.ggml.*` keys, and its resolved form.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;

use crate::error::TextError;

/// Token type codes of `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 0: undefined.
    Undefined,
    /// 1: an ordinary piece of text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (BOS, `<|im_start|>`): parsed from text only when asked, hidden when decoding unless asked.
    Control,
    /// 4: a user-defined token: always parsed from text as a whole, always shown when decoding.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a byte-fallback token such as `<0x0A>`.
    Byte,
}

impl TokenType {
    /// Maps a GGUF `tokenizer.ggml.token_type` code to a type; codes outside 0..=6 are `Undefined`.
    pub fn from_code(code: i32) -> Self {
        match code {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// The tokenizer part of a GGUF file's metadata, filled by the host from the `tokenizer.ggml.*` keys.
///
/// Optional keys that are absent in the file stay `None`; [`crate::Tokenizer::from_spec`] then applies
/// the same defaults as llama.cpp.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name, e.g. `qwen2`, `qwen35`, `deepseek-v3`, `llama-bpe`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: token text by id (byte-level encoded for `gpt2`, `▁` for spaces in `llama`).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: per-token score; SentencePiece merges the highest-scoring pair first.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: per-token type code, see [`TokenType`].
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: BPE merges as `"left right"`, highest priority first.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn).
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message).
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic, the GGUF spelling).
    pub sep_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: prepend BOS when special tokens are added.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`: append EOS when special tokens are added.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`: SentencePiece puts a space before text that follows a special token or the start.
    pub add_space_prefix: Option<bool>,
}

/// Which tokenization algorithm a vocabulary uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE with merges (`tokenizer.ggml.model = gpt2`).
    BytePairBpe,
    /// SentencePiece with scores and byte fallback (`tokenizer.ggml.model = llama`).
    SentencePiece,
}

/// Special-token ids and flags after llama.cpp's defaults and checks have been applied.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// End of turn, given or recognised by its text.
    pub eot: Option<u32>,
    /// End of message.
    pub eom: Option<u32>,
    /// Unknown token.
    pub unk: Option<u32>,
    /// Separator.
    pub sep: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
    /// Whether BOS is prepended when special tokens are added.
    pub add_bos: bool,
    /// Whether EOS is appended when special tokens are added.
    pub add_eos: bool,
    /// Whether SentencePiece text gets a leading space.
    pub add_space_prefix: bool,
}

/// Token texts that end generation, as llama.cpp recognises them by text.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
    "</s>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "[e~[",
];

/// Token texts recognised as end-of-turn when `eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle pad / repo / file-separator texts, which also end generation.
const FIM_EOG_TEXTS: &[&str] = &[
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

/// `<|end|>`'s id when it ends only a message, not generation, as llama.cpp decides it: among the
/// ids that end generation, `<|return|>` and `<|call|>` (o200k_harmony), or `<|call|>` or
/// `<|calls|>` with `<|flush|>` (Solar-Open), which end the reply instead.
fn end_of_message_not_generation(eog: &HashSet<u32>, ids: &HashMap<String, u32>) -> Option<u32> {
    let has = |t: &str| ids.get(t).is_some_and(|id| eog.contains(id));
    let end = ids.get("<|end|>").copied().filter(|id| eog.contains(id))?;
    let call = has("<|call|>") || has("<|calls|>");
    (call && (has("<|return|>") || has("<|flush|>"))).then_some(end)
}

/// A checked vocabulary: token texts, types, scores, the text-to-id map and the special tokens.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// Algorithm.
    pub kind: VocabKind,
    /// Token texts by id.
    pub tokens: Vec<String>,
    /// Token types by id (after end-of-generation tokens were promoted to control).
    pub types: Vec<TokenType>,
    /// Scores by id (zero when the file has none).
    pub scores: Vec<f32>,
    /// Text to id; a text listed twice maps to its last id, as in llama.cpp.
    pub ids: HashMap<String, u32>,
    /// Special ids and flags.
    pub special: SpecialTokens,
    /// Ids that end generation.
    pub eog: HashSet<u32>,
}

fn check_len<T>(key: &'static str, v: &Option<Vec<T>>, n: usize) -> Result<(), TextError> {
    match v {
        Some(v) if v.len() < n => Err(TextError::LengthMismatch {
            key,
            found: v.len(),
            expected: n,
        }),
        _ => Ok(()),
    }
}

impl Vocab {
    /// Checks a [`VocabSpec`] and applies llama.cpp's defaults for ids and flags.
    pub fn from_spec(spec: &VocabSpec) -> Result<Self, TextError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TextError::EmptyVocabulary);
        }
        check_len("tokenizer.ggml.scores", &spec.scores, n)?;
        check_len("tokenizer.ggml.token_type", &spec.token_types, n)?;
        let pre = spec.pre.as_deref().unwrap_or("default");
        let (kind, mut special) = match spec.model.as_str() {
            "llama" => (
                VocabKind::SentencePiece,
                SpecialTokens {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    add_bos: true,
                    add_space_prefix: true,
                    ..SpecialTokens::default()
                },
            ),
            "gpt2" => {
                let mut s = SpecialTokens {
                    bos: Some(11),
                    eos: Some(11),
                    ..SpecialTokens::default()
                };
                if matches!(
                    pre,
                    "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral"
                ) {
                    s.add_bos = true;
                }
                if matches!(pre, "chatglm-bpe" | "glm4" | "glm5") {
                    s.bos = None;
                }
                (VocabKind::BytePairBpe, s)
            }
            other => {
                return Err(TextError::UnknownModel {
                    found: other.to_string(),
                })
            }
        };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        special.bos = in_range(special.bos);
        special.eos = in_range(special.eos);
        special.unk = in_range(special.unk);
        let given = [
            (&mut special.bos, spec.bos_id, "tokenizer.ggml.bos_token_id"),
            (&mut special.eos, spec.eos_id, "tokenizer.ggml.eos_token_id"),
            (&mut special.eot, spec.eot_id, "tokenizer.ggml.eot_token_id"),
            (&mut special.eom, spec.eom_id, "tokenizer.ggml.eom_token_id"),
            (
                &mut special.unk,
                spec.unk_id,
                "tokenizer.ggml.unknown_token_id",
            ),
            (
                &mut special.sep,
                spec.sep_id,
                "tokenizer.ggml.seperator_token_id",
            ),
            (
                &mut special.pad,
                spec.pad_id,
                "tokenizer.ggml.padding_token_id",
            ),
        ];
        for (slot, value, key) in given {
            match value {
                Some(id) if (id as usize) < n => *slot = Some(id),
                Some(id) => tracing::warn!(
                    key,
                    id,
                    n_tokens = n,
                    "special token id out of range; keeping the default"
                ),
                None => {}
            }
        }
        if let Some(b) = spec.add_bos {
            special.add_bos = b;
        }
        if let Some(b) = spec.add_eos {
            special.add_eos = b;
        }
        if kind == VocabKind::SentencePiece {
            special.add_space_prefix = spec.add_space_prefix.unwrap_or(true);
        }

        let mut types: Vec<TokenType> = match &spec.token_types {
            Some(t) => t.iter().take(n).map(|&c| TokenType::from_code(c)).collect(),
            None => vec![TokenType::Normal; n],
        };
        let scores = match &spec.scores {
            Some(s) => s[..n].to_vec(),
            None => vec![0.0; n],
        };
        let mut tokens = spec.tokens.clone();
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
            ids.insert(t.clone(), i as u32);
        }

        let mut eog = HashSet::new();
        let by_text = |texts: &[&str]| -> Vec<u32> {
            texts.iter().filter_map(|t| ids.get(*t).copied()).collect()
        };
        if special.eot.is_none() {
            // llama.cpp takes the first match in its hash-map order; the list order here picks the same
            // token for the vocabularies under test (`<|im_end|>` before `<|endoftext|>`).
            special.eot = EOT_TEXTS.iter().find_map(|t| ids.get(*t).copied());
        }
        for id in by_text(FIM_EOG_TEXTS).into_iter().chain(by_text(EOG_TEXTS)) {
            eog.insert(id);
        }
        // A vocabulary with a normal `</s>` marker (gemma4, plamo) does not end generation on `</s>`.
        if let (Some(&s), true) = (
            ids.get("</s>"),
            ids.contains_key("<|tool_response>") || ids.contains_key("<|plamo:eos|>"),
        ) {
            eog.remove(&s);
        }
        eog.extend(
            [special.eos, special.eot, special.eom]
                .into_iter()
                .flatten(),
        );
        if let Some(end) = end_of_message_not_generation(&eog, &ids) {
            // `<|end|>` closes a message here, not the reply: it goes back to being text.
            eog.remove(&end);
            types[end as usize] = TokenType::UserDefined;
        }
        for &id in &eog {
            let t = &mut types[id as usize];
            if *t != TokenType::Control {
                tracing::debug!(id, "end-of-generation token promoted to control");
                *t = TokenType::Control;
            }
        }
        if special.add_bos && special.bos.is_none() {
            return Err(TextError::MissingSpecialToken {
                flag: "tokenizer.ggml.add_bos_token",
                id_key: "tokenizer.ggml.bos_token_id",
            });
        }
        if special.add_eos && special.eos.is_none() {
            return Err(TextError::MissingSpecialToken {
                flag: "tokenizer.ggml.add_eos_token",
                id_key: "tokenizer.ggml.eos_token_id",
            });
        }
        Ok(Self {
            kind,
            tokens,
            types,
            scores,
            ids,
            special,
            eog,
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
}
