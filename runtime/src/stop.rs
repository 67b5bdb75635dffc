//! Stop strings over streamed text: text is released only once no stop string can still begin
//! in it, so a stop string split across tokens is caught and never shown. Each stop string is
//! matched by its own automaton (Knuth–Morris–Pratt over bytes) that carries its state across
//! pieces, so a token costs time linear in its own text whatever the stop strings' lengths and
//! however much text is held.

/// One stop string and how much of it the text ends with.
#[derive(Clone, Debug)]
struct Stop {
    word: String,
    /// `fail[i]`: the length of the longest proper prefix of `word[..=i]` that is also its
    /// suffix.
    fail: Vec<usize>,
    /// Bytes of `word` the text seen so far ends with.
    matched: usize,
}

impl Stop {
    fn new(word: String) -> Self {
        let w = word.as_bytes();
        let mut fail = vec![0; w.len()];
        let mut k = 0;
        for i in 1..w.len() {
            while k > 0 && w[i] != w[k] {
                k = fail[k - 1];
            }
            if w[i] == w[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Stop {
            word,
            fail,
            matched: 0,
        }
    }

    /// Feeds one byte; true when the word is now whole.
    fn feed(&mut self, b: u8) -> bool {
        let w = self.word.as_bytes();
        if self.matched == w.len() {
            self.matched = self.fail[self.matched - 1];
        }
        while self.matched > 0 && w[self.matched] != b {
            self.matched = self.fail[self.matched - 1];
        }
        if w[self.matched] == b {
            self.matched += 1;
        }
        self.matched == w.len()
    }
}

/// Scans generated text for stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopScan {
    stops: Vec<Stop>,
    pending: String,
}

impl StopScan {
    /// A scanner for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopScan {
            stops: stops
                .into_iter()
                .filter(|s| !s.is_empty())
                .map(Stop::new)
                .collect(),
            pending: String::new(),
        }
    }

    /// Adds `text`; returns the text now safe to show and, when a stop string matched, that
    /// string (the text from the match on is dropped). Of several matches the one that starts
    /// first wins, then the one listed first.
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        let base = self.pending.len();
        self.pending.push_str(text);
        // (start in `pending`, stop index) of the earliest match.
        let mut earliest: Option<(usize, usize)> = None;
        for (k, stop) in self.stops.iter_mut().enumerate() {
            for (i, &b) in text.as_bytes().iter().enumerate() {
                if stop.feed(b) {
                    // The match's start is held text or new text: the held text is the longest
                    // part of any stop string the text ended with.
                    let start = base + i + 1 - stop.word.len();
                    if earliest.is_none_or(|(at, _)| start < at) {
                        earliest = Some((start, k));
                    }
                    break;
                }
            }
        }
        if let Some((at, k)) = earliest {
            let out = self.pending[..at].to_owned();
            self.pending.clear();
            for stop in &mut self.stops {
                stop.matched = 0;
            }
            return (out, Some(self.stops[k].word.clone()));
        }
        // What a stop string may still begin with starts on a character boundary: it equals
        // the start of a stop string, which is UTF-8.
        let hold = self.stops.iter().map(|s| s.matched).max().unwrap_or(0);
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_owned();
        self.pending.drain(..cut);
        (out, None)
    }

    /// Everything held back, followed by `extra` (the end of generation).
    pub fn flush(&mut self, extra: &str) -> String {
        let mut out = std::mem::take(&mut self.pending);
        out.push_str(extra);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_string_split_across_pieces_is_caught_and_never_shown() {
        let mut s = StopScan::new(vec!["</end>".into(), "STOP".into()]);
        assert_eq!(s.push("Hello </"), ("Hello ".into(), None));
        assert_eq!(s.push("en"), (String::new(), None));
        assert_eq!(s.push("d> more"), (String::new(), Some("</end>".into())));
    }

    #[test]
    fn held_text_is_released_when_the_match_fails_and_at_the_end() {
        let mut s = StopScan::new(vec!["STOP".into()]);
        assert_eq!(s.push("a ST"), ("a ".into(), None));
        assert_eq!(s.push("ART"), ("START".into(), None));
        assert_eq!(s.push(" ST"), (" ".into(), None));
        assert_eq!(s.flush("!"), "ST!");
    }

    #[test]
    fn the_earliest_match_wins_and_multibyte_text_is_cut_on_character_boundaries() {
        let mut s = StopScan::new(vec!["é!".into(), "b".into()]);
        assert_eq!(s.push("aé"), ("a".into(), None));
        assert_eq!(s.push("!b"), (String::new(), Some("é!".into())));
        let mut none = StopScan::new(vec![String::new()]);
        assert_eq!(none.push("xyz"), ("xyz".into(), None));
    }

    #[test]
    fn overlapping_and_repeated_prefixes_are_matched() {
        let mut s = StopScan::new(vec!["aab".into()]);
        assert_eq!(s.push("aaa"), ("a".into(), None));
        assert_eq!(s.push("ab!"), ("a".into(), Some("aab".into())));
        let mut s = StopScan::new(vec!["abcd".into(), "bc".into()]);
        assert_eq!(s.push("xabcd"), ("x".into(), Some("abcd".into())));
        let mut s = StopScan::new(vec!["abcd".into(), "bc".into()]);
        assert_eq!(s.push("xab"), ("x".into(), None));
        assert_eq!(s.push("cd"), (String::new(), Some("abcd".into())));
    }

    #[test]
    fn a_long_stop_string_costs_each_piece_its_own_length() {
        // A stop string of 20,001 bytes that the text keeps beginning: one byte at a time, the
        // held text grows to 20,000 bytes. Rescanning it per piece took hours (cubic).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let n = 20_000;
            let mut s = StopScan::new(vec![format!("{}b", "a".repeat(n))]);
            let mut shown = String::new();
            for _ in 0..n {
                shown.push_str(&s.push("a").0);
            }
            let (last, word) = s.push("b");
            let _ = tx.send((shown.len() + last.len(), word));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(
            got.expect("the scan did not finish in 10 s"),
            (0, Some(format!("{}b", "a".repeat(20_000))))
        );
    }
}
