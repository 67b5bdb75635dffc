//! Integer bounds as digit-by-digit grammar (llama.cpp's language for `minimum`/`maximum`,
//! quirks included: a lower bound alone admits at most 16 digits; a negative upper bound alone
//! admits leading zeros after the minus sign; a range that crosses zero admits `-0`).

fn digits(out: &mut String, from: u8, to: u8) {
    if from == to {
        out.push_str(&format!("[{}]", from as char));
    } else {
        out.push_str(&format!("[{}-{}]", from as char, to as char));
    }
}

/// `[0-9]` repeated `lo` to `hi` times.
fn more(out: &mut String, lo: usize, hi: usize) {
    out.push_str("[0-9]");
    if lo == 1 && hi == 1 {
        return;
    }
    if lo == hi {
        out.push_str(&format!("{{{lo}}}"));
    } else {
        out.push_str(&format!("{{{lo},{hi}}}"));
    }
}

/// Every digit string from `from` to `to` (equal lengths).
fn uniform(out: &mut String, from: &[u8], to: &[u8]) {
    let i = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if i > 0 {
        out.push('"');
        out.push_str(std::str::from_utf8(&from[..i]).unwrap_or_default());
        out.push('"');
    }
    if i >= from.len() {
        return;
    }
    if i > 0 {
        out.push(' ');
    }
    let rest = from.len() - i - 1;
    if rest == 0 {
        out.push_str(&format!("[{}-{}]", from[i] as char, to[i] as char));
        return;
    }
    let (f, t) = (&from[i + 1..], &to[i + 1..]);
    let zeros = vec![b'0'; rest];
    let nines = vec![b'9'; rest];
    let mut reached = false;
    out.push('(');
    if f == zeros.as_slice() {
        digits(out, from[i], to[i] - 1);
        out.push(' ');
        more(out, rest, rest);
    } else {
        out.push_str(&format!("[{}] (", from[i] as char));
        uniform(out, f, &nines);
        out.push(')');
        if from[i] + 1 < to[i] {
            out.push_str(" | ");
            if t == nines.as_slice() {
                digits(out, from[i] + 1, to[i]);
                reached = true;
            } else {
                digits(out, from[i] + 1, to[i] - 1);
            }
            out.push(' ');
            more(out, rest, rest);
        }
    }
    if !reached {
        out.push_str(" | ");
        digits(out, to[i], to[i]);
        out.push(' ');
        uniform(out, &zeros, t);
    }
    out.push(')');
}

fn build(out: &mut String, min: Option<i64>, max: Option<i64>, left: usize, top: bool) {
    let less = left.saturating_sub(1).max(1);
    match (min, max) {
        (Some(lo), Some(hi)) => {
            if lo < 0 && hi < 0 {
                out.push_str("\"-\" (");
                build(out, Some(-hi), Some(-lo), left, true);
                out.push(')');
                return;
            }
            let mut lo = lo;
            if lo < 0 {
                out.push_str("\"-\" (");
                build(out, Some(0), Some(-lo), left, true);
                out.push_str(") | ");
                lo = 0;
            }
            let mut from = lo.to_string().into_bytes();
            let to = hi.to_string().into_bytes();
            for n in from.len()..to.len() {
                uniform(out, &from, &vec![b'9'; n]);
                from = std::iter::once(b'1')
                    .chain(std::iter::repeat_n(b'0', n))
                    .collect();
                out.push_str(" | ");
            }
            uniform(out, &from, &to);
        }
        (Some(lo), None) => {
            if lo < 0 {
                out.push_str("\"-\" (");
                build(out, None, Some(-lo), left, false);
                out.push_str(") | [0] | [1-9] ");
                more(out, 0, left.saturating_sub(1));
            } else if lo == 0 {
                if top {
                    out.push_str("[0] | [1-9] ");
                    more(out, 0, less);
                } else {
                    more(out, 1, left);
                }
            } else if lo <= 9 {
                let c = b'0' + lo as u8;
                let start = if top { b'1' } else { b'0' };
                if c > start {
                    digits(out, start, c - 1);
                    out.push(' ');
                    more(out, 1, less);
                    out.push_str(" | ");
                }
                digits(out, c, b'9');
                out.push(' ');
                more(out, 0, less);
            } else {
                let s = lo.to_string().into_bytes();
                let c = s[0];
                if c > b'1' {
                    digits(out, if top { b'1' } else { b'0' }, c - 1);
                    out.push(' ');
                    more(out, s.len(), less);
                    out.push_str(" | ");
                }
                digits(out, c, c);
                out.push_str(" (");
                let tail: i64 = std::str::from_utf8(&s[1..])
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                build(out, Some(tail), None, less, false);
                out.push(')');
                if c < b'9' {
                    out.push_str(" | ");
                    digits(out, c + 1, b'9');
                    out.push(' ');
                    more(out, s.len() - 1, less);
                }
            }
        }
        (None, Some(hi)) => {
            if hi >= 0 {
                if top {
                    out.push_str("\"-\" [1-9] ");
                    more(out, 0, less);
                    out.push_str(" | ");
                }
                build(out, Some(0), Some(hi), left, true);
            } else {
                out.push_str("\"-\" (");
                build(out, Some(-hi), None, left, false);
                out.push(')');
            }
        }
        (None, None) => {}
    }
}

/// The integers from `min` to `max` (either may be open) as a GBNF expression.
pub(crate) fn int_range(min: Option<i64>, max: Option<i64>) -> String {
    let mut out = String::new();
    build(&mut out, min, max, 16, true);
    out
}
