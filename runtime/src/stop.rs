//! Stop strings over streamed text: text is released only once no stop string can still begin
//! in it, so a stop string split across tokens is caught and never shown.

/// Scans generated text for stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopScan {
    stops: Vec<String>,
    pending: String,
}

impl StopScan {
    /// A scanner for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopScan {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Adds `text`; returns the text now safe to show and, when a stop string matched, that
    /// string (the text from the match on is dropped).
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        self.pending.push_str(text);
        let earliest = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, word)) = earliest {
            let word = word.clone();
            let out = self.pending[..at].to_owned();
            self.pending.clear();
            return (out, Some(word));
        }
        let hold = self
            .stops
            .iter()
            .map(|s| partial_suffix(&self.pending, s))
            .max()
            .unwrap_or(0);
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

/// Length of the longest proper prefix of `stop` that `text` ends with.
fn partial_suffix(text: &str, stop: &str) -> usize {
    let mut best = 0;
    for (k, _) in stop.char_indices().skip(1) {
        if text.ends_with(&stop[..k]) {
            best = k;
        }
    }
    best
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
}
