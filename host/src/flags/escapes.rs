//! Escape sequences in command-line strings, as llama.cpp processes them by default
//! (`common/common.cpp`'s `string_process_escapes`; `-e/--escape`, turned off by `--no-escape`):
//! `\n`, `\r`, `\t`, `\'`, `\"`, `\\` and `\xHH`; any other backslash is kept as written. They apply
//! to `serve`'s reverse prompts (`-r`) and DRY sequence breakers, and to `run`'s prompt.

use clap::Args;

/// `-e/--escape` and `--no-escape`.
#[derive(Args, Clone, Copy, Debug)]
pub struct EscapeArgs {
    /// Process escape sequences (\n, \r, \t, \', \", \\, \xHH) in command-line strings (`-e`; on
    /// by default; `--no-escape` turns it off).
    #[arg(short = 'e', long = "escape", overrides_with = "no_escape")]
    pub escape: bool,
    /// Keep command-line strings as written.
    #[arg(long = "no-escape", overrides_with = "escape")]
    pub no_escape: bool,
}

impl EscapeArgs {
    /// `s` as the flags say to read it (escapes processed unless `--no-escape` came after any
    /// `-e`).
    pub fn apply(&self, s: &str) -> String {
        if !self.no_escape {
            process(s)
        } else {
            s.to_owned()
        }
    }
}

/// The value `strtol(x, _, 16)` reads from exactly two bytes when it consumes both (leading
/// white space and a sign allowed, as strtol allows them), else None.
fn two_hex(x: [u8; 2]) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    match x {
        [a, b] if digit(a).is_some() && digit(b).is_some() => {
            Some((digit(a)? * 16 + digit(b)?) as u8)
        }
        [a, b] if (a.is_ascii_whitespace() || a == b'+') && digit(b).is_some() => {
            Some(digit(b)? as u8)
        }
        [b'-', b] => digit(b).map(|d| (d as u8).wrapping_neg()),
        _ => None,
    }
}

/// `s` with its escape sequences replaced (llama.cpp's rules, byte for byte).
pub fn process(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            i += 1;
            match b[i] {
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b't' => out.push(b'\t'),
                b'\'' => out.push(b'\''),
                b'"' => out.push(b'"'),
                b'\\' => out.push(b'\\'),
                b'x' if i + 2 < b.len() && two_hex([b[i + 1], b[i + 2]]).is_some() => {
                    out.push(two_hex([b[i + 1], b[i + 2]]).unwrap_or(0));
                    i += 2;
                }
                other => out.extend([b'\\', other]),
            }
        } else {
            out.push(b[i]);
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{process, EscapeArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        e: EscapeArgs,
    }

    #[test]
    fn the_last_of_escape_and_no_escape_wins() {
        let read = |args: &[&str]| {
            let cli =
                Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).unwrap();
            cli.e.apply(r"a\nb")
        };
        assert_eq!(read(&[]), "a\nb");
        assert_eq!(read(&["--no-escape"]), r"a\nb");
        assert_eq!(read(&["--no-escape", "-e"]), "a\nb");
        assert_eq!(read(&["-e", "--no-escape"]), r"a\nb");
    }

    #[test]
    fn escapes_are_read_as_llama_cpp_reads_them() {
        assert_eq!(process(r#"a\nb\tc\\d\'e\"f\rg"#), "a\nb\tc\\d'e\"f\rg");
        assert_eq!(process(r"\x41\x4a!"), "AJ!");
        // \x needs two hex digits, else it stays as written.
        assert_eq!(process(r"\x4"), r"\x4");
        assert_eq!(process(r"\x41"), "A");
        assert_eq!(process(r"\xZZ."), r"\xZZ.");
        assert_eq!(
            process(r"\q and a \ at the end\"),
            r"\q and a \ at the end\"
        );
        assert_eq!(process("<|im_end|>"), "<|im_end|>");
    }
}
