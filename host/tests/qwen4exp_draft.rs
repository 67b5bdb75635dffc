//! Draft decoding of Qwen3.8-Flash-Next (`qwen4exp`) through the shared runtime on the synthetic
//! tiny trunk (`bloomery synth --arch qwen4exp --preset tiny --seed 7`, every tensor F32), the
//! drafts from test-only sources (the MTP block's own driver is not wired to a separate `-md`
//! file yet): prompts of the golden's first sequence, which holds the n-gram table's end id 270
//! at 20, 41, 42 and 44, answered greedily with 24 tokens:
//!
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

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;
use bloomery_runtime::request::{Event, Finish, GenParams, ShiftParams};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::spec::{DraftSource, SpecConfig};
use bloomery_runtime::{Runtime, RuntimeConfig};

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

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
    GenParams {
        sampler: SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        n_predict: Some(N_PREDICT),
        stop: Vec::new(),
        n_probs: 0,
        post_sampling_probs: false,
        return_progress: false,
        ignore_eos: true,
        cache_prompt: false,
        forced: Vec::new(),
        prompt_only: false,
        grammar: None,
        t_max_predict_ms: None,
        preserved: Vec::new(),
        shift: ShiftParams::default(),
        reasoning_budget: None,
    }
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
