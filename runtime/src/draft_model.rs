//! Drafts from a separate, smaller model of the same vocabulary: llama-server b11434's
//! `--spec-type draft-simple` with `--spec-draft-model` (`-md`), as common/speculative.cpp's
//! draft-simple runs it. The draft model keeps its own K/V cache for every slot, fed the tokens
//! the slot holds; from the token just sampled it drafts greedily, one shared pass a step for all
//! drafting slots (the logits stay on the device: `Readout::Top`), each step's choice kept while
//! its probability among the ten likeliest reaches
//! `--spec-draft-p-min`, up to `--spec-draft-n-max` tokens, the whole draft dropped when shorter
//! than `--spec-draft-n-min`. llama-server feeds the draft model every batch the target runs;
//! here a slot's tokens are fed when it next drafts (one pass for what it took in since), which
//! gives the draft model the same cache. Only a model whose state is positional (K/V caches, no
//! recurrent state or pooled keys) can draft: its cache past a refused draft is simply written
//! over. The vocabularies must agree as b11434 checks them ([`check_vocab`]).

use bloomery_exec::{LoadedModel, Readout};
use bloomery_text::Tokenizer;

use crate::spec::{empty_batch, SpecConfig, Want, TOP_K};

/// Token ids below this are not compared (b11434's `SPEC_VOCAB_CHECK_START_TOKEN_ID`).
const CHECK_FROM: usize = 5;
/// The most two vocabularies' sizes may differ (b11434's `SPEC_VOCAB_MAX_SIZE_DIFFERENCE`).
const MAX_SIZE_DIFFERENCE: usize = 128;

/// Whether a draft model with tokenizer `draft` can draft for a target with tokenizer `target`,
/// as b11434's `common_speculative_are_compatible` judges it: the same kind of vocabulary, the
/// same BOS and EOS where they are added, sizes within 128 and the same text for every token
/// from id 5 up to the smaller size. The error names the first difference.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    let (t, d) = (target.special(), draft.special());
    if target.kind() != draft.kind() {
        return Err(format!(
            "the draft model's vocabulary is of another kind ({:?}, the model's {:?})",
            draft.kind(),
            target.kind()
        ));
    }
    if t.add_bos != d.add_bos || (t.add_bos && t.bos != d.bos) {
        return Err("the draft model's BOS token differs from the model's".into());
    }
    if t.add_eos != d.add_eos || (t.add_eos && t.eos != d.eos) {
        return Err("the draft model's EOS token differs from the model's".into());
    }
    let (nt, nd) = (target.vocab_size(), draft.vocab_size());
    if nt.abs_diff(nd) > MAX_SIZE_DIFFERENCE {
        return Err(format!(
            "the draft model's vocabulary has {nd} tokens, the model's {nt} (at most \
             {MAX_SIZE_DIFFERENCE} apart)"
        ));
    }
    for id in CHECK_FROM..nt.min(nd) {
        if target.token_text(id as u32) != draft.token_text(id as u32) {
            return Err(format!(
                "the draft model's token {id} is {:?}, the model's {:?}",
                draft.token_text(id as u32),
                target.token_text(id as u32)
            ));
        }
    }
    Ok(())
}

/// Whether `draft` can draft for `target` with draft-simple: its state is positional (no
/// recurrent state, no hashed n-gram tables, whose rows follow the token record), and it
/// holds as many slots as the target. The error names what is not so.
pub fn check_draft_simple(target: &LoadedModel, draft: &LoadedModel) -> Result<(), String> {
    let arch = &draft.spec.architecture;
    if draft.rewind().per_sequence {
        return Err(format!(
            "the draft model (`{arch}`) keeps recurrent state, which a refused draft cannot be \
             cut back within: draft-simple needs a model whose state is kept per position"
        ));
    }
    if draft.spec.ngram.is_some() {
        return Err(format!(
            "the draft model (`{arch}`) reads hashed n-gram tables: not supported as a draft model"
        ));
    }
    if draft.options.n_slots != target.options.n_slots {
        return Err(format!(
            "the draft model holds {} slots, the model {}",
            draft.options.n_slots, target.options.n_slots
        ));
    }
    Ok(())
}

/// The draft model's driver.
pub struct ModelDrafter {
    cfg: SpecConfig,
    model: Box<LoadedModel>,
    /// Per slot, the tokens at positions 0.. of the draft model's cache (past them it is stale).
    held: Vec<Vec<u32>>,
    /// The most rows of a pass that feeds the draft model a slot's tokens.
    batch_rows: usize,
    /// The target's vocabulary: a drafted id past it ends the draft.
    n_vocab: usize,
}

impl ModelDrafter {
    /// A driver of `model` for `n_slots` slots, feeding at most `batch_rows` rows a pass, for a
    /// target of `n_vocab` tokens.
    pub fn new(
        cfg: SpecConfig,
        model: LoadedModel,
        n_slots: usize,
        batch_rows: usize,
        n_vocab: usize,
    ) -> ModelDrafter {
        ModelDrafter {
            cfg,
            model: Box::new(model),
            held: vec![Vec::new(); n_slots],
            batch_rows: batch_rows.max(1),
            n_vocab,
        }
    }

    /// The draft model (its caches, for tests).
    pub fn model(&self) -> &LoadedModel {
        &self.model
    }

    /// Feeds the draft model what each slot of `wants` holds (`cached`) past what its cache
    /// already matches, all slots' rows in shared passes of at most `batch_rows` rows.
    pub fn catch_up<'a>(
        &mut self,
        wants: &[Want],
        cached: impl Fn(usize) -> &'a [u32],
    ) -> Result<(), String> {
        let mut rows: Vec<(usize, usize, u32)> = Vec::new();
        for w in wants {
            let have = cached(w.slot);
            let held = &mut self.held[w.slot];
            let same = held.iter().zip(have).take_while(|(a, b)| a == b).count();
            held.truncate(same);
            rows.extend(
                have[same..]
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| (w.slot, same + i, t)),
            );
            held.extend_from_slice(&have[same..]);
        }
        for pass in rows.chunks(self.batch_rows) {
            let mut batch = empty_batch();
            for &(slot, pos, token) in pass {
                batch.tokens.push(token as i32);
                batch.positions.push(pos as i32);
                batch.slots.push(slot as i32);
            }
            // Every pass needs an output: the last row's final-norm row, read and not used.
            batch.output_rows.push(pass.len() as i32 - 1);
            self.model
                .forward_reading(&batch, Readout::Embeddings)
                .map_err(|e| format!("the draft model's pass over the slots' tokens: {e}"))?;
        }
        Ok(())
    }

    /// Drafts for every slot of `wants` (each caught up first, [`ModelDrafter::catch_up`]), all
    /// slots' steps in shared passes; the drafts in the order of `wants`.
    pub fn draft(&mut self, wants: &[Want]) -> Result<Vec<Vec<u32>>, String> {
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); wants.len()];
        // Each drafting slot's next row: the index of its want and the token to feed.
        let mut rows: Vec<(usize, u32)> = wants
            .iter()
            .enumerate()
            .filter(|(_, w)| w.max > 0)
            .map(|(i, w)| (i, w.last))
            .collect();
        while !rows.is_empty() {
            let mut batch = empty_batch();
            for (r, &(i, token)) in rows.iter().enumerate() {
                let w = &wants[i];
                batch.tokens.push(token as i32);
                batch.positions.push((w.pos + drafts[i].len()) as i32);
                batch.slots.push(w.slot as i32);
                batch.output_rows.push(r as i32);
                self.held[w.slot].push(token);
            }
            // The logits stay on the device: each row's ten likeliest ids and their probability
            // among those come back (draft-simple's top-k 10 sampler).
            let out = self
                .model
                .forward_reading(&batch, Readout::Top(TOP_K as u32))
                .map_err(|e| format!("a draft model step: {e}"))?;
            let mut next = Vec::with_capacity(rows.len());
            for (r, (i, _)) in rows.into_iter().enumerate() {
                let (best, p) = (out.top_ids[r * TOP_K], out.top_probs[r * TOP_K]);
                let Ok(best) = u32::try_from(best) else {
                    continue;
                };
                if p < self.cfg.p_min || best as usize >= self.n_vocab {
                    continue;
                }
                drafts[i].push(best);
                if drafts[i].len() < wants[i].max {
                    next.push((i, best));
                }
            }
            rows = next;
        }
        for d in &mut drafts {
            if d.len() < self.cfg.n_min {
                d.clear();
            }
        }
        Ok(drafts)
    }
}
