//! `--spec-type ngram-simple`'s drafts against llama.cpp b11434's own
//! (`common_ngram_simple_draft`, run as a program on the same cases:
//! `tests/oracle/make_ngram_draft_golden.sh`, fixture `fixtures/ngram_simple.jsonl`, command in
//! host/tests/fixtures/PROVENANCE.md): every case's draft equal, token for token.

use bloomery_runtime::ngram_draft::{simple_draft, NgramSimple, NgramSimpleConfig};
use bloomery_runtime::spec::DraftSource;
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

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
