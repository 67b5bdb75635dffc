//! Draft decoding of Qwen3.8-Flash-Next (`qwen4exp`) through the shared runtime on the synthetic
//! tiny trunk (`bloomery synth --arch qwen4exp --preset tiny --seed 7`, every tensor F32), the
//! drafts from test-only sources and from the MTP block of the separate MTP-only file (`--preset
//! tiny-mtp`, `Runtime::start_with_draft_model`): prompts of the golden's first sequence, which
//! holds the n-gram table's end id 270 at 20, 41, 42 and 44, answered greedily with 24 tokens:
//!
//! - the MTP driver with the separate file drafts what its block run by hand gives, paired as
//!   llama.cpp's draft-mtp pairs it: token p with the trunk's `h_nextn` row of p − 1 (zeros at
//!   0), each later step its draft with the block's own `h_nextn` row, one position on: the
//!   drafts and the block's caches bit for bit, also with the prompt and the first draft row
//!   in one block pass;
//! - drafting with the MTP file's block (n_max 3, its own residual chained) gives the tokens of
//!   decoding without drafts and leaves the slot's state bit for bit as they do; a draft file
//!   that cannot draft for the trunk is refused by name;
//! - a perfect source (the target's own greedy continuation) has every draft accepted, and
//!   sources wrong from the first, second or third drafted row have every wrong one refused,
//!   all with the tokens of decoding without drafts;
//! - after refused drafts the slot's state is bit for bit that of decoding the kept tokens
//!   without drafts: the GDN convolution and delta-rule states and the n-gram table layer's
//!   dilated convolution state (rolled back by the verify pass's per-row states: no pass runs
//!   kept tokens again), the K/V caches and the QSA indexer cache with its pooled keys
//!   (positional: the kept rows' are the same, refused rows are written over), and the n-gram
//!   rows the scheduler hashes from the slot's record (a refused draft leaves no token behind in
//!   the context of the next ones).

mod common;

use common::ALL_F32 as F32;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel, Readout};
use bloomery_plugin_api::graph::NEXTN_HIDDEN;
use bloomery_runtime::request::{Event, Finish, GenParams};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::spec::{Chunk, DraftSource, MtpDrafter, SpecConfig, Want};
use bloomery_runtime::{Runtime, RuntimeConfig};

const N_PREDICT: usize = 24;

/// The golden's first sequence (make_qwen4exp_goldens.sh): the end id 270 at 20, 41, 42, 44.
const SEQ: [u32; 46] = [
    75, 67, 158, 115, 127, 160, 138, 16, 113, 78, 27, 118, 271, 168, 107, 182, 154, 90, 171, 230,
    270, 259, 123, 131, 207, 229, 166, 251, 255, 266, 150, 227, 137, 218, 150, 266, 212, 115, 140,
    123, 230, 270, 270, 212, 270, 116,
];

/// Prompts ending before, at and after the end ids, and one the drafts run through the QSA
/// selection's start (position 19).
fn prompts() -> Vec<Vec<u32>> {
    [6, 19, 21, 43, 46]
        .iter()
        .map(|&n| SEQ[..n].to_vec())
        .collect()
}

fn load(path: &Path) -> LoadedModel {
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let options = LoadOptions {
        n_slots: 2,
        ctx_per_slot: 256,
        threads: 2,
        ..LoadOptions::default()
    };
    LoadedModel::load(&reg, path, options).unwrap()
}

fn config() -> RuntimeConfig {
    RuntimeConfig {
        n_ctx_slot: 256,
        n_batch: 64,
        cache_ram: None,
        queue_depth: 8,
        max_checkpoints: bloomery_runtime::DEFAULT_MAX_CHECKPOINTS,
        checkpoint_every: bloomery_runtime::DEFAULT_CHECKPOINT_EVERY,
        schemajump: false,
        context_shift: false,
        spec: SpecConfig::OFF,
        slot_similarity: bloomery_runtime::DEFAULT_SLOT_SIMILARITY,
    }
}

/// The MTP-only file `tiny-mtp` (seed 7, every tensor F32) in `dir`.
fn mtp_file(dir: &Path) -> std::path::PathBuf {
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let presets = reg.model_for("qwen4exp").unwrap().module.synth_presets()();
    let p = presets
        .iter()
        .find(|p| p.name.as_str() == "tiny-mtp")
        .unwrap();
    let path = dir.join("tiny-mtp.gguf");
    bloomery::synth::write(p, F32, 7, &path).unwrap();
    path
}

/// The trunk at `path` drafting with the block of the MTP file at `mtp`, at most 3 tokens a step.
fn start_mtp(path: &Path, mtp: &Path) -> Runtime {
    let m = load(path);
    let tok = tokenizer(&m);
    let cfg = RuntimeConfig {
        spec: SpecConfig::MTP,
        ..config()
    };
    Runtime::start_with_draft_model(m, load(mtp), tok, cfg).unwrap()
}

fn tokenizer(m: &LoadedModel) -> Arc<bloomery_text::Tokenizer> {
    Arc::new(bloomery::text::tokenizer(&m.file).unwrap())
}

/// The model at `path` without drafts.
fn start(path: &Path) -> Runtime {
    let m = load(path);
    let tok = tokenizer(&m);
    Runtime::start(m, tok, config()).unwrap()
}

/// The model at `path` drafting from `source`, at most 3 tokens a step.
fn start_with(path: &Path, source: impl DraftSource + 'static) -> Runtime {
    let m = load(path);
    let tok = tokenizer(&m);
    let cfg = RuntimeConfig {
        spec: SpecConfig {
            n_max: 3,
            ..SpecConfig::OFF
        },
        ..config()
    };
    Runtime::start_drafting(m, tok, cfg, Box::new(source)).unwrap()
}

fn greedy() -> GenParams {
    common::generation(
        SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        N_PREDICT,
    )
}

/// `prompt` answered greedily in slot 0: its tokens and its end.
fn answer(rt: &Runtime, prompt: &[u32]) -> (Vec<u32>, Finish) {
    let mut rx = rt
        .submit_blocking(prompt.to_vec(), greedy(), Some(0))
        .unwrap();
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

/// Drafts the next tokens of the known greedy sequence that `tokens` starts, each from draft
/// position `from` on replaced by the next id (wrong).
struct Scripted {
    sequences: Vec<Vec<u32>>,
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
                true => (t + 1) % 272,
                false => t,
            })
            .collect()
    }
}

/// Each prompt's whole greedy sequence (prompt and answer) without drafts.
fn greedy_off(path: &Path) -> Vec<Vec<u32>> {
    let rt = start(path);
    let out = prompts()
        .into_iter()
        .map(|p| {
            let (ids, f) = answer(&rt, &p);
            assert_eq!(f.n_drafted, 0);
            [p, ids].concat()
        })
        .collect();
    rt.shutdown().unwrap();
    out
}

/// Slot 0's state after answering `prompt` on `rt` (the positions it holds), and the passes
/// that ran kept tokens again.
fn state_after(rt: Runtime, prompt: &[u32]) -> (Vec<Vec<u8>>, u64) {
    let (_, f) = answer(&rt, prompt);
    let again = rt.shared().counters.rollback_passes.load(Ordering::Relaxed);
    // The last token is reported, never evaluated.
    let n = prompt.len() + f.n_predicted - 1;
    let model = rt.shutdown().unwrap();
    (model.read_slot(0, n as u32).unwrap(), again)
}

#[test]
fn drafted_tokens_are_those_of_decoding_without_drafts() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("qwen4exp", dir.path(), F32);
    let want = greedy_off(&path);
    for from in [usize::MAX, 0, 1, 2] {
        let source = Scripted {
            sequences: want.clone(),
            from,
        };
        let rt = start_with(&path, source);
        let (mut drafted, mut accepted) = (0, 0);
        for (p, seq) in prompts().iter().zip(&want) {
            let (ids, f) = answer(&rt, p);
            assert_eq!(ids, seq[p.len()..], "wrong from {from}: tokens differ");
            drafted += f.n_drafted;
            accepted += f.n_accepted;
        }
        eprintln!("wrong from {from}: {accepted} of {drafted} drafts accepted");
        assert!(drafted > 0);
        match from {
            usize::MAX => assert_eq!(accepted, drafted, "a perfect source"),
            0 => assert_eq!(accepted, 0, "a source wrong from its first row"),
            _ => assert!(accepted > 0 && accepted < drafted, "wrong from {from}"),
        }
        rt.shutdown().unwrap();
    }
}

#[test]
fn after_refused_drafts_the_state_is_bit_for_bit_that_of_decoding_without_drafts() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("qwen4exp", dir.path(), F32);
    let want = greedy_off(&path);
    let names: Vec<String> = {
        let m = load(&path);
        m.spec
            .state
            .iter()
            .map(|s| s.name.as_str().to_owned())
            .collect()
    };
    for prompt in prompts() {
        let (plain, _) = state_after(start(&path), &prompt);
        for from in [0, 1, 2] {
            let wrong = Scripted {
                sequences: want.clone(),
                from,
            };
            let (drafting, again) = state_after(start_with(&path, wrong), &prompt);
            assert_eq!(again, 0, "passes that ran kept tokens again");
            assert_eq!(drafting.len(), plain.len());
            for (i, (a, b)) in drafting.iter().zip(&plain).enumerate() {
                assert!(
                    a == b,
                    "prompt of {}, wrong from {from}: {} differs",
                    prompt.len(),
                    names[i]
                );
            }
        }
    }
}

#[test]
fn drafting_with_the_mtp_files_block_gives_the_tokens_and_state_of_no_drafting() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("qwen4exp", dir.path(), F32);
    let mtp = mtp_file(dir.path());
    let want = greedy_off(&path);
    let rt = start_mtp(&path, &mtp);
    let (mut drafted, mut accepted) = (0, 0);
    for (p, seq) in prompts().iter().zip(&want) {
        let (ids, f) = answer(&rt, p);
        assert_eq!(ids, seq[p.len()..], "prompt of {}: tokens differ", p.len());
        drafted += f.n_drafted;
        accepted += f.n_accepted;
    }
    eprintln!("MTP file: {accepted} of {drafted} drafts accepted");
    assert!(drafted > 0, "the block drafted nothing");
    rt.shutdown().unwrap();
    for prompt in prompts() {
        let (plain, _) = state_after(start(&path), &prompt);
        let (drafting, again) = state_after(start_mtp(&path, &mtp), &prompt);
        assert_eq!(again, 0, "passes that ran kept tokens again");
        assert!(
            drafting == plain,
            "prompt of {}: the state differs",
            prompt.len()
        );
    }
}

#[test]
fn a_draft_file_that_cannot_draft_for_the_trunk_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("qwen4exp", dir.path(), F32);
    let m = load(&path);
    let tok = tokenizer(&m);
    let cfg = RuntimeConfig {
        spec: SpecConfig::MTP,
        ..config()
    };
    let e = Runtime::start_with_draft_model(m, load(&path), tok.clone(), cfg)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("holds no MTP (nextn) block"), "{e}");
    let e =
        Runtime::start_with_draft_model(load(&path), load(&mtp_file(dir.path())), tok, config())
            .err()
            .expect("refused")
            .to_string();
    assert!(e.contains("--spec-type draft-mtp"), "{e}");
}

/// Rows `tokens` of slot 0 from position `start` (`history`: the tokens from position 0), every
/// row an output, with the n-gram row ids a model with the table needs.
fn rows(m: &LoadedModel, history: &[u32], start: usize) -> BatchInputs {
    let h: Vec<i32> = history.iter().map(|&t| t as i32).collect();
    let n = h.len() - start;
    BatchInputs {
        tokens: h[start..].to_vec(),
        positions: (start as i32..h.len() as i32).collect(),
        slots: vec![0; n],
        output_rows: (0..n as i32).collect(),
        ngram_rows: common::ngram_rows(&m.spec, &h, start),
        logit_rows: vec![],
    }
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len())
        .max_by(|&a, &b| v[a].total_cmp(&v[b]).then(b.cmp(&a)))
        .unwrap() as u32
}

#[test]
fn the_mtp_driver_drafts_as_the_separate_files_block_run_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("qwen4exp", dir.path(), F32);
    let mtp = mtp_file(dir.path());
    let mut trunk = load(&path);
    trunk.read_rows_from(NEXTN_HIDDEN);
    let mut by_hand = load(&mtp);
    by_hand.read_rows_from(NEXTN_HIDDEN);
    let w = by_hand.hidden_width().unwrap();
    assert_eq!(w, 4 * 128, "the hyper-connection residual");
    let nv = 272;
    for prompt in prompts() {
        let len = prompt.len();
        let out = trunk
            .forward_reading(&rows(&trunk, &prompt, 0), Readout::Both)
            .unwrap();
        assert_eq!(out.embeddings.len(), len * w);
        let x = argmax(&out.logits[(len - 1) * nv..]);
        let mut driver = MtpDrafter::new(SpecConfig::MTP, 2, w).with_draft_model(load(&mtp));
        let chunk = Chunk {
            slot: 0,
            start: 0,
            tokens: &prompt,
            rows: &out.embeddings,
            kept: len,
        };
        driver.take_in(&mut trunk, &[chunk]).unwrap();
        let want = Want {
            slot: 0,
            last: x,
            pos: len,
            max: 3,
        };
        let got = driver.draft(&mut trunk, &[want]).unwrap();
        let toks = [prompt.clone(), vec![x]].concat();
        let hidden = [vec![0f32; w], out.embeddings.clone()].concat();
        let r = by_hand
            .forward_draft_reading(&rows(&by_hand, &toks, 0), &hidden, Readout::Both)
            .unwrap();
        let mut drafts = vec![argmax(&r.logits[len * nv..])];
        let mut h = r.embeddings[len * w..].to_vec();
        for step in 1..3 {
            let history = [toks.clone(), drafts.clone()].concat();
            let r = by_hand
                .forward_draft_reading(&rows(&by_hand, &history, len + step), &h, Readout::Both)
                .unwrap();
            drafts.push(argmax(&r.logits));
            h = r.embeddings;
        }
        assert_eq!(got, vec![drafts.clone()], "prompt of {len} tokens");
        // The block's caches (K/V, indexer rows and pooled keys) over the prompt and the chain
        // are bit for bit those of the block run by hand.
        let n = (len + 3) as u32;
        let fed = driver.draft_model().unwrap().read_slot(0, n).unwrap();
        assert!(
            fed == by_hand.read_slot(0, n).unwrap(),
            "prompt of {len} tokens: the block's caches differ"
        );
        // Taking in the prompt and the first draft row in one block pass: the same drafts and
        // caches.
        let mut fused = MtpDrafter::new(SpecConfig::MTP, 2, w).with_draft_model(load(&mtp));
        let chunk = Chunk {
            slot: 0,
            start: 0,
            tokens: &prompt,
            rows: &out.embeddings,
            kept: len,
        };
        let got = fused
            .take_in_and_draft(&mut trunk, &[chunk], &[want])
            .unwrap();
        assert_eq!(got, vec![drafts], "prompt of {len} tokens, one pass fewer");
        let fed = fused.draft_model().unwrap().read_slot(0, n).unwrap();
        assert!(
            fed == by_hand.read_slot(0, n).unwrap(),
            "prompt of {len} tokens, one pass fewer: the block's caches differ"
        );
    }
}
