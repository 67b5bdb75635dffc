//! llama-bench's value lists: every test parameter takes comma-separated values, may be given
//! more than once, and a number may be a range `first-last`, `first-last+step` or
//! `first-last*factor` (llama-bench's README and `--help`).

use anyhow::{anyhow, bail};

/// The numbers of one occurrence of a list flag: `512`, `1,2,4`, `0-4096+1024`, `1-16*2`.
/// `negative` admits a leading minus on a plain value or a range's first number (`-ngl -1`).
pub fn int_list(flag: &str, text: &str, negative: bool) -> anyhow::Result<Vec<i64>> {
    let bad = |why: &str| anyhow!("{flag} {text:?}: {why}");
    let mut out = Vec::new();
    // One trailing comma is allowed, as llama-bench allows it.
    let items = text.strip_suffix(',').unwrap_or(text);
    if items.is_empty() {
        return Err(bad("expected a number, a list or a range"));
    }
    for item in items.split(',') {
        let (first, rest) = split_first(item, negative).ok_or_else(|| {
            bad("expected numbers or ranges (first-last, first-last+step, first-last*factor)")
        })?;
        let Some(rest) = rest else {
            out.push(first);
            continue;
        };
        let (last, op, step) = match rest.find(['+', '*']) {
            Some(at) => (&rest[..at], &rest[at..at + 1], &rest[at + 1..]),
            None => (rest, "+", "1"),
        };
        let number = |s: &str| -> anyhow::Result<i64> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(
                    "expected numbers or ranges (first-last, first-last+step, first-last*factor)",
                ));
            }
            s.parse().map_err(|_| bad("a number out of range"))
        };
        let (last, step) = (number(last)?, number(step)?);
        let mut i = first;
        while i <= last {
            out.push(i);
            let next = if op == "+" {
                i.checked_add(step)
            } else {
                i.checked_mul(step)
            };
            match next {
                Some(n) if n > i => i = n,
                // A step that does not advance would never end (llama-bench refuses it too).
                _ => bail!("{flag} {text:?}: the range {item:?} does not advance"),
            }
            if out.len() > 1 << 16 {
                bail!("{flag} {text:?}: more than 65,536 values");
            }
        }
    }
    Ok(out)
}

/// An item's first number and what follows its range dash, if any.
fn split_first(item: &str, negative: bool) -> Option<(i64, Option<&str>)> {
    let sign = usize::from(negative && item.starts_with('-'));
    let digits = item[sign..].bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let end = sign + digits;
    let first: i64 = item[..end].parse().ok()?;
    match &item[end..] {
        "" => Some((first, None)),
        r => r.strip_prefix('-').map(|r| (first, Some(r))),
    }
}

/// Every occurrence of a numeric list flag concatenated, or `default` when it was not given;
/// each value at least `min`.
pub fn ints(
    flag: &str,
    given: &[String],
    default: &[i64],
    negative: bool,
    min: i64,
) -> anyhow::Result<Vec<i64>> {
    let mut out = Vec::new();
    for g in given {
        out.extend(int_list(flag, g, negative)?);
    }
    if out.is_empty() {
        return Ok(default.to_vec());
    }
    if let Some(v) = out.iter().find(|&&v| v < min) {
        bail!("{flag} {v}: the least value is {min}");
    }
    Ok(out)
}

/// Every occurrence of a word list flag (`-fa on,off`, `-ctk f16,f32`) split on commas, or
/// `default` when it was not given.
pub fn words(given: &[String], default: &str) -> Vec<String> {
    let out: Vec<String> = given
        .iter()
        .flat_map(|g| g.split(','))
        .map(str::to_owned)
        .collect();
    if out.is_empty() {
        vec![default.to_owned()]
    } else {
        out
    }
}

/// llama-bench's `-pg pp,tg`: exactly two numbers per occurrence.
pub fn prompt_gen_pairs(given: &[String]) -> anyhow::Result<Vec<(u32, u32)>> {
    given
        .iter()
        .map(|g| {
            let parts: Vec<&str> = g.split(',').collect();
            let n = |s: &str| s.parse::<u32>().ok();
            match parts[..] {
                [p, t] => match (n(p), n(t)) {
                    (Some(p), Some(t)) => Ok((p, t)),
                    _ => bail!("-pg {g:?}: expected two token counts, pp,tg"),
                },
                _ => bail!("-pg {g:?}: expected two token counts, pp,tg"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &str) -> Vec<i64> {
        int_list("-p", s, false).unwrap()
    }

    /// The forms of llama-bench's README ("Syntax": `-p 1-16*2`, `-n 0-512+128`) and `--help`.
    #[test]
    fn values_lists_and_ranges_expand_as_llama_bench_expands_them() {
        assert_eq!(list("512"), [512]);
        assert_eq!(list("1,2,4"), [1, 2, 4]);
        assert_eq!(list("0-4"), [0, 1, 2, 3, 4]);
        assert_eq!(list("0-512+128"), [0, 128, 256, 384, 512]);
        assert_eq!(list("1-16*2"), [1, 2, 4, 8, 16]);
        assert_eq!(list("1-20*3"), [1, 3, 9]);
        assert_eq!(list("8,1-4*2,100-300+150"), [8, 1, 2, 4, 100, 250]);
        assert_eq!(list("5-3"), Vec::<i64>::new());
        assert_eq!(list("7,"), [7]);
        assert_eq!(int_list("-ngl", "-1,0,99", true).unwrap(), [-1, 0, 99]);
        assert_eq!(int_list("-ngl", "-1-1", true).unwrap(), [-1, 0, 1]);
    }

    #[test]
    fn malformed_lists_are_refused_by_flag() {
        for bad in [
            "", ",", "a", "1,,", ",1", "1-", "1-4+", "1-4/2", "-1", "1--4", "1-4+2+3", " 1",
        ] {
            let e = int_list("-p", bad, false).unwrap_err().to_string();
            assert!(e.starts_with("-p "), "{bad:?}: {e}");
        }
        let e = int_list("-p", "0-8*2", false).unwrap_err().to_string();
        assert!(e.contains("does not advance"), "{e}");
        let e = int_list("-p", "1-8+0", false).unwrap_err().to_string();
        assert!(e.contains("does not advance"), "{e}");
    }

    #[test]
    fn repeated_flags_concatenate_and_absent_ones_take_the_default() {
        let given = vec!["1,2".to_owned(), "8-16*2".to_owned()];
        assert_eq!(ints("-d", &given, &[0], false, 0).unwrap(), [1, 2, 8, 16]);
        assert_eq!(ints("-d", &[], &[0], false, 0).unwrap(), [0]);
        let e = ints("-b", &["0".to_owned()], &[2048], false, 1).unwrap_err();
        assert!(e.to_string().contains("-b 0"), "{e}");
        assert_eq!(
            words(&["on,off".into(), "auto".into()], "auto"),
            ["on", "off", "auto"]
        );
        assert_eq!(words(&[], "f16"), ["f16"]);
        assert_eq!(
            prompt_gen_pairs(&["512,128".into(), "0,32".into()]).unwrap(),
            [(512, 128), (0, 32)]
        );
        assert!(prompt_gen_pairs(&["512".into()]).is_err());
    }
}
