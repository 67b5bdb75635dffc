//! A parsed grammar flattened for matching: every alternative's items laid end to end, each
//! alternative closed by an end marker, so a position in the grammar is one index.

use crate::gbnf::{CharClass, Grammar, Item};
use crate::utf8::{completions, Partial};

/// One element of the flattened grammar.
#[derive(Clone, Debug)]
pub(crate) enum Elem {
    /// A character of this class.
    Class(CharClass),
    /// Any character.
    Any,
    /// Enter this rule.
    Ref(u32),
    /// This token (`negated`: any other).
    Token { id: u32, negated: bool },
    /// The end of an alternative.
    End,
}

/// The flattened grammar.
#[derive(Debug)]
pub(crate) struct Program {
    pub(crate) elems: Vec<Elem>,
    /// Each rule's alternatives, by their first position.
    pub(crate) alts: Vec<Vec<u32>>,
    /// The start rule.
    pub(crate) root: u32,
    /// Per element, the ASCII characters it takes (bit `c` of the pair; none for non-character
    /// elements).
    ascii: Vec<[u64; 2]>,
}

impl Program {
    pub(crate) fn new(g: &Grammar) -> Self {
        let mut elems = Vec::new();
        let mut alts = Vec::with_capacity(g.rules.len());
        for rule in &g.rules {
            let mut starts = Vec::with_capacity(rule.len());
            for alt in rule {
                starts.push(elems.len() as u32);
                for item in alt {
                    elems.push(match item {
                        Item::Class(c) => Elem::Class(c.clone()),
                        Item::Any => Elem::Any,
                        Item::Ref(r) => Elem::Ref(*r),
                        Item::Token { id, negated } => Elem::Token {
                            id: *id,
                            negated: *negated,
                        },
                    });
                }
                elems.push(Elem::End);
            }
            alts.push(starts);
        }
        let mut p = Program {
            elems,
            alts,
            root: g.root,
            ascii: Vec::new(),
        };
        p.ascii = (0..p.elems.len() as u32)
            .map(|pos| {
                let mut bits = [0u64; 2];
                for c in (0..128u32).filter(|&c| p.takes(pos, c)) {
                    bits[(c / 64) as usize] |= 1 << (c % 64);
                }
                bits
            })
            .collect();
        p
    }

    /// The ASCII characters the element at `pos` takes (bit `c` of the pair).
    pub(crate) fn ascii(&self, pos: u32) -> [u64; 2] {
        self.ascii[pos as usize]
    }

    pub(crate) fn elem(&self, pos: u32) -> &Elem {
        &self.elems[pos as usize]
    }

    /// Whether the element at `pos` (a character element) takes `c`.
    pub(crate) fn takes(&self, pos: u32, c: u32) -> bool {
        match self.elem(pos) {
            Elem::Class(cl) => cl.matches(c),
            Elem::Any => true,
            _ => false,
        }
    }

    /// Whether some completion of the partial character `p` could satisfy the character element
    /// at `pos`. For a negated class, any overlap with its ranges refuses (llama.cpp's rule).
    pub(crate) fn may_take(&self, pos: u32, p: Partial) -> bool {
        let Some((low, high)) = completions(p) else {
            return false;
        };
        match self.elem(pos) {
            Elem::Any => true,
            Elem::Class(cl) => {
                let overlaps = cl.ranges.iter().any(|&(lo, hi)| lo <= high && low <= hi);
                overlaps != cl.negated
            }
            _ => false,
        }
    }
}
