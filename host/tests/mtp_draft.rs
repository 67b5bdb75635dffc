//! Draft decoding through the shared runtime on the tiny files with an MTP block
//! (`bloomery synth --arch qwen35moe|qwen35 --preset tiny-mtp --seed 7`, and glm5-next's `tiny`
//! with its NextN layer, every tensor F32):
//!
//! - the MTP block drafting (n_max 3; GLM-5.3's NextN layer one token a step) gives the same
//!   tokens as no drafting, greedy and seeded, one request at a time and two in shared passes;
//! - test-only sources: a perfect one (the target's own greedy continuation) has every draft
//!   accepted, an always-wrong one every draft refused at its first row, both with the same
//!   tokens;
//! - the MTP driver drafts what the block run by hand, paired as llama.cpp's draft-mtp pairs it,
//!   gives, also with the rows taken in and the first draft row in one block pass; a drafting
//!   step of k drafts runs k block passes; a draft pass's top-10 readout gives the ten likeliest
//!   ids of its logits and their softmax, reading no logits;
//! - after refused drafts (refused at the first, second or third drafted row) the slot's state
//!   (K/V rows, recurrent and convolution state; GLM-5.3's KDA state, latent and indexer caches
//!   and its NextN layer's) is bit-for-bit the state of decoding the kept
//!   tokens without drafts (on the CPU a row's results do not depend on the rows beside it);
//! - a verify pass keeps each row's per-sequence state, and the slot takes the state of its
//!   last kept row from there: a refused draft runs no second pass;
//! - types combined as llama-server b11434 combines them (`--spec-type ngram-simple,draft-mtp`):
//!   ngram-simple is consulted first, the next drafter only where it drafts nothing, only the
//!   drafter of a draft hears how much of it was kept; greedy and seeded tokens are those of
//!   drafting off, both drafters drafting.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel, Readout};
use bloomery_plugin_api::model::StateKind;
use bloomery_plugin_api::DType;
use bloomery_runtime::draft_gate::{StepCosts, StepShape};
use bloomery_runtime::ngram_draft::{simple_draft, NgramSimpleConfig};
use bloomery_runtime::request::{Event, Finish, GenParams};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::spec::{Chunk, DraftSource, MtpDrafter, SpecConfig, SpecType, Want};
use bloomery_runtime::{Runtime, RuntimeConfig};
use bloomery_text::Tokenizer;

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

const N_PREDICT: usize = 24;

/// `arch`'s tiny file with an MTP block (seed 7) in `dir`: the `tiny-mtp` preset, or glm5-next's
/// `tiny`, which carries its NextN layer.
fn tiny_mtp(arch: &str, dir: &Path) -> PathBuf {
    let preset = match arch {
        "glm5-next" => "tiny",
        _ => "tiny-mtp",
    };
    common::preset_of(
        arch,
        preset,
        &dir.join(format!("{arch}-tiny-mtp.gguf")),
        F32,
    )
}

fn load(path: &Path) -> (LoadedModel, Arc<Tokenizer>) {
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let options = LoadOptions {
        n_slots: 2,
        ctx_per_slot: 256,
        threads: 2,
        ..LoadOptions::default()
    };
    let model = LoadedModel::load(&reg, path, options).unwrap();
    assert_eq!(model.spec.caps.n_mtp_layers, 1);
    let tok = Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
    (model, tok)
}

fn config(spec: SpecConfig) -> RuntimeConfig {
    RuntimeConfig {
        n_ctx_slot: 256,
        n_batch: 64,
        cache_ram: None,
        queue_depth: 8,
        max_checkpoints: bloomery_runtime::DEFAULT_MAX_CHECKPOINTS,
        checkpoint_every: bloomery_runtime::DEFAULT_CHECKPOINT_EVERY,
        schemajump: true,
        context_shift: false,
        spec,
        slot_similarity: bloomery_runtime::DEFAULT_SLOT_SIMILARITY,
    }
}

/// The model at `path` with drafting as `spec` asks.
fn start(path: &Path, spec: SpecConfig) -> (Runtime, Arc<Tokenizer>) {
    let (model, tok) = load(path);
    (
        Runtime::start(model, tok.clone(), config(spec)).unwrap(),
        tok,
    )
}

/// The model at `path` drafting from `source`, at most `n_max` tokens a step, every step (no
/// gate: these tests count drafts).
fn start_with(path: &Path, source: impl DraftSource + 'static, n_max: usize) -> Runtime {
    let (model, tok) = load(path);
    let spec = SpecConfig {
        n_max,
        gate: false,
        ..SpecConfig::OFF
    };
    Runtime::start_drafting(model, tok, config(spec), Box::new(source)).unwrap()
}

fn params(seed: Option<u32>) -> GenParams {
    common::generation(
        SamplerParams {
            temp: if seed.is_some() { 1.0 } else { 0.0 },
            seed: u64::from(seed.unwrap_or(0)),
            ..SamplerParams::default()
        },
        N_PREDICT,
    )
}

fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    [
        "The quick brown fox",
        "Once upon a time, in a land far away,",
        "1, 2, 3, 4,",
        "Hello",
    ]
    .iter()
    .map(|s| tok.encode(s, true, false).unwrap())
    .collect()
}

/// The tokens a request's receiver gets, and its end.
fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<u32>, Finish) {
    let mut ids = Vec::new();
    loop {
        match rx
            .blocking_recv()
            .expect("the scheduler dropped the request")
        {
            Event::Token(piece) => ids.push(piece.id),
            Event::Done(f) => return (ids, f),
            Event::Failed(f) => panic!("request failed: {}", f.message),
            _ => {}
        }
    }
}

/// `prompt` answered in slot 0.
fn answer(rt: &Runtime, prompt: &[u32], p: GenParams) -> (Vec<u32>, Finish) {
    collect(rt.submit_blocking(prompt.to_vec(), p, Some(0)).unwrap())
}

/// `prompts` answered together, in shared passes.
fn answer_together(rt: &Runtime, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let reqs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| (p.clone(), params(None), Some(i)))
        .collect();
    let rxs = rt.submit_together_blocking(reqs).unwrap();
    rxs.into_iter().map(|rx| collect(rx).0).collect()
}

/// Drafts from known greedy continuations: the next tokens of the sequence that `tokens`
/// starts, each from draft position `from` on replaced by the next id (wrong).
struct Scripted {
    sequences: Vec<Vec<u32>>,
    n_vocab: u32,
    /// Draft positions (0: the first) from which tokens are wrong.
    from: usize,
}

impl DraftSource for Scripted {
    fn draft(&mut self, _: usize, tokens: &[u32], max: usize) -> Vec<u32> {
        let Some(seq) = self.sequences.iter().find(|s| s.starts_with(tokens)) else {
            return Vec::new();
        };
        seq[tokens.len()..]
            .iter()
            .take(max)
            .enumerate()
            .map(|(i, &t)| match i >= self.from {
                true => (t + 1) % self.n_vocab,
                false => t,
            })
            .collect()
    }
}

/// Greedy answers with drafting off: each prompt's whole sequence (prompt and answer).
fn greedy_off(path: &Path) -> Vec<Vec<u32>> {
    let (off, tok) = start(path, SpecConfig::OFF);
    let mut out = Vec::new();
    for prompt in prompts(&tok) {
        let (ids, f) = answer(&off, &prompt, params(None));
        assert_eq!((f.n_drafted, f.n_accepted), (0, 0));
        out.push([prompt, ids].concat());
    }
    off.shutdown().unwrap();
    out
}

/// `arch`'s tokens with MTP drafting on and off agree; its steps draft at most `width` tokens.
fn mtp_on_and_off_agree(arch: &str, width: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp(arch, dir.path());
    let (off, tok) = start(&path, SpecConfig::OFF);
    // Ungated: every step drafts (the gate's own tests are below).
    let ungated = SpecConfig {
        gate: false,
        ..SpecConfig::MTP
    };
    let (on, _) = start(&path, ungated);
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in prompts(&tok) {
        for seed in [None, Some(3), Some(11)] {
            let (a, fa) = answer(&on, &prompt, params(seed));
            let (b, fb) = answer(&off, &prompt, params(seed));
            assert_eq!(a, b, "{arch}, seed {seed:?}: tokens differ");
            assert_eq!((fb.n_drafted, fb.n_accepted), (0, 0));
            assert!(fa.n_accepted <= fa.n_drafted);
            drafted += fa.n_drafted;
            accepted += fa.n_accepted;
        }
    }
    let all = prompts(&tok);
    for pair in all.chunks(2) {
        assert_eq!(
            answer_together(&on, pair),
            answer_together(&off, pair),
            "{arch}: two requests in shared passes"
        );
    }
    eprintln!("{arch}: {accepted} of {drafted} MTP drafts accepted");
    assert!(drafted > 0, "the MTP block drafted nothing");
    let c = &on.shared().counters;
    let steps = c.spec_verify_steps.load(Ordering::Relaxed) as usize;
    let tokens = c.spec_draft_tokens.load(Ordering::Relaxed) as usize;
    assert!(tokens <= width * steps, "{tokens} tokens in {steps} drafts");
    assert!(
        tokens > (width - 1) * steps,
        "{tokens} tokens in {steps} drafts"
    );
    on.shutdown().unwrap();
    off.shutdown().unwrap();
}

#[test]
fn qwen35moe_greedy_and_seeded_tokens_are_the_same_with_mtp_drafting_on_and_off() {
    mtp_on_and_off_agree("qwen35moe", 3);
}

#[test]
fn qwen35_greedy_and_seeded_tokens_are_the_same_with_mtp_drafting_on_and_off() {
    mtp_on_and_off_agree("qwen35", 3);
}

/// GLM-5.3's NextN layer drafts one token a step (issue 48) through its own latent and indexer
/// caches, beside the trunk's KDA, MLA and hyper-connection streams.
#[test]
fn glm5next_greedy_and_seeded_tokens_are_the_same_with_nextn_drafting_on_and_off() {
    mtp_on_and_off_agree("glm5-next", 1);
}

/// Answers every prompt in slot 0 drafting from `source` (`from` wrong positions on), checks
/// the tokens against `want`, and gives the (drafted, accepted) totals.
fn scripted(path: &Path, want: &[Vec<u32>], from: usize) -> (usize, usize) {
    let (model, tok) = load(path);
    let n_vocab = model.spec.hparams.n_vocab;
    drop(model);
    let source = Scripted {
        sequences: want.to_vec(),
        n_vocab,
        from,
    };
    let rt = start_with(path, source, 3);
    let (mut drafted, mut accepted) = (0, 0);
    for (prompt, seq) in prompts(&tok).iter().zip(want) {
        let (ids, f) = answer(&rt, prompt, params(None));
        assert_eq!(
            ids,
            seq[prompt.len()..],
            "drafts wrong from {from}: tokens differ"
        );
        drafted += f.n_drafted;
        accepted += f.n_accepted;
    }
    // llama-server's spec_decode counters (/metrics) say the same.
    let c = &rt.shared().counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as usize;
    assert_eq!(get(&c.spec_draft_tokens), drafted);
    assert_eq!(get(&c.spec_accepted), accepted);
    assert!(get(&c.spec_verify_steps) * 3 >= drafted);
    // Accepted tokens per draft position (llama-server's labeled counter): one entry per
    // position up to n_max, a step keeping position i kept every one before it, adding up to
    // the accepted tokens.
    let per_pos = c.spec_accepted_per_pos.lock().unwrap().clone();
    assert_eq!(per_pos.len(), 3);
    assert!(per_pos.windows(2).all(|w| w[0] >= w[1]), "{per_pos:?}");
    assert_eq!(
        per_pos.iter().sum::<u64>() as usize,
        accepted,
        "{per_pos:?}"
    );
    assert!(per_pos[0] as usize <= get(&c.spec_verify_steps));
    eprintln!("accepted per position: {per_pos:?}");
    rt.shutdown().unwrap();
    (drafted, accepted)
}

#[test]
fn a_perfect_source_is_accepted_whole_and_a_wrong_one_refused_at_its_first_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let want = greedy_off(&path);
    let (drafted, accepted) = scripted(&path, &want, usize::MAX);
    eprintln!("perfect: {accepted} of {drafted} accepted");
    assert!(drafted > 0);
    assert_eq!(
        accepted, drafted,
        "a perfect source's drafts are all accepted"
    );
    let (drafted, accepted) = scripted(&path, &want, 0);
    eprintln!("wrong: {accepted} of {drafted} accepted");
    // Each step after the first token drafts 3 (fewer near the limit) and keeps none.
    assert!(drafted >= want.len() * (N_PREDICT - 4) * 3);
    assert_eq!(accepted, 0, "a wrong source's drafts are all refused");
}

/// Slot 0's state after answering `prompt` greedily on `rt`, and the positions it holds.
fn state_after(rt: Runtime, prompt: &[u32]) -> Vec<Vec<u8>> {
    let (_, f) = answer(&rt, prompt, params(None));
    // The last token is reported, never evaluated.
    let n = prompt.len() + f.n_predicted - 1;
    let model = rt.shutdown().unwrap();
    model.read_slot(0, n as u32).unwrap()
}

#[test]
fn after_refused_drafts_the_state_is_bit_for_bit_that_of_decoding_without_drafts() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen35moe", "qwen35", "glm5-next"] {
        let path = tiny_mtp(arch, dir.path());
        let want = greedy_off(&path);
        let (model, tok) = load(&path);
        let n_vocab = model.spec.hparams.n_vocab;
        drop(model);
        for prompt in prompts(&tok) {
            let plain = state_after(start(&path, SpecConfig::OFF).0, &prompt);
            for from in [0, 1, 2] {
                let wrong = Scripted {
                    sequences: want.clone(),
                    n_vocab,
                    from,
                };
                let drafting = state_after(start_with(&path, wrong, 3), &prompt);
                assert_eq!(drafting.len(), plain.len());
                for (i, (a, b)) in drafting.iter().zip(&plain).enumerate() {
                    assert!(a == b, "{arch}, wrong from {from}: state part {i} differs");
                }
            }
        }
    }
}

/// Rows `tokens` of slot `slot` from position `start`, every row an output.
fn rows(tokens: &[u32], start: usize, slot: i32) -> BatchInputs {
    BatchInputs {
        tokens: tokens.iter().map(|&t| t as i32).collect(),
        positions: (start..start + tokens.len()).map(|p| p as i32).collect(),
        slots: vec![slot; tokens.len()],
        output_rows: (0..tokens.len() as i32).collect(),
        ngram_rows: vec![],
        logit_rows: vec![],
    }
}

/// The likeliest token of `logits` (the lowest id among equals).
fn argmax(logits: &[f32]) -> u32 {
    let best = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logits.iter().position(|&l| l == best).unwrap() as u32
}

/// The MTP driver's draft after a prompt against the block run by hand as llama.cpp's draft-mtp
/// pairs it (common/speculative.cpp): row p is token p with the trunk's final-norm row of p − 1
/// (zeros at 0), and each later step its drafted token with the block's own final-norm row of
/// the step before, one position on.
#[test]
fn the_mtp_driver_drafts_as_the_block_run_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (mut m, tok) = load(&path);
    let n = m.spec.hparams.n_embd as usize;
    let nv = m.spec.hparams.n_vocab as usize;
    for prompt in prompts(&tok) {
        let len = prompt.len();
        let trunk = m
            .forward_reading(&rows(&prompt, 0, 0), Readout::Both)
            .unwrap();
        let x = argmax(&trunk.logits[(len - 1) * nv..]);
        let mut driver = MtpDrafter::new(SpecConfig::MTP, 2, n);
        let chunk = Chunk {
            slot: 0,
            start: 0,
            tokens: &prompt,
            rows: &trunk.embeddings,
            kept: len,
        };
        driver.take_in(&mut m, &[chunk]).unwrap();
        let want = Want {
            slot: 0,
            last: x,
            pos: len,
            max: 3,
        };
        let got = driver.draft(&mut m, &[want]).unwrap();
        // By hand, in slot 1's draft caches.
        let toks = [prompt.clone(), vec![x]].concat();
        let hidden = [vec![0f32; n], trunk.embeddings.clone()].concat();
        let r = m
            .forward_draft_reading(&rows(&toks, 0, 1), &hidden, Readout::Both)
            .unwrap();
        let mut drafts = vec![argmax(&r.logits[len * nv..])];
        let mut h = r.embeddings[len * n..].to_vec();
        for step in 1..3 {
            let r = m
                .forward_draft_reading(
                    &rows(&drafts[step - 1..step], len + step, 1),
                    &h,
                    Readout::Both,
                )
                .unwrap();
            drafts.push(argmax(&r.logits));
            h = r.embeddings;
        }
        assert_eq!(got, vec![drafts.clone()], "prompt of {len} tokens");
        // Taking in the prompt and the first draft row in one block pass drafts the same.
        let mut fused = MtpDrafter::new(SpecConfig::MTP, 2, n);
        let chunk = Chunk {
            slot: 0,
            start: 0,
            tokens: &prompt,
            rows: &trunk.embeddings,
            kept: len,
        };
        let got = fused.take_in_and_draft(&mut m, &[chunk], &[want]).unwrap();
        assert_eq!(got, vec![drafts], "prompt of {len} tokens, one pass fewer");
        assert_eq!(fused.stats().passes, 3, "three drafts, three block passes");
    }
}

/// A draft pass's top-10 readout (its logits kept on the device) gives the ten likeliest ids of
/// the logits the same pass reads whole (ties to the lower id), their probabilities a softmax
/// over those ten (llama.cpp b11434's draft-mtp: a top-k 10 sampler, then the first candidate's
/// p), the same final-norm rows, and no logits.
#[test]
fn the_top_readout_gives_the_ten_likeliest_of_the_logits_and_their_softmax() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (mut m, tok) = load(&path);
    let n = m.spec.hparams.n_embd as usize;
    let nv = m.spec.hparams.n_vocab as usize;
    let prompt = &prompts(&tok)[1];
    let len = prompt.len();
    let trunk = m
        .forward_reading(&rows(prompt, 0, 0), Readout::Both)
        .unwrap();
    let hidden = [vec![0f32; n], trunk.embeddings[..(len - 1) * n].to_vec()].concat();
    let batch = rows(prompt, 0, 0);
    let both = m
        .forward_draft_reading(&batch, &hidden, Readout::Both)
        .unwrap();
    let top = m
        .forward_draft_reading(&batch, &hidden, Readout::Top(10))
        .unwrap();
    assert!(top.logits.is_empty());
    assert_eq!(top.embeddings, both.embeddings);
    assert_eq!(
        (top.top_ids.len(), top.top_probs.len()),
        (10 * len, 10 * len)
    );
    for r in 0..len {
        let row = &both.logits[r * nv..(r + 1) * nv];
        let mut order: Vec<usize> = (0..nv).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let ids: Vec<i32> = order[..10].iter().map(|&i| i as i32).collect();
        assert_eq!(top.top_ids[r * 10..(r + 1) * 10], ids, "row {r}");
        let max = f64::from(row[order[0]]);
        let sum: f64 = order[..10]
            .iter()
            .map(|&i| (f64::from(row[i]) - max).exp())
            .sum();
        for (j, &i) in order[..10].iter().enumerate() {
            let want = (f64::from(row[i]) - max).exp() / sum;
            let got = f64::from(top.top_probs[r * 10 + j]);
            assert!(
                (got - want).abs() < 1e-6,
                "row {r}, candidate {j}: {got} vs {want}"
            );
        }
    }
}

/// A drafting step of k drafts runs k passes of the MTP block: its first draft row goes through
/// the block in the same pass as the target's rows it takes in (before: one pass more a step).
/// A step that drafts nothing (the request's last) puts its rows off, so a request's block
/// passes are its drafted tokens.
#[test]
fn a_drafting_step_runs_one_block_pass_per_draft() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let want = greedy_off(&path);
    let spec = SpecConfig {
        gate: false,
        ..SpecConfig::MTP
    };
    let (rt, tok) = start(&path, spec);
    let c = &rt.shared().counters;
    for (prompt, seq) in prompts(&tok).iter().zip(&want) {
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let before = (get(&c.mtp_passes), get(&c.spec_draft_tokens));
        let (ids, f) = answer(&rt, prompt, params(None));
        assert_eq!(ids, seq[prompt.len()..], "tokens differ");
        let passes = get(&c.mtp_passes) - before.0;
        let drafted = get(&c.spec_draft_tokens) - before.1;
        assert_eq!(drafted as usize, f.n_drafted);
        assert!(drafted > 0);
        assert_eq!(passes, drafted, "{drafted} drafted tokens");
    }
    rt.shutdown().unwrap();
}

/// Every draft a [`Recorder`] made, with the length of what it follows.
type Seen = Arc<std::sync::Mutex<Vec<(usize, Vec<u32>)>>>;

/// Drafts `n_max` wrong tokens (each the token before it plus 7) and records every draft.
struct Recorder {
    n_vocab: u32,
    seen: Seen,
}

impl DraftSource for Recorder {
    fn draft(&mut self, _: usize, tokens: &[u32], max: usize) -> Vec<u32> {
        let mut last = *tokens.last().unwrap();
        let d: Vec<u32> = (0..max)
            .map(|_| {
                last = (last + 7) % self.n_vocab;
                last
            })
            .collect();
        self.seen.lock().unwrap().push((tokens.len(), d.clone()));
        d
    }
}

/// The target's greedy choice after every prefix of `seq` past `prompt` (drafting off, the
/// answer forced, each row's likeliest token read from its probabilities).
fn greedy_choices(path: &Path, prompt: &[u32], answer: &[u32]) -> Vec<u32> {
    let (off, _) = start(path, SpecConfig::OFF);
    let mut p = params(None);
    p.n_predict = Some(answer.len());
    p.forced = answer.to_vec();
    p.n_probs = 1;
    let mut rx = off.submit_blocking(prompt.to_vec(), p, Some(0)).unwrap();
    let mut best = Vec::new();
    loop {
        match rx.blocking_recv().unwrap() {
            // The end's flush of held text comes without probabilities.
            Event::Token(piece) => best.extend(piece.probs.map(|p| p.ranked()[0].0)),
            Event::Done(_) => break,
            Event::Failed(f) => panic!("{}", f.message),
            _ => {}
        }
    }
    off.shutdown().unwrap();
    assert_eq!(best.len(), answer.len());
    best
}

/// `--spec-synth-len 2.5` (llama-server's synthetic acceptance length, the target's token
/// included): verify steps keep 0 to 3 of their three drafts, 1.5 on average; the kept tokens
/// are the drafts themselves, and every token after them is the target's own greedy choice
/// given everything kept before it (so the cache and recurrent state hold exactly the kept
/// tokens).
#[test]
fn a_fixed_acceptance_length_keeps_the_drafts_and_the_state_follows_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (model, tok) = load(&path);
    let n_vocab = model.spec.hparams.n_vocab;
    drop(model);
    let seen: Seen = Arc::default();
    let source = Recorder {
        n_vocab,
        seen: Arc::clone(&seen),
    };
    let (model, _) = load(&path);
    let spec = SpecConfig {
        n_max: 3,
        synth_len: Some(2.5),
        ..SpecConfig::OFF
    };
    let rt = Runtime::start_drafting(model, tok.clone(), config(spec), Box::new(source)).unwrap();
    let (mut steps, mut kept_total, mut counts) = (0, 0, [0; 4]);
    for (i, prompt) in prompts(&tok).into_iter().enumerate() {
        seen.lock().unwrap().clear();
        let mut p = params(None);
        p.n_predict = Some(120);
        // Its own seed: the synthetic draws come from it (greedy all the same).
        p.sampler.seed = i as u64 + 1;
        let (mut ids, f) = answer(&rt, &prompt, p);
        // The end's flush of held text may repeat the last id.
        assert_eq!(f.n_predicted, 120);
        ids.truncate(120);
        let seq = [prompt.clone(), ids.clone()].concat();
        let drafts = seen.lock().unwrap().clone();
        let best = greedy_choices(&path, &prompt, &ids);
        // Each draft follows `c` tokens; the next draft follows what this step kept and the
        // token sampled after it.
        for w in drafts.windows(2) {
            let ((c, d), (next, _)) = (&w[0], &w[1]);
            let kept = next - c - 1;
            assert!(kept <= 3, "{kept} drafts kept of {d:?}");
            counts[kept] += 1;
            assert_eq!(
                seq[*c..c + kept],
                d[..kept],
                "the kept tokens are the drafts"
            );
            // The token after them is the target's greedy choice there.
            let at = c + kept - prompt.len();
            assert_eq!(ids[at], best[at], "token {at} after {kept} kept drafts");
            steps += 1;
            kept_total += kept;
        }
        assert_eq!(f.n_accepted, f.n_accepted.min(f.n_drafted));
    }
    let mean = 1.0 + kept_total as f64 / steps as f64;
    eprintln!("{kept_total} drafts kept in {steps} steps ({counts:?} kept 0..3): length {mean:.3}");
    // Every count of kept drafts occurs.
    assert!(counts.iter().all(|&n| n > 0), "{counts:?}");
    // About 190 steps: the spread of the mean is under 0.08.
    assert!((mean - 2.5).abs() < 0.25, "length {mean}");
    let c = &rt.shared().counters;
    let steps_all = c.spec_verify_steps.load(Ordering::Relaxed) as f64;
    let accepted_all = c.spec_accepted.load(Ordering::Relaxed) as f64;
    assert!((1.0 + accepted_all / steps_all - 2.5).abs() < 0.25);
    rt.shutdown().unwrap();
}

/// With the MTP block drafting (the benchmark's path) the realised mean acceptance length is
/// the one asked for.
#[test]
fn mtp_drafting_with_a_fixed_acceptance_length_keeps_its_mean() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    for len in [1.5, 3.4] {
        let spec = SpecConfig {
            synth_len: Some(len),
            ..SpecConfig::MTP
        };
        let (rt, tok) = start(&path, spec);
        for (i, prompt) in prompts(&tok).into_iter().enumerate() {
            let mut p = params(None);
            p.n_predict = Some(120);
            // Its own seed: the synthetic draws come from it (greedy all the same).
            p.sampler.seed = i as u64 + 1;
            assert_eq!(answer(&rt, &prompt, p).1.n_predicted, 120);
        }
        let c = &rt.shared().counters;
        let steps = c.spec_verify_steps.load(Ordering::Relaxed) as f64;
        let mean = 1.0 + c.spec_accepted.load(Ordering::Relaxed) as f64 / steps;
        eprintln!("L {len}: length {mean:.3} over {steps} steps");
        assert!((mean - len).abs() < 0.25, "L {len}: length {mean}");
        rt.shutdown().unwrap();
    }
}

/// `bloomery bench` runs decoding with drafting off and on at a fixed acceptance length, each
/// a row of its table with the accepted drafts per verify step; its timed runs prepare no pass
/// shape the warm-up run did not.
#[test]
fn bench_runs_drafting_off_and_on_and_prints_the_accepted_per_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(common::plugin_dir())
        .args([
            "bench",
            "-m",
            path.to_str().unwrap(),
            "-p",
            "0",
            "-n",
            "100",
        ])
        .args(["-r", "2", "-t", "2", "--spec-type", "none,draft-mtp"])
        .args(["--spec-synth-len", "2.7"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].contains("| spec             | acc/step |   len |"),
        "{stdout}"
    );
    let row = |spec: &str| {
        let l = lines
            .iter()
            .find(|l| l.contains(&format!("| {spec:<16} |")))
            .unwrap_or_else(|| panic!("no {spec} row: {stdout}"));
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        assert_eq!(cells[cells.len() - 3], "tg100", "{l}");
        (
            cells[cells.len() - 5].to_owned(),
            cells[cells.len() - 4].to_owned(),
        )
    };
    assert_eq!(row("none"), ("-".into(), "-".into()));
    let (acc, len) = row("draft-mtp L2.7");
    let (acc, len): (f64, f64) = (acc.parse().unwrap(), len.parse().unwrap());
    assert!((len - 2.7).abs() < 0.35, "{len}\n{stdout}");
    assert!((acc + 1.0 - len).abs() < 0.011, "{acc} {len}");
    assert!(stderr.contains("verify steps"), "{stderr}");
    // The warm-up run prepared every pass shape the timed runs use, and refused drafts ran no
    // second pass (verify passes keep each row's state).
    assert!(
        stderr.contains("; 0 pass shapes prepared in the runs; 0 re-run passes"),
        "{stderr}"
    );
}

/// Synthetic acceptance draws from the request's own seed, as llama-server's slot seeds its
/// generator: the same seed keeps the same drafts, another seed others.
#[test]
fn synthetic_acceptance_draws_from_the_requests_seed() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let spec = SpecConfig {
        synth_len: Some(2.5),
        ..SpecConfig::MTP
    };
    let (rt, tok) = start(&path, spec);
    let prompt = &prompts(&tok)[1];
    let accepted = |seed: u64| {
        let mut p = params(None);
        p.n_predict = Some(120);
        p.sampler.seed = seed;
        let f = answer(&rt, prompt, p).1;
        (f.n_drafted, f.n_accepted)
    };
    let (a, b, c) = (accepted(5), accepted(5), accepted(6));
    eprintln!("seed 5: {a:?} twice {b:?}, seed 6: {c:?}");
    assert_eq!(a, b);
    assert_ne!(a, c);
    rt.shutdown().unwrap();
}

/// Slot `slot` takes in `tokens` from position `start` (one pass, no readout wanted).
fn feed(m: &mut LoadedModel, tokens: &[u32], start: usize, slot: i32) {
    let mut batch = rows(tokens, start, slot);
    batch.output_rows = vec![tokens.len() as i32 - 1];
    m.forward(&batch).unwrap();
}

/// A slot's per-sequence state saved on the device (before a verify pass) comes back bit for bit
/// after more tokens changed it, leaving the other slot's state and the slot's positional
/// buffers as they were; a restore without a save since the last one is refused.
#[test]
fn a_slots_state_saved_on_the_device_is_restored_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (mut m, tok) = load(&path);
    let p = prompts(&tok);
    let (a, b) = (&p[1], &p[0]);
    feed(&mut m, a, 0, 1);
    feed(&mut m, b, 0, 0);
    let before = m.read_checkpoint(1).unwrap();
    let other = m.read_checkpoint(0).unwrap();
    m.save_sequence(1).unwrap();
    // Slot 1 goes on; slot 0 goes on too, after the save.
    feed(&mut m, &[5, 6, 7], a.len(), 1);
    feed(&mut m, &[9], b.len(), 0);
    let other_after = m.read_checkpoint(0).unwrap();
    assert_ne!(other_after, other);
    let moved = m.read_checkpoint(1).unwrap();
    assert_ne!(moved, before, "the tokens after the save changed nothing");
    let positional = m.read_slot(1, a.len() as u32 + 3).unwrap();
    m.restore_sequence(1).unwrap();
    assert!(m.read_checkpoint(1).unwrap() == before, "slot 1's state");
    assert!(
        m.read_checkpoint(0).unwrap() == other_after,
        "slot 0's state"
    );
    // The positional buffers (K/V rows) keep the rows written after the save.
    let restored = m.read_slot(1, a.len() as u32 + 3).unwrap();
    let mut saved = before.iter();
    for (i, (x, y)) in restored.iter().zip(&positional).enumerate() {
        match m.spec.state[i].kind {
            StateKind::Conv | StateKind::Recurrent => {
                assert!(Some(x) == saved.next(), "per-sequence part {i}")
            }
            _ => assert!(x == y, "positional part {i}"),
        }
    }
    assert!(saved.next().is_none());
    let err = m.restore_sequence(1).unwrap_err().to_string();
    assert!(err.contains("no state saved"), "{err}");
    assert!(m.restore_sequence(0).is_err());
}

/// A runtime that drafts makes the device copy of the slots' recurrent state at start (so a
/// device without room turns drafting off there, by name); one that does not draft makes none.
#[test]
fn a_drafting_runtime_reserves_the_state_copy_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (model, tok) = load(&path);
    let off = Runtime::start(model, tok.clone(), config(SpecConfig::OFF)).unwrap();
    let model = off.shutdown().unwrap();
    assert_eq!(model.sequence_spare_bytes(), 0);
    // Every slot's per-sequence state (conv and recurrent): one spare byte for each.
    let per_sequence: u64 = (0..2)
        .flat_map(|s| model.read_checkpoint(s).unwrap())
        .map(|p| p.len() as u64)
        .sum();
    let on = Runtime::start(model, tok, config(SpecConfig::MTP)).unwrap();
    let model = on.shutdown().unwrap();
    assert!(per_sequence > 0);
    assert_eq!(model.sequence_spare_bytes(), per_sequence);
}

/// A drafting loop's pass shapes (verify passes of 1–4 rows a slot, re-runs after refusals,
/// the MTP block's passes), one slot drafting and two in shared passes, are all kept prepared:
/// the same requests a second time prepare none. The small passes share one activation arena.
#[test]
fn a_drafting_loop_prepares_each_pass_shape_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (mut model, tok) = load(&path);
    let spec = SpecConfig {
        synth_len: Some(1.7),
        ..SpecConfig::MTP
    };
    let p = prompts(&tok);
    let synth = |seed: u64| {
        let mut p = params(None);
        p.n_predict = Some(120);
        p.sampler.seed = seed;
        p
    };
    let mut counts = Vec::new();
    for _ in 0..2 {
        let rt = Runtime::start(model, tok.clone(), config(spec)).unwrap();
        let f = answer(&rt, &p[1], synth(4)).1;
        assert!(f.n_drafted > f.n_accepted && f.n_accepted > 0, "{f:?}");
        let reqs = vec![
            (p[0].clone(), synth(5), Some(0)),
            (p[2].clone(), synth(6), Some(1)),
        ];
        for rx in rt.submit_together_blocking(reqs).unwrap() {
            let f = collect(rx).1;
            assert!(f.n_drafted > f.n_accepted && f.n_accepted > 0, "{f:?}");
        }
        model = rt.shutdown().unwrap();
        counts.push(model.executors_prepared());
    }
    eprintln!("executors prepared: {counts:?}");
    // One slot: verify passes of 4 to 1 rows, re-runs of 1 to 3, MTP passes of 1 to 4 and the
    // prompt's; two slots: more of each.
    assert!(counts[0] >= 20, "{counts:?}");
    assert_eq!(counts[1], counts[0], "the second requests prepared again");
}

/// Passes of 1 to 16 rows (decode, verify, re-run and MTP passes) share one activation arena
/// instead of one each: what the arenas hold is a small part of what their plans add up to.
#[test]
fn small_passes_share_one_activation_arena() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (mut m, _) = load(&path);
    let tokens: Vec<u32> = (1..=16).collect();
    for n in 1..=16 {
        m.forward(&rows(&tokens[..n], 0, 0)).unwrap();
    }
    let (held, planned) = m.arena_bytes();
    eprintln!("arenas hold {held} bytes; planned {planned}");
    // Own arenas: `planned` (about 8.5 times the 16-row pass's); shared, grown by doubling:
    // under twice the 16-row pass's.
    assert!(
        held * 3 < planned,
        "arenas hold {held} bytes; planned {planned}"
    );
}

/// A verify pass keeps each row's per-sequence state: after it, each slot holds the state of its
/// last row, and [`LoadedModel::keep_row_state`] puts any of its rows' states into the slot,
/// bit for bit the state that decoding those tokens one pass each leaves (two slots in the
/// pass, Qwen3.6's conv and delta-net states, GLM-5.3's KDA ones). A verify pass before the
/// row states are made, or of more rows than they were made for, is refused by name.
#[test]
fn a_verify_pass_keeps_each_rows_state_for_its_slot_to_take() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen35moe", "glm5-next"] {
        let path = tiny_mtp(arch, dir.path());
        let (mut m, tok) = load(&path);
        let p = prompts(&tok);
        let (a, b) = (&p[1], &p[0]);
        let (da, db) = ([11u32, 12, 13, 14], [21u32, 22, 23]);
        // Decoding one token a pass: each slot's state after each of its tokens.
        let (mut one, _) = load(&path);
        feed(&mut one, a, 0, 0);
        feed(&mut one, b, 0, 1);
        let mut after = |slot: i32, start: usize, toks: &[u32]| -> Vec<Vec<Vec<u8>>> {
            let mut states = Vec::new();
            for (i, &t) in toks.iter().enumerate() {
                feed(&mut one, &[t], start + i, slot);
                states.push(one.read_checkpoint(slot as u32).unwrap());
            }
            states
        };
        let (want_a, want_b) = (after(0, a.len(), &da), after(1, b.len(), &db));
        feed(&mut m, a, 0, 0);
        feed(&mut m, b, 0, 1);
        let mut batch = rows(&da, a.len(), 0);
        let more = rows(&db, b.len(), 1);
        batch.tokens.extend(more.tokens);
        batch.positions.extend(more.positions);
        batch.slots.extend(more.slots);
        batch.output_rows = (0..7).collect();
        let err = m.forward_verify(&batch, Readout::Logits).unwrap_err();
        assert!(err.to_string().contains("row states are made"), "{err}");
        assert!(m.reserve_row_states(7).unwrap(), "{arch}: no row states");
        assert_eq!(m.verify_rows(), 7);
        // Every per-sequence state (one slot's checkpoint) once a row.
        let per_row: usize = want_a[0].iter().map(Vec::len).sum();
        assert_eq!(m.row_state_bytes(), 7 * per_row as u64);
        m.forward_verify(&batch, Readout::Logits).unwrap();
        assert!(
            m.read_checkpoint(0).unwrap() == want_a[3],
            "{arch}: slot 0 after the pass"
        );
        assert!(
            m.read_checkpoint(1).unwrap() == want_b[2],
            "{arch}: slot 1 after the pass"
        );
        for (k, want) in want_a.iter().enumerate() {
            m.keep_row_state(0, k as u32).unwrap();
            assert!(
                m.read_checkpoint(0).unwrap() == *want,
                "{arch}: slot 0 at row {k}"
            );
        }
        for (k, want) in want_b.iter().enumerate() {
            m.keep_row_state(1, 4 + k as u32).unwrap();
            assert!(
                m.read_checkpoint(1).unwrap() == *want,
                "{arch}: slot 1 at row {}",
                4 + k
            );
        }
        let long: Vec<u32> = (1..=8).collect();
        let err = m
            .forward_verify(&rows(&long, a.len(), 0), Readout::Logits)
            .unwrap_err();
        assert!(err.to_string().contains("at most 7"), "{err}");
        assert!(m.keep_row_state(0, 7).is_err());
    }
}

/// A refused draft costs no second pass: with every draft refused at its first row, a request
/// takes one pass a token (the prompt's, then one verify pass each) and none runs kept tokens
/// again; its tokens are those of decoding without drafts.
#[test]
fn a_refused_draft_costs_no_second_pass() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen35moe", "glm5-next"] {
        let path = tiny_mtp(arch, dir.path());
        let want = greedy_off(&path);
        let (model, tok) = load(&path);
        let n_vocab = model.spec.hparams.n_vocab;
        drop(model);
        let prompt = &prompts(&tok)[1];
        for from in [0, 1] {
            let wrong = Scripted {
                sequences: want.clone(),
                n_vocab,
                from,
            };
            let rt = start_with(&path, wrong, 3);
            let (ids, f) = answer(&rt, prompt, params(None));
            assert_eq!(ids, want[1][prompt.len()..], "{arch}: tokens differ");
            assert!(f.n_drafted > f.n_accepted, "{arch}: {f:?}");
            let c = &rt.shared().counters;
            let passes = c.decode_calls.load(Ordering::Relaxed) as usize;
            let again = c.rollback_passes.load(Ordering::Relaxed);
            eprintln!("{arch}, wrong from {from}: {passes} passes, {again} again, {f:?}");
            assert_eq!(again, 0, "{arch}: passes that ran kept tokens again");
            // The prompt's pass gives the first token, each verify pass one more and its kept
            // drafts; the last token is never evaluated.
            assert_eq!(
                passes,
                f.n_predicted - f.n_accepted,
                "{arch}, wrong from {from}"
            );
            rt.shutdown().unwrap();
        }
    }
}

/// Prices a step for the drafting gate from its shape alone: `pass` seconds a target pass,
/// `row` a row of it, `draft` a drafted token (the draft passes).
struct Priced {
    pass: f64,
    row: f64,
    draft: f64,
}

impl StepCosts for Priced {
    fn seconds(&mut self, s: StepShape, _: f64) -> f64 {
        self.pass + self.row * s.rows as f64 + self.draft * s.drafted as f64
    }
}

/// Rows cost all: a step of 1 + 3 drafts costs 7 plain steps and keeps at most 4 tokens.
const ROWS_COST: Priced = Priced {
    pass: 0.0,
    row: 1.0,
    draft: 1.0,
};

/// Passes cost all: 4 tokens kept for little more than one plain step.
const PASSES_COST: Priced = Priced {
    pass: 1.0,
    row: 0.01,
    draft: 0.01,
};

/// The gate weighs the costs a [`StepCosts`] gives: with a perfect source, drafting stays on
/// where a verify step costs about a plain one, and turns off (one switch, counted for
/// /metrics) where rows cost all, drafting then only in its probes; the tokens are those of
/// decoding without drafts either way.
#[test]
fn the_drafting_gate_turns_off_when_drafting_costs_more_and_stays_on_when_it_pays() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let want = greedy_off(&path);
    let mut drafted = Vec::new();
    for (costs, pays) in [(PASSES_COST, true), (ROWS_COST, false)] {
        let (model, tok) = load(&path);
        let source = Scripted {
            sequences: want.clone(),
            n_vocab: model.spec.hparams.n_vocab,
            from: usize::MAX,
        };
        let spec = SpecConfig {
            n_max: 3,
            ..SpecConfig::OFF
        };
        let rt = Runtime::start_priced(
            model,
            tok.clone(),
            config(spec),
            Some(Box::new(source)),
            Box::new(costs),
        )
        .unwrap();
        let mut n = 0;
        for (prompt, seq) in prompts(&tok).iter().zip(&want) {
            let (ids, f) = answer(&rt, prompt, params(None));
            assert_eq!(ids, seq[prompt.len()..], "pays {pays}: tokens differ");
            assert_eq!(f.n_accepted, f.n_drafted, "a perfect source");
            n += f.n_drafted;
        }
        let view = rt.shared().slots.lock().unwrap()[0].clone();
        let gate = *view.gates.last().expect("slot 0 drafts gated");
        eprintln!("pays {pays}: {n} drafted, gate {gate:?}");
        assert!(view.speculative);
        assert_eq!((gate.on, gate.switches), (pays, u64::from(!pays)));
        assert_eq!(
            rt.shared()
                .counters
                .spec_gate_switches
                .load(Ordering::Relaxed),
            u64::from(!pays)
        );
        // Perfect drafts: a drafting step keeps its 3 drafts and the target's token (fewer at
        // the limit).
        assert!(gate.kept.unwrap() > 3.0, "{gate:?}");
        drafted.push(n);
        rt.shutdown().unwrap();
    }
    // Turned off after its first figures (about 20 tokens drafted), only the probes draft.
    assert!(drafted[1] * 2 < drafted[0], "{drafted:?}");
}

/// The MTP block's drafts under the gate, two slots in shared passes and seeded sampling: where
/// rows cost all the gate turns drafting off in each slot, and the tokens stay those of
/// decoding without drafts.
#[test]
fn gated_mtp_drafting_gives_the_same_tokens_as_no_drafting() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (off, tok) = start(&path, SpecConfig::OFF);
    let (model, _) = load(&path);
    let on = Runtime::start_priced(
        model,
        tok.clone(),
        config(SpecConfig::MTP),
        None,
        Box::new(ROWS_COST),
    )
    .unwrap();
    let all = prompts(&tok);
    for _ in 0..2 {
        for pair in all.chunks(2) {
            assert_eq!(answer_together(&on, pair), answer_together(&off, pair));
        }
    }
    for prompt in &all {
        for seed in [3, 11] {
            assert_eq!(
                answer(&on, prompt, params(Some(seed))).0,
                answer(&off, prompt, params(Some(seed))).0,
                "seed {seed}"
            );
        }
    }
    let views = on.shared().slots.lock().unwrap().clone();
    for v in &views {
        let gate = *v.gates.last().expect("gated");
        eprintln!("slot {}: {gate:?}", v.id);
        assert!(!gate.on && gate.switches >= 1, "slot {}: {gate:?}", v.id);
    }
    assert!(
        on.shared()
            .counters
            .spec_draft_tokens
            .load(Ordering::Relaxed)
            > 0
    );
    on.shutdown().unwrap();
    off.shutdown().unwrap();
}

/// A slot whose gate holds drafting off does no drafting work between its probes: its passes
/// read its final-norm rows only in the 64 steps before each drafting probe (and the probe's
/// own), and the MTP block runs only in the probes' draft passes (the rows put off go in with
/// the first). The tokens stay those of decoding without drafts.
#[test]
fn a_slot_with_drafting_off_reads_its_rows_only_before_its_probes() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let long = |spec: SpecConfig, costs: Option<Priced>| {
        let options = LoadOptions {
            n_slots: 1,
            ctx_per_slot: 1024,
            threads: 2,
            ..LoadOptions::default()
        };
        let model = LoadedModel::load(&reg, &path, options).unwrap();
        let tok = Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
        let cfg = RuntimeConfig {
            n_ctx_slot: 1024,
            ..config(spec)
        };
        match costs {
            Some(c) => Runtime::start_priced(model, tok.clone(), cfg, None, Box::new(c)),
            None => Runtime::start(model, tok.clone(), cfg),
        }
        .map(|rt| (rt, tok))
        .unwrap()
    };
    let (on, tok) = long(SpecConfig::MTP, Some(ROWS_COST));
    let (off, _) = long(SpecConfig::OFF, None);
    let prompt = &prompts(&tok)[0];
    let p = GenParams {
        n_predict: Some(600),
        ..params(None)
    };
    let (ids, _) = answer(&on, prompt, p.clone());
    assert_eq!(ids, answer(&off, prompt, p).0, "tokens differ");
    let c = &on.shared().counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let (passes, row_passes) = (get(&c.decode_calls), get(&c.row_read_passes));
    let (mtp, drafted) = (get(&c.mtp_passes), get(&c.spec_draft_tokens));
    eprintln!(
        "{passes} passes, {row_passes} read rows; {mtp} MTP passes, {drafted} drafted, {} \
         verify steps",
        get(&c.spec_verify_steps)
    );
    let gate = *on.shared().slots.lock().unwrap()[0]
        .gates
        .last()
        .expect("gated");
    assert!(!gate.on, "{gate:?}");
    // Probes 16, 32, 64, 128 and 256 steps apart: the last two read 65 of their steps' rows.
    assert!(
        row_passes * 10 < passes * 7,
        "{row_passes} of {passes} passes read rows"
    );
    assert_eq!(mtp, drafted, "block passes beside the probes' draft passes");
    on.shutdown().unwrap();
    off.shutdown().unwrap();
}

/// Draft passes cost: a target pass 1, a row 0.1, a drafted token 0.3 (the block's passes).
/// A step of 1 + 3 drafts costs 2.3 plain steps' worth of 1.1, so it pays from 2.1 kept tokens.
const DRAFTS_COST: Priced = Priced {
    pass: 1.0,
    row: 0.1,
    draft: 0.3,
};

/// `--spec-type ngram-simple,draft-mtp` gates each drafter on its own. A first request's
/// short random greedy answer repeats almost no token, so nearly only the MTP block drafts; on
/// random weights it keeps almost nothing and its gate turns off. A second request in the slot repeats one
/// token, which the n-gram drafter predicts: its gate, still on, lets it draft each step, with
/// the block idle between its probes. (With one gate for both, the block's figures had turned
/// drafting off for the slot, and the n-gram drafter drafted in the probes alone.) The tokens
/// stay those of decoding without drafts.
#[test]
fn each_drafter_of_a_chain_has_its_own_gate() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let spec = SpecConfig {
        ngram_simple: NgramSimpleConfig {
            size_n: 1,
            size_m: 4,
        },
        ..SpecConfig::MTP
    }
    .with_types(&[SpecType::NgramSimple, SpecType::DraftMtp])
    .unwrap();
    let (model, tok) = load(&path);
    let on = Runtime::start_priced(
        model,
        tok.clone(),
        config(spec),
        None,
        Box::new(DRAFTS_COST),
    )
    .unwrap();
    let (off, _) = start(&path, SpecConfig::OFF);
    let prompt = &prompts(&tok)[0];
    let random = GenParams {
        n_predict: Some(24),
        ..params(None)
    };
    // One token pushed to the top: the greedy answer repeats it, which the n-gram drafter
    // predicts (one token a draft: a constant answer's latest match is the token just before)
    // and the block (which does not see the bias) does not.
    let mut repeating = GenParams {
        n_predict: Some(100),
        ..params(None)
    };
    repeating.sampler.logit_bias = vec![(42, 100.0)];
    let c = &on.shared().counters;
    let gates = || on.shared().slots.lock().unwrap()[0].gates.clone();
    let (ids, f) = answer(&on, prompt, random.clone());
    assert_eq!(ids, answer(&off, prompt, random).0, "tokens differ");
    let after_random = gates();
    let names: Vec<&str> = after_random.iter().map(|g| g.drafter).collect();
    assert_eq!(names, ["ngram-simple", "draft-mtp"]);
    eprintln!(
        "random: {} drafted, {} kept; {after_random:?}",
        f.n_drafted, f.n_accepted
    );
    assert!(
        !after_random[1].on && after_random[1].switches == 1,
        "{after_random:?}"
    );
    assert!(after_random[0].on, "{after_random:?}");
    let block_passes = c.mtp_passes.load(Ordering::Relaxed);
    let (ids, f) = answer(&on, prompt, repeating.clone());
    assert_eq!(ids, answer(&off, prompt, repeating).0, "tokens differ");
    let block_passes = c.mtp_passes.load(Ordering::Relaxed) - block_passes;
    let (ngram, mtp) = (gates()[0], gates()[1]);
    eprintln!(
        "repeating: {} drafted, {} kept, {block_passes} block passes; {ngram:?}; {mtp:?}",
        f.n_drafted, f.n_accepted
    );
    assert!(ngram.on && ngram.switches == 0, "{ngram:?}");
    assert!(!mtp.on, "{mtp:?}");
    // The n-gram drafts went on each step; the block drafted in its probes alone.
    assert!(
        f.n_accepted >= 40,
        "{} of {} kept",
        f.n_accepted,
        f.n_drafted
    );
    assert!(block_passes < 10, "{block_passes} block passes");
    on.shutdown().unwrap();
    off.shutdown().unwrap();
}

/// The placement plan keeps card room for draft decoding's state exactly as large as what a
/// drafting runtime then makes on the device (the rollback copy and the verify row states), for
/// one and two slots; none with drafting off (`draft_n_max` 0) or on a file without MTP layers.
#[test]
fn the_plan_holds_the_drafting_state_the_runtime_makes() {
    use bloomery_plugin_api::kernel::DeviceClass;
    use bloomery_tiering::plan::TierRequest;
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let kernel = reg.best_kernel(DeviceClass::Cpu).unwrap();
    let planned = |path: &Path, n_slots: u32, draft_n_max: u32| {
        let options = LoadOptions {
            n_slots,
            ctx_per_slot: 256,
            threads: 2,
            draft_n_max,
            ..LoadOptions::default()
        };
        let plan = bloomery_exec::placement::plan_only(
            &reg,
            path,
            options,
            kernel,
            &TierRequest::default(),
        )
        .unwrap();
        assert_eq!(
            plan.to_string().contains("drafting state"),
            plan.fixed.drafting > 0,
            "{plan}"
        );
        plan.fixed.drafting
    };
    let path = tiny_mtp("qwen35moe", dir.path());
    for n_slots in [1, 2] {
        let options = LoadOptions {
            n_slots,
            ctx_per_slot: 256,
            threads: 2,
            ..LoadOptions::default()
        };
        let model = LoadedModel::load(&reg, &path, options).unwrap();
        let tok = Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
        let mut cfg = config(SpecConfig::MTP);
        cfg.n_ctx_slot = 256;
        let model = Runtime::start(model, tok, cfg).unwrap().shutdown().unwrap();
        let made = model.sequence_spare_bytes() + model.row_state_bytes();
        eprintln!("{n_slots} slot(s): {made} bytes of drafting state");
        assert!(model.row_state_bytes() > 0 && model.sequence_spare_bytes() > 0);
        assert_eq!(planned(&path, n_slots, 3), made, "{n_slots} slot(s)");
        assert_eq!(planned(&path, n_slots, 0), 0);
    }
    // The same architecture without its MTP block drafts nothing.
    let plain = dir.path().join("qwen35moe-tiny.gguf");
    common::preset_of("qwen35moe", "tiny", &plain, F32);
    assert_eq!(planned(&plain, 2, 3), 0);
}

/// A verify pass that also carries another slot's prompt chunk is too large for the row-state
/// buffers (8 rows at two slots), so a refused draft there takes the other path: the slot's
/// state copied before the pass, copied back and its kept tokens run again. Two requests
/// together, one with a prompt long enough to take three passes beside the other's verify rows,
/// drafts wrong from the first or the second position: the tokens of both are those of decoding
/// without drafts, and the re-run path ran.
#[test]
fn a_verify_pass_beside_another_slots_prompt_gives_the_tokens_of_no_drafting() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (off, tok) = start(&path, SpecConfig::OFF);
    let short = prompts(&tok)[3].clone();
    let long = tok
        .encode(
            &"The quick brown fox jumps over the lazy dog; ".repeat(6),
            true,
            false,
        )
        .unwrap();
    // More than two passes of prompt beside the short one's verify rows (64-row passes).
    assert!(long.len() > 2 * 64, "{} tokens", long.len());
    let pair = vec![short.clone(), long];
    let want = answer_together(&off, &pair);
    off.shutdown().unwrap();
    let (model, _) = load(&path);
    let n_vocab = model.spec.hparams.n_vocab;
    drop(model);
    for from in [0, 1] {
        let source = Scripted {
            sequences: vec![[short.clone(), want[0].clone()].concat()],
            n_vocab,
            from,
        };
        let rt = start_with(&path, source, 3);
        assert_eq!(
            answer_together(&rt, &pair),
            want,
            "drafts wrong from {from}"
        );
        let c = &rt.shared().counters;
        let again = c.rollback_passes.load(Ordering::Relaxed);
        let drafted = c.spec_draft_tokens.load(Ordering::Relaxed);
        eprintln!("wrong from {from}: {again} re-run passes, {drafted} drafted");
        assert!(again >= 2, "wrong from {from}: {again} re-run passes");
        rt.shutdown().unwrap();
    }
}

/// A slot not drafting puts its rows off and the block takes them in later in one pass, either
/// before the slot drafts (`catch_up`) or joined to its next chunk (`take_in`): its drafts are
/// those of taking every chunk in as it came (slot 0 here; on the CPU a row's results do not
/// depend on the rows beside it).
#[test]
fn rows_put_off_and_taken_in_later_draft_as_rows_taken_in_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (mut m, tok) = load(&path);
    let n = m.spec.hparams.n_embd as usize;
    let nv = m.spec.hparams.n_vocab as usize;
    let prompt = prompts(&tok)[1].clone();
    // The trunk's greedy tokens and final-norm rows, one pass a token after the prompt's.
    let mut seq = prompt.clone();
    let mut chunks: Vec<(usize, Vec<u32>, Vec<f32>)> = Vec::new();
    let mut next = (0, prompt.clone());
    for _ in 0..6 {
        let (start, toks) = next;
        let r = m
            .forward_reading(&rows(&toks, start, 0), Readout::Both)
            .unwrap();
        let x = argmax(&r.logits[(toks.len() - 1) * nv..]);
        chunks.push((start, toks.clone(), r.embeddings));
        seq.push(x);
        next = (seq.len() - 1, vec![x]);
    }
    let (pos, last) = (seq.len() - 1, *seq.last().unwrap());
    fn chunk(slot: usize, (start, toks, rows): &(usize, Vec<u32>, Vec<f32>)) -> Chunk<'_> {
        Chunk {
            slot,
            start: *start,
            tokens: toks,
            rows,
            kept: toks.len(),
        }
    }
    let want = |slot| Want {
        slot,
        last,
        pos,
        max: 3,
    };
    for joined in [false, true] {
        // A fresh model: no cache rows left from the other way.
        let (mut m, _) = load(&path);
        let mut driver = MtpDrafter::new(SpecConfig::MTP, 2, n);
        for c in &chunks {
            driver.take_in(&mut m, &[chunk(0, c)]).unwrap();
        }
        let at_once = driver.draft(&mut m, &[want(0)]).unwrap();
        // Slot 1: the prompt taken in, then the steps put off.
        driver.take_in(&mut m, &[chunk(1, &chunks[0])]).unwrap();
        let (put_off, rest) = match joined {
            true => (&chunks[1..chunks.len() - 1], Some(chunks.last().unwrap())),
            false => (&chunks[1..], None),
        };
        for c in put_off {
            driver.defer(&chunk(1, c));
        }
        assert_eq!(driver.behind(1), put_off.len());
        match rest {
            Some(c) => driver.take_in(&mut m, &[chunk(1, c)]).unwrap(),
            None => driver.catch_up(&mut m, &[1]).unwrap(),
        }
        assert_eq!(driver.behind(1), 0);
        // The block's row at the next position reads what each slot's cache holds: bit-equal.
        let h = &chunks.last().unwrap().2[..n];
        let read = |m: &mut LoadedModel, slot| {
            m.forward_draft_reading(&rows(&[last], pos, slot), h, Readout::Logits)
                .unwrap()
                .logits
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(read(&mut m, 1), read(&mut m, 0), "joined {joined}");
        let later = driver.draft(&mut m, &[want(1)]).unwrap();
        assert_eq!(later, at_once, "joined {joined}");
        assert_eq!(at_once[0].len(), 3);
    }
}

/// ngram-simple looking up the sampled token alone, drafting up to 4 tokens: on these short
/// answers it finds matches now and then.
const NGRAM: NgramSimpleConfig = NgramSimpleConfig {
    size_n: 1,
    size_m: 4,
};

/// What the drafter after ngram-simple was asked and told.
#[derive(Debug)]
enum Heard {
    /// Asked to draft after these tokens; drafted this many.
    Draft(Vec<u32>, usize),
    /// Told that this many of its draft were kept.
    Kept(usize),
}

/// A drafter after ngram-simple, drafting as `inner` and recording what it hears.
struct Recorded {
    inner: Scripted,
    heard: Arc<Mutex<Vec<Heard>>>,
}

impl DraftSource for Recorded {
    fn draft(&mut self, slot: usize, tokens: &[u32], max: usize) -> Vec<u32> {
        let d = self.inner.draft(slot, tokens, max);
        let heard = Heard::Draft(tokens.to_vec(), d.len());
        self.heard.lock().unwrap().push(heard);
        d
    }

    fn accepted(&mut self, _: usize, accepted: usize) {
        self.heard.lock().unwrap().push(Heard::Kept(accepted));
    }
}

/// b11434's `common_speculative_draft` and `_accept` with ngram-simple before another drafter
/// (here a test source in the MTP block's place, right at its first token only): the other is
/// asked only where ngram-simple drafts nothing, and hears only of its own drafts, each kept to
/// its first token. Shown failing with the chain's order reversed and with every draft's
/// verdict told to the last drafter.
#[test]
fn ngram_simple_is_consulted_first_and_only_a_drafts_drafter_hears_its_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    // Longer answers than the other tests', so that the sampled token is now and then one the
    // history holds.
    let long = common::generation(
        SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        64,
    );
    let (off, tok) = start(&path, SpecConfig::OFF);
    let want: Vec<Vec<u32>> = prompts(&tok)
        .into_iter()
        .map(|p| {
            let (ids, _) = answer(&off, &p, long.clone());
            [p, ids].concat()
        })
        .collect();
    off.shutdown().unwrap();
    let (model, tok) = load(&path);
    let n_vocab = model.spec.hparams.n_vocab;
    let spec = SpecConfig {
        n_max: 3,
        gate: false,
        ngram_simple: NGRAM,
        ..SpecConfig::OFF
    }
    .with_types(&[SpecType::DraftMtp, SpecType::NgramSimple])
    .unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let source = Recorded {
        inner: Scripted {
            sequences: want.clone(),
            n_vocab,
            from: 1,
        },
        heard: heard.clone(),
    };
    let rt = Runtime::start_drafting(model, tok.clone(), config(spec), Box::new(source)).unwrap();
    let mut drafted = 0;
    for (prompt, seq) in prompts(&tok).iter().zip(&want) {
        let (ids, f) = answer(&rt, prompt, long.clone());
        assert_eq!(ids, seq[prompt.len()..], "tokens differ");
        drafted += f.n_drafted;
    }
    rt.shutdown().unwrap();
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    let (mut asked, mut from_source, mut pending) = (0, 0, None);
    for h in &heard {
        match h {
            Heard::Draft(tokens, n) => {
                let (&sampled, history) = tokens.split_last().unwrap();
                assert!(
                    simple_draft(history, sampled, NGRAM).is_empty(),
                    "asked where ngram-simple drafts, after {tokens:?}"
                );
                assert!(
                    pending.is_none(),
                    "a draft's verdict went unheard: {heard:?}"
                );
                asked += 1;
                from_source += n;
                pending = (*n > 0).then_some(1);
            }
            // The source's drafts are kept to their first token.
            Heard::Kept(k) => assert_eq!(pending.take(), Some(*k), "{heard:?}"),
        }
    }
    eprintln!("{drafted} tokens drafted, {from_source} by the source in {asked} asks");
    assert!(
        from_source > 0,
        "the drafter after ngram-simple drafted nothing"
    );
    assert!(drafted > from_source, "ngram-simple drafted nothing");
}

/// `--spec-type ngram-simple,draft-mtp` on `arch`, ungated: the tokens of drafting off, greedy
/// and seeded, alone and in shared passes (a refused n-gram draft rolls the recurrent state
/// back as a refused MTP draft does); both drafters draft, so the drafted tokens differ from
/// either's alone. Gated, the same tokens.
fn combined_on_and_off_agree(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp(arch, dir.path());
    let (off, tok) = start(&path, SpecConfig::OFF);
    let ungated = SpecConfig {
        gate: false,
        ngram_simple: NGRAM,
        ..SpecConfig::MTP
    };
    let with = |types: &[SpecType]| ungated.with_types(types).unwrap();
    let combined = with(&[SpecType::NgramSimple, SpecType::DraftMtp]);
    let only_ngram = SpecConfig {
        n_max: NGRAM.size_m,
        ..with(&[SpecType::NgramSimple])
    };
    let mut totals = Vec::new();
    for spec in [combined, only_ngram, with(&[SpecType::DraftMtp])] {
        let (on, _) = start(&path, spec);
        let mut drafted = 0;
        for prompt in prompts(&tok) {
            for seed in [None, Some(3)] {
                let (a, fa) = answer(&on, &prompt, params(seed));
                let (b, _) = answer(&off, &prompt, params(seed));
                assert_eq!(
                    a,
                    b,
                    "{arch} {}, seed {seed:?}: tokens differ",
                    spec.names()
                );
                drafted += fa.n_drafted;
            }
        }
        on.shutdown().unwrap();
        totals.push(drafted);
    }
    eprintln!("{arch}: drafted (combined, ngram-simple, draft-mtp): {totals:?}");
    assert!(totals[0] > 0 && totals[0] != totals[1] && totals[0] != totals[2]);
    let (on, _) = start(&path, combined);
    let gated = SpecConfig {
        gate: true,
        ..combined
    };
    let (gated, _) = start(&path, gated);
    for pair in prompts(&tok).chunks(2) {
        let plain = answer_together(&off, pair);
        assert_eq!(answer_together(&on, pair), plain, "{arch}: shared passes");
        assert_eq!(answer_together(&gated, pair), plain, "{arch}: gated");
    }
    for rt in [on, gated, off] {
        rt.shutdown().unwrap();
    }
}

#[test]
fn qwen35moe_tokens_are_the_same_with_ngram_simple_and_mtp_drafting_combined() {
    combined_on_and_off_agree("qwen35moe");
}

#[test]
fn qwen35_tokens_are_the_same_with_ngram_simple_and_mtp_drafting_combined() {
    combined_on_and_off_agree("qwen35");
}

/// A prompt whose rows the MTP block takes in runs the output head on its last row alone: its
/// passes read every row's final-norm row and one row of logits (they read every row's logits
/// before, which made a 512-token prompt 12× slower on the card). The tokens stay those of
/// decoding without drafts, the prompt in two chunks.
#[test]
fn a_drafting_prompt_reads_the_logits_of_its_last_row_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp("qwen35moe", dir.path());
    let (model, tok) = load(&path);
    let (n_embd, n_vocab) = (
        model.spec.hparams.n_embd as u64,
        model.spec.hparams.n_vocab as u64,
    );
    let spec = SpecConfig {
        gate: false,
        ..SpecConfig::MTP
    };
    let on = Runtime::start(model, tok.clone(), config(spec)).unwrap();
    let (off, _) = start(&path, SpecConfig::OFF);
    let prompt: Vec<u32> = prompts(&tok).concat().repeat(2);
    let n = prompt.len() as u64;
    assert!(n > 64 && n <= 128, "{n} tokens: two chunks of 64");
    let one = common::generation(SamplerParams::default(), 1);
    let c = &on.shared().counters;
    let read = || c.pass_read_bytes.load(Ordering::Relaxed);
    let before = read();
    answer(&on, &prompt, one);
    assert_eq!(read() - before, 4 * (n * n_embd + n_vocab));
    assert_eq!(
        answer(&on, &prompt, params(None)).0,
        answer(&off, &prompt, params(None)).0
    );
    on.shutdown().unwrap();
    off.shutdown().unwrap();
}
