//! Byte-level BPE (`tokenizer.ggml.model = gpt2`) on the `tokenizers` library: pre-tokenizer regexes,
//! GPT-2 byte-to-character mapping, merges.

use std::collections::HashMap;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::TextError;
use crate::pretokenize::PreTokenizerSpec;
use crate::vocab::Vocab;

/// The GPT-2 table from byte value to the printable character that stands for it in token texts.
pub fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(b)
        } else {
            extra += 1;
            255 + extra
        };
        // Codes are at most 255 + 68 = 323, always a valid scalar value.
        table[usize::from(b)] = char::from_u32(code).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_char`].
pub fn char_to_byte() -> HashMap<char, u8> {
    byte_to_char()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// A byte-level BPE encoder for text with no special tokens in it.
pub struct BpeEncoder {
    inner: tokenizers::Tokenizer,
}

impl BpeEncoder {
    /// Builds the encoder from a checked vocabulary, its merges and the pre-tokenizer chosen by name.
    pub fn new(
        vocab: &Vocab,
        merges: &[String],
        pre: &PreTokenizerSpec,
    ) -> Result<Self, TextError> {
        let mut pairs = Vec::with_capacity(merges.len());
        for (index, m) in merges.iter().enumerate() {
            // The separator is the first space after the first character, as llama.cpp reads it.
            let first_len = m.chars().next().map_or(0, char::len_utf8);
            let Some(pos) = m[first_len..].find(' ').map(|p| p + first_len) else {
                return Err(TextError::BadMerge {
                    index,
                    found: m.clone(),
                });
            };
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            for token in [a.to_string(), b.to_string(), format!("{a}{b}")] {
                if !vocab.ids.contains_key(&token) {
                    return Err(TextError::MergeOutsideVocab {
                        index,
                        merge: m.clone(),
                        token,
                    });
                }
            }
            pairs.push((a.to_string(), b.to_string()));
        }
        let ids: tokenizers::models::bpe::Vocab =
            vocab.ids.iter().map(|(k, &v)| (k.clone(), v)).collect();
        let model = BPE::builder()
            .vocab_and_merges(ids, pairs)
            .ignore_merges(pre.ignore_merges)
            .build()
            .map_err(|e| TextError::Library {
                what: "BPE model",
                message: e.to_string(),
            })?;
        let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
        for re in &pre.regexes {
            let split = Split::new(
                SplitPattern::Regex((*re).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TextError::Library {
                what: "pre-tokenizer regex",
                message: format!("{re}: {e}"),
            })?;
            steps.push(split.into());
        }
        steps.push(ByteLevel::new(false, false, false).into());
        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(Sequence::new(steps)));
        Ok(Self { inner })
    }

    /// Appends the ids of `text` (which holds no special tokens) to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TextError> {
        if text.is_empty() {
            return Ok(());
        }
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TextError::Library {
                what: "BPE encoding",
                message: e.to_string(),
            })?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_matching_gpt2() {
        let t = byte_to_char();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(char_to_byte().len(), 256);
    }
}
