//! UTF-8 decoding as llama.cpp's grammar does it, one byte at a time, so that a character may
//! start in one token and end in the next: a lead byte sets how many continuation bytes follow
//! (a stray continuation byte is invalid), and only the bytes that finish a character carried over
//! from the previous token are checked to be continuation bytes.

/// Continuation bytes after a lead byte, by its high nibble (-1: not a lead byte).
const FOLLOWING: [i8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, 1, 1, 2, 3];

/// A character in progress: the bits so far and the bytes still to come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Partial {
    /// The bits decoded so far.
    pub value: u32,
    /// Continuation bytes still expected (0: between characters).
    pub remain: u8,
}

/// Decoding within one token.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decoder {
    pub(crate) partial: Partial,
    /// Still finishing the character the previous token began.
    carried: bool,
}

/// What one byte did.
pub(crate) enum Step {
    /// A character is complete.
    Char(u32),
    /// More bytes are needed.
    More,
    /// The token is not valid UTF-8 for the grammar.
    Invalid,
}

impl Decoder {
    /// Starts a token after `partial` (what the previous token left unfinished).
    pub(crate) fn new(partial: Partial) -> Self {
        Decoder {
            partial,
            carried: partial.remain > 0,
        }
    }

    /// Feeds one byte.
    pub(crate) fn push(&mut self, b: u8) -> Step {
        let p = &mut self.partial;
        if p.remain > 0 {
            if self.carried && b >> 6 != 2 {
                return Step::Invalid;
            }
            p.value = (p.value << 6) + u32::from(b & 0x3f);
            p.remain -= 1;
        } else {
            let n = FOLLOWING[usize::from(b >> 4)];
            if n < 0 {
                return Step::Invalid;
            }
            p.value = u32::from(b) & ((1u32 << (7 - n)) - 1);
            p.remain = n as u8;
        }
        if p.remain == 0 {
            self.carried = false;
            // Between characters the state is always the same (one cache key per grammar state).
            Step::Char(std::mem::take(&mut p.value))
        } else {
            Step::More
        }
    }
}

/// The code points a partial character can still become, or None when it cannot become any
/// (an overlong two-byte start).
pub(crate) fn completions(p: Partial) -> Option<(u32, u32)> {
    let n = u32::from(p.remain);
    if n == 1 && p.value < 2 {
        return None;
    }
    let mut low = p.value << (n * 6);
    let high = low | ((1u32 << (n * 6)) - 1);
    if low == 0 {
        low = match n {
            2 => 1 << 11,
            3 => 1 << 16,
            _ => low,
        };
    }
    Some((low, high))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8], from: Partial) -> (Vec<u32>, Option<Partial>) {
        let mut d = Decoder::new(from);
        let mut out = Vec::new();
        for &b in bytes {
            match d.push(b) {
                Step::Char(c) => out.push(c),
                Step::More => {}
                Step::Invalid => return (out, None),
            }
        }
        (out, Some(d.partial))
    }

    #[test]
    fn a_character_split_across_tokens_completes() {
        let bytes = "é😀".as_bytes();
        let (c, p) = decode(&bytes[..3], Partial::default());
        assert_eq!(c, vec![0xe9]);
        let p = p.unwrap();
        assert_eq!(p.remain, 3);
        let (c, p) = decode(&bytes[3..], p);
        assert_eq!((c, p.unwrap().remain), (vec![0x1f600], 0));
    }

    #[test]
    fn stray_continuations_are_invalid() {
        assert!(decode(&[0x80], Partial::default()).1.is_none());
        let (_, p) = decode(&[0xc3], Partial::default());
        assert!(decode(b"a", p.unwrap()).1.is_none());
    }

    #[test]
    fn completions_cover_the_possible_code_points() {
        let (_, p) = decode(&[0xe4], Partial::default());
        assert_eq!(completions(p.unwrap()), Some((0x4000, 0x4fff)));
        let (_, p) = decode(&[0xc1], Partial::default());
        assert_eq!(completions(p.unwrap()), None);
    }
}
