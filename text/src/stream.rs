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
}

impl<'t> StreamDecoder<'t> {
    /// A decoder over `tokenizer`; `render_special` shows control tokens' text (as llama-server does for
    /// `/detokenize`), otherwise they decode to nothing.
    pub fn new(tokenizer: &'t Tokenizer, render_special: bool) -> Self {
        Self {
            tokenizer,
            pending: Vec::with_capacity(8),
            render_special,
        }
    }

    /// Adds one token and returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending
            .extend_from_slice(self.tokenizer.token_to_piece(id, self.render_special));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid` bytes were just checked to be UTF-8.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: keep it for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
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
