//! A request's grammar while it generates: where it applies in the sampler chain (llama.cpp's
//! place: the chain samples first, and only a token the grammar refuses makes it sample again
//! with the grammar's mask applied before the chain), the wait for a think span's end, and the
//! forced tokens of schemajump (a state that admits a single token needs no sampling), and its
//! drafts (the canonical tokens of the text the grammar fixes next, verified by sampling).

use std::collections::HashMap;
use std::sync::Arc;

use bloomery_grammar::{Matcher, TokenTrie};
use bloomery_text::Tokenizer;

use crate::request::GrammarSpec;
use crate::sampling::Sampler;

/// The vocabulary trie a grammar's mask walks, built once per model from the tokenizer's
/// pieces (special tokens as their text, as llama.cpp's grammar sees them).
pub(crate) fn token_trie(tok: &Tokenizer, n_vocab: usize) -> Arc<TokenTrie> {
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

/// A request's grammar state.
pub(crate) struct Constraint {
    matcher: Matcher,
    /// The text that opens the grammar and what the model has written while it waits for it.
    waiting: Option<(String, String)>,
    /// Logits with the mask applied (reused: no allocation per token once grown).
    masked: Vec<f32>,
    /// Tokens forced by schemajump.
    pub(crate) forced: usize,
    /// Tokens schemajump drafted and a pass evaluated.
    pub(crate) drafted: usize,
    /// Of those, the tokens sampling confirmed.
    pub(crate) accepted: usize,
    /// Each fixed text met so far and its canonical tokens (empty: not drafted).
    drafts: HashMap<String, Vec<u32>>,
    /// The fixed text from the current state (reused: no allocation per token once grown).
    fixed: String,
}

/// Longest fixed text a draft is made of, in characters.
const MAX_DRAFT_CHARS: usize = 64;

/// Fixed texts whose tokens a request remembers before it starts over.
const MAX_CACHED_DRAFTS: usize = 1024;

impl Constraint {
    pub(crate) fn new(spec: &GrammarSpec, vocab: Arc<TokenTrie>) -> Self {
        Constraint {
            matcher: Matcher::new(&spec.grammar, vocab),
            waiting: spec.after.clone().map(|t| (t, String::new())),
            masked: Vec::new(),
            forced: 0,
            drafted: 0,
            accepted: 0,
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
    pub(crate) fn draft(&mut self, tok: &Tokenizer, max: usize, out: &mut Vec<u32>) {
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
    pub(crate) fn active(&self) -> bool {
        self.waiting.is_none()
    }

    /// The only token the grammar admits next, when exactly one is (an end-of-generation token
    /// included).
    pub(crate) fn only(&mut self) -> Option<u32> {
        if !self.active() {
            return None;
        }
        self.matcher.mask().only()
    }

    /// Picks the next token from `row`: the only admissible one (one draw of the RNG, as a
    /// sampled token costs); else the chain's pick when the grammar admits it; else the chain
    /// again over the masked logits.
    pub(crate) fn choose(&mut self, row: &[f32], sampler: &mut Sampler) -> Result<u32, String> {
        if !self.active() {
            return Ok(sampler.sample(row));
        }
        let mask = self.matcher.mask();
        if mask.count() == 0 {
            return Err("the grammar admits no token of this vocabulary here".into());
        }
        if let Some(only) = mask.only() {
            sampler.skip_draw();
            return Ok(only);
        }
        let id = sampler.sample(row);
        if mask.allows(id) {
            return Ok(id);
        }
        self.masked.clear();
        self.masked.extend_from_slice(row);
        mask.apply(&mut self.masked);
        let id = sampler.sample(&self.masked);
        if mask.allows(id) {
            Ok(id)
        } else {
            Err("no token the grammar admits survives the sampler".into())
        }
    }

    /// Advances over the generated token `id`.
    pub(crate) fn accept(&mut self, id: u32, tok: &Tokenizer) -> Result<(), String> {
        let piece = tok.token_to_piece(id, true);
        if let Some((open, seen)) = &mut self.waiting {
            seen.push_str(&String::from_utf8_lossy(piece));
            if let Some(at) = seen.find(open.as_str()) {
                let rest = seen[at + open.len()..].to_owned();
                let open = open.clone();
                self.waiting = None;
                if !rest.is_empty() && !self.matcher.accept_text(&rest) {
                    return Err(format!(
                        "the text after {open:?} in one token does not fit the grammar"
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
