//! Tests of [`super::rope`] against hand-computed values and an independent f64 rope.

use super::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
}

fn assert_close(a: &[f32], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!((f64::from(x) - y).abs() <= tol, "at {i}: {x} vs {y}");
    }
}

/// Independent f64 rope of one head: `pairs` lists the (a, b) dims of pair i; `theta(i)` and `mag`
/// are supplied by the caller.
fn rope_head_f64(
    x: &[f32],
    pairs: &[(usize, usize)],
    theta: impl Fn(usize) -> f64,
    mag: f64,
) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (i, &(a, b)) in pairs.iter().enumerate() {
        let (c, s) = (theta(i).cos() * mag, theta(i).sin() * mag);
        let (x0, x1) = (x[a] as f64, x[b] as f64);
        y[a] = x0 * c - x1 * s;
        y[b] = x0 * s + x1 * c;
    }
    y
}

#[test]
fn norm_and_neox_known_values() {
    let (c1, s1) = (1f64.cos(), 1f64.sin());
    let (c2, s2) = (0.01f64.cos(), 0.01f64.sin()); // 1 * 10000^(-2/4)
    let mut x = vec![1.0f32, 0.0, 0.0, 1.0];
    rope(
        &mut x,
        4,
        1,
        &[1],
        &RopeParams::plain(RopeMode::Norm, 4, 10000.0),
    )
    .unwrap();
    assert_close(&x, &[c1, s1, -s2, c2], 1e-6);

    let mut x = vec![1.0f32, 0.0, 0.0, 1.0];
    rope(
        &mut x,
        4,
        1,
        &[1],
        &RopeParams::plain(RopeMode::Neox, 4, 10000.0),
    )
    .unwrap();
    // pairs (0, 2) at angle 1 and (1, 3) at angle 0.01
    assert_close(&x, &[c1, -s2, s1, c2], 1e-6);
}

#[test]
fn partial_rotation_leaves_the_tail() {
    // head_dim 6, n_dims 2, position 2: only dims 0, 1 rotate, by 2 rad.
    let x0 = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    for mode in [RopeMode::Norm, RopeMode::Neox] {
        let mut x = x0.to_vec();
        rope(&mut x, 6, 1, &[2], &RopeParams::plain(mode, 2, 10000.0)).unwrap();
        let (c, s) = (2f64.cos(), 2f64.sin());
        assert_close(&x, &[c - 2.0 * s, s + 2.0 * c, 3.0, 4.0, 5.0, 6.0], 1e-6);
    }
}

#[test]
fn position_zero_is_identity() {
    let x0 = random(10 * 3 * 2, 1);
    for mode in [
        RopeMode::Norm,
        RopeMode::Neox,
        RopeMode::Imrope {
            sections: [2, 2, 1, 0],
        },
    ] {
        let mut x = x0.clone();
        rope(&mut x, 10, 3, &[0, 0], &RopeParams::plain(mode, 10, 1e6)).unwrap();
        assert_eq!(x, x0);
    }
}

#[test]
fn neox_and_norm_differ_as_expected() {
    // NORM rotates (0,1),(2,3); NEOX rotates (0,2),(1,3): the same input gives different outputs, and
    // NEOX equals NORM applied to the input with dims permuted [0,2,1,3].
    let x0 = [0.3f32, -1.2, 0.7, 2.0];
    let mut neox = x0.to_vec();
    rope(
        &mut neox,
        4,
        1,
        &[5],
        &RopeParams::plain(RopeMode::Neox, 4, 100.0),
    )
    .unwrap();
    let mut norm = vec![x0[0], x0[2], x0[1], x0[3]];
    rope(
        &mut norm,
        4,
        1,
        &[5],
        &RopeParams::plain(RopeMode::Norm, 4, 100.0),
    )
    .unwrap();
    let back = [norm[0], norm[2], norm[1], norm[3]];
    assert!(neox.iter().zip(&back).all(|(a, b)| (a - b).abs() < 1e-6));
    let mut plain_norm = x0.to_vec();
    rope(
        &mut plain_norm,
        4,
        1,
        &[5],
        &RopeParams::plain(RopeMode::Norm, 4, 100.0),
    )
    .unwrap();
    assert!(plain_norm
        .iter()
        .zip(&neox)
        .any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn matches_f64_for_awkward_shapes() {
    // odd head_dim 9 with n_dims 6, n_rows 1 and 7, 3 heads, big and negative-free positions
    for (n_rows, mode) in [
        (1, RopeMode::Norm),
        (7, RopeMode::Neox),
        (7, RopeMode::Norm),
    ] {
        let (head_dim, n_head, n_dims, base) = (9usize, 3usize, 6usize, 10000.0f64);
        let x0 = random(head_dim * n_head * n_rows, n_rows as u64);
        let pos: Vec<i32> = (0..n_rows as i32).map(|r| r * 37 + 3).collect();
        let mut x = x0.clone();
        rope(
            &mut x,
            head_dim,
            n_head,
            &pos,
            &RopeParams::plain(mode, n_dims, base as f32),
        )
        .unwrap();
        let pairs: Vec<(usize, usize)> = match mode {
            RopeMode::Norm => (0..n_dims / 2).map(|i| (2 * i, 2 * i + 1)).collect(),
            _ => (0..n_dims / 2).map(|i| (i, i + n_dims / 2)).collect(),
        };
        let mut want = Vec::new();
        for (h, head) in x0.chunks(head_dim).enumerate() {
            let p = pos[h / n_head] as f64;
            want.extend(rope_head_f64(
                head,
                &pairs,
                |i| p / base.powf(2.0 * i as f64 / n_dims as f64),
                1.0,
            ));
        }
        assert_close(&x, &want, 2e-5);
    }
}

#[test]
fn imrope_with_text_positions_equals_neox() {
    let (head_dim, n_head, n_rows) = (16, 2, 7);
    let x0 = random(head_dim * n_head * n_rows, 3);
    let pos: Vec<i32> = (0..n_rows as i32).map(|r| 1000 + r).collect();
    let mut neox = x0.clone();
    rope(
        &mut neox,
        head_dim,
        n_head,
        &pos,
        &RopeParams::plain(RopeMode::Neox, 8, 1e7),
    )
    .unwrap();
    let sections = [2, 1, 1, 0];
    let mut one_plane = x0.clone();
    let im = RopeParams::plain(RopeMode::Imrope { sections }, 8, 1e7);
    rope(&mut one_plane, head_dim, n_head, &pos, &im).unwrap();
    assert_eq!(one_plane, neox);
    let four: Vec<i32> = pos.iter().cycle().take(4 * n_rows).copied().collect();
    let mut four_planes = x0.clone();
    rope(&mut four_planes, head_dim, n_head, &four, &im).unwrap();
    assert_eq!(four_planes, neox);
}

#[test]
fn imrope_planes_interleave() {
    // sections [2, 1, 1, 0] (4 pairs): sector 0 -> t, 1 -> h, 2 -> w, 3 -> t (3 < 3*2).
    // Give t position 0 (identity) and h, w distinct positions: pairs 0 and 3 must not move.
    let (head_dim, n_dims) = (8, 8);
    let x0 = random(head_dim, 4);
    let mut x = x0.clone();
    let p = RopeParams::plain(
        RopeMode::Imrope {
            sections: [2, 1, 1, 0],
        },
        n_dims,
        10000.0,
    );
    rope(&mut x, head_dim, 1, &[0, 5, 9, 11], &p).unwrap();
    let pairs: Vec<(usize, usize)> = (0..4).map(|i| (i, i + 4)).collect();
    let plane_pos = [0.0, 5.0, 9.0, 0.0];
    let want = rope_head_f64(
        &x0,
        &pairs,
        |i| plane_pos[i] / 10000f64.powf(2.0 * i as f64 / 8.0),
        1.0,
    );
    assert_close(&x, &want, 1e-5);
}

#[test]
fn yarn_matches_hand_computed_ramp() {
    // n_dims 8, base 1e4, n_ctx_orig 4096, betas 32/1:
    // dim(32) = 8 ln(4096 / 64π) / (2 ln 1e4) = 1.309 -> low 1; dim(1) = 2.814 -> high 3.
    let corr = yarn_corr_dims(8, 4096, 10000.0, 32.0, 1.0);
    assert_eq!(corr, [1.0, 3.0]);
    let p = RopeParams {
        freq_scale: 0.25,
        ext_factor: 1.0,
        attn_factor: 0.9,
        n_ctx_orig: 4096,
        ..RopeParams::plain(RopeMode::Neox, 8, 10000.0)
    };
    let x0 = random(8 * 2, 5);
    let mut x = x0.clone();
    rope(&mut x, 8, 2, &[300], &p).unwrap();
    // ramp by pair: i=0 -> 1, i=1 -> 1, i=2 -> 0.5, i=3 -> 0
    let ramp = [1.0, 1.0, 0.5, 0.0];
    let mag = 0.9 * (1.0 + 0.1 * 4f64.ln());
    let pairs: Vec<(usize, usize)> = (0..4).map(|i| (i, i + 4)).collect();
    let theta = |i: usize| {
        let extrap = 300.0 / 10000f64.powf(2.0 * i as f64 / 8.0);
        let interp = 0.25 * extrap;
        interp * (1.0 - ramp[i]) + extrap * ramp[i]
    };
    let mut want = rope_head_f64(&x0[..8], &pairs, theta, mag);
    want.extend(rope_head_f64(&x0[8..], &pairs, theta, mag));
    assert_close(&x, &want, 1e-5);
}

#[test]
fn linear_scaling_without_yarn() {
    let p = RopeParams {
        freq_scale: 0.5,
        attn_factor: 2.0,
        ..RopeParams::plain(RopeMode::Norm, 2, 10000.0)
    };
    let mut x = vec![1.0f32, 0.0];
    rope(&mut x, 2, 1, &[4], &p).unwrap();
    assert_close(&x, &[2.0 * 2f64.cos(), 2.0 * 2f64.sin()], 1e-6);
}

#[test]
fn bad_parameters_are_named_errors() {
    let mut x = vec![0.0f32; 12];
    let p = RopeParams::plain(RopeMode::Neox, 4, 10000.0);
    assert!(matches!(
        rope(&mut x, 4, 1, &[0, 1], &p),
        Err(OpError::Length { .. })
    ));
    assert!(matches!(
        rope(&mut x, 5, 1, &[0, 1], &p),
        Err(OpError::NotWholeRows { .. })
    ));
    let odd = RopeParams::plain(RopeMode::Neox, 3, 10000.0);
    assert!(matches!(
        rope(&mut x, 4, 1, &[0, 1, 2], &odd),
        Err(OpError::Parameter { .. })
    ));
    let wide = RopeParams::plain(RopeMode::Neox, 6, 10000.0);
    assert!(matches!(
        rope(&mut x, 4, 1, &[0, 1, 2], &wide),
        Err(OpError::Parameter { .. })
    ));
    let zero = RopeParams::plain(RopeMode::Imrope { sections: [0; 4] }, 4, 10000.0);
    assert!(matches!(
        rope(&mut x, 4, 1, &[0, 1, 2], &zero),
        Err(OpError::Parameter { .. })
    ));
    // four planes are only for imrope
    assert!(rope(&mut x, 4, 1, &[0; 12], &p).is_err());
}
