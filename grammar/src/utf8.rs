//! UTF-8 decoding for the grammar, one byte at a time, so that a character may start in one
//! token and end in the next. Valid UTF-8 decodes as in llama.cpp's grammar. Invalid UTF-8 is
//! refused where llama.cpp lets some through (a lead byte followed by a non-continuation byte
//! inside one token, overlong forms, surrogates, code points past U+10FFFF): a grammar for JSON
//! must not admit bytes that no JSON parser reads.

/// Continuation bytes after a lead byte, by its high nibble (-1: not a lead byte).
const FOLLOWING: [i8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, 1, 1, 2, 3];

/// A character in progress: the bits so far and the bytes still to come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Partial {
    /// The bits decoded so far.
    pub value: u32,
    /// Continuation bytes still expected (0: between characters).
    pub remain: u8,
    /// The whole sequence's length in bytes.
    pub len: u8,
}

/// Decoding within one token.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decoder {
    pub(crate) partial: Partial,
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
        Decoder { partial }
    }

    /// Feeds one byte.
    pub(crate) fn push(&mut self, b: u8) -> Step {
        let p = &mut self.partial;
        if p.remain > 0 {
            if b >> 6 != 2 {
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
            p.len = n as u8 + 1;
        }
        if p.remain > 0 {
            return Step::More;
        }
        // Between characters the state is always the same (one cache key per grammar state).
        let c = std::mem::take(&mut p.value);
        let least = match std::mem::take(&mut p.len) {
            2 => 0x80,
            3 => 0x800,
            4 => 0x10000,
            _ => 0,
        };
        if c < least || (0xd800..=0xdfff).contains(&c) || c > 0x10ffff {
            return Step::Invalid;
        }
        Step::Char(c)
    }
}

/// The code points a partial character can still become, or None when it can become no valid
/// one (an overlong or surrogate start, or past U+10FFFF).
pub(crate) fn completions(p: Partial) -> Option<(u32, u32)> {
    let n = u32::from(p.remain);
    let least = match p.len {
        2 => 0x80,
        3 => 0x800,
        _ => 0x10000,
    };
    let low = (p.value << (n * 6)).max(least);
    let high = ((p.value << (n * 6)) | ((1u32 << (n * 6)) - 1)).min(0x10ffff);
    let surrogates = 0xd800..=0xdfff;
    if low > high || (surrogates.contains(&low) && surrogates.contains(&high)) {
        return None;
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
    fn overlong_forms_and_surrogates_are_invalid() {
        for bad in [
            &[0xf0, 0x8c, 0xa1, 0xb4][..],
            &[0xc1, 0xbf],
            &[0xed, 0xa0, 0x80],
            &[0xc3, 0x41],
        ] {
            assert!(decode(bad, Partial::default()).1.is_none(), "{bad:x?}");
        }
    }

    #[test]
    fn completions_cover_the_possible_code_points() {
        let (_, p) = decode(&[0xe4], Partial::default());
        assert_eq!(completions(p.unwrap()), Some((0x4000, 0x4fff)));
        for dead in [&[0xc1][..], &[0xf0, 0x80], &[0xf5], &[0xed, 0xa0]] {
            let (_, p) = decode(dead, Partial::default());
            assert_eq!(completions(p.unwrap()), None, "{dead:x?}");
        }
    }
}
