//! A grammar in use by one request: its state (a set of stacks and any partial character), which
//! tokens it admits next (a mask over the vocabulary, cached per state), and taking a token.

use std::sync::Arc;

use crate::gbnf::Grammar;
use crate::mask::Mask;
use crate::program::{Elem, Program};
use crate::stacks::{Map, SetId, Stacks, DEAD};
use crate::utf8::{Decoder, Partial, Step};
use crate::vocab::TokenTrie;

/// Masks kept per matcher before the cache starts over (each at most `n_vocab` bits).
const MAX_CACHED_MASKS: usize = 4096;

/// A token the grammar does not admit here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the grammar does not admit token {token} here")]
pub struct Rejected {
    /// The token.
    pub token: u32,
}

/// One request's grammar state over a vocabulary.
pub struct Matcher {
    stacks: Stacks,
    vocab: Arc<TokenTrie>,
    set: SetId,
    partial: Partial,
    masks: Map<(SetId, Partial), Arc<Mask>>,
    /// The trie nodes a walk has still to visit (kept: no allocation per mask once grown).
    todo: Vec<(u32, SetId, Decoder)>,
    /// The tokens a mask being computed admits (kept, as `todo`).
    found: Vec<u32>,
    /// Masks computed (not found in the cache).
    pub computed: u64,
}

impl Matcher {
    /// The grammar at its start.
    pub fn new(grammar: &Grammar, vocab: Arc<TokenTrie>) -> Self {
        let mut stacks = Stacks::new(Arc::new(Program::new(grammar)));
        let set = stacks.start();
        Matcher {
            stacks,
            vocab,
            set,
            partial: Partial::default(),
            masks: Map::default(),
            todo: Vec::new(),
            found: Vec::new(),
            computed: 0,
        }
    }

    /// Back to the grammar's start, keeping the cached masks (to walk another sentence of the
    /// same grammar over the same vocabulary).
    pub fn restart(&mut self) {
        self.set = self.stacks.start();
        self.partial = Partial::default();
    }

    /// Whether the text so far is a whole sentence of the grammar (end of generation allowed).
    pub fn accepts_end(&self) -> bool {
        self.partial.remain == 0 && self.stacks.accepts(self.set)
    }

    /// Whether no continuation is possible (only after text the grammar refused).
    fn dead(&self) -> bool {
        self.set == DEAD
    }

    /// The tokens admitted next, from the cache when this state was seen before. On the decode
    /// path: a cached mask is an `Arc` clone; a new state allocates its mask (`n_vocab` bits).
    pub fn mask(&mut self) -> Arc<Mask> {
        let key = (self.set, self.partial);
        if let Some(m) = self.masks.get(&key) {
            return m.clone();
        }
        if self.masks.len() >= MAX_CACHED_MASKS {
            self.masks.clear();
        }
        let m = Arc::new(self.compute());
        self.computed += 1;
        self.masks.insert(key, m.clone());
        m
    }

    fn compute(&mut self) -> Mask {
        let mut found = std::mem::take(&mut self.found);
        found.clear();
        self.admitted(&mut found);
        let mask = Mask::of(self.vocab.n_vocab, &mut found);
        self.found = found;
        mask
    }

    /// Appends to `found` the tokens admitted here (in no order, perhaps repeated).
    fn admitted(&mut self, found: &mut Vec<u32>) {
        let vocab = self.vocab.clone();
        if self.stacks.accepts(self.set) && self.partial.remain == 0 {
            found.extend_from_slice(&vocab.eog);
        }
        // Token elements on top admit whole tokens by id.
        let tops: Vec<u32> = self
            .stacks
            .set(self.set)
            .iter()
            .filter_map(|&s| self.stacks.top(s))
            .collect();
        for pos in tops {
            if let Elem::Token { id, negated } = *self.stacks.program().elem(pos) {
                if vocab.eog.contains(&id) && !negated {
                    continue;
                }
                if negated {
                    found.extend(vocab.ids.iter().filter(|&&t| t != id));
                } else {
                    found.push(id);
                }
            }
        }
        let start = self.stacks.char_stacks(self.set);
        if start == DEAD {
            return;
        }
        self.walk(0, start, Decoder::new(self.partial), |ids| {
            found.extend_from_slice(ids);
            false
        });
    }

    /// Walks the trie below node `from`, whose bytes left the character-topped stacks `set`
    /// and the decoder `dec`, handing `found` the tokens of every node the grammar admits;
    /// true as soon as `found` returns true (the walk stops there).
    fn walk(
        &mut self,
        from: u32,
        set: SetId,
        dec: Decoder,
        found: impl FnMut(&[u32]) -> bool,
    ) -> bool {
        let vocab = self.vocab.clone();
        let mut todo = std::mem::take(&mut self.todo);
        todo.clear();
        self.push_children(&vocab, from, set, dec, &mut todo);
        let found = self.walk_from(&vocab, &mut todo, found);
        self.todo = todo;
        found
    }

    /// Queues the children of trie node `n` that may follow: all of them in the middle of a
    /// character, else those whose byte is not an ASCII character `set` refuses.
    fn push_children(
        &self,
        vocab: &TokenTrie,
        n: u32,
        set: SetId,
        dec: Decoder,
        todo: &mut Vec<(u32, SetId, Decoder)>,
    ) {
        let node = vocab.nodes[n as usize];
        let between = dec.partial.remain == 0;
        for c in node.children.0..node.children.1 {
            let b = vocab.nodes[c as usize].byte;
            if between && b < 0x80 && !self.stacks.takes_ascii(set, b) {
                continue;
            }
            todo.push((c, set, dec));
        }
    }

    /// [`Matcher::walk`] over the nodes queued in `todo`.
    fn walk_from(
        &mut self,
        vocab: &TokenTrie,
        todo: &mut Vec<(u32, SetId, Decoder)>,
        mut found: impl FnMut(&[u32]) -> bool,
    ) -> bool {
        while let Some((n, set, mut dec)) = todo.pop() {
            let node = vocab.nodes[n as usize];
            let set = match dec.push(node.byte) {
                Step::Invalid => continue,
                // A character in progress that no stack can take ends the whole subtree.
                Step::More if !self.ends_well(set, dec.partial) => continue,
                Step::More => set,
                Step::Char(c) => {
                    let next = self.stacks.step(set, c);
                    if next == DEAD {
                        continue;
                    }
                    next
                }
            };
            if node.tokens.0 < node.tokens.1
                && self.ends_well(set, dec.partial)
                && found(&vocab.ids[node.tokens.0 as usize..node.tokens.1 as usize])
            {
                return true;
            }
            self.push_children(vocab, n, set, dec, todo);
        }
        false
    }

    /// Whether, once the text `before` is taken from here, the grammar admits a token whose
    /// piece is `piece` followed by more bytes: a token that would join `piece` to what comes
    /// after it. True in the middle of a character (unknown: the caller should not rely on
    /// `piece` standing alone). The state is left as it was.
    pub fn admits_longer(&mut self, before: &str, piece: &[u8]) -> bool {
        if self.partial.remain != 0 {
            return true;
        }
        let mut set = self.set;
        for c in before.chars() {
            set = self.stacks.step(set, c as u32);
        }
        let mut set = self.stacks.char_stacks(set);
        let vocab = self.vocab.clone();
        let mut node = 0u32;
        let mut dec = Decoder::new(Partial::default());
        for &b in piece {
            let n = vocab.nodes[node as usize];
            let Some(child) =
                (n.children.0..n.children.1).find(|&c| vocab.nodes[c as usize].byte == b)
            else {
                return false;
            };
            node = child;
            match dec.push(b) {
                Step::Invalid => return false,
                Step::More => {}
                Step::Char(c) => set = self.stacks.step(set, c),
            }
            if set == DEAD {
                return false;
            }
        }
        self.walk(node, set, dec, |_| true)
    }

    /// Whether a token may end in `set` with `partial` unfinished.
    fn ends_well(&self, set: SetId, partial: Partial) -> bool {
        if partial.remain == 0 {
            return true;
        }
        self.stacks.set(set).iter().any(|&s| {
            self.stacks
                .top(s)
                .is_some_and(|pos| self.stacks.program().may_take(pos, partial))
        })
    }

    /// Takes token `id` whose piece is `piece` (end-of-generation tokens: `eog`). A refused
    /// token leaves the state as it was. On the decode path: a state met before costs table
    /// lookups and no allocation (a grammar with token items builds one short list per call).
    pub fn accept(&mut self, id: u32, piece: &[u8], eog: bool) -> Result<(), Rejected> {
        if eog {
            return if self.accepts_end() {
                Ok(())
            } else {
                Err(Rejected { token: id })
            };
        }
        let by_token = self.stacks.step_token(self.set, id);
        let piece = &piece[..piece.iter().position(|&b| b == 0).unwrap_or(piece.len())];
        let mut set = self.stacks.char_stacks(self.set);
        let mut dec = Decoder::new(self.partial);
        if piece.is_empty() {
            set = DEAD;
        }
        for &b in piece {
            match dec.push(b) {
                Step::Invalid => {
                    set = DEAD;
                    break;
                }
                Step::More => {}
                Step::Char(c) => set = self.stacks.step(set, c),
            }
            if set == DEAD {
                break;
            }
        }
        if set != DEAD && !self.ends_well(set, dec.partial) {
            set = DEAD;
        }
        let (set, partial) = match (by_token == DEAD, set == DEAD) {
            (true, true) => return Err(Rejected { token: id }),
            (false, true) => (by_token, Partial::default()),
            (true, false) => (set, dec.partial),
            (false, false) => (self.stacks.union(by_token, set), dec.partial),
        };
        self.set = set;
        self.partial = partial;
        Ok(())
    }

    /// The text the grammar fixes from here: the characters taken one by one while the state
    /// admits exactly one next character (and may neither end nor take a token item), at most
    /// `max_chars` of them, written over `text`. Empty in the middle of a character. The state
    /// is left as it was. A stretch ends at any branch, optional whitespace included. On the
    /// decode path: memoized steps, and no allocation once `text` has grown.
    pub fn fixed_text(&mut self, max_chars: usize, text: &mut String) {
        text.clear();
        if self.partial.remain != 0 {
            return;
        }
        let mut set = self.set;
        for _ in 0..max_chars {
            let Some(c) = self.stacks.only_char(set).and_then(char::from_u32) else {
                break;
            };
            set = self.stacks.step(set, c as u32);
            if set == DEAD {
                break;
            }
            text.push(c);
        }
    }

    /// Takes a whole text (no token ids), as the grammar engine of llama.cpp's validator does:
    /// false when the grammar refuses some character.
    pub fn accept_text(&mut self, text: &str) -> bool {
        let mut set = self.set;
        for c in text.chars() {
            set = self.stacks.step(set, c as u32);
            if set == DEAD {
                self.set = DEAD;
                return false;
            }
        }
        self.set = set;
        !self.dead()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(pieces: &[&'static str], eog: &[u32]) -> Arc<TokenTrie> {
        let p: Vec<&[u8]> = pieces.iter().map(|s| s.as_bytes()).collect();
        Arc::new(TokenTrie::new(p.len(), |i| p[i as usize], eog))
    }

    fn grammar(src: &str) -> Grammar {
        Grammar::parse(src, None).unwrap()
    }

    fn full(src: &str, text: &str) -> bool {
        let g = grammar(src);
        let mut m = Matcher::new(&g, trie(&[], &[]));
        m.accept_text(text) && m.accepts_end()
    }

    #[test]
    fn text_matching_follows_the_language() {
        let g = "root ::= \"a\"{2,3} (\"b\" | [c-e]+)? .";
        for (t, ok) in [
            ("aax", true),
            ("aaax", true),
            ("ax", false),
            ("aaaax", false),
            ("aabx", true),
            ("aacdex", true),
            ("aabcx", false),
            ("aa", false),
        ] {
            assert_eq!(full(g, t), ok, "{t}");
        }
        assert!(full("root ::= [^\"\\\\]* \"\\\"\"", "héllo\""));
        assert!(full("root ::= x*\nx ::= \"(\" x* \")\"", "(()(()))"));
        assert!(!full("root ::= x*\nx ::= \"(\" x* \")\"", "(()"));
    }

    #[test]
    fn the_mask_admits_exactly_the_tokens_that_fit() {
        let t = trie(&["{", "\"", "\"a", "a\"", "}", "{\"", "x", "</s>"], &[7]);
        let g = grammar("root ::= \"{\" (\"\\\"a\\\"\")? \"}\"");
        let mut m = Matcher::new(&g, t);
        let mask = m.mask();
        let admitted: Vec<u32> = (0..8).filter(|&i| mask.allows(i)).collect();
        assert_eq!(admitted, vec![0, 5]);
        m.accept(5, b"{\"", false).unwrap();
        let mask = m.mask();
        assert_eq!(mask.only(), Some(3));
        assert!(m.accept(6, b"x", false).is_err());
        m.accept(3, b"a\"", false).unwrap();
        assert_eq!(m.mask().only(), Some(4));
        m.accept(4, b"}", false).unwrap();
        assert_eq!(m.mask().only(), Some(7));
        m.accept(7, b"</s>", true).unwrap();
    }

    #[test]
    fn a_character_may_span_tokens() {
        let e = "é".as_bytes();
        let halves: Vec<&[u8]> = vec![&e[..1], &e[1..], b"e", "\u{e8}".as_bytes()];
        let t = Arc::new(TokenTrie::new(halves.len(), |i| halves[i as usize], &[]));
        let g = grammar("root ::= [\\u00e9]");
        let mut m = Matcher::new(&g, t);
        let mask = m.mask();
        // The lead byte 0xC3 may become é; è (also 0xC3 ..) is whole and refused.
        assert!(mask.allows(0) && !mask.allows(2) && !mask.allows(3));
        m.accept(0, &e[..1], false).unwrap();
        assert!(!m.accepts_end());
        assert_eq!(m.mask().only(), Some(1));
        m.accept(1, &e[1..], false).unwrap();
        assert!(m.accepts_end());
    }

    #[test]
    fn masks_are_cached_per_state() {
        let t = trie(&["a", "b"], &[]);
        let g = grammar("root ::= \"a\"*");
        let mut m = Matcher::new(&g, t);
        for _ in 0..5 {
            m.mask();
            m.accept(0, b"a", false).unwrap();
        }
        assert_eq!(m.computed, 1);
    }

    #[test]
    fn the_fixed_text_runs_to_the_first_branch() {
        let g = grammar(
            r#"root ::= "{" ws "\"kind\"" ws ":" ws ("\"alpha\"" | "\"beta\"") "}"
ws ::= " "?"#,
        );
        let t = trie(&["{", "\"", "kind", "\":", " ", "\"al", "pha\"}"], &[]);
        let mut m = Matcher::new(&g, t);
        let fixed = |m: &mut Matcher, max| {
            let mut text = String::new();
            m.fixed_text(max, &mut text);
            text
        };
        assert_eq!(fixed(&mut m, 64), "{");
        m.accept(0, b"{", false).unwrap();
        // Optional whitespace is a branch.
        assert_eq!(fixed(&mut m, 64), "");
        m.accept(1, b"\"", false).unwrap();
        assert_eq!(fixed(&mut m, 64), "kind\"");
        assert_eq!(fixed(&mut m, 2), "ki");
        m.accept(2, b"kind", false).unwrap();
        m.accept(3, b"\":", false).unwrap();
        assert_eq!(fixed(&mut m, 64), "");
        m.accept(5, b"\"al", false).unwrap();
        // A unique enum continuation, up to the end the grammar allows.
        assert_eq!(fixed(&mut m, 64), "pha\"}");
        m.accept(6, b"pha\"}", false).unwrap();
        assert_eq!(fixed(&mut m, 64), "");
    }

    #[test]
    fn a_longer_token_that_would_join_a_piece_to_what_follows_is_found() {
        let g = grammar(
            r#"root ::= "{\"kind\"" ws ":" ws "1"
ws ::= " "?"#,
        );
        let t = trie(&["{\"", "kind", "\"", "\":", "\"x", ":", " 1"], &[]);
        let mut m = Matcher::new(&g, t.clone());
        m.accept(0, b"{\"", false).unwrap();
        // `"` may join the `:` after it (`":`); `kind` cannot grow into an admitted token.
        assert!(m.admits_longer("kind", b"\""));
        assert!(!m.admits_longer("", b"kind"));
        // Past the colon only ` 1` extends nothing of `:`.
        assert!(!m.admits_longer("kind\"", b":"));
        let g = grammar(r#"root ::= "{\"kind\"" " " "1""#);
        let mut m = Matcher::new(&g, t);
        m.accept(0, b"{\"", false).unwrap();
        assert!(!m.admits_longer("kind", b"\""));
    }

    #[test]
    fn token_items_admit_their_token() {
        let t = trie(&["<think>", "x", "y"], &[]);
        let g = grammar("root ::= <[0]> !<[1]>");
        let mut m = Matcher::new(&g, t);
        assert_eq!(m.mask().only(), Some(0));
        m.accept(0, b"<think>", false).unwrap();
        let mask = m.mask();
        assert!(mask.allows(0) && !mask.allows(1) && mask.allows(2));
    }
}

#[cfg(test)]
mod mask_tests {
    //! The mask against taking each token one by one, on a vocabulary of JSON pieces, whitespace
    //! runs and split multi-byte characters.
    use super::*;

    fn vocab() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        for s in [
            "{\"", "\":", "\": ", "\",", "\"}", "},", "[{", "}]", "true", "false", "null", "na",
            "me", "\"name", "\"name\"", "  ", "\n\n", "\t\t\t", " \"", "12", "-3", "e+", "é",
            "中文", "\\u00", "\\\"", "alpha", "al", "pha\"", "\"a", "😀",
        ] {
            v.push(s.as_bytes().to_vec());
        }
        // Multi-byte characters split at every byte.
        for s in ["é", "中", "😀"] {
            let b = s.as_bytes();
            for i in 1..b.len() {
                v.push(b[..i].to_vec());
                v.push(b[i..].to_vec());
            }
        }
        v
    }

    #[test]
    fn the_mask_equals_taking_each_token() {
        let pieces = vocab();
        let eog = pieces.len() as u32;
        let mut all = pieces.clone();
        all.push(b"</s>".to_vec());
        let trie = Arc::new(TokenTrie::new(all.len(), |i| &all[i as usize], &[eog]));
        // A JSON object of a short string, an enum and an optional number (as the schema
        // converter writes one, spelled out here).
        let g = Grammar::parse(
            r#"root ::= "{" ws "\"name\"" ws ":" ws str ws "," ws "\"kind\"" ws ":" ws kind ( ws "," ws "\"n\"" ws ":" ws num )? ws "}"
ws ::= ( " " | "\n" "\n"? [ \t]{0,3} )?
str ::= "\"" ( [^"\\\x00-\x1F] | "\\" ["\\bfnrt] ){0,4} "\""
kind ::= "\"alpha\"" | "\"beta\""
num ::= "-"? [0-9]+ ("." [0-9]+)?"#,
            None,
        )
        .unwrap();
        for seed in 0..2 {
            let text = g.sample(seed).unwrap();
            // Byte tokens spell the sentence (ids 0..256 are the single bytes).
            let ids: Vec<u32> = text.bytes().map(u32::from).collect();
            let mut m = Matcher::new(&g, trie.clone());
            for step in 0..=ids.len() {
                let mask = m.mask();
                for id in 0..all.len() as u32 {
                    let mut probe = Matcher::new(&g, trie.clone());
                    for &p in &ids[..step] {
                        probe.accept(p, &all[p as usize], false).unwrap();
                    }
                    let ok = probe.accept(id, &all[id as usize], id == eog).is_ok();
                    assert_eq!(
                        mask.allows(id),
                        ok,
                        "{text:?} at {step}, token {:?}",
                        all[id as usize]
                    );
                }
                if let Some(&id) = ids.get(step) {
                    m.accept(id, &all[id as usize], false).unwrap();
                }
            }
        }
    }
}
