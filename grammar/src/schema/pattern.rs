//! A `pattern` (an anchored regular expression) as a GBNF rule body, reading the regex as
//! llama.cpp's converter does: `^…$` required; groups, `(?:…)`, alternation, classes with GBNF's
//! escapes, `.` (no newline), `*`, `+`, `?` and `{m,n}`; a quantifier after a run of literal
//! characters that holds an escape repeats the whole run, as in llama.cpp. Beyond llama.cpp,
//! `\d`, `\w`, `\s` and their negations are enforced (llama.cpp drops any pattern with them and
//! accepts every string). Anything else (look-around, backreferences, anchors inside) is an
//! error, not an unconstrained string.

use std::collections::HashMap;

/// Characters that end a literal run.
const SPECIAL: &str = "|.()[]{}*+?^$";
/// Characters a backslash makes literal.
const ESCAPABLE: &str = "^$.[]()|{}*+?";
/// Deepest group nesting.
const MAX_DEPTH: usize = 100;

/// The length of a GBNF escape at `i` (0: none).
fn gbnf_escape(p: &[char], i: usize) -> usize {
    if p.get(i) != Some(&'\\') || i + 1 >= p.len() {
        return 0;
    }
    let hex = match p[i + 1] {
        'x' => 2,
        'u' => 4,
        'U' => 8,
        't' | 'r' | 'n' | '\\' | '"' | '[' | ']' | '-' => return 2,
        _ => return 0,
    };
    if i + 2 + hex > p.len() || !p[i + 2..i + 2 + hex].iter().all(char::is_ascii_hexdigit) {
        return 0;
    }
    2 + hex
}

/// The class a shorthand escape (`\d` …) stands for.
fn shorthand(c: char) -> Option<&'static str> {
    Some(match c {
        'd' => "[0-9]",
        'D' => "[^0-9]",
        'w' => "[a-zA-Z0-9_]",
        'W' => "[^a-zA-Z0-9_]",
        's' => "[ \\t\\n\\r\\x0B\\x0C]",
        'S' => "[^ \\t\\n\\r\\x0B\\x0C]",
        _ => return None,
    })
}

struct Translator<'a> {
    p: Vec<char>,
    i: usize,
    depth: usize,
    name: String,
    subs: HashMap<String, String>,
    add: &'a mut dyn FnMut(&str, String) -> String,
}

/// (text, is a literal's inside)
type Piece = (String, bool);

fn rule(piece: &Piece) -> String {
    if piece.1 {
        format!("\"{}\"", piece.0)
    } else {
        piece.0.clone()
    }
}

impl Translator<'_> {
    fn join(seq: Vec<Piece>) -> Piece {
        let mut out: Vec<String> = Vec::new();
        let mut lit = String::new();
        for (s, is_lit) in seq {
            if is_lit {
                lit.push_str(&s);
            } else {
                if !lit.is_empty() {
                    out.push(format!("\"{}\"", std::mem::take(&mut lit)));
                }
                out.push(s);
            }
        }
        if !lit.is_empty() {
            out.push(format!("\"{lit}\""));
        }
        (out.join(" "), false)
    }

    fn seq(&mut self) -> Result<Piece, String> {
        let mut seq: Vec<Piece> = Vec::new();
        while self.i < self.p.len() {
            let c = self.p[self.i];
            let next = self.p.get(self.i + 1).copied();
            match c {
                '.' => {
                    let dot = (self.add)("dot", "[^\\x0A\\x0D]".into());
                    seq.push((dot, false));
                    self.i += 1;
                }
                '(' => {
                    self.i += 1;
                    if self.p.get(self.i) == Some(&'?') {
                        if self.p.get(self.i + 1) == Some(&':') {
                            self.i += 2;
                        } else {
                            return Err(
                                "group syntax `(?…` other than `(?:` cannot be enforced".into()
                            );
                        }
                    }
                    self.depth += 1;
                    if self.depth > MAX_DEPTH {
                        return Err("groups nested too deep".into());
                    }
                    let inner = self.seq()?;
                    seq.push((format!("({})", rule(&inner)), false));
                }
                ')' => {
                    self.i += 1;
                    if self.depth == 0 {
                        return Err("unbalanced parentheses".into());
                    }
                    self.depth -= 1;
                    return Ok(Self::join(seq));
                }
                '^' | '$' => return Err("an anchor inside the pattern cannot be enforced".into()),
                '[' => {
                    let mut class = String::from("[");
                    self.i += 1;
                    while self.i < self.p.len() && self.p[self.i] != ']' {
                        if self.p[self.i] == '\\' {
                            let n = gbnf_escape(&self.p, self.i);
                            if n == 0 {
                                return Err(format!(
                                    "the escape {} in a class cannot be enforced",
                                    self.p[self.i..(self.i + 2).min(self.p.len())]
                                        .iter()
                                        .collect::<String>()
                                ));
                            }
                            class.extend(&self.p[self.i..self.i + n]);
                            self.i += n;
                        } else {
                            class.push(self.p[self.i]);
                            self.i += 1;
                        }
                    }
                    if self.i >= self.p.len() {
                        return Err("unterminated character class".into());
                    }
                    class.push(']');
                    self.i += 1;
                    seq.push((class, false));
                }
                '|' => {
                    seq.push(("|".into(), false));
                    self.i += 1;
                }
                '*' | '+' | '?' => {
                    let last = seq.last_mut().ok_or("nothing to repeat")?;
                    *last = (format!("{}{c}", rule(last)), false);
                    self.i += 1;
                }
                '{' => self.braces(&mut seq)?,
                '\\' if next.and_then(shorthand).is_some() => {
                    let class = next.and_then(shorthand).unwrap_or_default();
                    seq.push((class.into(), false));
                    self.i += 2;
                }
                _ => seq.push((self.literal(c)?, true)),
            }
        }
        Ok(Self::join(seq))
    }

    fn braces(&mut self, seq: &mut [Piece]) -> Result<(), String> {
        let start = self.i + 1;
        let end = self.p[start..]
            .iter()
            .position(|&c| c == '}')
            .map(|n| start + n)
            .ok_or("unterminated braces")?;
        let inner: String = self.p[start..end].iter().collect();
        self.i = end + 1;
        let nums: Vec<&str> = inner.split(',').collect();
        let num = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("bad count in {{{inner}}}"))
        };
        let (min, max) = match nums.as_slice() {
            [n] => {
                let n = num(n)?;
                (n, Some(n))
            }
            [a, b] => (
                if a.is_empty() { 0 } else { num(a)? },
                if b.is_empty() { None } else { Some(num(b)?) },
            ),
            _ => return Err(format!("{{{inner}}} needs one or two counts")),
        };
        let last = seq.last_mut().ok_or("nothing to repeat")?;
        let item = if last.1 {
            format!("\"{}\"", last.0)
        } else {
            let n = self.subs.len() + 1;
            let name = format!("{}-{n}", self.name);
            let sub = last.0.clone();
            if let Some(id) = self.subs.get(&sub) {
                id.clone()
            } else {
                let id = (self.add)(&name, sub.clone());
                self.subs.insert(sub, id.clone());
                id
            }
        };
        *last = (super::emit::repetition(&item, min, max, ""), false);
        Ok(())
    }

    /// A run of literal characters (the inside of a GBNF string).
    fn literal(&mut self, first: char) -> Result<String, String> {
        let mut lit = String::new();
        let special = |c: char| SPECIAL.contains(c);
        while self.i < self.p.len() {
            let c = self.p[self.i];
            let next = self.p.get(self.i + 1).copied();
            if c == '\\' {
                let Some(n) = next else {
                    return Err("trailing backslash".into());
                };
                if shorthand(n).is_some() {
                    break;
                }
                if ESCAPABLE.contains(n) {
                    lit.push(n);
                    self.i += 2;
                } else {
                    let len = gbnf_escape(&self.p, self.i);
                    if len == 0 {
                        return Err(format!("the escape \\{n} cannot be enforced"));
                    }
                    lit.extend(&self.p[self.i..self.i + len]);
                    self.i += len;
                }
            } else if c == '"' {
                lit.push_str("\\\"");
                self.i += 1;
            } else if !special(c)
                && (next.is_none()
                    || lit.is_empty()
                    || next == Some('.')
                    || !special(next.unwrap_or('.')))
            {
                lit.push(c);
                self.i += 1;
            } else {
                break;
            }
        }
        if lit.is_empty() {
            return Err(format!("unsupported character `{first}`"));
        }
        Ok(lit)
    }
}

/// The rule body for a JSON string matching `pattern`; `add(name, body)` adds helper rules and
/// returns their names.
pub(crate) fn translate(
    pattern: &str,
    name: &str,
    add: &mut dyn FnMut(&str, String) -> String,
) -> Result<String, String> {
    let p: Vec<char> = pattern.chars().collect();
    if p.len() < 2 || p[0] != '^' || p[p.len() - 1] != '$' {
        return Err(format!(
            "pattern {pattern} is not anchored with ^ and $ and cannot be enforced"
        ));
    }
    let mut t = Translator {
        p: p[1..p.len() - 1].to_vec(),
        i: 0,
        depth: 0,
        name: name.to_owned(),
        subs: HashMap::new(),
        add,
    };
    let body = t.seq()?;
    if t.depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    Ok(format!("\"\\\"\" ({}) \"\\\"\"", rule(&body)))
}

/// Errs when `pattern` cannot be translated.
pub(crate) fn check(pattern: &str) -> Result<(), String> {
    translate(pattern, "p", &mut |n, _| n.to_owned()).map(|_| ())
}
