//! `--spec-type ngram-simple` and `ngram-mod` drafts against llama.cpp b11434's own, run as
//! programs on the same cases (`tests/oracle/make_ngram_draft_golden.sh`, command in
//! host/tests/fixtures/PROVENANCE.md): `common_ngram_simple_draft` on single drafts
//! (`fixtures/ngram_simple.jsonl`), and both drafters over scripted sessions through
//! common/speculative.cpp's API (`fixtures/ngram_sessions.jsonl`); every draft equal.

use bloomery_runtime::ngram_draft::{
    simple_draft, NgramMod, NgramModConfig, NgramSimple, NgramSimpleConfig,
};
use bloomery_runtime::spec::DraftSource;
use serde_json::Value;

mod common;

use common::ids;

#[test]
fn drafts_are_llama_cpps() {
    let text = include_str!("fixtures/ngram_simple.jsonl");
    let (mut cases, mut drafted) = (0, 0);
    for line in text.lines() {
        let c: Value = serde_json::from_str(line).unwrap();
        let cfg = NgramSimpleConfig {
            size_n: c["size_n"].as_u64().unwrap() as usize,
            size_m: c["size_m"].as_u64().unwrap() as usize,
        };
        let (history, sampled) = (ids(&c["history"]), c["sampled"].as_u64().unwrap() as u32);
        let want = ids(&c["draft"]);
        assert_eq!(simple_draft(&history, sampled, cfg), want, "case {line}");
        // The drafter the scheduler calls takes the history with the sampled token last.
        let mut tokens = history.clone();
        tokens.push(sampled);
        let got = NgramSimple::new(cfg).draft(0, &tokens, usize::MAX);
        assert_eq!(got, want, "case {line}");
        cases += 1;
        drafted += usize::from(!want.is_empty());
    }
    // The cases exercise both outcomes.
    assert!(
        cases >= 200 && drafted >= 50,
        "{cases} cases, {drafted} drafted"
    );
}

/// Replays one scripted session of `fixtures/ngram_sessions.jsonl` (made by llama.cpp's own
/// drafters through common/speculative.cpp's API, `tests/oracle/ngram_session_dump.cpp`) with
/// `source`, as that program drives llama.cpp's: each sequence begins with its prompt, then they
/// take turns sampling the next truth token, drafting at most the truth left after it and
/// keeping the draft's prefix that matches the truth. Returns the drafts made, every one equal
/// to llama.cpp's.
fn replay(c: &Value, source: &mut dyn DraftSource) -> usize {
    let seqs = c["seqs"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = seqs.iter().map(|s| ids(&s["prompt"])).collect();
    let truths: Vec<Vec<u32>> = seqs.iter().map(|s| ids(&s["truth"])).collect();
    for (s, p) in prompts.iter().enumerate() {
        source.begin(s, p);
    }
    let mut gen = vec![0usize; seqs.len()];
    let want = c["drafts"].as_array().unwrap();
    let (mut k, mut drafted) = (0, 0);
    loop {
        let mut busy = false;
        for s in 0..seqs.len() {
            let truth = &truths[s];
            if gen[s] >= truth.len() {
                continue;
            }
            busy = true;
            let mut tokens = prompts[s].clone();
            tokens.extend_from_slice(&truth[..=gen[s]]);
            let room = truth.len() - gen[s] - 1;
            let draft = match room {
                0 => Vec::new(),
                _ => source.draft(s, &tokens, room),
            };
            let w = &want[k];
            assert_eq!(
                (
                    w[0].as_u64().unwrap() as usize,
                    w[1].as_u64().unwrap() as usize
                ),
                (s, gen[s]),
                "step {k}"
            );
            assert_eq!(draft, ids(&w[2]), "step {k} of {}", c["seqs"]);
            let accepted = draft
                .iter()
                .zip(&truth[gen[s] + 1..])
                .take_while(|(d, t)| d == t)
                .count();
            if !draft.is_empty() {
                source.accepted(s, accepted);
                drafted += 1;
            }
            gen[s] += 1 + accepted;
            k += 1;
        }
        if !busy {
            break;
        }
    }
    assert_eq!(k, want.len());
    drafted
}

#[test]
fn whole_sessions_draft_as_llama_cpps_ngram_simple_and_ngram_mod() {
    let text = include_str!("fixtures/ngram_sessions.jsonl");
    let (mut simple, mut modded) = (0, 0);
    for line in text.lines() {
        let c: Value = serde_json::from_str(line).unwrap();
        let arg = |k: &str| c[k].as_u64().unwrap() as usize;
        match c["type"].as_str().unwrap() {
            "simple" => {
                let cfg = NgramSimpleConfig {
                    size_n: arg("a"),
                    size_m: arg("b"),
                };
                simple += replay(&c, &mut NgramSimple::new(cfg));
            }
            _ => {
                let cfg = NgramModConfig {
                    n_match: arg("a"),
                    n_max: arg("b"),
                    n_min: arg("c"),
                };
                let n = c["seqs"].as_array().unwrap().len();
                modded += replay(&c, &mut NgramMod::new(cfg, n));
            }
        }
    }
    // The sessions draft often enough to mean something.
    assert!(
        simple > 1000 && modded > 2000,
        "{simple} and {modded} drafts"
    );
}
