//! A request's grammar while it generates: where it applies in the sampler chain (llama.cpp's
//! place: the chain samples first, and only a token the grammar refuses makes it sample again
//! with the grammar's mask applied before the chain), the wait for a think span's end and for a
//! lazy grammar's trigger word, the forced tokens of schemajump (a state that admits a single
//! token needs no sampling), and its drafts (the canonical tokens of the text the grammar fixes
//! next, verified by sampling).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloomery_grammar::{Matcher, TokenTrie};
use bloomery_text::Tokenizer;

use crate::request::GrammarSpec;
use crate::sampling::Sampler;

/// The vocabulary trie a grammar's mask walks, built once per model from the tokenizer's
/// pieces (special tokens as their text, as llama.cpp's grammar sees them).
pub fn token_trie(tok: &Tokenizer, n_vocab: usize) -> Arc<TokenTrie> {
    let started = std::time::Instant::now();
    let trie = TokenTrie::new(n_vocab, |id| tok.token_to_piece(id, true), &tok.eog_ids());
    tracing::info!(
        "grammar: vocabulary trie of {} tokens, {} nodes in {:.0} ms",
        n_vocab,
        trie.n_nodes(),
        started.elapsed().as_secs_f64() * 1e3
    );
    Arc::new(trie)
}

/// A request's grammar state (public for `examples/grammar_bench.rs`, which times it).
pub struct Constraint {
    matcher: Matcher,
    /// What the grammar still waits for and the text written since it began waiting.
    wait: Wait,
    /// Logits with the mask applied (reused: no allocation per token once grown).
    masked: Vec<f32>,
    /// Tokens forced by schemajump.
    pub(crate) forced: usize,
    /// Time spent in the grammar: masks, the chain's re-sampling, advancing, drafting.
    pub(crate) spent: Duration,
    /// Each fixed text met so far and its canonical tokens (empty: not drafted).
    drafts: HashMap<String, Vec<u32>>,
    /// The fixed text from the current state (reused: no allocation per token once grown).
    fixed: String,
}

/// The texts a grammar waits for before it applies: first the end of a think span (left out of
/// the grammar's text), then one of a lazy grammar's trigger words (kept in it).
struct Wait {
    after: Option<String>,
    /// A span the text may open with, inside which trigger words do not count.
    span: Option<(String, String)>,
    triggers: Vec<String>,
    seen: String,
}

impl Wait {
    fn done(&self) -> bool {
        self.after.is_none() && self.triggers.is_empty()
    }

    /// Adds written text; once nothing is awaited, returns the text the grammar must read
    /// (from the first trigger word's start, or what followed `after`).
    fn push(&mut self, text: &str) -> Option<String> {
        self.seen.push_str(text);
        if let Some(after) = &self.after {
            let at = self.seen.find(after.as_str())?;
            self.seen.drain(..at + after.len());
            self.after = None;
        }
        if let Some((open, close)) = self.span.as_ref().filter(|_| !self.triggers.is_empty()) {
            let t = self.seen.trim_start();
            if t.starts_with(open.as_str()) {
                let at = self.seen.find(close.as_str())?;
                self.seen.drain(..at + close.len());
                self.span = None;
            } else if open.starts_with(t) {
                return None; // maybe the span's opening
            } else {
                self.span = None;
            }
        }
        if !self.triggers.is_empty() {
            let Some(at) = self
                .triggers
                .iter()
                .filter_map(|t| self.seen.find(t.as_str()))
                .min()
            else {
                self.keep_tail();
                return None;
            };
            self.seen.drain(..at);
            self.triggers.clear();
        }
        Some(std::mem::take(&mut self.seen))
    }

    /// Keeps only the text a trigger word could still end in (a word split across tokens).
    fn keep_tail(&mut self) {
        let longest = self.triggers.iter().map(String::len).max().unwrap_or(0);
        let mut cut = self.seen.len().saturating_sub(longest);
        while !self.seen.is_char_boundary(cut) {
            cut -= 1;
        }
        self.seen.drain(..cut);
    }
}

/// Longest fixed text a draft is made of, in characters.
const MAX_DRAFT_CHARS: usize = 64;

/// A greedy chain picks from the admitted tokens' logits alone when fewer than one token in
/// this many is admitted (else over the whole row, which vectorizes).
const SPARSE_SHARE: usize = 8;

/// Fixed texts whose tokens a request remembers before it starts over.
const MAX_CACHED_DRAFTS: usize = 1024;

impl Constraint {
    /// The grammar of `spec` at its start (or waiting for its opening text), masking with the
    /// trie `vocab`.
    pub fn new(spec: &GrammarSpec, vocab: Arc<TokenTrie>) -> Self {
        Constraint {
            matcher: Matcher::new(&spec.grammar, vocab),
            wait: Wait {
                after: spec.after.clone(),
                span: spec.lazy.as_ref().and_then(|l| l.optional_span.clone()),
                triggers: spec
                    .lazy
                    .as_ref()
                    .map_or(Vec::new(), |l| l.triggers.clone()),
                seen: String::new(),
            },
            masked: Vec::new(),
            forced: 0,
            spent: Duration::ZERO,
            drafts: HashMap::new(),
            fixed: String::new(),
        }
    }

    /// Appends to `out` at most `max` tokens: the model's own tokenization of the text the
    /// grammar fixes from here (up to its first branch; see [`Matcher::fixed_text`]), tokenized
    /// alone, so every token lies inside the fixed text; its last token is left out when the
    /// grammar admits a longer token there that would join it to what follows (a key's closing
    /// `"` that a model writes as `":`). Nothing while the grammar waits for its opening text,
    /// or when the tokens do not spell the text exactly (a tokenizer that adds a leading space).
    /// A guess that sampling verifies: it never changes what is generated.
    pub fn draft(&mut self, tok: &Tokenizer, max: usize, out: &mut Vec<u32>) {
        let started = Instant::now();
        self.draft_untimed(tok, max, out);
        self.spent += started.elapsed();
    }

    fn draft_untimed(&mut self, tok: &Tokenizer, max: usize, out: &mut Vec<u32>) {
        if !self.active() || max == 0 {
            return;
        }
        let mut text = std::mem::take(&mut self.fixed);
        self.matcher.fixed_text(MAX_DRAFT_CHARS, &mut text);
        if !text.is_empty() {
            self.draft_of(&text, tok, max, out);
        }
        self.fixed = text;
    }

    /// Appends to `out` at most `max` of the draft tokens of the fixed text `text`, worked out
    /// the first time it is met.
    fn draft_of(&mut self, text: &str, tok: &Tokenizer, max: usize, out: &mut Vec<u32>) {
        if !self.drafts.contains_key(text) {
            if self.drafts.len() >= MAX_CACHED_DRAFTS {
                self.drafts.clear();
            }
            let mut ids = canonical_tokens(tok, text);
            if let Some(&last) = ids.last() {
                let piece = tok.token_to_piece(last, true);
                let joins = match text.get(..text.len() - piece.len()) {
                    Some(before) => self.matcher.admits_longer(before, piece),
                    None => true,
                };
                if joins {
                    ids.pop();
                }
            }
            self.drafts.insert(text.to_owned(), ids);
        }
        if let Some(ids) = self.drafts.get(text) {
            out.extend(ids.iter().take(max));
        }
    }

    /// Whether the grammar applies to the next token.
    pub fn active(&self) -> bool {
        self.wait.done()
    }

    /// The only token the grammar admits next, when exactly one is (an end-of-generation token
    /// included).
    pub fn only(&mut self) -> Option<u32> {
        if !self.active() {
            return None;
        }
        let started = Instant::now();
        let only = self.matcher.mask().only();
        self.spent += started.elapsed();
        only
    }

    /// Picks the next token from `row`: the only admissible one (one draw of the RNG, as a
    /// sampled token costs; not when the sampler keeps its candidates, whose probabilities are
    /// then those of the chain that chose it); else the chain's pick when the grammar admits
    /// it; else the chain again over the masked logits.
    pub fn choose(&mut self, row: &[f32], sampler: &mut Sampler) -> Result<u32, String> {
        if !self.active() {
            return Ok(sampler.sample(row));
        }
        let started = Instant::now();
        let chosen = self.choose_masked(row, sampler);
        self.spent += started.elapsed();
        chosen
    }

    /// [`Constraint::choose`] once the grammar applies.
    fn choose_masked(&mut self, row: &[f32], sampler: &mut Sampler) -> Result<u32, String> {
        let mask = self.matcher.mask();
        if mask.count() == 0 {
            return Err("the grammar admits no token of this vocabulary here".into());
        }
        if let Some(only) = mask.only().filter(|_| !sampler.keeps_candidates()) {
            sampler.skip_draw();
            return Ok(only);
        }
        // A greedy chain's pick, when admitted, is also the best admitted token, and the best
        // admitted token is what the masked re-sample picks: with few tokens admitted, read
        // their logits alone (no pass over the row, no copy).
        let sparse = mask.count() * SPARSE_SHARE < row.len();
        let greedy = sparse
            .then(|| sampler.greedy_among(row, mask.admitted()))
            .flatten();
        let id = match greedy {
            Some(id) => id,
            None => {
                let id = sampler.sample(row);
                if mask.allows(id) {
                    return Ok(id);
                }
                self.masked.clear();
                self.masked.extend_from_slice(row);
                mask.apply(&mut self.masked);
                sampler.sample(&self.masked)
            }
        };
        if mask.allows(id) {
            Ok(id)
        } else {
            Err("no token the grammar admits survives the sampler".into())
        }
    }

    /// Advances over the generated token `id`.
    pub fn accept(&mut self, id: u32, tok: &Tokenizer) -> Result<(), String> {
        let started = Instant::now();
        let accepted = self.accept_untimed(id, tok);
        self.spent += started.elapsed();
        accepted
    }

    fn accept_untimed(&mut self, id: u32, tok: &Tokenizer) -> Result<(), String> {
        let piece = tok.token_to_piece(id, true);
        if !self.wait.done() {
            if let Some(text) = self.wait.push(&String::from_utf8_lossy(piece)) {
                if !text.is_empty() && !self.matcher.accept_text(&text) {
                    return Err(format!(
                        "the text that opened the grammar, {text:?}, does not fit it"
                    ));
                }
            }
            return Ok(());
        }
        self.matcher
            .accept(id, piece, tok.is_eog(id))
            .map_err(|e| e.to_string())
    }
}

/// The tokens `text` encodes to alone, when their pieces spell exactly `text`; else none.
fn canonical_tokens(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let Ok(ids) = tok.encode(text, false, false) else {
        return Vec::new();
    };
    let mut spelled = Vec::with_capacity(text.len());
    for &id in &ids {
        spelled.extend_from_slice(tok.token_to_piece(id, true));
    }
    if spelled == text.as_bytes() {
        ids
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplerParams;
    use bloomery_grammar::Grammar;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The pick, however it is made, is llama.cpp's: the chain's pick when the grammar admits
    /// it, else the chain's pick over the masked row. Greedy (which reads the admitted tokens
    /// alone when few are), with penalties, and sampled; leaders admitted and refused, ties,
    /// NaNs and infinities.
    #[test]
    fn the_pick_is_the_chain_then_the_masked_chain() {
        // 300 tokens: the single bytes, then longer pieces; the grammar admits digits only.
        let pieces: Vec<Vec<u8>> = (0u8..=255)
            .map(|b| vec![b])
            .chain((0..44).map(|i| format!("{}x", i % 10).into_bytes()))
            .collect();
        let trie = Arc::new(TokenTrie::new(300, |i| &pieces[i as usize], &[]));
        let spec = GrammarSpec {
            grammar: Arc::new(Grammar::parse("root ::= [0-9]+", None).unwrap()),
            after: None,
            lazy: None,
        };
        let digit = |id: u32| (48..58).contains(&id);
        let mut rng = StdRng::seed_from_u64(7);
        let mut rows: Vec<Vec<f32>> = (0..40)
            .map(|_| (0..300).map(|_| rng.gen_range(-4.0..4.0)).collect())
            .collect();
        for (i, row) in rows.iter_mut().enumerate() {
            match i % 5 {
                // The leader admitted.
                0 => row[50] = 9.0,
                // Tied admitted leaders.
                1 => (row[49], row[55]) = (6.0, 6.0),
                2 => row[0] = f32::NAN,
                3 => row[52] = f32::INFINITY,
                _ => {}
            }
        }
        rows.push(vec![f32::NEG_INFINITY; 300]);
        let chains = [
            SamplerParams {
                temp: 0.0,
                ..SamplerParams::default()
            },
            SamplerParams {
                temp: 0.0,
                penalty_repeat: 1.5,
                penalty_present: 0.5,
                ..SamplerParams::default()
            },
            SamplerParams {
                seed: 3,
                ..SamplerParams::default()
            },
        ];
        for params in chains {
            let mut ours = Sampler::new(params.clone(), 300);
            let mut theirs = Sampler::new(params.clone(), 300);
            let mut c = Constraint::new(&spec, trie.clone());
            for (i, row) in rows.iter().enumerate() {
                let want = match theirs.sample(row) {
                    id if digit(id) => Ok(id),
                    _ => {
                        let mut masked = row.clone();
                        for (t, l) in masked.iter_mut().enumerate() {
                            if !digit(t as u32) {
                                *l = f32::NEG_INFINITY;
                            }
                        }
                        Some(theirs.sample(&masked))
                            .filter(|&id| digit(id))
                            .ok_or(())
                    }
                };
                let got = c.choose(row, &mut ours).map_err(|_| ());
                assert_eq!(got, want, "{params:?} row {i}");
                if let Ok(id) = want {
                    ours.accept(id);
                    theirs.accept(id);
                }
            }
        }
    }

    fn wait(after: Option<&str>, triggers: &[&str]) -> Wait {
        Wait {
            after: after.map(str::to_owned),
            span: None,
            triggers: triggers.iter().map(|t| (*t).to_owned()).collect(),
            seen: String::new(),
        }
    }

    #[test]
    fn a_lazy_grammar_opens_at_its_trigger_word_split_across_pieces() {
        let mut w = wait(None, &["<tool_call>", "<|x|>"]);
        for piece in ["Let me look: a < b, ", "then <tool", "_"] {
            assert_eq!(w.push(piece), None, "{piece}");
        }
        assert_eq!(
            w.push("call>\n{\"na").as_deref(),
            Some("<tool_call>\n{\"na")
        );
        assert!(w.done());
        // The earliest trigger wins.
        let mut w = wait(None, &["<tool_call>", "<|x|>"]);
        assert_eq!(
            w.push("a<|x|> <tool_call>").as_deref(),
            Some("<|x|> <tool_call>")
        );
    }

    #[test]
    fn a_trigger_inside_a_span_the_model_opened_does_not_count() {
        let span = |w: &mut Wait| w.span = Some(("<think>".into(), "</think>".into()));
        let mut w = wait(None, &["<tool_call>"]);
        span(&mut w);
        for piece in ["\n<th", "ink>maybe <tool_call>", " x</think>\n"] {
            assert_eq!(w.push(piece), None, "{piece}");
        }
        assert_eq!(w.push("<tool_call>{").as_deref(), Some("<tool_call>{"));
        // Text that does not open the span looks for triggers at once.
        let mut w = wait(None, &["<tool_call>"]);
        span(&mut w);
        assert_eq!(w.push("Hi <tool_call>").as_deref(), Some("<tool_call>"));
    }

    #[test]
    fn a_trigger_inside_the_think_span_does_not_open_the_grammar() {
        let mut w = wait(Some("</think>"), &["<tool_call>"]);
        assert_eq!(w.push("I could write <tool_call> here"), None);
        assert_eq!(w.push("</think>\n\nSure."), None);
        assert!(!w.done());
        assert_eq!(w.push(" 東京<tool_call>").as_deref(), Some("<tool_call>"));
        // Without triggers the text after the span is the grammar's.
        let mut w = wait(Some("</think>"), &[]);
        assert_eq!(w.push("x</think>{\"a").as_deref(), Some("{\"a"));
    }
}
