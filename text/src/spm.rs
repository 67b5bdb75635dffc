//! SentencePiece tokenization (`tokenizer.ggml.model = llama`) as llama.cpp does it: start from single
//! characters, repeatedly merge the adjacent pair whose joined text is a token with the highest score
//! (the leftmost pair on a tie), and spell any piece that is not a token as `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

/// One live or merged-away piece of the input, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Higher score first; on equal score the leftmost pair first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Replaces spaces by `▁`, the SentencePiece space marker.
pub fn escape_whitespace(text: &str) -> String {
    text.replace(' ', "\u{2581}")
}

/// Appends the ids of `text` (already whitespace-escaped, holding no special tokens) to `out`.
pub fn encode_into(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, ch)) in text.char_indices().enumerate() {
        let len = ch.len_utf8();
        let next = if start + len == text.len() {
            None
        } else {
            Some(i + 1)
        };
        symbols.push(Symbol {
            start,
            len,
            prev: i.checked_sub(1),
            next,
        });
    }
    let mut queue = BinaryHeap::new();
    let try_add = |symbols: &[Symbol],
                   queue: &mut BinaryHeap<Bigram>,
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (sl, sr) = (symbols[l], symbols[r]);
        let piece = &text[sl.start..sr.start + sr.len];
        if let Some(&id) = vocab.ids.get(piece) {
            queue.push(Bigram {
                left: l,
                right: r,
                score: vocab.scores[id as usize],
                size: piece.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        // Skip a pair whose symbols have changed since it was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        try_add(&symbols, &mut queue, symbols[b.left].prev, Some(b.left));
        try_add(&symbols, &mut queue, Some(b.left), symbols[b.left].next);
    }
    let mut cur = if symbols.is_empty() { None } else { Some(0) };
    while let Some(i) = cur {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.len];
        match vocab.ids.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_token(vocab, b))),
        }
        cur = s.next;
    }
}

/// The id of the `<0xXX>` token for `byte`, else of the one-character token, else the unknown token.
fn byte_token(vocab: &Vocab, byte: u8) -> Option<u32> {
    vocab
        .ids
        .get(&format!("<0x{byte:02X}>"))
        .or_else(|| char::from_u32(u32::from(byte)).and_then(|c| vocab.ids.get(&c.to_string())))
        .copied()
        .or(vocab.special.unk)
}

/// The byte a `<0xXX>` token text stands for.
pub fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabSpec;

    fn toy() -> Vocab {
        let mut tokens: Vec<String> = [
            "<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁ab", "bb", "abb",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut scores = vec![0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -0.5, -0.1, -0.3, -0.2];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
        }
        Vocab::from_spec(&VocabSpec {
            model: "llama".into(),
            tokens,
            scores: Some(scores),
            ..VocabSpec::default()
        })
        .unwrap()
    }

    fn ids_to_text(v: &Vocab, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&i| v.tokens[i as usize].clone()).collect()
    }

    #[test]
    fn merges_highest_score_first() {
        let v = toy();
        let mut out = vec![];
        // "ab" (-0.5) and "bb" (-0.3): "bb" wins, then "abb" (-0.2).
        encode_into(&v, "abb", &mut out);
        assert_eq!(ids_to_text(&v, &out), ["abb"]);
        out.clear();
        encode_into(&v, "▁ab", &mut out);
        assert_eq!(ids_to_text(&v, &out), ["▁ab"]);
    }

    #[test]
    fn equal_scores_merge_the_leftmost_pair() {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "x", "y", "xy", "yx"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut scores = vec![0.0, 0.0, 0.0, -1.0, -1.0, -0.5, -0.5];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
        }
        let v = Vocab::from_spec(&VocabSpec {
            model: "llama".into(),
            tokens,
            scores: Some(scores),
            ..VocabSpec::default()
        })
        .unwrap();
        let mut out = vec![];
        encode_into(&v, "xyx", &mut out);
        assert_eq!(ids_to_text(&v, &out), ["xy", "x"]);
        out.clear();
        encode_into(&v, "yxy", &mut out);
        assert_eq!(ids_to_text(&v, &out), ["yx", "y"]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let v = toy();
        let mut out = vec![];
        encode_into(&v, "aé", &mut out);
        assert_eq!(ids_to_text(&v, &out), ["a", "<0xC3>", "<0xA9>"]);
        assert_eq!(parse_byte_token("<0xC3>"), Some(0xC3));
        assert_eq!(parse_byte_token("<0xC3"), None);
    }
}
