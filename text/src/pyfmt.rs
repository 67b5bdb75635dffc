//! Python's way of printing values, for templates that must render as jinja2 does: `str()` / `repr()`
//! of template values and `json.dumps` with its default spacing.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// Python `repr(float)`: shortest round-trip digits, fixed notation for exponents -4..16, else `1e+16`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.push_str(&"0".repeat(int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.push_str(&"0".repeat((-exp - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

fn number_str(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) => float_repr(f),
        Err(_) => v.to_string(),
    }
}

/// Python `repr(str)`: single quotes unless the text has a single quote and no double quote.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python `str(value)`: strings as they are, `True`/`False`/`None`, float repr, containers as their repr.
pub fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => py_repr(v),
    }
}

/// Python `repr(value)`.
pub fn py_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => number_str(v),
        ValueKind::String => str_repr(v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = v
                .try_iter()
                .map(|it| it.map(|x| py_repr(&x)).collect())
                .unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = v
                .try_iter()
                .map(|it| {
                    it.map(|k| {
                        format!(
                            "{}: {}",
                            py_repr(&k),
                            py_repr(&v.get_item(&k).unwrap_or_default())
                        )
                    })
                    .collect()
                })
                .unwrap_or_default();
            format!("{{{}}}", items.join(", "))
        }
        _ => v.to_string(),
    }
}

/// Options of Python's `json.dumps` that chat templates pass to `tojson`.
#[derive(Debug, Clone)]
pub struct JsonStyle {
    /// Escape every character outside printable ASCII as `\u` and four hex digits.
    pub ensure_ascii: bool,
    /// Pretty-print with this many spaces per level; `None` keeps one line.
    pub indent: Option<usize>,
    /// Item and key separators; Python's default is `", "` and `": "` (`","` with an indent).
    pub separators: (String, String),
    /// Sort object keys.
    pub sort_keys: bool,
}

impl Default for JsonStyle {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            separators: (", ".into(), ": ".into()),
            sort_keys: false,
        }
    }
}

fn json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python `json.dumps(value, ...)` with the given style.
pub fn json_dumps(v: &Value, style: &JsonStyle) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    dump(&mut out, v, style, 0)?;
    Ok(out)
}

fn newline(out: &mut String, style: &JsonStyle, level: usize) {
    if let Some(n) = style.indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * level));
    }
}

fn dump(
    out: &mut String,
    v: &Value,
    style: &JsonStyle,
    level: usize,
) -> Result<(), minijinja::Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let s = number_str(v);
            out.push_str(match s.as_str() {
                "nan" => "NaN",
                "inf" => "Infinity",
                "-inf" => "-Infinity",
                other => other,
            });
        }
        ValueKind::String => json_str(out, v.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.separators.0);
                }
                newline(out, style, level + 1);
                dump(out, item, style, level + 1)?;
            }
            newline(out, style, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort_by_key(py_str);
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.separators.0);
                }
                newline(out, style, level + 1);
                json_str(out, &py_str(k), style.ensure_ascii);
                out.push_str(&style.separators.1);
                dump(out, &v.get_item(k)?, style, level + 1)?;
            }
            newline(out, style, level);
            out.push('}');
        }
        other => {
            return Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                format!("tojson: a {other} value is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        for (f, want) in [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.0, "123456789012345.0"),
            (-0.5, "-0.5"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn json_matches_python_default_spacing() {
        let v = Value::from_pairs([
            ("b", Value::from(vec![Value::from(1), Value::from(())])),
            ("a", Value::from("é\n\"x\"")),
        ]);
        assert_eq!(
            json_dumps(&v, &JsonStyle::default()).unwrap(),
            r#"{"b": [1, null], "a": "é\n\"x\""}"#
        );
        let ascii = JsonStyle {
            ensure_ascii: true,
            sort_keys: true,
            ..JsonStyle::default()
        };
        assert_eq!(
            json_dumps(&v, &ascii).unwrap(),
            r#"{"a": "\u00e9\n\"x\"", "b": [1, null]}"#
        );
        let indented = JsonStyle {
            indent: Some(2),
            separators: (",".into(), ": ".into()),
            ..JsonStyle::default()
        };
        assert_eq!(
            json_dumps(&v, &indented).unwrap(),
            "{\n  \"b\": [\n    1,\n    null\n  ],\n  \"a\": \"é\\n\\\"x\\\"\"\n}"
        );
    }

    #[test]
    fn repr_matches_python() {
        let v = Value::from_pairs([(
            "k",
            Value::from(vec![
                Value::from(true),
                Value::from(()),
                Value::from("it's"),
            ]),
        )]);
        assert_eq!(py_str(&v), r#"{'k': [True, None, "it's"]}"#);
    }
}
