//! The pushdown stacks of a grammar in use, interned: a stack is a node (the position to match
//! next and the stack below it), so equal stacks are one id; a state is an interned, sorted set of
//! stacks whose tops are terminals (or the empty stack, which means the grammar may end). Expanding
//! a stack to its terminals and stepping a set over a character are memoized, so a state seen
//! before costs a table lookup.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::program::{Elem, Program};

/// A stack id; [`EMPTY`] is the stack with nothing left to match.
pub(crate) type StackId = u32;
/// A set id; [`DEAD`] is the empty set (no way forward).
pub(crate) type SetId = u32;

/// The empty stack: the grammar's input may end here.
pub(crate) const EMPTY: StackId = 0;
/// The empty set.
pub(crate) const DEAD: SetId = 0;

/// A hash map keyed by small integers, hashed fast (the keys come from our own tables).
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// Interned stacks and sets of one grammar in use.
pub(crate) struct Stacks {
    program: Arc<Program>,
    /// (top position, stack below) per stack id; index 0 is the empty stack.
    nodes: Vec<(u32, StackId)>,
    node_ids: Map<(u32, StackId), StackId>,
    /// The terminal-topped stacks each stack expands to, once computed.
    expanded: Vec<Option<SetId>>,
    sets: Vec<Arc<[StackId]>>,
    /// Per set, the ASCII characters some stack of it takes next (bit `c` of the pair).
    ascii: Vec<[u64; 2]>,
    set_ids: Map<Arc<[StackId]>, SetId>,
    /// A set stepped over a character.
    steps: Map<(SetId, u32), SetId>,
    /// A set's character-topped part.
    char_parts: Map<SetId, SetId>,
}

impl Stacks {
    pub(crate) fn new(program: Arc<Program>) -> Self {
        let empty: Arc<[StackId]> = Arc::from(Vec::new());
        let mut set_ids = Map::default();
        set_ids.insert(empty.clone(), DEAD);
        Stacks {
            program,
            nodes: vec![(u32::MAX, EMPTY)],
            node_ids: Map::default(),
            expanded: vec![None],
            sets: vec![empty],
            ascii: vec![[0; 2]],
            set_ids,
            steps: Map::default(),
            char_parts: Map::default(),
        }
    }

    pub(crate) fn program(&self) -> &Program {
        &self.program
    }

    /// The set of the start rule's alternatives, expanded.
    pub(crate) fn start(&mut self) -> SetId {
        let root = self.program.root as usize;
        let starts = self.program.alts[root].clone();
        let mut out = Vec::new();
        for a in starts {
            let s = if matches!(self.program.elem(a), Elem::End) {
                EMPTY
            } else {
                self.node(a, EMPTY)
            };
            let e = self.expand(s);
            out.extend_from_slice(&self.sets[e as usize]);
        }
        self.intern(out)
    }

    pub(crate) fn set(&self, id: SetId) -> &Arc<[StackId]> {
        &self.sets[id as usize]
    }

    /// The position a stack matches next (None for the empty stack).
    pub(crate) fn top(&self, s: StackId) -> Option<u32> {
        (s != EMPTY).then(|| self.nodes[s as usize].0)
    }

    fn node(&mut self, pos: u32, below: StackId) -> StackId {
        if let Some(&id) = self.node_ids.get(&(pos, below)) {
            return id;
        }
        let id = self.nodes.len() as StackId;
        self.nodes.push((pos, below));
        self.expanded.push(None);
        self.node_ids.insert((pos, below), id);
        id
    }

    /// Interns a set of stacks (sorted and deduplicated here).
    pub(crate) fn intern(&mut self, mut v: Vec<StackId>) -> SetId {
        v.sort_unstable();
        v.dedup();
        if let Some(&id) = self.set_ids.get(v.as_slice()) {
            return id;
        }
        let id = self.sets.len() as SetId;
        let mut ascii = [0u64; 2];
        for pos in v.iter().filter_map(|&s| self.top(s)) {
            let bits = self.program.ascii(pos);
            ascii[0] |= bits[0];
            ascii[1] |= bits[1];
        }
        let a: Arc<[StackId]> = Arc::from(v);
        self.sets.push(a.clone());
        self.ascii.push(ascii);
        self.set_ids.insert(a, id);
        id
    }

    /// Whether some stack of `set` takes the ASCII character `c` (`c` < 128): a check that
    /// spares the memo table the characters a set refuses.
    pub(crate) fn takes_ascii(&self, set: SetId, c: u8) -> bool {
        let bits = self.ascii[set as usize];
        c < 128 && bits[usize::from(c / 64)] >> (c % 64) & 1 != 0
    }

    /// The stack after its top element matched: the next element of the alternative, or the
    /// stack below when the alternative ends there.
    pub(crate) fn after(&mut self, s: StackId) -> StackId {
        let (pos, below) = self.nodes[s as usize];
        if matches!(self.program.elem(pos + 1), Elem::End) {
            below
        } else {
            self.node(pos + 1, below)
        }
    }

    /// The terminal-topped stacks (and the empty stack) that `s` stands for: rule references
    /// on top are entered, each alternative a stack of its own.
    pub(crate) fn expand(&mut self, s: StackId) -> SetId {
        if let Some(e) = self.expanded[s as usize] {
            return e;
        }
        let mut out = Vec::new();
        let mut todo = vec![s];
        let mut seen: HashSet<StackId, foldhash::fast::FixedState> = HashSet::default();
        while let Some(t) = todo.pop() {
            if !seen.insert(t) {
                continue;
            }
            if t == EMPTY {
                out.push(EMPTY);
                continue;
            }
            let pos = self.nodes[t as usize].0;
            match self.program.elem(pos) {
                Elem::Ref(r) => {
                    let r = *r as usize;
                    let cont = self.after(t);
                    for i in 0..self.program.alts[r].len() {
                        let a = self.program.alts[r][i];
                        if matches!(self.program.elem(a), Elem::End) {
                            todo.push(cont);
                        } else {
                            let n = self.node(a, cont);
                            todo.push(n);
                        }
                    }
                }
                Elem::End => {}
                _ => out.push(t),
            }
        }
        let id = self.intern(out);
        self.expanded[s as usize] = Some(id);
        id
    }

    /// The set after character `c`: every character-topped stack that takes it, advanced.
    pub(crate) fn step(&mut self, set: SetId, c: u32) -> SetId {
        if set == DEAD {
            return DEAD;
        }
        if let Some(&n) = self.steps.get(&(set, c)) {
            return n;
        }
        let stacks = self.sets[set as usize].clone();
        let mut out = Vec::new();
        for &s in stacks.iter() {
            let Some(pos) = self.top(s) else { continue };
            if self.program.takes(pos, c) {
                let next = self.after(s);
                let e = self.expand(next);
                out.extend_from_slice(&self.sets[e as usize]);
            }
        }
        let id = self.intern(out);
        self.steps.insert((set, c), id);
        id
    }

    /// The set after a whole token taken by a token element on top.
    pub(crate) fn step_token(&mut self, set: SetId, token: u32) -> SetId {
        let stacks = self.sets[set as usize].clone();
        let mut out = Vec::new();
        for &s in stacks.iter() {
            let Some(pos) = self.top(s) else { continue };
            if let Elem::Token { id, negated } = *self.program.elem(pos) {
                if (id == token) != negated {
                    let next = self.after(s);
                    let e = self.expand(next);
                    out.extend_from_slice(&self.sets[e as usize]);
                }
            }
        }
        self.intern(out)
    }

    /// The character-topped stacks of a set (what a token's text is matched against).
    pub(crate) fn char_stacks(&mut self, set: SetId) -> SetId {
        if let Some(&c) = self.char_parts.get(&set) {
            return c;
        }
        let stacks = self.sets[set as usize].clone();
        let keep: Vec<StackId> = stacks
            .iter()
            .copied()
            .filter(|&s| {
                self.top(s)
                    .is_some_and(|p| matches!(self.program.elem(p), Elem::Class(_) | Elem::Any))
            })
            .collect();
        let id = self.intern(keep);
        self.char_parts.insert(set, id);
        id
    }

    /// The one character every stack of `set` takes next, when the set admits exactly one
    /// character and nothing else: no end of the input, no token item, no class of more than
    /// one code point.
    pub(crate) fn only_char(&self, set: SetId) -> Option<u32> {
        let mut only = None;
        for &s in self.sets[set as usize].iter() {
            let Elem::Class(class) = self.program.elem(self.top(s)?) else {
                return None;
            };
            if class.negated {
                return None;
            }
            for &(lo, hi) in &class.ranges {
                if lo != hi || only.is_some_and(|c| c != lo) {
                    return None;
                }
                only = Some(lo);
            }
        }
        only
    }

    /// Whether the set may end here (holds the empty stack).
    pub(crate) fn accepts(&self, set: SetId) -> bool {
        self.sets[set as usize].first() == Some(&EMPTY)
    }

    /// Union of two sets.
    pub(crate) fn union(&mut self, a: SetId, b: SetId) -> SetId {
        let mut v = self.sets[a as usize].to_vec();
        v.extend_from_slice(&self.sets[b as usize]);
        self.intern(v)
    }
}
