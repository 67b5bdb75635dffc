//! The Qwen3.5 hybrids on the CPU, checked against themselves where the recurrent state matters:
//! a prompt in one pass equals the same tokens one by one, two sequences in one pass equal each
//! alone, a row at position 0 forgets the slot's old state, and restoring a checkpoint equals
//! evaluating the prefix again. (Logits against llama.cpp and transformers: `qwen35_golden.rs`.)

mod common;

use common::{plugin_dir, tiny_of};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::BatchInputs;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;

const SEQ_A: [i32; 9] = [5, 77, 300, 12, 509, 256, 1, 42, 8];
const SEQ_B: [i32; 6] = [3, 4, 5, 6, 100, 200];

fn load(arch: &str, dir: &tempfile::TempDir, n_slots: u32) -> LoadedModel {
    let path = tiny_of(
        arch,
        dir.path(),
        ClassTypes {
            experts: DType::F32,
            attention: DType::F32,
            embedding: DType::F32,
            output: DType::F32,
            dense: DType::F32,
        },
    );
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = LoadOptions {
        n_slots,
        ctx_per_slot: 64,
        kv_type_k: DType::F32,
        kv_type_v: DType::F32,
        threads: 2,
        graphs: true,
        mlock: false,
        overrides: &[],
        check_tensors: false,
        draft_n_max: 0,
        draft_history: false,
    };
    LoadedModel::load(&reg, &path, opts).unwrap()
}

/// Rows `tokens` of slot `slot` from position `start`, every row an output.
fn rows(tokens: &[i32], slot: i32, start: i32) -> BatchInputs {
    let n = tokens.len() as i32;
    BatchInputs {
        tokens: tokens.to_vec(),
        positions: (start..start + n).collect(),
        slots: vec![slot; tokens.len()],
        output_rows: (0..n).collect(),
        ngram_rows: vec![],
        logit_rows: vec![],
    }
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |s, v| s.max(v.abs()));
    a.iter().zip(b).fold(0f32, |s, (x, y)| s.max((x - y).abs())) / scale
}

fn one_by_one(m: &mut LoadedModel, tokens: &[i32], slot: i32) -> Vec<f32> {
    let mut out = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        out.extend(m.forward(&rows(&[t], slot, i as i32)).unwrap());
    }
    out
}

fn prompt_equals_token_by_token(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load(arch, &dir, 1);
    let whole = m.forward(&rows(&SEQ_A, 0, 0)).unwrap();
    // Position 0 starts a new sequence: the state left by the pass above must not leak in.
    let steps = one_by_one(&mut m, &SEQ_A, 0);
    let r = max_rel(&steps, &whole);
    eprintln!("{arch}: prompt vs token by token: max rel {r:.2e}");
    assert!(r < 1e-5, "{arch}: max rel {r}");
}

#[test]
fn qwen35moe_prompt_equals_token_by_token() {
    prompt_equals_token_by_token("qwen35moe");
}

#[test]
fn qwen35_prompt_equals_token_by_token() {
    prompt_equals_token_by_token("qwen35");
}

#[test]
fn two_sequences_in_one_pass_equal_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load("qwen35moe", &dir, 2);
    let a = m.forward(&rows(&SEQ_A, 0, 0)).unwrap();
    let b = m.forward(&rows(&SEQ_B, 1, 0)).unwrap();
    // Both again in one batch, B first, on swapped slots.
    let mut batch = rows(&SEQ_B, 0, 0);
    let tail = rows(&SEQ_A, 1, 0);
    batch.tokens.extend(tail.tokens);
    batch.positions.extend(tail.positions);
    batch.slots.extend(tail.slots);
    batch.output_rows = (0..batch.tokens.len() as i32).collect();
    let both = m.forward(&batch).unwrap();
    let v = m.spec.hparams.n_vocab as usize;
    let (rb, ra) = both.split_at(SEQ_B.len() * v);
    assert!(max_rel(rb, &b) < 1e-5, "B: {}", max_rel(rb, &b));
    assert!(max_rel(ra, &a) < 1e-5, "A: {}", max_rel(ra, &a));
    // Decoding one more row for each continues each state.
    let mut next = rows(&[9], 0, SEQ_B.len() as i32);
    next.tokens.push(9);
    next.positions.push(SEQ_A.len() as i32);
    next.slots.push(1);
    next.output_rows = vec![0, 1];
    let stepped = m.forward(&next).unwrap();
    let mut alone = load("qwen35moe", &dir, 1);
    alone.forward(&rows(&SEQ_B, 0, 0)).unwrap();
    let b9 = alone.forward(&rows(&[9], 0, SEQ_B.len() as i32)).unwrap();
    assert!(max_rel(&stepped[..v], &b9) < 1e-5);
}

#[test]
fn a_checkpoint_restores_the_state_it_was_taken_at() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = load("qwen35moe", &dir, 1);
    assert!(m.rewind().per_sequence);
    let (head, tail) = SEQ_A.split_at(5);
    let n = head.len() as u32;
    m.forward(&rows(head, 0, 0)).unwrap();
    let ck = m.read_checkpoint(0).unwrap();
    let first = m.forward(&rows(tail, 0, n as i32)).unwrap();
    // What the prompt cache keeps: the whole state at 9 positions and the checkpoint at 5.
    let saved = m.read_slot(0, SEQ_A.len() as u32).unwrap();
    let all = SEQ_A.len() as u32;
    // Another sequence overwrites the slot.
    m.forward(&rows(&SEQ_B, 0, 0)).unwrap();
    let other = m.read_checkpoint(0).unwrap();
    // Without a checkpoint a hybrid's state restores only whole.
    assert!(m.write_slot(0, n, all, &saved, None).is_err());
    m.write_slot(0, n, all, &saved, Some(&ck)).unwrap();
    let again = m.forward(&rows(tail, 0, n as i32)).unwrap();
    let r = max_rel(&again, &first);
    assert!(r < 1e-6, "max rel {r}");
    // The checkpoint is what makes it right: another sequence's recurrent state gives other
    // logits.
    m.write_slot(0, n, all, &saved, Some(&other)).unwrap();
    let wrong = m.forward(&rows(tail, 0, n as i32)).unwrap();
    assert!(max_rel(&wrong, &first) > 1e-3);
}
