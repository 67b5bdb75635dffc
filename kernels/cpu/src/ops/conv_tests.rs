//! Tests of [`super::conv_causal`] against the definition over whole sequences.

use super::*;
use crate::pool::Pool;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn random(n: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// `y[t, c] = Σ_j w[j, c]·x[t - (taps-1) + j, c]` over one whole sequence `x` `[ch, n]` that starts
/// from `history` (`[ch, taps-1]`, oldest first), in f64.
fn reference(x: &[f32], w: &[f32], history: &[f32], ch: usize, taps: usize) -> Vec<f64> {
    dilated(x, w, history, ch, taps, 1)
}

/// `y[t, c] = Σ_j w[j, c]·x[t - (taps-1-j)·dil, c]` over one whole sequence `x` `[ch, n]` that
/// starts from `history` (`[ch, (taps-1)·dil]`, oldest first), in f64.
fn dilated(x: &[f32], w: &[f32], history: &[f32], ch: usize, taps: usize, dil: usize) -> Vec<f64> {
    let hist = (taps - 1) * dil;
    let n = x.len() / ch;
    let at = |t: usize, c: usize| -> f64 {
        if t < hist {
            f64::from(history[t * ch + c])
        } else {
            f64::from(x[(t - hist) * ch + c])
        }
    };
    let mut y = vec![0f64; n * ch];
    for t in 0..n {
        for c in 0..ch {
            y[t * ch + c] = (0..taps)
                .map(|j| f64::from(w[c * taps + j]) * at(t + j * dil, c))
                .sum();
        }
    }
    y
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(g) - w).abs() <= 1e-5, "{what}[{i}]: {g} vs {w}");
    }
}

/// One call on `pool`: rows `x` with their slots and positions.
#[allow(clippy::too_many_arguments)]
fn call(
    pool: &Pool,
    x: &[f32],
    w: &[f32],
    state: &mut [f32],
    slots: &[u32],
    positions: &[i32],
    p: &ConvParams,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; x.len()];
    conv_causal(pool, x, w, state, slots, positions, p, &mut out).unwrap();
    out
}

// 300 channels: two tasks, the second one partial.
const P: ConvParams = ConvParams {
    ch: 300,
    taps: 4,
    dilation: 1,
    n_slots: 3,
};

#[test]
fn a_dilated_sequence_split_over_three_calls_matches_the_definition() {
    // 4 taps at dilation 3: a window of 9 rows; calls of 2, 8 and 1 rows.
    let p = ConvParams { dilation: 3, ..P };
    let pool = Pool::with_threads(3).unwrap();
    let mut rng = StdRng::seed_from_u64(4);
    let (ch, n, hist) = (p.ch, 11, 9);
    let (x, w) = (random(ch * n, &mut rng), random(p.taps * ch, &mut rng));
    let mut state = random(ch * hist * p.n_slots, &mut rng);
    let mut got = Vec::new();
    for (r, pos0) in [(0..2, 0), (2..10, 2), (10..11, 10)] {
        let rows = r.len();
        let pos: Vec<i32> = (pos0..pos0 + rows as i32).collect();
        let xs = &x[r.start * ch..r.end * ch];
        got.extend(call(&pool, xs, &w, &mut state, &vec![2; rows], &pos, &p));
    }
    let want = dilated(&x, &w, &vec![0.0; hist * ch], ch, p.taps, 3);
    assert_close(&got, &want, "dilated");
    // The slot holds its last nine inputs, oldest first.
    assert_eq!(&state[2 * hist * ch..], &x[2 * ch..]);
    let zero = ConvParams { dilation: 0, ..P };
    let mut out = vec![0.0; ch];
    let err = conv_causal(&pool, &x[..ch], &w, &mut state, &[0], &[0], &zero, &mut out);
    assert!(matches!(err, Err(OpError::Parameter { .. })), "{err:?}");
}

#[test]
fn a_sequence_split_over_two_calls_matches_the_definition() {
    let pool = Pool::with_threads(3).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let (ch, n) = (P.ch, 11);
    let (x, w) = (random(ch * n, &mut rng), random(P.taps * ch, &mut rng));
    let mut state = random(ch * 3 * P.n_slots, &mut rng);
    let untouched = state[..ch * 3].to_vec();
    let first = call(
        &pool,
        &x[..5 * ch],
        &w,
        &mut state,
        &[1; 5],
        &[0, 1, 2, 3, 4],
        &P,
    );
    let second = call(
        &pool,
        &x[5 * ch..],
        &w,
        &mut state,
        &[1; 6],
        &[5, 6, 7, 8, 9, 10],
        &P,
    );
    let want = reference(&x, &w, &vec![0.0; 3 * ch], ch, P.taps);
    assert_close(&first, &want[..5 * ch], "first call");
    assert_close(&second, &want[5 * ch..], "second call");
    // The slot holds its last three inputs, oldest first; other slots are untouched.
    assert_eq!(&state[3 * ch..6 * ch], &x[8 * ch..]);
    assert_eq!(&state[..3 * ch], &untouched[..]);
}

#[test]
fn position_zero_starts_from_zeros_and_later_rows_read_the_state() {
    let pool = Pool::with_threads(2).unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    let ch = P.ch;
    let (x, w) = (random(ch * 2, &mut rng), random(P.taps * ch, &mut rng));
    let garbage = random(ch * 3 * P.n_slots, &mut rng);
    let mut state = garbage.clone();
    let fresh = call(&pool, &x, &w, &mut state, &[2, 2], &[0, 1], &P);
    assert_close(
        &fresh,
        &reference(&x, &w, &vec![0.0; 3 * ch], ch, P.taps),
        "reset",
    );
    let mut state = garbage.clone();
    let carried = call(&pool, &x, &w, &mut state, &[2, 2], &[7, 8], &P);
    let history = &garbage[6 * ch..9 * ch];
    assert_close(&carried, &reference(&x, &w, history, ch, P.taps), "carried");
}

#[test]
fn sequences_in_one_batch_equal_each_alone() {
    let pool = Pool::with_threads(3).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let ch = P.ch;
    let (x, w) = (random(ch * 12, &mut rng), random(P.taps * ch, &mut rng));
    let start = random(ch * 3 * P.n_slots, &mut rng);
    // Slot 0 continues at position 3 for 4 rows, slot 2 starts a prompt of 5 rows, slot 1
    // continues at position 9 for 3 rows.
    let slots = [0, 0, 0, 0, 2, 2, 2, 2, 2, 1, 1, 1];
    let positions = [3, 4, 5, 6, 0, 1, 2, 3, 4, 9, 10, 11];
    let mut both = start.clone();
    let together = call(&pool, &x, &w, &mut both, &slots, &positions, &P);
    let mut alone = start.clone();
    let mut one_by_one = Vec::new();
    for r in [0..4, 4..9, 9..12] {
        let xs = &x[r.start * ch..r.end * ch];
        let (s, pos) = (&slots[r.clone()], &positions[r]);
        one_by_one.extend(call(&pool, xs, &w, &mut alone, s, pos, &P));
    }
    assert_eq!(together, one_by_one);
    assert_eq!(both, alone);
}

#[test]
fn bad_slots_and_shapes_are_refused_before_writing() {
    let pool = Pool::with_threads(1).unwrap();
    let ch = P.ch;
    let (x, w) = (vec![1.0; ch], vec![1.0; P.taps * ch]);
    let mut state = vec![0.5; ch * 3 * P.n_slots];
    let mut out = vec![0.0; ch];
    let bad_slot = conv_causal(&pool, &x, &w, &mut state, &[3], &[0], &P, &mut out);
    assert!(matches!(bad_slot, Err(OpError::Index { what: "slot", .. })));
    let short_w = conv_causal(&pool, &x, &w[1..], &mut state, &[0], &[0], &P, &mut out);
    assert!(matches!(short_w, Err(OpError::Length { what: "w", .. })));
    assert!(state.iter().all(|&v| v == 0.5) && out.iter().all(|&v| v == 0.0));
}

/// Row states: column `r` equals the window that calls of one row each leave after row `r`, for
/// sequences continuing their slot's window and one starting at position 0, dilated and not.
#[test]
fn row_states_are_the_windows_of_one_row_calls() {
    let pool = Pool::with_threads(2).unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    for dil in [1, 3] {
        let p = ConvParams { dilation: dil, ..P };
        let width = p.ch * (p.taps - 1) * dil;
        let (slots, positions) = ([1u32, 1, 1, 0, 0, 2], [4i32, 5, 6, 0, 1, 9]);
        let rows = slots.len();
        let x = random(rows * p.ch, &mut rng);
        let w = random(p.taps * p.ch, &mut rng);
        let start = random(width * p.n_slots, &mut rng);
        let mut state = start.clone();
        let mut row_states = vec![f32::NAN; width * rows];
        let mut out = vec![f32::NAN; x.len()];
        conv_causal_rows(
            &pool,
            &x,
            &w,
            &mut state,
            &slots,
            &positions,
            &p,
            &mut out,
            Some(&mut row_states),
        )
        .unwrap();
        let mut one = start.clone();
        for r in 0..rows {
            let xr = &x[r * p.ch..][..p.ch];
            let y = call(
                &pool,
                xr,
                &w,
                &mut one,
                &slots[r..=r],
                &positions[r..=r],
                &p,
            );
            assert_eq!(
                &out[r * p.ch..][..p.ch],
                &y[..],
                "dilation {dil}: row {r}'s output"
            );
            let s = slots[r] as usize;
            assert_eq!(
                &row_states[r * width..][..width],
                &one[s * width..][..width],
                "dilation {dil}: row {r}'s window"
            );
        }
        assert_eq!(state, one);
    }
}
