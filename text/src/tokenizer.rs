//! The tokenizer: encode and decode with the vocabulary of a GGUF file, as llama.cpp's `llama_tokenize`
//! and `llama_token_to_piece` do.

use crate::bpe::{char_to_byte, BpeEncoder};
use crate::error::TextError;
use crate::pretokenize::pre_tokenizer;
use crate::special::{Fragment, SpecialMatcher};
use crate::spm;
use crate::vocab::{SpecialTokens, TokenType, Vocab, VocabKind, VocabSpec};

enum Encoder {
    Bpe(Box<BpeEncoder>),
    SentencePiece,
}

/// A tokenizer built from the `tokenizer.ggml.*` metadata of a GGUF file.
pub struct Tokenizer {
    vocab: Vocab,
    encoder: Encoder,
    specials: SpecialMatcher,
    /// Bytes of each token when shown; control and unknown tokens hold their text here.
    pieces: Vec<Vec<u8>>,
    /// The most bytes of input text one token stands for (`None` when some byte maps to no
    /// token, so text can vanish).
    max_token_bytes: Option<usize>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.vocab.kind)
            .field("n_tokens", &self.vocab.len())
            .field("special", &self.vocab.special)
            .finish()
    }
}

impl Tokenizer {
    /// Builds a tokenizer; fails with a named error on an unknown model or pre-tokenizer, arrays of the
    /// wrong length, or merges that leave the vocabulary.
    pub fn from_spec(spec: &VocabSpec) -> Result<Self, TextError> {
        let vocab = Vocab::from_spec(spec)?;
        let encoder = match vocab.kind {
            VocabKind::BytePairBpe => {
                let merges = spec.merges.as_deref().ok_or(TextError::MissingMerges)?;
                let pre = pre_tokenizer(spec.pre.as_deref())?;
                Encoder::Bpe(Box::new(BpeEncoder::new(&vocab, merges, &pre)?))
            }
            VocabKind::SentencePiece => Encoder::SentencePiece,
        };
        let pieces = build_pieces(&vocab);
        let max_token_bytes = max_token_bytes(&vocab, &pieces);
        let specials = SpecialMatcher::new(&vocab);
        tracing::info!(
            kind = ?vocab.kind,
            pre = spec.pre.as_deref().unwrap_or("default"),
            n_tokens = vocab.len(),
            bos = ?vocab.special.bos,
            eos = ?vocab.special.eos,
            add_bos = vocab.special.add_bos,
            "tokenizer loaded"
        );
        Ok(Self {
            vocab,
            encoder,
            specials,
            pieces,
            max_token_bytes,
        })
    }

    /// Token ids of `text`. `add_special` adds BOS/EOS as the vocabulary's flags say; `parse_special`
    /// recognises control-token texts such as `<|im_start|>` (user-defined tokens are always recognised).
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TextError> {
        let s = &self.vocab.special;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && s.add_bos {
            out.extend(s.bos);
        }
        let mut prev_special = true;
        for frag in self.specials.partition(&self.vocab, text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    match &self.encoder {
                        Encoder::Bpe(bpe) => bpe.encode_into(t, &mut out)?,
                        Encoder::SentencePiece => {
                            let mut piece = String::with_capacity(t.len() + 3);
                            if s.add_space_prefix && prev_special {
                                piece.push(' ');
                            }
                            piece.push_str(t);
                            spm::encode_into(
                                &self.vocab,
                                &spm::escape_whitespace(&piece),
                                &mut out,
                            );
                        }
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && s.add_eos {
            out.extend(s.eos);
        }
        Ok(out)
    }

    /// The bytes token `id` stands for; control and unknown tokens give their text only when
    /// `render_special` is set. An id outside the vocabulary gives no bytes. Does not allocate.
    pub fn token_to_piece(&self, id: u32, render_special: bool) -> &[u8] {
        let i = id as usize;
        let Some(piece) = self.pieces.get(i) else {
            return &[];
        };
        match self.vocab.types[i] {
            TokenType::Control | TokenType::Unknown if !render_special => &[],
            _ => piece,
        }
    }

    /// The text of `ids` joined, with invalid UTF-8 replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_to_piece(id, render_special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The most bytes of input text one token of [`Tokenizer::encode`] stands for, so a text of
    /// `n` bytes gives at least `n / max` tokens (a bound a server checks before tokenizing a
    /// prompt that cannot fit its context). `None` when some byte has no token at all (neither
    /// its own nor an unknown token), so that text can vanish and no such bound holds.
    pub fn max_token_bytes(&self) -> Option<usize> {
        self.max_token_bytes
    }

    /// The vocabulary's algorithm.
    pub fn kind(&self) -> VocabKind {
        self.vocab.kind
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The raw text of token `id` as stored in the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a token given its exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.ids.get(text).copied()
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.types.get(id as usize).copied()
    }

    /// Special ids and flags in force.
    pub fn special(&self) -> &SpecialTokens {
        &self.vocab.special
    }

    /// Beginning-of-sequence id.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    /// End-of-sequence id.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// End-of-turn id.
    pub fn eot(&self) -> Option<u32> {
        self.vocab.special.eot
    }

    /// Whether generating `id` ends generation (EOS, EOT, EOM and the end-of-generation texts llama.cpp knows).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// All ids that end generation, sorted.
    pub fn eog_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.vocab.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }
}

/// The most bytes of input one token stands for: its text (special tokens, SentencePiece's
/// `▁`) or its bytes, whichever is longer; `None` unless every byte has a token (byte-level BPE
/// holds a token for each byte's character; SentencePiece falls back to `<0xXX>` tokens or the
/// unknown token).
fn max_token_bytes(vocab: &Vocab, pieces: &[Vec<u8>]) -> Option<usize> {
    let covered = match vocab.kind {
        VocabKind::BytePairBpe => crate::bpe::byte_to_char()
            .iter()
            .all(|c| vocab.ids.contains_key(&c.to_string())),
        VocabKind::SentencePiece => {
            vocab.special.unk.is_some()
                || (0..=255u8).all(|b| vocab.ids.contains_key(&format!("<0x{b:02X}>")))
        }
    };
    covered.then(|| {
        vocab
            .tokens
            .iter()
            .zip(pieces)
            .map(|(text, piece)| text.len().max(piece.len()))
            .max()
            .unwrap_or(0)
            .max(1)
    })
}

/// Precomputes every token's bytes (empty for unused tokens): byte-level decoding for BPE, `▁` to space and `<0xXX>` to the byte
/// for SentencePiece, and the raw text for control, user-defined and unknown tokens.
fn build_pieces(vocab: &Vocab) -> Vec<Vec<u8>> {
    let bytes_of = char_to_byte();
    vocab
        .tokens
        .iter()
        .zip(&vocab.types)
        .map(|(text, ty)| match (ty, vocab.kind) {
            (TokenType::Control | TokenType::Unknown | TokenType::UserDefined, _) => {
                text.as_bytes().to_vec()
            }
            // llama.cpp shows nothing for unused and undefined tokens.
            (TokenType::Unused | TokenType::Undefined, _) => Vec::new(),
            (TokenType::Byte, _) => {
                spm::parse_byte_token(text).map_or_else(|| text.as_bytes().to_vec(), |b| vec![b])
            }
            (_, VocabKind::SentencePiece) => text.replace('\u{2581}', " ").into_bytes(),
            (_, VocabKind::BytePairBpe) => {
                let mut out = Vec::with_capacity(text.len());
                for c in text.chars() {
                    match bytes_of.get(&c) {
                        Some(&b) => out.push(b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpe::byte_to_char;

    /// A byte-level vocabulary: the 256 byte characters, four merges, two control and one user-defined token.
    fn toy_spec() -> VocabSpec {
        let mut tokens: Vec<String> = byte_to_char().iter().map(|c| c.to_string()).collect();
        let mut types = vec![1; 256];
        for (t, ty) in [
            ("he", 1),
            ("ll", 1),
            ("hell", 1),
            ("hello", 1),
            ("<|im_start|>", 3),
            ("<|im_end|>", 3),
            ("<think>", 4),
        ] {
            tokens.push(t.to_string());
            types.push(ty);
        }
        VocabSpec {
            model: "gpt2".into(),
            pre: Some("qwen2".into()),
            tokens,
            token_types: Some(types),
            merges: Some(
                ["h e", "l l", "he ll", "hell o"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            ),
            bos_id: Some(260),
            eos_id: Some(261),
            ..VocabSpec::default()
        }
    }

    #[test]
    fn special_tokens_follow_parse_special_and_flags() {
        let tok = Tokenizer::from_spec(&toy_spec()).unwrap();
        let text = "<|im_start|>hello<think>";
        assert_eq!(tok.encode(text, false, true).unwrap(), [260, 259, 262]);
        // Without parse_special the control token is plain text; the user-defined one is still split out.
        let plain = tok.encode(text, false, false).unwrap();
        assert_eq!(plain.last(), Some(&262));
        assert!(!plain.contains(&260));
        assert_eq!(tok.decode(&plain, true), text);
        // Flags decide what add_special adds.
        let mut spec = toy_spec();
        spec.add_bos = Some(true);
        spec.add_eos = Some(true);
        let tok = Tokenizer::from_spec(&spec).unwrap();
        assert_eq!(tok.encode("hello", true, false).unwrap(), [260, 259, 261]);
        assert_eq!(tok.encode("hello", false, false).unwrap(), [259]);
    }

    #[test]
    fn end_of_generation_and_pieces() {
        let tok = Tokenizer::from_spec(&toy_spec()).unwrap();
        // <|im_end|> is EOS here and also recognised by text as end of turn.
        assert!(tok.is_eog(261));
        assert_eq!(tok.eot(), Some(261));
        assert!(!tok.is_eog(259));
        assert_eq!(tok.token_to_piece(260, false), b"");
        assert_eq!(tok.token_to_piece(260, true), b"<|im_start|>");
        assert_eq!(tok.token_to_piece(u32::from(b' '), true), b" ");
        assert_eq!(tok.token_to_piece(99_999, true), b"");
        assert_eq!(tok.vocab_size(), 263);
    }

    #[test]
    fn no_token_stands_for_more_input_than_the_bound() {
        let tok = Tokenizer::from_spec(&toy_spec()).unwrap();
        // `<|im_start|>` is the longest text; every byte has its own token.
        assert_eq!(tok.max_token_bytes(), Some(12));
        let text = "hello hello<|im_start|>hellohello";
        let n = tok.encode(text, false, true).unwrap().len();
        assert!(n >= text.len().div_ceil(12), "{n} tokens");
        // Without a token for byte 0x00, that byte vanishes and no bound holds.
        let mut spec = toy_spec();
        spec.tokens[0] = "[GONE]".into();
        let tok = Tokenizer::from_spec(&spec).unwrap();
        assert_eq!(tok.max_token_bytes(), None);
    }

    #[test]
    fn unused_tokens_show_nothing_and_tokenizer_is_shareable() {
        let mut spec = toy_spec();
        spec.tokens.push("[PAD263]".into());
        spec.token_types.as_mut().unwrap().push(5);
        let tok = Tokenizer::from_spec(&spec).unwrap();
        assert_eq!(tok.token_to_piece(263, true), b"");
        fn shareable<T: Send + Sync>(_: &T) {}
        shareable(&tok);
    }

    #[test]
    fn errors_name_what_was_found_and_expected() {
        let mut spec = toy_spec();
        spec.model = "bert".into();
        assert!(Tokenizer::from_spec(&spec)
            .unwrap_err()
            .to_string()
            .contains("`bert`"));
        let mut spec = toy_spec();
        spec.pre = Some("martian".into());
        assert!(Tokenizer::from_spec(&spec)
            .unwrap_err()
            .to_string()
            .contains("`martian`"));
        let mut spec = toy_spec();
        spec.token_types = Some(vec![1; 3]);
        let e = Tokenizer::from_spec(&spec).unwrap_err().to_string();
        assert!(e.contains("has 3 entries") && e.contains("263"), "{e}");
        let mut spec = toy_spec();
        spec.merges = Some(vec!["x yz".into()]);
        let e = Tokenizer::from_spec(&spec).unwrap_err().to_string();
        assert!(e.contains("`yz`"), "{e}");
        let mut spec = toy_spec();
        spec.bos_id = None;
        spec.pre = Some("glm4".into()); // glm4 has no BOS
        spec.add_bos = Some(true);
        let e = Tokenizer::from_spec(&spec).unwrap_err().to_string();
        assert!(
            e.contains("add_bos_token") && e.contains("bos_token_id"),
            "{e}"
        );
    }
}
