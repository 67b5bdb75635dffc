//! Tests of latent attention (values from the keys, `v_from_k`) and sparse selection against an
//! f64 attention that decides each position's visibility on its own.

use super::tests::{assert_close, random, run};
use super::*;
use rand::{rngs::StdRng, SeedableRng};

fn params(
    n_head: usize,
    n_head_kv: usize,
    dk: usize,
    dv: usize,
    len: usize,
) -> AttentionParams<'static> {
    AttentionParams {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
        cache_len: len,
        n_slots: 2,
        scale: 1.0 / (dk as f32).sqrt(),
        softcap: None,
        window: None,
        sinks: None,
        rot_k: 0,
        rot_v: 0,
        v_from_k: false,
        selected: None,
        comp: None,
    }
}

/// f64 attention: row `r` sees position `t` when `sees(r, t)`; head `h`'s values are the first
/// `dv` of its KV head's key row (`v` is `None`) or its V row.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    slots: &[u32],
    pos: &[i32],
    k: &[f64],
    v: Option<&[f64]>,
    p: &AttentionParams,
    sees: &dyn Fn(usize, usize) -> bool,
) -> Vec<f64> {
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    let mut out = Vec::new();
    for r in 0..slots.len() {
        for h in 0..p.n_head {
            let kvh = h * p.n_head_kv / p.n_head;
            let mut logits = Vec::new();
            let mut values = Vec::new();
            for t in (0..=pos[r] as usize).filter(|&t| sees(r, t)) {
                let row = slots[r] as usize * p.cache_len + t % p.cache_len;
                let kr = &k[(row * p.n_head_kv + kvh) * dk..][..dk];
                let qr = &q[(r * p.n_head + h) * dk..][..dk];
                let s: f64 = qr.iter().zip(kr).map(|(&a, &b)| f64::from(a) * b).sum();
                logits.push(s * f64::from(p.scale));
                values.push(match v {
                    Some(v) => &v[(row * p.n_head_kv + kvh) * dv..][..dv],
                    None => &kr[..dv],
                });
            }
            let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let denom: f64 = logits.iter().map(|s| (s - m).exp()).sum();
            for i in 0..dv {
                let num: f64 = logits
                    .iter()
                    .zip(&values)
                    .map(|(s, v)| (s - m).exp() * v[i])
                    .sum();
                out.push(if denom > 0.0 { num / denom } else { 0.0 });
            }
        }
    }
    out
}

/// A random K cache of `p`'s shape (f32, and the same values through f16), and the f16 one
/// widened to f64.
fn keys(p: &AttentionParams, seed: u64) -> (Vec<f32>, Vec<f16>, Vec<f64>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let k = random(
        p.head_dim_k * p.n_head_kv * p.cache_len * p.n_slots,
        &mut rng,
    );
    let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
    let k16_64 = k16.iter().map(|x| x.to_f64()).collect();
    (k, k16, k16_64)
}

#[test]
fn latent_values_are_the_keys_first_dims() {
    // GLM-5.3's latent layer (dk = dv = 512, one KV head, scale 1/sqrt(256)) with 4 of its 64
    // heads, and a general dv < dk with two KV heads.
    for (nh, nkv, dk, dv, scale) in [(4, 1, 512, 512, 1.0 / 16.0), (6, 2, 96, 64, 0.1f32)] {
        let p = AttentionParams {
            v_from_k: true,
            scale,
            ..params(nh, nkv, dk, dv, 20)
        };
        let (k, k16, k16_64) = keys(&p, 3);
        let k64: Vec<f64> = k.iter().map(|&x| f64::from(x)).collect();
        let mut rng = StdRng::seed_from_u64(4);
        let (slots, pos) = ([1u32, 0, 1], [19i32, 0, 7]);
        let q = random(dk * nh * 3, &mut rng);
        let all = |_: usize, _: usize| true;
        let got = run(&q, &slots, &pos, KvCache::F32(&k), KvCache::F32(&k), &p);
        assert_close(
            &got,
            &reference(&q, &slots, &pos, &k64, None, &p, &all),
            1e-5,
        );
        let got = run(&q, &slots, &pos, KvCache::F16(&k16), KvCache::F16(&k16), &p);
        assert_close(
            &got,
            &reference(&q, &slots, &pos, &k16_64, None, &p, &all),
            1e-5,
        );
    }
}

#[test]
fn latent_values_from_a_quantized_cache_or_wider_than_the_keys_are_refused() {
    let p = AttentionParams {
        v_from_k: true,
        ..params(2, 1, 32, 64, 4)
    };
    let k = vec![0f32; 32 * 4 * 2];
    let mut out = vec![0f32; 64 * 2];
    let e = attention(
        &[0.0; 64],
        &[0],
        &[0],
        KvCache::F32(&k),
        KvCache::F32(&k),
        &p,
        &mut out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("dv 64 <= dk 32"), "{e}");
    let p = AttentionParams {
        v_from_k: true,
        ..params(2, 1, 32, 32, 4)
    };
    let bytes = vec![0u8; 34 * 4 * 2];
    let kq = KvCache::Quant(DType::Q8_0, &bytes);
    let e = attention(&[0.0; 64], &[0], &[0], kq, kq, &p, &mut out[..64]).unwrap_err();
    assert!(e.to_string().contains("v_from_k) of a Q8_0 cache"), "{e}");
}

/// Row lists for three rows at positions 9, 4 and 12: unused entries, duplicates and positions
/// after the row's own among them.
const LISTS: [i32; 15] = [
    3, -1, 9, 3, 11, /**/ 0, 4, 2, -1, -1, /**/ 12, 1, 5, 5, 13,
];
const POS: [i32; 3] = [9, 4, 12];
const SLOTS: [u32; 3] = [0, 1, 0];

#[test]
fn a_sparse_row_sees_its_listed_positions_and_its_window() {
    for window in [None, Some(3)] {
        for (v_from_k, dv) in [(false, 24), (true, 32)] {
            let lists = Selection {
                ids: &LISTS,
                n_sel: 5,
            };
            let p = AttentionParams {
                window,
                v_from_k,
                selected: Some(lists),
                ..params(4, 2, 32, dv, 16)
            };
            let (k, k16, k16_64) = keys(&p, 8);
            let k64: Vec<f64> = k.iter().map(|&x| f64::from(x)).collect();
            let mut rng = StdRng::seed_from_u64(9);
            let v = random(dv * 2 * 16 * 2, &mut rng);
            let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
            let v16_64: Vec<f64> = v16.iter().map(|x| x.to_f64()).collect();
            let v64: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
            let q = random(32 * 4 * 3, &mut rng);
            let sees = |r: usize, t: usize| {
                let listed = LISTS[r * 5..][..5].contains(&(t as i32));
                listed || window.is_some_and(|w| t + w > POS[r] as usize)
            };
            let (vc, vc16, v_ref, v16_ref) = if v_from_k {
                (KvCache::F32(&k), KvCache::F16(&k16), None, None)
            } else {
                (
                    KvCache::F32(&v),
                    KvCache::F16(&v16),
                    Some(&v64[..]),
                    Some(&v16_64[..]),
                )
            };
            let got = run(&q, &SLOTS, &POS, KvCache::F32(&k), vc, &p);
            let want = reference(&q, &SLOTS, &POS, &k64, v_ref, &p, &sees);
            assert_close(&got, &want, 1e-5);
            let got = run(&q, &SLOTS, &POS, KvCache::F16(&k16), vc16, &p);
            let want = reference(&q, &SLOTS, &POS, &k16_64, v16_ref, &p, &sees);
            assert_close(&got, &want, 1e-5);
            // each group through attention_group is the same part of the whole call
            let whole = run(&q, &SLOTS, &POS, KvCache::F32(&k), vc, &p);
            for r in 0..3 {
                for kvh in 0..2 {
                    let heads = r * 4 + kvh * 2;
                    let mut out = vec![f32::NAN; dv * 2];
                    let qg = &q[heads * 32..][..64];
                    let (k, s, t) = (KvCache::F32(&k), SLOTS[r], POS[r]);
                    attention_group(qg, r, s, t, kvh, k, vc, &p, &mut out).unwrap();
                    assert_eq!(
                        &whole[heads * dv..][..dv * 2],
                        &out[..],
                        "row {r} group {kvh}"
                    );
                }
            }
        }
    }
}

#[test]
fn listing_every_position_equals_dense_attention_exactly() {
    let p = params(4, 1, 64, 64, 16);
    let (k, k16, _) = keys(&p, 21);
    let mut rng = StdRng::seed_from_u64(22);
    let q = random(64 * 4 * 3, &mut rng);
    // every position up to the row's own, shuffled, some twice, with later ones and -1s
    let mut ids = Vec::new();
    for &t in &POS {
        let mut row: Vec<i32> = (0..=t).rev().collect();
        row.extend([t, 0, -1, t + 1, 15]);
        row.resize(20, -1);
        ids.extend(row);
    }
    let sparse = AttentionParams {
        selected: Some(Selection {
            ids: &ids,
            n_sel: 20,
        }),
        ..p
    };
    for (kc, vc) in [
        (KvCache::F32(&k), KvCache::F32(&k)),
        (KvCache::F16(&k16), KvCache::F16(&k16)),
    ] {
        let dense = run(&q, &SLOTS, &POS, kc, vc, &p);
        assert_eq!(run(&q, &SLOTS, &POS, kc, vc, &sparse), dense);
    }
    // and a window of w equals listing the window's positions with window 0
    let windowed = AttentionParams {
        window: Some(3),
        ..p
    };
    let mut ids = Vec::new();
    for &t in &POS {
        ids.extend([t, t - 1, t - 2, -1]);
    }
    let listed = AttentionParams {
        selected: Some(Selection {
            ids: &ids,
            n_sel: 4,
        }),
        ..p
    };
    let (kc, vc) = (KvCache::F32(&k), KvCache::F32(&k));
    assert_eq!(
        run(&q, &SLOTS, &POS, kc, vc, &listed),
        run(&q, &SLOTS, &POS, kc, vc, &windowed)
    );
}

#[test]
fn a_short_selection_is_refused() {
    let p = AttentionParams {
        selected: Some(Selection {
            ids: &LISTS[..10],
            n_sel: 5,
        }),
        ..params(4, 2, 32, 32, 16)
    };
    let (k, _, _) = keys(&p, 1);
    let mut out = vec![0f32; 32 * 4 * 3];
    let e = attention(
        &[0.0; 32 * 4 * 3],
        &SLOTS,
        &POS,
        KvCache::F32(&k),
        KvCache::F32(&k),
        &p,
        &mut out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("selected"), "{e}");
}
