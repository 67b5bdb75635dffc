//! Splitting special-token texts out of raw text before tokenization, as llama.cpp's
//! `tokenizer_st_partition` does: longest token text first, every occurrence, left to right.
//! An Aho-Corasick pass first finds which special texts occur at all, so a vocabulary with thousands of
//! control tokens costs one scan of the prompt instead of one per token.

use aho_corasick::AhoCorasick;

use crate::vocab::{TokenType, Vocab};

/// A piece of the input: raw text to tokenize, or a token already recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment<'a> {
    /// Text with no special token in it.
    Text(&'a str),
    /// A special token found in the text.
    Token(u32),
}

/// The special tokens that may be parsed out of text, longest text first.
#[derive(Debug, Clone)]
pub struct SpecialMatcher {
    /// `(id, parsed only with parse_special)`, ordered by text length, longest first, then by id.
    order: Vec<(u32, bool)>,
    /// Matches the texts of `order` (pattern `i` is `order[i]`); `None` when there are no special tokens.
    finder: Option<AhoCorasick>,
}

impl SpecialMatcher {
    /// Collects control, user-defined and unknown tokens of the vocabulary.
    pub fn new(vocab: &Vocab) -> Self {
        let mut order: Vec<(u32, bool)> = vocab
            .types
            .iter()
            .enumerate()
            .filter_map(|(id, t)| match t {
                TokenType::Control | TokenType::Unknown => Some((id as u32, true)),
                TokenType::UserDefined => Some((id as u32, false)),
                _ => None,
            })
            .collect();
        order.retain(|&(id, _)| !vocab.tokens[id as usize].is_empty());
        order.sort_by(|a, b| {
            vocab.tokens[b.0 as usize]
                .len()
                .cmp(&vocab.tokens[a.0 as usize].len())
                .then(a.0.cmp(&b.0))
        });
        let finder = if order.is_empty() {
            None
        } else {
            // Texts are non-empty and few enough for the library's limits; a build failure only loses the
            // prefilter, and every token is then searched for directly.
            AhoCorasick::new(
                order
                    .iter()
                    .map(|&(id, _)| vocab.tokens[id as usize].as_bytes()),
            )
            .ok()
        };
        Self { order, finder }
    }

    /// Splits `text` into fragments. Control and unknown tokens are recognised only when `parse_special`
    /// is set; user-defined tokens always are.
    pub fn partition<'a>(
        &self,
        vocab: &Vocab,
        text: &'a str,
        parse_special: bool,
    ) -> Vec<Fragment<'a>> {
        let mut frags = if text.is_empty() {
            vec![]
        } else {
            vec![Fragment::Text(text)]
        };
        if text.is_empty() {
            return frags;
        }
        // Which special texts occur anywhere in `text` (a text cut by a longer token is still searched
        // for in the pieces, so this only skips tokens that cannot match).
        let present: Option<Vec<bool>> = self.finder.as_ref().map(|f| {
            let mut seen = vec![false; self.order.len()];
            for m in f.find_overlapping_iter(text) {
                seen[m.pattern().as_usize()] = true;
            }
            seen
        });
        for (i, &(id, needs_parse_special)) in self.order.iter().enumerate() {
            if needs_parse_special && !parse_special {
                continue;
            }
            if present.as_ref().is_some_and(|p| !p[i]) {
                continue;
            }
            let needle = vocab.tokens[id as usize].as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = rest.find(needle) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[pos + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabSpec;

    fn vocab() -> Vocab {
        let tokens = ["a", "<|x|>", "<|x|><|y|>", "<u>", "b"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        Vocab::from_spec(&VocabSpec {
            model: "llama".into(),
            tokens,
            token_types: Some(vec![1, 3, 3, 4, 1]),
            bos_id: Some(0),
            eos_id: Some(1),
            unk_id: Some(0),
            ..VocabSpec::default()
        })
        .unwrap()
    }

    #[test]
    fn longest_special_text_wins_and_every_occurrence_is_split() {
        let v = vocab();
        let m = SpecialMatcher::new(&v);
        assert_eq!(
            m.partition(&v, "a<|x|><|y|>b<|x|><u>", true),
            [
                Fragment::Text("a"),
                Fragment::Token(2),
                Fragment::Text("b"),
                Fragment::Token(1),
                Fragment::Token(3)
            ]
        );
        // Control tokens need parse_special; user-defined ones do not.
        assert_eq!(
            m.partition(&v, "a<|x|><u>", false),
            [Fragment::Text("a<|x|>"), Fragment::Token(3)]
        );
        assert!(m.partition(&v, "", true).is_empty());
    }
}
