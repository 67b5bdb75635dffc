//! Incremental detokenization that never emits half of a UTF-8 character.

use crate::tokenizer::Tokenizer;

/// Turns generated token ids into text one id at a time.
///
/// Bytes of a character split across tokens (byte-fallback or byte-level pieces) are held until the
/// character is complete. A byte sequence that can never become valid UTF-8 is emitted as U+FFFD.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
    render_special: bool,
    /// Control tokens shown as text all the same (a chat format's tags).
    preserved: Vec<u32>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder over `tokenizer`; `render_special` shows control tokens' text (as llama-server does for
    /// `/detokenize`), otherwise they decode to nothing.
    pub fn new(tokenizer: &'t Tokenizer, render_special: bool) -> Self {
        Self {
            tokenizer,
            pending: Vec::with_capacity(8),
            render_special,
            preserved: Vec::new(),
        }
    }

    /// The same decoder showing the text of these control tokens (llama.cpp's preserved tokens:
    /// the tags a chat format's parser reads).
    pub fn preserving(mut self, ids: &[u32]) -> Self {
        self.preserved = ids.to_vec();
        self
    }

    /// Adds one token and returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let mut out = String::new();
        self.push_to(id, &mut out);
        out
    }

    /// Adds one token and appends the text that became complete to `out`. On the decode hot path:
    /// allocates only when `out` or the (at most 4-byte) hold-back buffer must grow.
    pub fn push_to(&mut self, id: u32, out: &mut String) {
        let special = self.render_special || self.preserved.contains(&id);
        let piece = self.tokenizer.token_to_piece(id, special);
        if self.pending.is_empty() {
            // Fast path: a whole piece of valid text with nothing held back.
            if let Ok(s) = std::str::from_utf8(piece) {
                out.push_str(s);
                return;
            }
        }
        self.pending.extend_from_slice(piece);
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid` bytes were just checked to be UTF-8.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: keep it for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Returns whatever is still held (an unfinished character becomes U+FFFD) and empties the decoder.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Number of bytes held back waiting for a character to complete.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabSpec;

    /// A SentencePiece vocabulary with byte tokens, so that one character can span several tokens.
    fn byte_vocab() -> Tokenizer {
        let mut tokens = vec![
            "<unk>".to_string(),
            "<s>".into(),
            "</s>".into(),
            "▁hi".into(),
        ];
        let mut types = vec![2, 3, 3, 1];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        Tokenizer::from_spec(&VocabSpec {
            model: "llama".into(),
            tokens,
            token_types: Some(types),
            ..VocabSpec::default()
        })
        .unwrap()
    }

    fn byte(b: u8) -> u32 {
        4 + u32::from(b)
    }

    #[test]
    fn holds_bytes_until_a_character_completes() {
        let tok = byte_vocab();
        let mut d = StreamDecoder::new(&tok, false);
        assert_eq!(d.push(3), " hi");
        // "€" is E2 82 AC.
        assert_eq!(d.push(byte(0xE2)), "");
        assert_eq!(d.push(byte(0x82)), "");
        assert_eq!(d.pending_len(), 2);
        assert_eq!(d.push(byte(0xAC)), "€");
        // Control tokens are hidden unless asked for.
        assert_eq!(d.push(2), "");
        assert_eq!(StreamDecoder::new(&tok, true).push(2), "</s>");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let tok = byte_vocab();
        let mut d = StreamDecoder::new(&tok, false);
        // A lone continuation byte can never start a character.
        assert_eq!(d.push(byte(0x80)), "\u{FFFD}");
        // A lead byte followed by ASCII: the lead byte is bad, the ASCII comes through.
        assert_eq!(d.push(byte(0xE2)), "");
        assert_eq!(d.push(byte(b'a')), "\u{FFFD}a");
        // An unfinished character at the end is flushed as U+FFFD.
        assert_eq!(d.push(byte(0xF0)), "");
        assert_eq!(d.flush(), "\u{FFFD}");
        assert_eq!(d.pending_len(), 0);
    }
}
