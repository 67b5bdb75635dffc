//! `POST /infill`, fill-in-the-middle as llama-server b11434 builds its prompt
//! (`tools/server/server-context.cpp`'s handler and `server-common.cpp`'s `format_prompt_infill`):
//! the repository-level pattern `[FIM_REP]myproject\n [FIM_SEP]file\n text … [FIM_SEP]filename\n
//! [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]` (suffix first with `--spm-infill`), the prefix
//! and suffix cut to fit a batch (3:1), the extra chunks to what the context leaves. The FIM
//! tokens are the file's `tokenizer.ggml.fim_*_token_id` or, without them, the vocabulary's tokens
//! of the texts llama.cpp looks for.

use bloomery_gguf::Metadata;
use bloomery_text::Tokenizer;
use serde_json::Value;

use super::error::ApiError;
use super::native::{check_fits, fewest_tokens};
use super::Ready;

/// The fill-in-the-middle tokens of a vocabulary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fim {
    /// Before the prefix.
    pub pre: Option<u32>,
    /// Before the suffix.
    pub suf: Option<u32>,
    /// Where the middle is generated.
    pub mid: Option<u32>,
    /// Before the repository's name.
    pub rep: Option<u32>,
    /// Before each file's name.
    pub sep: Option<u32>,
}

/// Each FIM token's metadata key and the texts llama.cpp b11434 recognizes it by
/// (`src/llama-vocab.cpp`).
const KINDS: [(&str, &[&str]); 5] = [
    (
        "tokenizer.ggml.fim_pre_token_id",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];

impl Fim {
    /// The FIM tokens of a model: each from its metadata key (an id inside the vocabulary),
    /// else the first of its texts the vocabulary holds.
    pub fn of(meta: &Metadata, tok: &Tokenizer, n_vocab: usize) -> Fim {
        let find = |(key, texts): (&str, &[&str])| {
            let from_key = meta
                .get_uint(key)
                .ok()
                .filter(|&id| id < n_vocab as u64)
                .map(|id| id as u32);
            from_key.or_else(|| texts.iter().find_map(|t| tok.token_id(t)))
        };
        let [pre, suf, mid, rep, sep] = KINDS.map(find);
        Fim {
            pre,
            suf,
            mid,
            rep,
            sep,
        }
    }
}

/// What the prompt is cut to fit: the server's batch (`-b`), default generation limit (`-n`)
/// and a slot's context, and the order (`--spm-infill`).
pub struct Limits {
    /// `-b`.
    pub n_batch: i64,
    /// `-n` (-1: none).
    pub n_predict: i64,
    /// A slot's context.
    pub n_ctx: i64,
    /// Suffix before prefix.
    pub spm: bool,
}

/// An `input_prefix`/`input_suffix` value: a string, or a list of strings and token ids.
fn mixed(ready: &Ready, v: &Value, key: &str) -> Result<Vec<u32>, ApiError> {
    let encode = |s: &str| {
        ready
            .tok
            .encode(s, false, false)
            .map_err(|e| ApiError::invalid(format!("tokenizing \"{key}\": {e}")))
    };
    match v {
        Value::String(s) => encode(s),
        Value::Array(items) => {
            let mut out = Vec::new();
            for x in items {
                match x {
                    Value::String(s) => out.extend(encode(s)?),
                    _ => out.push(super::native::token_id(ready, x)?),
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid(format!(
            "\"{key}\" must be a string or a list of strings and tokens"
        ))),
    }
}

/// The FIM prompt of an /infill body (`body`: the parsed JSON object).
pub fn prompt(ready: &Ready, body: &Value, lim: &Limits) -> Result<Vec<u32>, ApiError> {
    let fim = &ready.fim;
    let missing: String = [
        (fim.pre, "prefix"),
        (fim.suf, "suffix"),
        (fim.mid, "middle"),
    ]
    .iter()
    .filter(|(t, _)| t.is_none())
    .map(|(_, n)| format!("{n} token is missing. "))
    .collect();
    let (Some(pre), Some(suf), Some(mid)) = (fim.pre, fim.suf, fim.mid) else {
        return Err(ApiError::not_supported(format!(
            "Infill is not supported by this model: {missing}"
        )));
    };
    let prompt = match body.get("prompt") {
        None => "",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(ApiError::invalid("\"prompt\" must be a string")),
    };
    let prefix = body
        .get("input_prefix")
        .ok_or_else(|| ApiError::invalid("\"input_prefix\" is required"))?;
    let suffix = body
        .get("input_suffix")
        .ok_or_else(|| ApiError::invalid("\"input_suffix\" is required"))?;
    let extra = match body.get("input_extra") {
        None => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(_) => {
            return Err(ApiError::invalid(
                "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
            ))
        }
    };
    let mut chunks = Vec::with_capacity(extra.len());
    for c in extra {
        let Some(text) = c.get("text").and_then(Value::as_str) else {
            return Err(ApiError::invalid(
                "extra_context chunk must contain a \"text\" field with a string value",
            ));
        };
        let filename = match c.get("filename") {
            None => "tmp",
            Some(Value::String(f)) => f.as_str(),
            Some(_) => {
                return Err(ApiError::invalid(
                    "extra_context chunk's \"filename\" field must be a string",
                ))
            }
        };
        chunks.push((text, filename));
    }
    let mut at_least = 3 + fewest_tokens(ready, prompt);
    for v in [prefix, suffix] {
        at_least += v.as_str().map_or(0, |s| fewest_tokens(ready, s));
    }
    check_fits(ready, at_least)?;
    let plain = |s: &str| {
        ready
            .tok
            .encode(s, false, false)
            .map_err(|e| ApiError::invalid(format!("tokenizing the infill context: {e}")))
    };
    let mut extra_tokens = Vec::new();
    if let Some(rep) = fim.rep {
        extra_tokens.push(rep);
        extra_tokens.extend(plain("myproject\n")?);
    }
    for (text, filename) in chunks {
        match fim.sep {
            Some(sep) => {
                extra_tokens.push(sep);
                extra_tokens.extend(plain(&format!("{filename}\n"))?);
            }
            // A chunk separator as text when the vocabulary has no file separator.
            None => extra_tokens.extend(plain("\n\n--- snippet ---\n\n")?),
        }
        extra_tokens.extend(plain(text)?);
    }
    if let Some(sep) = fim.sep {
        extra_tokens.push(sep);
        extra_tokens.extend(plain("filename\n")?);
    }
    let prompt_tokens = ready
        .tok
        .encode(prompt, false, true)
        .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))?;
    let mut prefix = mixed(ready, prefix, "input_prefix")?;
    let mut suffix = mixed(ready, suffix, "input_suffix")?;
    // The prefix and suffix fill a batch 3:1; the extra chunks what the context leaves.
    let take_prefix = (prefix.len() as i64).min(3 * (lim.n_batch / 4)).max(0) as usize;
    let room = (lim.n_batch / 4 - (2 + prompt_tokens.len() as i64)).max(0);
    let take_suffix = (suffix.len() as i64).min(room) as usize;
    let take_extra = (lim.n_ctx - lim.n_batch - 2 * lim.n_predict)
        .max(0)
        .min(extra_tokens.len() as i64) as usize;
    prefix.drain(..prefix.len() - take_prefix);
    suffix.truncate(take_suffix);
    prefix.insert(0, pre);
    prefix.extend(&prompt_tokens);
    suffix.insert(0, suf);
    let (mut inp, end) = if lim.spm {
        (suffix, prefix)
    } else {
        (prefix, suffix)
    };
    if ready.tok.special().add_bos {
        inp.splice(0..0, ready.tok.bos());
    }
    // The extra context goes before everything, BOS included, as in b11434.
    inp.splice(
        0..0,
        extra_tokens[extra_tokens.len() - take_extra..]
            .iter()
            .copied(),
    );
    inp.extend(end);
    inp.push(mid);
    Ok(inp)
}
