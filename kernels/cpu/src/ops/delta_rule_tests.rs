//! Tests of [`super::delta_rule`]: both forms against an f64 step-by-step definition, against each
//! other and against token-by-token decoding, several sequences per call, resets and head tiling.

use super::*;
use crate::pool::Pool;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// A batch's inputs, owned.
struct Batch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
    beta: Vec<f32>,
    slots: Vec<u32>,
    positions: Vec<i32>,
}

impl Batch {
    /// Random rows as a model makes them: unit-norm q and k, log decays in [-1, -0.05), β in
    /// (0, 1). `seqs` lists (slot, first position, rows).
    fn random(p: &DeltaRuleParams, seqs: &[(u32, i32, usize)], seed: u64) -> Batch {
        let mut rng = StdRng::seed_from_u64(seed);
        let rows: usize = seqs.iter().map(|s| s.2).sum();
        let mut unit = |n: usize| -> Vec<f32> {
            let mut x: Vec<f32> = (0..n * p.n_head_k * rows)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            for r in x.chunks_exact_mut(n) {
                let norm = r.iter().map(|v| v * v).sum::<f32>().sqrt();
                r.iter_mut().for_each(|v| *v /= norm);
            }
            x
        };
        let (q, k) = (unit(p.dk), unit(p.dk));
        let gates = if p.per_dim_gate { p.dk } else { 1 } * p.n_head_v * rows;
        let mut rng = StdRng::seed_from_u64(seed + 1000);
        Batch {
            q,
            k,
            v: (0..p.dv * p.n_head_v * rows)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect(),
            gate: (0..gates).map(|_| rng.gen_range(-1.0f32..-0.05)).collect(),
            beta: (0..p.n_head_v * rows)
                .map(|_| rng.gen_range(0.01f32..1.0))
                .collect(),
            slots: seqs
                .iter()
                .flat_map(|&(s, _, n)| std::iter::repeat_n(s, n))
                .collect(),
            positions: seqs
                .iter()
                .flat_map(|&(_, p0, n)| p0..p0 + n as i32)
                .collect(),
        }
    }

    fn inputs(&self) -> DeltaRuleInputs<'_> {
        DeltaRuleInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            gate: &self.gate,
            beta: &self.beta,
            slots: &self.slots,
            positions: &self.positions,
        }
    }

    /// Rows `r` only.
    fn rows(&self, p: &DeltaRuleParams, r: std::ops::Range<usize>) -> Batch {
        let cut = |x: &[f32], per_row: usize| x[r.start * per_row..r.end * per_row].to_vec();
        let gates = if p.per_dim_gate { p.dk } else { 1 } * p.n_head_v;
        Batch {
            q: cut(&self.q, p.dk * p.n_head_k),
            k: cut(&self.k, p.dk * p.n_head_k),
            v: cut(&self.v, p.dv * p.n_head_v),
            gate: cut(&self.gate, gates),
            beta: cut(&self.beta, p.n_head_v),
            slots: self.slots[r.clone()].to_vec(),
            positions: self.positions[r].to_vec(),
        }
    }
}

fn params(hk: usize, hv: usize, dk: usize, dv: usize, form: Form) -> DeltaRuleParams {
    DeltaRuleParams {
        n_head_k: hk,
        n_head_v: hv,
        dk,
        dv,
        n_slots: 3,
        scale: 1.0 / (dk as f32).sqrt(),
        beta_scale: 1.0,
        per_dim_gate: false,
        form,
    }
}

fn random_state(p: &DeltaRuleParams, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..p.dk * p.dv * p.n_head_v * p.n_slots)
        .map(|_| rng.gen_range(-0.5f32..0.5))
        .collect()
}

/// The definition, row by row in f64; value head `h` reads key head `h % hk`.
fn reference(b: &Batch, p: &DeltaRuleParams, state: &mut [f64]) -> Vec<f64> {
    let (hk, hv, dk, dv) = (p.n_head_k, p.n_head_v, p.dk, p.dv);
    let mut out = vec![0f64; dv * hv * b.slots.len()];
    for (t, (&slot, &pos)) in b.slots.iter().zip(&b.positions).enumerate() {
        for h in 0..hv {
            let s = &mut state[(slot as usize * hv + h) * dk * dv..][..dk * dv];
            if pos == 0 {
                s.fill(0.0);
            }
            let kh = t * hk + h % hk;
            let q = |i: usize| f64::from(b.q[kh * dk + i]);
            let k = |i: usize| f64::from(b.k[kh * dk + i]);
            let decay = |i: usize| {
                f64::from(if p.per_dim_gate {
                    b.gate[(t * hv + h) * dk + i]
                } else {
                    b.gate[t * hv + h]
                })
                .exp()
            };
            for j in 0..dv {
                for i in 0..dk {
                    s[j * dk + i] *= decay(i);
                }
            }
            let beta = f64::from(p.beta_scale * b.beta[t * hv + h]);
            for j in 0..dv {
                let m: f64 = (0..dk).map(|i| s[j * dk + i] * k(i)).sum();
                let d = beta * (f64::from(b.v[(t * hv + h) * dv + j]) - m);
                for i in 0..dk {
                    s[j * dk + i] += k(i) * d;
                }
                let y: f64 = (0..dk).map(|i| s[j * dk + i] * q(i)).sum();
                out[(t * hv + h) * dv + j] = f64::from(p.scale) * y;
            }
        }
    }
    out
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// ‖a − b‖ / ‖b‖.
fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

fn run(pool: &Pool, b: &Batch, p: &DeltaRuleParams, state: &mut [f32]) -> Vec<f32> {
    let mut out = vec![f32::NAN; p.dv * p.n_head_v * b.slots.len()];
    delta_rule(pool, &b.inputs(), p, state, &mut out).unwrap();
    out
}

/// The band within which the two forms, and either form and the f64 definition, agree (f32,
/// relative in norm, outputs and states): the largest measured over these tests is below 1e-6.
const BAND: f64 = 1e-5;

#[test]
fn both_forms_match_the_definition() {
    let pool = Pool::with_threads(3).unwrap();
    // dk 20 and dv 13 leave partial register blocks in the chunked form; with 3 threads and 4
    // heads, dv 48 splits into two tasks per head and dv 44 into unequal ones (24 and 20).
    for (form, per_dim, (dk, dv)) in [
        (Form::Steps, false, (32, 48)),
        (Form::Chunks, false, (32, 48)),
        (Form::Chunks, false, (20, 13)),
        (Form::Chunks, false, (20, 44)),
        (Form::Steps, false, (20, 44)),
        (Form::Steps, true, (32, 48)),
        (Form::Chunks, true, (32, 48)),
        (Form::Chunks, true, (20, 13)),
        (Form::Chunks, true, (20, 44)),
    ] {
        let p = DeltaRuleParams {
            per_dim_gate: per_dim,
            beta_scale: if per_dim { 2.0 } else { 1.0 },
            ..params(2, 4, dk, dv, form)
        };
        // 150 rows: whole chunks and a partial one, from a carried state.
        let b = Batch::random(&p, &[(1, 9, 150)], 11);
        let mut state = random_state(&p, 12);
        let mut want_state = widen(&state);
        let got = run(&pool, &b, &p, &mut state);
        let want = reference(&b, &p, &mut want_state);
        let (e_out, e_state) = (rel(&widen(&got), &want), rel(&widen(&state), &want_state));
        assert!(
            e_out < BAND && e_state < BAND,
            "{form:?} per_dim {per_dim} {dk}x{dv}: {e_out:e} {e_state:e}"
        );
    }
}

#[test]
fn chunked_and_step_wise_forms_agree() {
    let pool = Pool::with_threads(3).unwrap();
    let steps = params(4, 8, 128, 128, Form::Steps);
    let chunks = DeltaRuleParams {
        form: Form::Chunks,
        ..steps
    };
    // A 200-row prompt from position 0 and a 70-row continuation of another slot.
    let b = Batch::random(&steps, &[(0, 0, 200), (2, 31, 70)], 21);
    let start = random_state(&steps, 22);
    let (mut s1, mut s2) = (start.clone(), start);
    let (o1, o2) = (
        run(&pool, &b, &steps, &mut s1),
        run(&pool, &b, &chunks, &mut s2),
    );
    let (e_out, e_state) = (rel(&widen(&o2), &widen(&o1)), rel(&widen(&s2), &widen(&s1)));
    assert!(e_out < BAND && e_state < BAND, "{e_out:e} {e_state:e}");
}

#[test]
fn per_dim_chunked_and_step_wise_forms_agree() {
    let pool = Pool::with_threads(3).unwrap();
    let steps = DeltaRuleParams {
        per_dim_gate: true,
        beta_scale: 2.0,
        ..params(4, 4, 128, 128, Form::Steps)
    };
    let chunks = DeltaRuleParams {
        form: Form::Chunks,
        ..steps
    };
    let b = Batch::random(&steps, &[(0, 0, 200), (2, 31, 70)], 23);
    let start = random_state(&steps, 24);
    let (mut s1, mut s2) = (start.clone(), start);
    let (o1, o2) = (
        run(&pool, &b, &steps, &mut s1),
        run(&pool, &b, &chunks, &mut s2),
    );
    let (e_out, e_state) = (rel(&widen(&o2), &widen(&o1)), rel(&widen(&s2), &widen(&s1)));
    assert!(e_out < BAND && e_state < BAND, "{e_out:e} {e_state:e}");
}

/// An unbounded KDA gate (`−e^{A_log}·softplus(·)`) can decay a key dim by `e^{-200}` in one
/// row: a chunk that divided cumulative decays would overflow to inf and NaN there. The chunked
/// form must stay finite and equal to the step-wise one and the definition.
#[test]
fn per_dim_chunks_survive_decays_that_underflow() {
    let pool = Pool::with_threads(2).unwrap();
    let p = DeltaRuleParams {
        per_dim_gate: true,
        ..params(2, 2, 32, 16, Form::Chunks)
    };
    let mut b = Batch::random(&p, &[(0, 0, 40)], 25);
    // Every third key dim of every fifth row forgets almost at once.
    for (n, g) in b.gate.iter_mut().enumerate() {
        if n % 3 == 0 && (n / (p.dk * p.n_head_v)) % 5 == 1 {
            *g = -200.0 - (n % 7) as f32 * 30.0;
        }
    }
    let start = random_state(&p, 26);
    let mut chunked = start.clone();
    let mut want_state = widen(&start);
    let got = run(&pool, &b, &p, &mut chunked);
    assert!(got.iter().chain(&chunked).all(|v| v.is_finite()));
    let want = reference(&b, &p, &mut want_state);
    let (e_out, e_state) = (rel(&widen(&got), &want), rel(&widen(&chunked), &want_state));
    assert!(e_out < BAND && e_state < BAND, "{e_out:e} {e_state:e}");
}

#[test]
fn a_batched_prompt_equals_token_by_token() {
    let pool = Pool::with_threads(2).unwrap();
    for per_dim in [false, true] {
        let p = DeltaRuleParams {
            per_dim_gate: per_dim,
            ..params(2, 4, 64, 64, Form::Auto)
        };
        let b = Batch::random(&p, &[(1, 0, 130)], 31);
        let start = random_state(&p, 32);
        let mut batched = start.clone();
        let all = run(&pool, &b, &p, &mut batched);
        let mut stepped = start;
        let mut one_by_one = Vec::new();
        for t in 0..130 {
            one_by_one.extend(run(&pool, &b.rows(&p, t..t + 1), &p, &mut stepped));
        }
        let (e_out, e_state) = (
            rel(&widen(&all), &widen(&one_by_one)),
            rel(&widen(&batched), &widen(&stepped)),
        );
        assert!(
            e_out < BAND && e_state < BAND,
            "per_dim {per_dim}: {e_out:e} {e_state:e}"
        );
    }
}

#[test]
fn sequences_in_one_call_equal_each_alone() {
    let pool = Pool::with_threads(3).unwrap();
    for form in [Form::Steps, Form::Auto] {
        let p = params(2, 4, 32, 32, form);
        // Slot 2 decodes 3 rows from position 40, slot 0 continues for 70 rows from position 10
        // (neither starts at 0, so only the slot tells them apart), slot 1 starts a 20-row prompt.
        let seqs = [(2, 40, 3), (0, 10, 70), (1, 0, 20)];
        let b = Batch::random(&p, &seqs, 41);
        let start = random_state(&p, 42);
        let mut both = start.clone();
        let together = run(&pool, &b, &p, &mut both);
        let mut alone = start;
        let mut one_by_one = Vec::new();
        for r in [0..3, 3..73, 73..93] {
            one_by_one.extend(run(&pool, &b.rows(&p, r), &p, &mut alone));
        }
        assert_eq!(together, one_by_one, "{form:?}");
        assert_eq!(both, alone, "{form:?}");
    }
}

#[test]
fn position_zero_starts_from_a_zero_state() {
    let pool = Pool::with_threads(2).unwrap();
    for form in [Form::Steps, Form::Chunks] {
        let p = params(1, 2, 16, 16, form);
        let b = Batch::random(&p, &[(1, 0, 5)], 51);
        let (mut garbage, mut zeros) = (random_state(&p, 52), random_state(&p, 52));
        let slot = p.dk * p.dv * p.n_head_v;
        zeros[slot..2 * slot].fill(0.0);
        let from_garbage = run(&pool, &b, &p, &mut garbage);
        let from_zeros = run(&pool, &b, &p, &mut zeros);
        assert_eq!(from_garbage, from_zeros, "{form:?}");
        assert_eq!(garbage, zeros, "{form:?}");
        // The same rows later in a sequence do read the state.
        let mut later = Batch::random(&p, &[(1, 0, 5)], 51);
        later.positions.iter_mut().for_each(|x| *x += 3);
        let mut state = random_state(&p, 52);
        assert_ne!(run(&pool, &later, &p, &mut state), from_zeros, "{form:?}");
    }
}

#[test]
fn value_heads_tile_over_key_heads() {
    let pool = Pool::with_threads(2).unwrap();
    for form in [Form::Steps, Form::Chunks] {
        let p = params(2, 4, 16, 8, form);
        let b = Batch::random(&p, &[(0, 0, 70)], 61);
        let mut state = random_state(&p, 62);
        let mut want_state = widen(&state);
        let got = run(&pool, &b, &p, &mut state);
        let want = reference(&b, &p, &mut want_state);
        let e = rel(&widen(&got), &want);
        assert!(e < BAND, "{form:?}: {e:e}");
    }
}

#[test]
fn bad_calls_are_refused_before_writing() {
    let pool = Pool::with_threads(1).unwrap();
    let p = params(2, 4, 8, 8, Form::Chunks);
    let b = Batch::random(&p, &[(0, 0, 3)], 71);
    let mut state = vec![0.5; p.dk * p.dv * p.n_head_v * p.n_slots];
    let mut out = vec![0.0; p.dv * p.n_head_v * 3];
    // A per-dim call whose gate holds one value per head.
    let per_dim = DeltaRuleParams {
        per_dim_gate: true,
        ..p
    };
    let r = delta_rule(&pool, &b.inputs(), &per_dim, &mut state, &mut out);
    assert!(
        matches!(r, Err(OpError::Length { what: "gate", .. })),
        "{r:?}"
    );
    let mut bad = b.rows(&p, 0..3);
    bad.slots[2] = 3;
    let r = delta_rule(&pool, &bad.inputs(), &p, &mut state, &mut out);
    assert!(
        matches!(r, Err(OpError::Index { what: "slot", .. })),
        "{r:?}"
    );
    let odd = DeltaRuleParams { n_head_k: 3, ..p };
    let r = delta_rule(&pool, &b.inputs(), &odd, &mut state, &mut out);
    assert!(matches!(r, Err(OpError::Parameter { .. })), "{r:?}");
    assert!(state.iter().all(|&v| v == 0.5) && out.iter().all(|&v| v == 0.0));
}

/// Row states: column `r` equals, bit for bit, the state that calls of one row each leave after
/// row `r` (what decoding without drafts computes), for a per-head and a per-dim gate, with a
/// sequence long enough to take the chunked form without row states, one continuing its slot's
/// state and one starting at position 0; the outputs and final state equal the plain call's.
#[test]
fn row_states_are_the_states_of_one_row_calls() {
    let pool = Pool::with_threads(3).unwrap();
    for per_dim in [false, true] {
        let p = DeltaRuleParams {
            per_dim_gate: per_dim,
            ..params(2, 4, 20, 13, Form::Auto)
        };
        let seqs = [(1, 5, 9), (0, 0, 3), (2, 7, 1)];
        let b = Batch::random(&p, &seqs, 11);
        let rows = b.slots.len();
        let per = p.dk * p.dv * p.n_head_v;
        let start = random_state(&p, 12);
        let mut state = start.clone();
        let mut row_states = vec![f32::NAN; per * rows];
        let mut out = vec![f32::NAN; p.dv * p.n_head_v * rows];
        delta_rule_rows(
            &pool,
            &b.inputs(),
            &p,
            &mut state,
            &mut out,
            Some(&mut row_states),
        )
        .unwrap();
        let mut one = start.clone();
        let steps = DeltaRuleParams {
            form: Form::Steps,
            ..p
        };
        for r in 0..rows {
            let y = run(&pool, &b.rows(&steps, r..r + 1), &steps, &mut one);
            let slot = b.slots[r] as usize;
            let (got, want) = (&row_states[r * per..][..per], &one[slot * per..][..per]);
            assert!(
                got.iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "per_dim {per_dim}: row {r}'s state"
            );
            let o = &out[r * p.dv * p.n_head_v..][..p.dv * p.n_head_v];
            assert!(o.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        assert!(state
            .iter()
            .zip(&one)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut short = vec![0f32; per * rows - 1];
        let r = delta_rule_rows(
            &pool,
            &b.inputs(),
            &p,
            &mut state,
            &mut out,
            Some(&mut short),
        );
        assert!(r.unwrap_err().to_string().contains("row states"));
    }
}
