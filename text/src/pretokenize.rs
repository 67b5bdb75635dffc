//! Pre-tokenizer regexes chosen by `tokenizer.ggml.pre`, with the facts llama.cpp attaches to each name.

use crate::error::TextError;

/// llama.cpp's adaptation of the Llama-3 pattern (case-insensitive contractions spelled out).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2 / Qwen3 (and Solar-Open's `solar-open`): like Llama-3 but single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: Qwen2 with combining marks (`\p{M}`) kept inside words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// DeepSeek-V3 (also JoyAI, Hunyuan dense): digits in threes, CJK runs, then the word pattern.
const DEEPSEEK3: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
/// llama.cpp's fallback for `default` and a missing `tokenizer.ggml.pre`.
const DEFAULT: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// How a BPE vocabulary splits text before merging.
#[derive(Debug, Clone)]
pub struct PreTokenizerSpec {
    /// Regexes applied one after another; each splits every piece, keeping matches and gaps.
    pub regexes: Vec<&'static str>,
    /// Whether a word found whole in the vocabulary is emitted without merging (llama.cpp `ignore_merges`).
    pub ignore_merges: bool,
}

/// The `tokenizer.ggml.pre` names this crate accepts.
pub const KNOWN_PRE: &[&str] = &[
    "default",
    "gpt-2",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "qwen2",
    "deepseek-r1-qwen",
    "qwen35",
    "deepseek-v3",
    "joyai-llm",
    "hunyuan-dense",
    "solar-open",
    "chatglm-bpe",
    "glm4",
    "glm5",
    "dbrx",
    "smaug-bpe",
    "stablelm2",
];

/// Looks up the pre-tokenizer for a `tokenizer.ggml.pre` value (`None` means `default`).
pub fn pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerSpec, TextError> {
    let name = pre.unwrap_or("default");
    let (regexes, ignore_merges): (Vec<&'static str>, bool) = match name {
        "default" => (DEFAULT.to_vec(), false),
        "gpt-2" => (vec![GPT2], false),
        "llama3" | "llama-v3" | "llama-bpe" => (vec![LLAMA3], true),
        "dbrx" | "smaug-bpe" => (vec![LLAMA3], false),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "solar-open" => (vec![QWEN2], false),
        "qwen35" => (vec![QWEN35], false),
        "deepseek-v3" | "joyai-llm" | "hunyuan-dense" => (DEEPSEEK3.to_vec(), false),
        "chatglm-bpe" => (vec![LLAMA3], false),
        "glm4" | "glm5" => (vec![LLAMA3], true),
        other => {
            return Err(TextError::UnknownPreTokenizer {
                found: other.to_string(),
                known: KNOWN_PRE.to_vec(),
            });
        }
    };
    Ok(PreTokenizerSpec {
        regexes,
        ignore_merges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_name_resolves_and_unknown_is_named() {
        for name in KNOWN_PRE {
            assert!(pre_tokenizer(Some(name)).is_ok(), "{name}");
        }
        let err = pre_tokenizer(Some("martian")).unwrap_err().to_string();
        assert!(err.contains("martian") && err.contains("qwen35"), "{err}");
    }

    #[test]
    fn regexes_compile_in_fancy_regex() {
        for name in KNOWN_PRE {
            for re in pre_tokenizer(Some(name)).unwrap().regexes {
                tokenizers::pre_tokenizers::split::Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
                    tokenizers::SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{name}: {re}: {e}"));
            }
        }
    }
}
