//! Tests of [`super::route`] against an independent f64 router built on sorting.

use super::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn random(n: usize, seed: u64, range: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-range..range)).collect()
}

/// f64 router of one row: returns (ids, weights).
fn reference(row: &[f32], p: &RouterParams) -> (Vec<i32>, Vec<f64>) {
    let n = row.len();
    let l: Vec<f64> = row.iter().map(|&v| v as f64).collect();
    let score: Vec<f64> = match p.gating {
        Gating::Softmax => {
            let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = l.iter().map(|v| (v - m).exp()).sum();
            l.iter().map(|v| (v - m).exp() / s).collect()
        }
        Gating::Sigmoid => l.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
        Gating::SoftmaxSelected => l.clone(),
        Gating::SqrtSoftplus => l.iter().map(|v| (1.0 + v.exp()).ln().sqrt()).collect(),
    };
    let biased: Vec<f64> = (0..n)
        .map(|e| score[e] + p.bias.map_or(0.0, |b| b[e] as f64))
        .collect();
    let mut allowed = vec![true; n];
    if let Some(g) = p.groups {
        let size = n / g.n_group;
        let mut gs: Vec<(f64, usize)> = (0..g.n_group)
            .map(|gi| {
                let mut v: Vec<f64> = biased[gi * size..(gi + 1) * size].to_vec();
                v.sort_by(|a, b| b.partial_cmp(a).unwrap());
                (v.iter().take(2).sum(), gi)
            })
            .collect();
        gs.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
        let keep: Vec<usize> = gs.iter().take(g.topk_group).map(|x| x.1).collect();
        for (e, a) in allowed.iter_mut().enumerate() {
            *a = keep.contains(&(e / size));
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&e| allowed[e]).collect();
    order.sort_by(|&a, &b| biased[b].partial_cmp(&biased[a]).unwrap().then(a.cmp(&b)));
    let chosen: Vec<usize> = order[..p.k].to_vec();
    let mut w: Vec<f64> = chosen.iter().map(|&e| score[e]).collect();
    if p.gating == Gating::SoftmaxSelected {
        let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = w.iter().map(|v| (v - m).exp()).sum();
        w = w.iter().map(|v| (v - m).exp() / s).collect();
    }
    let sum: f64 = w.iter().sum();
    let d = match p.renorm {
        Renorm::Off => 1.0,
        Renorm::SumPlus(eps) => sum + eps as f64,
        Renorm::SumAtLeast(m) => sum.max(m as f64),
    };
    (
        chosen.iter().map(|&e| e as i32).collect(),
        w.iter().map(|v| v / d * p.scale as f64).collect(),
    )
}

fn check(logits: &[f32], p: &RouterParams) -> (Vec<i32>, Vec<f32>) {
    let n_rows = logits.len() / p.n_expert;
    let mut ids = vec![-1; p.k * n_rows];
    let mut w = vec![f32::NAN; p.k * n_rows];
    route(logits, p, &mut ids, &mut w).unwrap();
    for (r, row) in logits.chunks(p.n_expert).enumerate() {
        let (want_ids, want_w) = reference(row, p);
        assert_eq!(&ids[r * p.k..(r + 1) * p.k], &want_ids[..], "row {r}");
        for (a, b) in w[r * p.k..(r + 1) * p.k].iter().zip(&want_w) {
            assert!(
                (*a as f64 - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "row {r}: {a} vs {b}"
            );
        }
    }
    (ids, w)
}

fn params(n_expert: usize, k: usize, gating: Gating) -> RouterParams<'static> {
    RouterParams {
        n_expert,
        k,
        gating,
        bias: None,
        groups: None,
        renorm: Renorm::Off,
        scale: 1.0,
    }
}

#[test]
fn each_gating_function_matches_f64() {
    let logits = random(37 * 7, 1, 4.0);
    for gating in [
        Gating::Softmax,
        Gating::Sigmoid,
        Gating::SoftmaxSelected,
        Gating::SqrtSoftplus,
    ] {
        for renorm in [
            Renorm::Off,
            Renorm::SumPlus(0.0),
            Renorm::SumPlus(1e-20),
            Renorm::SumAtLeast(6.1e-5),
        ] {
            for k in [1, 5] {
                check(
                    &logits,
                    &RouterParams {
                        renorm,
                        scale: 2.5,
                        ..params(37, k, gating)
                    },
                );
            }
        }
    }
    assert_eq!(Gating::from_gguf(4), Some(Gating::SqrtSoftplus));
    assert_eq!(Gating::from_gguf(0), None);
}

#[test]
fn bias_only_affects_selection() {
    let logits = vec![2.0f32, 1.0, 0.0, -1.0, -2.0];
    let bias = [0.0f32, 0.0, 0.0, 0.0, 10.0]; // expert 4 forced in
    let p = RouterParams {
        bias: Some(&bias),
        ..params(5, 2, Gating::Sigmoid)
    };
    let (ids, w) = check(&logits, &p);
    assert_eq!(ids, vec![4, 0]);
    let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
    assert!(
        (w[0] - sig(-2.0)).abs() < 1e-6 && (w[1] - sig(2.0)).abs() < 1e-6,
        "{w:?}"
    );
    let logits = random(64 * 7, 2, 3.0);
    let bias = random(64, 3, 0.5);
    for gating in [Gating::Sigmoid, Gating::SqrtSoftplus, Gating::Softmax] {
        check(
            &logits,
            &RouterParams {
                bias: Some(&bias),
                renorm: Renorm::SumPlus(1e-20),
                ..params(64, 6, gating)
            },
        );
    }
}

#[test]
fn groups_keep_the_best_groups_by_top2_sum() {
    // 4 groups of 3. Group 0 has the single best expert but a weak second; group 2 has two good ones.
    let logits = vec![
        5.0, -5.0, -5.0, // g0: top-2 sum 0
        1.0, 1.0, -5.0, // g1: 2
        2.0, 2.0, -5.0, // g2: 4
        0.5, 0.5, 0.5, // g3: 1
    ];
    let p = RouterParams {
        groups: Some(Groups {
            n_group: 4,
            topk_group: 2,
        }),
        ..params(12, 3, Gating::SoftmaxSelected)
    };
    let (ids, _) = check(&logits, &p);
    assert_eq!(ids, vec![6, 7, 3]); // expert 0 (logit 5) is in a dropped group
    let logits = random(256 * 7, 4, 3.0);
    let bias = random(256, 5, 0.3);
    let v3 = RouterParams {
        bias: Some(&bias),
        groups: Some(Groups {
            n_group: 8,
            topk_group: 4,
        }),
        renorm: Renorm::SumPlus(0.0),
        scale: 2.5,
        ..params(256, 8, Gating::Sigmoid)
    };
    check(&logits, &v3);
}

#[test]
fn renorm_and_scale() {
    let logits = random(16 * 7, 6, 2.0);
    let p = RouterParams {
        renorm: Renorm::SumPlus(0.0),
        scale: 1.5,
        ..params(16, 4, Gating::Sigmoid)
    };
    let (_, w) = check(&logits, &p);
    for row in w.chunks(4) {
        assert!((row.iter().sum::<f32>() - 1.5).abs() < 1e-5);
    }
    let p = RouterParams {
        renorm: Renorm::SumAtLeast(100.0),
        ..params(16, 4, Gating::Sigmoid)
    };
    let (_, w) = check(&logits, &p);
    assert!(w.iter().sum::<f32>() < 7.0 * 4.0 / 100.0 + 1e-4);
}

#[test]
fn ties_go_to_the_lower_id() {
    let logits = vec![1.0f32, 3.0, 3.0, 0.0, 3.0, 1.0];
    let (ids, _) = check(&logits, &params(6, 4, Gating::Sigmoid));
    assert_eq!(ids, vec![1, 2, 4, 0]);
    // groups tied on score: the lower group index is kept
    let logits = vec![1.0f32, 1.0, 1.0, 1.0];
    let p = RouterParams {
        groups: Some(Groups {
            n_group: 2,
            topk_group: 1,
        }),
        ..params(4, 2, Gating::Sigmoid)
    };
    let (ids, _) = check(&logits, &p);
    assert_eq!(ids, vec![0, 1]);
    // NaN ranks last instead of poisoning the choice
    let logits = vec![f32::NAN, 0.5, 0.25];
    let mut ids = [0i32; 2];
    let mut w = [0f32; 2];
    route(&logits, &params(3, 2, Gating::Sigmoid), &mut ids, &mut w).unwrap();
    assert_eq!(ids, [1, 2]);
}

#[test]
fn bad_parameters_are_named_errors() {
    let logits = vec![0.0f32; 12];
    let (mut ids, mut w) = (vec![0i32; 8], vec![0f32; 8]);
    let too_many = params(6, 7, Gating::Softmax);
    assert!(matches!(
        route(&logits, &too_many, &mut ids[..], &mut w[..]),
        Err(OpError::Length { .. })
    ));
    let p = params(6, 4, Gating::Softmax);
    assert!(matches!(
        route(&logits, &p, &mut ids[..7], &mut w[..8]),
        Err(OpError::Length { .. })
    ));
    let g = RouterParams {
        groups: Some(Groups {
            n_group: 4,
            topk_group: 2,
        }),
        ..params(6, 4, Gating::Softmax)
    };
    assert!(matches!(
        route(&logits, &g, &mut ids, &mut w),
        Err(OpError::Parameter { .. })
    ));
    let g = RouterParams {
        groups: Some(Groups {
            n_group: 3,
            topk_group: 1,
        }),
        ..params(6, 4, Gating::Softmax)
    };
    assert!(matches!(
        route(&logits, &g, &mut ids, &mut w),
        Err(OpError::Parameter { .. })
    ));
    let k7 = params(6, 7, Gating::Softmax);
    let (mut i14, mut w14) = (vec![0i32; 14], vec![0f32; 14]);
    assert!(matches!(
        route(&logits, &k7, &mut i14, &mut w14),
        Err(OpError::Parameter { .. })
    ));
}
