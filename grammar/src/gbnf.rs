//! GBNF, llama.cpp's grammar syntax, parsed into rules of alternatives of items.
//!
//! A grammar is a list of `name ::= alternatives` rules, one per line (a rule continues on the
//! next line only inside parentheses or after `|`); `#` starts a comment. Items are string
//! literals (`"..."`), character classes (`[a-z]`, `[^"\\]`), `.` (any character), rule names,
//! groups, tokens (`<[123]>` by id, `<think>` by text, `!<...>` for any other token) and the
//! repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`. Escapes: `\x`, `\u`, `\U` with 2, 4 and 8
//! hex digits, `\t`, `\r`, `\n`, `\\`, `\"`, `\[`, `\]`, `\-`. A grammar needs a `root` rule,
//! every rule it names, and no left recursion. Repetitions are expanded into generated rules,
//! as llama.cpp does, so the language is the same.

use std::collections::HashMap;
use std::fmt;

/// Repetition counts above this are refused (a minimum) or taken as unbounded (a maximum), and
/// nested repetitions may not multiply past it: llama.cpp's limit.
const MAX_REPETITION: u64 = 2000;

/// A set of code points: inclusive ranges, or everything outside them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CharClass {
    /// Everything but the ranges.
    pub negated: bool,
    /// Inclusive ranges (a single character is a range of one).
    pub ranges: Vec<(u32, u32)>,
}

impl CharClass {
    /// One code point.
    pub fn single(c: u32) -> Self {
        CharClass {
            negated: false,
            ranges: vec![(c, c)],
        }
    }

    /// Whether `c` is in the set.
    pub fn matches(&self, c: u32) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
    }
}

/// One item of an alternative.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Item {
    /// A character of a class (string literals are one single-character class per character).
    Class(CharClass),
    /// Any character (`.`).
    Any,
    /// A rule, by index.
    Ref(u32),
    /// A whole token by id; `negated`: any token but that one.
    Token {
        /// The token id.
        id: u32,
        /// `!<...>`: every other token.
        negated: bool,
    },
}

/// A parsed grammar: rules of alternatives of items, and the start rule.
#[derive(Clone, Debug)]
pub struct Grammar {
    /// Rules by index; each is its alternatives, each a sequence of items (empty: the empty string).
    pub(crate) rules: Vec<Vec<Vec<Item>>>,
    /// Rule names by index (generated rules are named `base_N`).
    pub(crate) names: Vec<String>,
    /// The index of `root`.
    pub(crate) root: u32,
}

/// A grammar the parser refused: where and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("grammar line {line}, column {column}: {message}")]
pub struct ParseError {
    /// Line, from 1.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
    /// What was expected or what is wrong.
    pub message: String,
}

/// Resolves `<text>` token items to token ids (the text must be exactly one token).
pub type TokenLookup<'a> = &'a dyn Fn(&str) -> Option<u32>;

impl Grammar {
    /// Parses GBNF text. `tokens` resolves `<text>` items; without it they are refused (`<[id]>`
    /// needs no vocabulary).
    pub fn parse(src: &str, tokens: Option<TokenLookup<'_>>) -> Result<Grammar, ParseError> {
        let mut p = Parser {
            src: src.as_bytes(),
            text: src,
            pos: 0,
            ids: HashMap::new(),
            names: Vec::new(),
            rules: Vec::new(),
            tokens,
        };
        p.grammar()
    }

    /// Rule names by index.
    pub fn rule_names(&self) -> &[String] {
        &self.names
    }
}

struct Parser<'s, 't> {
    src: &'s [u8],
    text: &'s str,
    pos: usize,
    ids: HashMap<String, u32>,
    names: Vec<String>,
    rules: Vec<Option<Vec<Vec<Item>>>>,
    tokens: Option<TokenLookup<'t>>,
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}

impl Parser<'_, '_> {
    fn peek(&self) -> u8 {
        self.src.get(self.pos).copied().unwrap_or(0)
    }

    fn at(&self, i: usize) -> u8 {
        self.src.get(self.pos + i).copied().unwrap_or(0)
    }

    fn error_at(&self, at: usize, message: impl Into<String>) -> ParseError {
        let before = &self.text[..at.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let start = before.rfind('\n').map_or(0, |i| i + 1);
        ParseError {
            line,
            column: before[start..].chars().count() + 1,
            message: message.into(),
        }
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        self.error_at(self.pos, message)
    }

    fn space(&mut self, newline_ok: bool) {
        loop {
            match self.peek() {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), 0 | b'\r' | b'\n') {
                        self.pos += 1;
                    }
                }
                _ => return,
            }
        }
    }

    fn symbol(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.ids.insert(name.to_owned(), id);
        self.names.push(name.to_owned());
        self.rules.push(None);
        id
    }

    fn generated(&mut self, base: &str) -> u32 {
        let name = format!("{base}_{}", self.names.len());
        self.symbol(&name)
    }

    fn name(&mut self) -> Result<String, ParseError> {
        let start = self.pos;
        while is_word(self.peek()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expecting a rule name"));
        }
        Ok(self.text[start..self.pos].to_owned())
    }

    fn int(&mut self) -> Result<u64, ParseError> {
        let start = self.pos;
        while self.peek().is_ascii_digit() {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expecting an integer"));
        }
        self.text[start..self.pos]
            .parse()
            .map_err(|_| self.error_at(start, "integer out of range"))
    }

    fn hex(&mut self, n: usize) -> Result<u32, ParseError> {
        let start = self.pos;
        let mut v = 0u32;
        for _ in 0..n {
            let d = (self.peek() as char).to_digit(16);
            match d {
                Some(d) => v = (v << 4) | d,
                None => return Err(self.error_at(start, format!("expecting {n} hex digits"))),
            }
            self.pos += 1;
        }
        Ok(v)
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<u32, ParseError> {
        match self.peek() {
            0 if self.pos >= self.src.len() => Err(self.error("unexpected end of input")),
            b'\\' => {
                let at = self.pos;
                self.pos += 2;
                match self.src.get(at + 1).copied().unwrap_or(0) {
                    b'x' => self.hex(2),
                    b'u' => self.hex(4),
                    b'U' => self.hex(8),
                    b't' => Ok('\t' as u32),
                    b'r' => Ok('\r' as u32),
                    b'n' => Ok('\n' as u32),
                    c @ (b'\\' | b'"' | b'[' | b']' | b'-') => Ok(u32::from(c)),
                    _ => Err(self.error_at(at, "unknown escape")),
                }
            }
            _ => {
                // The source is a &str, so a character starts here.
                let c = self.text[self.pos..].chars().next().map_or(0, |c| c as u32);
                self.pos += self.text[self.pos..]
                    .chars()
                    .next()
                    .map_or(1, char::len_utf8);
                Ok(c)
            }
        }
    }

    fn grammar(&mut self) -> Result<Grammar, ParseError> {
        self.space(true);
        while self.pos < self.src.len() {
            self.rule()?;
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, r) in self.rules.iter().enumerate() {
            match r {
                Some(r) => rules.push(r.clone()),
                None => {
                    return Err(self.error_at(
                        self.first_use(i as u32),
                        format!("undefined rule `{}`", self.names[i]),
                    ))
                }
            }
        }
        let root = *self
            .ids
            .get("root")
            .ok_or_else(|| self.error_at(0, "the grammar has no `root` rule"))?;
        let g = Grammar {
            rules,
            names: self.names.clone(),
            root,
        };
        if let Some(r) = left_recursive(&g) {
            return Err(self.error_at(
                self.definition(&g.names[r]),
                format!("rule `{}` is left-recursive (unsupported)", g.names[r]),
            ));
        }
        Ok(g)
    }

    /// Where rule `id` is first named (for an undefined rule's error).
    fn first_use(&self, id: u32) -> usize {
        let name = &self.names[id as usize];
        let mut from = 0;
        while let Some(i) = self.text[from..].find(name.as_str()) {
            let at = from + i;
            let before = at.checked_sub(1).map_or(b' ', |b| self.src[b]);
            let after = self.src.get(at + name.len()).copied().unwrap_or(b' ');
            if !is_word(before) && !is_word(after) {
                return at;
            }
            from = at + name.len();
        }
        0
    }

    /// Where a rule is defined (the start of its line).
    fn definition(&self, name: &str) -> usize {
        let base = name.split('_').next().unwrap_or(name);
        self.text
            .match_indices(base)
            .find(|(i, _)| *i == 0 || self.src[i - 1] == b'\n')
            .map_or(0, |(i, _)| i)
    }

    fn rule(&mut self) -> Result<(), ParseError> {
        let name = self.name()?;
        self.space(false);
        if !self.src[self.pos..].starts_with(b"::=") {
            return Err(self.error("expecting ::="));
        }
        self.pos += 3;
        self.space(true);
        let id = self.symbol(&name);
        self.alternates(&name, id, false)?;
        match self.peek() {
            b'\r' => self.pos += if self.at(1) == b'\n' { 2 } else { 1 },
            b'\n' => self.pos += 1,
            _ if self.pos >= self.src.len() => {}
            _ => return Err(self.error("expecting a newline or the end")),
        }
        self.space(true);
        Ok(())
    }

    fn alternates(&mut self, name: &str, id: u32, nested: bool) -> Result<(), ParseError> {
        let mut alts = vec![self.sequence(name, nested)?];
        while self.peek() == b'|' {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(name, nested)?);
        }
        self.rules[id as usize] = Some(alts);
        Ok(())
    }

    fn sequence(&mut self, name: &str, nested: bool) -> Result<Vec<Item>, ParseError> {
        let mut seq: Vec<Item> = Vec::new();
        let mut last = 0;
        let mut n_prev: u64 = 1;
        loop {
            let c = self.peek();
            match c {
                b'"' => {
                    self.pos += 1;
                    last = seq.len();
                    n_prev = 1;
                    while self.peek() != b'"' {
                        if self.pos >= self.src.len() {
                            return Err(self.error("unexpected end of input in a string"));
                        }
                        let ch = self.char()?;
                        seq.push(Item::Class(CharClass::single(ch)));
                    }
                    self.pos += 1;
                }
                b'[' => {
                    self.pos += 1;
                    let negated = self.peek() == b'^';
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    while self.peek() != b']' {
                        if self.pos >= self.src.len() {
                            return Err(self.error("unexpected end of input in a class"));
                        }
                        let lo = self.char()?;
                        let mut hi = lo;
                        if self.peek() == b'-' && self.at(1) != b']' {
                            if self.pos + 1 >= self.src.len() {
                                return Err(self.error("unexpected end of input in a class"));
                            }
                            self.pos += 1;
                            hi = self.char()?;
                        }
                        ranges.push((lo, hi));
                    }
                    self.pos += 1;
                    last = seq.len();
                    n_prev = 1;
                    seq.push(Item::Class(CharClass { negated, ranges }));
                }
                b'<' | b'!' => {
                    let negated = c == b'!';
                    if negated {
                        self.pos += 1;
                    }
                    let id = self.token()?;
                    last = seq.len();
                    n_prev = 1;
                    seq.push(Item::Token { id, negated });
                }
                b'(' => {
                    self.pos += 1;
                    self.space(true);
                    let before = self.names.len() as u64;
                    let sub = self.generated(name);
                    self.alternates(name, sub, true)?;
                    n_prev = (self.names.len() as u64 - before).max(1);
                    last = seq.len();
                    seq.push(Item::Ref(sub));
                    if self.peek() != b')' {
                        return Err(self.error("expecting ')'"));
                    }
                    self.pos += 1;
                }
                b'.' => {
                    self.pos += 1;
                    last = seq.len();
                    n_prev = 1;
                    seq.push(Item::Any);
                }
                b'*' | b'+' | b'?' => {
                    self.pos += 1;
                    self.space(nested);
                    let (lo, hi) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(name, &mut seq, last, &mut n_prev, lo, hi)?;
                    continue;
                }
                b'{' => {
                    self.pos += 1;
                    self.space(nested);
                    let lo = self.int()?;
                    self.space(nested);
                    let hi = match self.peek() {
                        b'}' => Some(lo),
                        b',' => {
                            self.pos += 1;
                            self.space(nested);
                            let hi = if self.peek().is_ascii_digit() {
                                let h = self.int()?;
                                self.space(nested);
                                Some(h)
                            } else {
                                None
                            };
                            if self.peek() != b'}' {
                                return Err(self.error("expecting '}'"));
                            }
                            hi
                        }
                        _ => return Err(self.error("expecting ',' or '}'")),
                    };
                    self.pos += 1;
                    self.space(nested);
                    if lo > MAX_REPETITION {
                        return Err(self.error(format!(
                            "{lo} repetitions exceed the limit of {MAX_REPETITION}"
                        )));
                    }
                    let hi = hi.filter(|&h| h <= MAX_REPETITION);
                    self.repeat(name, &mut seq, last, &mut n_prev, lo, hi)?;
                    continue;
                }
                _ if is_word(c) => {
                    let n = self.name()?;
                    last = seq.len();
                    n_prev = 1;
                    let id = self.symbol(&n);
                    seq.push(Item::Ref(id));
                    self.space(nested);
                    continue;
                }
                _ => return Ok(seq),
            }
            self.space(nested);
        }
    }

    /// `<[id]>` or `<text>` after an optional `!`.
    fn token(&mut self) -> Result<u32, ParseError> {
        let start = self.pos;
        if self.peek() != b'<' {
            return Err(self.error("expecting '<'"));
        }
        self.pos += 1;
        if self.peek() == b'[' {
            self.pos += 1;
            let id = self.int()?;
            if self.peek() != b']' || self.at(1) != b'>' {
                return Err(self.error("expecting ']>'"));
            }
            self.pos += 2;
            return u32::try_from(id).map_err(|_| self.error_at(start, "token id out of range"));
        }
        while !matches!(self.peek(), 0 | b'>') {
            self.pos += 1;
        }
        if self.peek() != b'>' {
            return Err(self.error("expecting '>'"));
        }
        self.pos += 1;
        let text = &self.text[start..self.pos];
        let lookup = self
            .tokens
            .ok_or_else(|| self.error_at(start, format!("no vocabulary to resolve {text}")))?;
        lookup(text).ok_or_else(|| self.error_at(start, format!("{text} is not one token")))
    }

    /// Applies `{lo, hi}` to the items from `last` on (`hi` None: unbounded).
    fn repeat(
        &mut self,
        name: &str,
        seq: &mut Vec<Item>,
        last: usize,
        n_prev: &mut u64,
        lo: u64,
        hi: Option<u64>,
    ) -> Result<(), ParseError> {
        if last == seq.len() {
            return Err(self.error("a repetition needs a preceding item"));
        }
        let total = match hi {
            Some(h) if h > 0 => h,
            _ if lo > 0 => lo,
            _ => 1,
        };
        if *n_prev * total > MAX_REPETITION {
            return Err(self.error(format!(
                "nested repetitions would expand past the limit of {MAX_REPETITION} rules"
            )));
        }
        let item: Vec<Item> = seq[last..].to_vec();
        seq.truncate(last);
        for _ in 0..lo {
            seq.extend(item.iter().cloned());
        }
        let optional = match hi {
            None => 1,
            Some(h) => h.saturating_sub(lo),
        };
        let mut prev: Option<u32> = None;
        for _ in 0..optional {
            let id = self.generated(name);
            let mut body = item.clone();
            match (hi, prev) {
                (None, _) => body.push(Item::Ref(id)),
                (Some(_), Some(p)) => body.push(Item::Ref(p)),
                (Some(_), None) => {}
            }
            self.rules[id as usize] = Some(vec![body, Vec::new()]);
            prev = Some(id);
        }
        if let Some(p) = prev {
            seq.push(Item::Ref(p));
        }
        *n_prev *= total;
        Ok(())
    }
}

/// The first rule that can reach itself without consuming anything, if any.
fn left_recursive(g: &Grammar) -> Option<usize> {
    let n = g.rules.len();
    // Which rules can derive the empty string (to a fixed point).
    let mut nullable = vec![false; n];
    loop {
        let mut changed = false;
        for (i, alts) in g.rules.iter().enumerate() {
            if !nullable[i]
                && alts.iter().any(|a| {
                    a.iter()
                        .all(|it| matches!(it, Item::Ref(r) if nullable[*r as usize]))
                })
            {
                nullable[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Edges to the rules that can come first.
    let first: Vec<Vec<usize>> = g
        .rules
        .iter()
        .map(|alts| {
            let mut out = Vec::new();
            for a in alts {
                for it in a {
                    match it {
                        Item::Ref(r) => {
                            out.push(*r as usize);
                            if !nullable[*r as usize] {
                                break;
                            }
                        }
                        _ => break,
                    }
                }
            }
            out
        })
        .collect();
    // 0 unvisited, 1 in progress, 2 done.
    let mut mark = vec![0u8; n];
    fn visit(i: usize, first: &[Vec<usize>], mark: &mut [u8]) -> Option<usize> {
        match mark[i] {
            1 => return Some(i),
            2 => return None,
            _ => {}
        }
        mark[i] = 1;
        for &j in &first[i] {
            if let Some(r) = visit(j, first, mark) {
                return Some(r);
            }
        }
        mark[i] = 2;
        None
    }
    (0..n).find_map(|i| visit(i, &first, &mut mark))
}

impl fmt::Display for Grammar {
    /// Prints the rules back in GBNF (generated rules included), one per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let class = |c: &CharClass, f: &mut fmt::Formatter<'_>| -> fmt::Result {
            write!(f, "[{}", if c.negated { "^" } else { "" })?;
            for &(lo, hi) in &c.ranges {
                write!(f, "\\U{lo:08X}")?;
                if hi != lo {
                    write!(f, "-\\U{hi:08X}")?;
                }
            }
            write!(f, "]")
        };
        for (i, alts) in self.rules.iter().enumerate() {
            write!(f, "{} ::=", self.names[i])?;
            for (k, a) in alts.iter().enumerate() {
                if k > 0 {
                    write!(f, " |")?;
                }
                for it in a {
                    write!(f, " ")?;
                    match it {
                        Item::Class(c) => class(c, f)?,
                        Item::Any => write!(f, ".")?,
                        Item::Ref(r) => write!(f, "{}", self.names[*r as usize])?,
                        Item::Token { id, negated } => {
                            write!(f, "{}<[{id}]>", if *negated { "!" } else { "" })?
                        }
                    }
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(src: &str) -> ParseError {
        Grammar::parse(src, None).unwrap_err()
    }

    #[test]
    fn parses_every_construct() {
        let g = Grammar::parse(
            "root ::= \"a\\x41\\u00e9\" [^\"\\\\a-c] . item{2,3} (x | \"y\")* # comment\n\
             item ::= [0-9]+ | \"\"\nx ::= <[7]> !<[8]>\n",
            None,
        )
        .unwrap();
        assert_eq!(g.names[g.root as usize], "root");
        let root = &g.rules[g.root as usize][0];
        assert_eq!(root[1], Item::Class(CharClass::single(0x41)));
        assert_eq!(root[2], Item::Class(CharClass::single(0xe9)));
        assert_eq!(
            root[3],
            Item::Class(CharClass {
                negated: true,
                ranges: vec![(34, 34), (92, 92), (97, 99)]
            })
        );
        assert_eq!(root[4], Item::Any);
    }

    #[test]
    fn errors_name_the_line_and_column() {
        let e = err("root ::= \"a\"\nitem ::= [0-9");
        assert_eq!((e.line, e.column), (2, 14), "{e}");
        let e = err("root ::= foo\n");
        assert_eq!((e.line, e.column), (1, 10));
        assert!(e.message.contains("undefined rule `foo`"), "{e}");
        let e = err("item ::= \"a\"\n");
        assert!(e.message.contains("root"), "{e}");
        let e = err("root ::= \"\\q\"");
        assert_eq!((e.line, e.column), (1, 11));
        let e = err("root ::= root \"a\" | \"b\"\n");
        assert!(e.message.contains("left-recursive"), "{e}");
        let e = err("root ::= * \"a\"");
        assert!(e.message.contains("preceding item"), "{e}");
        let e = err("root ::= \"a\" \"b\"\n   \"c\" ::= x");
        assert_eq!(e.line, 2);
        assert!(err("root ::= \"a\"{2001}").message.contains("limit"));
        assert!(err("root ::= <think>").message.contains("no vocabulary"));
    }

    #[test]
    fn newlines_continue_a_rule_only_inside_groups() {
        assert!(Grammar::parse("root ::= (\"a\"\n | \"b\")\n", None).is_ok());
        assert!(Grammar::parse("root ::= \"a\" |\n \"b\"\n", None).is_ok());
    }

    #[test]
    fn tokens_resolve_through_the_lookup() {
        let lookup = |t: &str| (t == "<think>").then_some(42);
        let g = Grammar::parse("root ::= <think> \"x\"", Some(&lookup)).unwrap();
        assert_eq!(
            g.rules[0][0][0],
            Item::Token {
                id: 42,
                negated: false
            }
        );
        assert!(Grammar::parse("root ::= <nope>", Some(&lookup)).is_err());
    }
}
