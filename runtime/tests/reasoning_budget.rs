//! The reasoning budget against llama.cpp b11434's own sampler: for each case of
//! `fixtures/reasoning_budget.jsonl` (made by `tests/oracle/make_reasoning_budget_golden.sh`),
//! the token bloomery's budget forces before each token of the sequence is taken in must be the
//! one llama.cpp's left alive (or none), and `ends_whole_char` must judge each byte string as
//! `common_utf8_is_complete` does.

use bloomery_runtime::reasoning_budget::{ends_whole_char, Budget, BudgetSpec, EndSwitch};
use serde_json::Value;

mod common;

use common::ids;

fn cases() -> Vec<Value> {
    let text = include_str!("fixtures/reasoning_budget.jsonl");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn forcing_matches_llama_cpp_on_every_case() {
    let (mut n_cases, mut n_forced) = (0, 0);
    for c in cases().iter().filter(|c| c.get("name").is_some()) {
        let budget = c["budget"].as_u64().unwrap();
        let spec = BudgetSpec {
            budget: u32::try_from(budget).unwrap_or(u32::MAX),
            start: ids(&c["start"]),
            ends: c["ends"].as_array().unwrap().iter().map(ids).collect(),
            forced: ids(&c["forced"]),
            prefill: ids(&c["prefill"]),
            control: Some(EndSwitch::new()),
        };
        let switch = spec.control.clone().unwrap();
        let end_at = ids(&c["end_at"]);
        let mut b = Budget::new(&spec);
        let seq = ids(&c["seq"]);
        let want: Vec<i64> = c["forcing"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        for (i, (&t, &w)) in seq.iter().zip(&want).enumerate() {
            // The span's end asked for at run time before this token's row (reasoning_control).
            if end_at.contains(&(i as u32)) {
                switch.set();
            }
            b.take_control();
            let got = b.forced().map_or(-1, i64::from);
            assert_eq!(
                got, w,
                "case {} token {i}: forced {got}, llama.cpp {w}",
                c["name"]
            );
            // The mask keeps exactly the forced token's logit.
            if let Some(row) = b.mask(&[0.5; 16]) {
                let alive: Vec<usize> = (0..16).filter(|&j| row[j].is_finite()).collect();
                assert_eq!(alive, vec![w as usize], "case {}", c["name"]);
                n_forced += 1;
            }
            b.accept(t, true);
        }
        n_cases += 1;
    }
    // The file holds the fixed cases and 300 random ones, many of which force, then six fixed
    // and 100 random ones that ask for the span's end at run time.
    assert_eq!(n_cases, 415);
    assert!(n_forced > 300, "only {n_forced} forced tokens");
}

#[test]
fn whole_characters_as_llama_cpp_judges_them() {
    let mut n = 0;
    for c in cases().iter().filter(|c| c.get("utf8").is_some()) {
        let bytes: Vec<u8> = ids(&c["utf8"]).into_iter().map(|b| b as u8).collect();
        let want = c["complete"].as_bool().unwrap();
        assert_eq!(ends_whole_char(&bytes), want, "{bytes:x?}");
        n += 1;
    }
    assert_eq!(n, 17);
}

#[test]
fn a_split_character_delays_the_forced_end() {
    // Budget 1: the one token inside the span ends mid-character, so forcing waits for the
    // next token that ends on a whole one (llama.cpp's WAITING_UTF8).
    let spec = BudgetSpec {
        budget: 1,
        start: vec![1],
        ends: vec![vec![3]],
        forced: vec![6, 3],
        prefill: vec![1],
        control: None,
    };
    let mut b = Budget::new(&spec);
    b.accept(9, false);
    assert_eq!(b.forced(), None);
    b.accept(9, false);
    assert_eq!(b.forced(), None);
    b.accept(9, true);
    assert_eq!(b.forced(), Some(6));
    b.accept(6, true);
    assert_eq!(b.forced(), Some(3));
    b.accept(3, true);
    assert_eq!(b.forced(), None);
}
