//! The MTP block's drafts with ngram-simple consulted first (`--spec-type ngram-simple,draft-mtp`,
//! as llama-server b11434 combines them): a step an n-gram draft wins leaves the block's rows
//! and carried row as they would be had the block drafted it, so each draft the block makes is
//! the draft it makes at the same position drafting alone (on the CPU a row's results do not
//! depend on the rows beside it). The drafts are read from the runtime's trace lines, in a test
//! binary of its own (the subscriber is the process's).

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bloomery_runtime::ngram_draft::NgramSimpleConfig;
use bloomery_runtime::request::Event;
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::spec::{SpecConfig, SpecType};
use bloomery_runtime::{Runtime, RuntimeConfig};

/// Every trace line of the process, as written.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The tiny qwen35moe with its MTP block (seed 7, every tensor F32) in `dir`.
fn tiny_mtp(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("qwen35moe-tiny-mtp.gguf");
    common::preset_of("qwen35moe", "tiny-mtp", &path, common::ALL_F32)
}

/// Greedy answers of 64 tokens to the prompts, one runtime drafting as `spec` asks (ungated):
/// the tokens, and per prompt each draft-mtp draft by the position of its first token.
fn run(
    path: &Path,
    spec: SpecConfig,
    lines: &Lines,
) -> (Vec<Vec<u32>>, Vec<HashMap<usize, String>>) {
    let (model, tok) = common::one_slot(path, 256);
    let cfg = RuntimeConfig {
        n_batch: 64,
        schemajump: true,
        spec,
        ..common::plain_runtime(256)
    };
    let rt = Runtime::start(model, tok.clone(), cfg).unwrap();
    let params = common::generation(
        SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        64,
    );
    let (mut answers, mut drafts) = (Vec::new(), Vec::new());
    for text in ["The quick brown fox", "1, 2, 3, 4,", "Hello"] {
        let prompt = tok.encode(text, true, false).unwrap();
        lines.0.lock().unwrap().clear();
        let mut rx = rt.submit_blocking(prompt, params.clone(), Some(0)).unwrap();
        let mut ids = Vec::new();
        loop {
            match rx.blocking_recv().unwrap() {
                Event::Token(piece) => ids.push(piece.id),
                Event::Done(_) => break,
                Event::Failed(f) => panic!("{}", f.message),
                _ => {}
            }
        }
        answers.push(ids);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        drafts.push(mtp_drafts(&text));
    }
    rt.shutdown().unwrap();
    (answers, drafts)
}

/// The draft-mtp drafts of the trace lines `slot 0: K of the draft-mtp draft [..] at position
/// P accepted`, by P.
fn mtp_drafts(text: &str) -> HashMap<usize, String> {
    text.lines()
        .filter_map(|l| {
            let rest = l.split("of the draft-mtp draft ").nth(1)?;
            let (draft, rest) = rest.split_once(" at position ")?;
            let pos = rest.split_whitespace().next()?.parse().ok()?;
            Some((pos, draft.to_owned()))
        })
        .collect()
}

#[test]
fn the_mtp_blocks_drafts_are_the_same_whether_or_not_n_gram_drafts_won_steps_before() {
    let lines = Lines::default();
    let writer = lines.clone();
    tracing_subscriber::fmt()
        .with_env_filter("bloomery_runtime=trace")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_mtp(dir.path());
    let mtp = SpecConfig {
        gate: false,
        ngram_simple: NgramSimpleConfig {
            size_n: 1,
            size_m: 4,
        },
        ..SpecConfig::MTP
    };
    let combined = mtp
        .with_types(&[SpecType::NgramSimple, SpecType::DraftMtp])
        .unwrap();
    let (alone_ids, alone) = run(&path, mtp, &lines);
    let (mixed_ids, mixed) = run(&path, combined, &lines);
    assert_eq!(alone_ids, mixed_ids, "tokens differ");
    let (mut compared, mut won) = (0, 0);
    for (alone, mixed) in alone.iter().zip(&mixed) {
        // Alone, nothing is accepted (random weights): the block drafts at every position.
        won += alone.len() - mixed.len();
        for (pos, draft) in mixed {
            assert_eq!(
                alone.get(pos),
                Some(draft),
                "the block's draft at position {pos}"
            );
            compared += 1;
        }
    }
    eprintln!("{compared} draft-mtp drafts compared; {won} positions drafted otherwise or passed by kept n-gram drafts");
    assert!(
        compared > 0 && won > 0,
        "{compared} compared, {won} otherwise"
    );
}
