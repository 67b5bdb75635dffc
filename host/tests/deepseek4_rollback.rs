//! DeepSeek V4 and V4.1 (`deepseek4`, `deepseek41`) state rolled back: a verify pass writes the
//! window ring, the compressor's raw rows, the compressed rows and the index keys for every
//! drafted position, and a refused draft leaves them written past the kept position, possibly
//! with a compressed row finished from refused tokens; a slot reused for a prompt that shares a
//! prefix restores that prefix and computes the rest over rows a longer sequence wrote. Both
//! must give the tokens a fresh, undrafted run gives (greedy), across the compressed rows'
//! boundaries (ratios 4 and 128 in the V4 file, 1 and 2 in the V4.1 one).

mod common;

use std::path::Path;

use bloomery_runtime::ngram_draft::NgramSimpleConfig;
use bloomery_runtime::request::{Event, Finish};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::spec::{SpecConfig, SpecType};
use bloomery_runtime::{Runtime, RuntimeConfig};

const CTX: usize = 640;

/// The arch's tiny preset (seed 7, every tensor F32) in `dir`.
fn tiny(arch: &str, dir: &Path) -> std::path::PathBuf {
    common::preset_of(
        arch,
        "tiny",
        &dir.join(format!("{arch}.gguf")),
        common::ALL_F32,
    )
}

/// A prompt of `n` token ids that repeats a 12-token phrase (so that n-gram drafts are made
/// and, in the model's answers, some are kept and some refused).
fn phrase_prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 20 + (i % 12) * 17 + salt).collect()
}

/// One slot's runtime, drafting as `spec` asks (ungated).
fn runtime(path: &Path, spec: SpecConfig) -> Runtime {
    let (model, tok) = common::one_slot(path, CTX as u32);
    let cfg = RuntimeConfig {
        n_batch: 64,
        spec,
        ..common::plain_runtime(CTX)
    };
    Runtime::start(model, tok, cfg).unwrap()
}

/// The greedy answer of `n` tokens to `prompt` in slot 0 (reusing what the slot holds when
/// `reuse`), and its end.
fn answer(rt: &Runtime, prompt: &[u32], n: usize, reuse: bool) -> (Vec<u32>, Finish) {
    let mut params = common::generation(
        SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        n,
    );
    params.cache_prompt = reuse;
    let mut rx = rt
        .submit_blocking(prompt.to_vec(), params, Some(0))
        .unwrap();
    let mut ids = Vec::new();
    loop {
        match rx.blocking_recv().unwrap() {
            Event::Token(piece) => ids.push(piece.id),
            Event::Done(finish) => return (ids, finish),
            Event::Failed(f) => panic!("{}", f.message),
            _ => {}
        }
    }
}

/// Checks drafting and slot reuse against fresh undrafted runs for `arch`.
fn rolls_back(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(arch, dir.path());
    let first = phrase_prompt(150, 0);
    // Undrafted, each answer from a fresh runtime.
    let plain = runtime(&path, SpecConfig::OFF);
    let (want_first, _) = answer(&plain, &first, 300, false);
    // The second prompt shares the first's prompt and 140 of its answer's tokens (290
    // positions: past the V4 file's second 128-row boundary), then goes elsewhere.
    let mut second: Vec<u32> = first.iter().chain(&want_first[..140]).copied().collect();
    second.extend(phrase_prompt(30, 5));
    let (want_second, _) = answer(&plain, &second, 200, false);
    plain.shutdown().unwrap();

    let spec = SpecConfig {
        gate: false,
        ngram_simple: NgramSimpleConfig {
            size_n: 1,
            size_m: 4,
        },
        ..SpecConfig::OFF
    }
    .with_types(&[SpecType::NgramSimple])
    .unwrap();
    let drafting = runtime(&path, spec);
    let (got_first, f) = answer(&drafting, &first, 300, true);
    assert_eq!(got_first, want_first, "{arch}: drafted answer");
    eprintln!("{arch}: {} drafted, {} kept", f.n_drafted, f.n_accepted);
    assert!(
        f.n_accepted > 0 && f.n_accepted < f.n_drafted,
        "{arch}: drafts both kept and refused ({} of {})",
        f.n_accepted,
        f.n_drafted
    );
    let (got_second, f) = answer(&drafting, &second, 200, true);
    assert!(f.n_cached > 0, "{arch}: the slot's prefix was reused");
    eprintln!("{arch}: {} positions reused", f.n_cached);
    assert_eq!(
        got_second, want_second,
        "{arch}: answer after the slot's prefix was restored"
    );
    drafting.shutdown().unwrap();
}

#[test]
fn deepseek4_drafts_refused_and_a_reused_prefix_give_the_undrafted_tokens() {
    rolls_back("deepseek4");
}

#[test]
fn deepseek41_drafts_refused_and_a_reused_prefix_give_the_undrafted_tokens() {
    rolls_back("deepseek41");
}
