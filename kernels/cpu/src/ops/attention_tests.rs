//! Tests of [`super::attention`] and [`super::store_kv`] against an independent f64 attention.

use super::*;
use bloomery_plugin_api::DType;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// `n` values drawn uniformly from [-1.5, 1.5).
pub(super) fn random(n: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.5f32..1.5)).collect()
}

/// A filled test cache: `n_slots` sequences of `seq_len` tokens, K and V stored with `store_kv`.
struct Fixture {
    k: Vec<f32>,
    v: Vec<f32>,
    k16: Vec<f16>,
    v16: Vec<f16>,
}

fn params(
    n_head: usize,
    n_head_kv: usize,
    dk: usize,
    dv: usize,
    cache_len: usize,
    n_slots: usize,
) -> AttentionParams<'static> {
    AttentionParams {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
        cache_len,
        n_slots,
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

fn fill(p: &AttentionParams, seq_len: usize, seed: u64) -> Fixture {
    let mut rng = StdRng::seed_from_u64(seed);
    let (kw, vw) = (p.head_dim_k * p.n_head_kv, p.head_dim_v * p.n_head_kv);
    let rows = p.cache_len * p.n_slots;
    let mut f = Fixture {
        k: vec![0.0; kw * rows],
        v: vec![0.0; vw * rows],
        k16: vec![f16::ZERO; kw * rows],
        v16: vec![f16::ZERO; vw * rows],
    };
    for slot in 0..p.n_slots as u32 {
        for pos in 0..seq_len as i32 {
            let (k, v) = (random(kw, &mut rng), random(vw, &mut rng));
            let (c, n) = (p.cache_len, p.n_slots);
            store_kv(&k, kw, &[slot], &[pos], KvCacheMut::F32(&mut f.k), c, n).unwrap();
            store_kv(&v, vw, &[slot], &[pos], KvCacheMut::F32(&mut f.v), c, n).unwrap();
            store_kv(&k, kw, &[slot], &[pos], KvCacheMut::F16(&mut f.k16), c, n).unwrap();
            store_kv(&v, vw, &[slot], &[pos], KvCacheMut::F16(&mut f.v16), c, n).unwrap();
        }
    }
    f
}

/// Straightforward f64 attention: for each row and head, gather the visible tokens, softmax, mix.
fn reference(
    q: &[f32],
    slots: &[u32],
    pos: &[i32],
    k: &[f64],
    v: &[f64],
    p: &AttentionParams,
) -> Vec<f64> {
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    let mut out = Vec::new();
    for r in 0..slots.len() {
        for h in 0..p.n_head {
            let kvh = h * p.n_head_kv / p.n_head;
            let first = p
                .window
                .map_or(0, |w| (pos[r] as i64 - w as i64 + 1).max(0));
            let mut logits = Vec::new();
            let mut values = Vec::new();
            for t in first..=pos[r] as i64 {
                let row = slots[r] as usize * p.cache_len + t as usize % p.cache_len;
                let kr = &k[row * dk * p.n_head_kv + kvh * dk..][..dk];
                let qr = &q[(r * p.n_head + h) * dk..][..dk];
                let mut s: f64 =
                    qr.iter().zip(kr).map(|(&a, &b)| a as f64 * b).sum::<f64>() * p.scale as f64;
                if let Some(c) = p.softcap {
                    s = c as f64 * (s / c as f64).tanh();
                }
                logits.push(s);
                values.push(&v[row * dv * p.n_head_kv + kvh * dv..][..dv]);
            }
            let sink = p.sinks.map(|s| s[h] as f64);
            let m = logits
                .iter()
                .cloned()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let denom: f64 = logits.iter().map(|s| (s - m).exp()).sum::<f64>()
                + sink.map_or(0.0, |s| (s - m).exp());
            for i in 0..dv {
                out.push(
                    logits
                        .iter()
                        .zip(&values)
                        .map(|(s, val)| (s - m).exp() * val[i])
                        .sum::<f64>()
                        / denom,
                );
            }
        }
    }
    out
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn widen16(x: &[f16]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// One attention call into a fresh output (NaN where the call writes nothing).
pub(super) fn run(
    q: &[f32],
    slots: &[u32],
    pos: &[i32],
    k: KvCache,
    v: KvCache,
    p: &AttentionParams,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; p.head_dim_v * p.n_head * slots.len()];
    attention(q, slots, pos, k, v, p, &mut out).unwrap();
    out
}

/// Every value of `a` within `tol` of `b`'s.
pub(super) fn assert_close(a: &[f32], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!((x as f64 - y).abs() <= tol, "at {i}: {x} vs {y}");
    }
}

#[test]
fn matches_f64_for_gqa_f32_and_f16_caches() {
    // odd dk 7, dv 5, GQA 6/2, 3 slots, 7 rows mixing slots and positions
    let mut p = params(6, 2, 7, 5, 16, 3);
    let f = fill(&p, 12, 1);
    let mut rng = StdRng::seed_from_u64(2);
    let slots = [0u32, 2, 1, 0, 2, 2, 1];
    let pos = [0i32, 11, 5, 7, 3, 4, 11];
    let q = random(7 * 6 * 7, &mut rng);
    for softcap in [None, Some(0.8f32)] {
        p.softcap = softcap;
        let got = run(&q, &slots, &pos, KvCache::F32(&f.k), KvCache::F32(&f.v), &p);
        assert_close(
            &got,
            &reference(&q, &slots, &pos, &widen(&f.k), &widen(&f.v), &p),
            1e-5,
        );
        let got16 = run(
            &q,
            &slots,
            &pos,
            KvCache::F16(&f.k16),
            KvCache::F16(&f.v16),
            &p,
        );
        assert_close(
            &got16,
            &reference(&q, &slots, &pos, &widen16(&f.k16), &widen16(&f.v16), &p),
            1e-5,
        );
        // and the f16 cache is close to the f32 one
        assert!(got.iter().zip(&got16).all(|(a, b)| (a - b).abs() < 5e-3));
    }
    // a single row, n_head_kv == n_head
    let p1 = params(3, 3, 7, 5, 16, 1);
    let f1 = fill(&p1, 4, 3);
    let q1 = random(7 * 3, &mut rng);
    let got = run(
        &q1,
        &[0],
        &[3],
        KvCache::F32(&f1.k),
        KvCache::F32(&f1.v),
        &p1,
    );
    assert_close(
        &got,
        &reference(&q1, &[0], &[3], &widen(&f1.k), &widen(&f1.v), &p1),
        1e-5,
    );
}

#[test]
fn batch_of_two_sequences_equals_each_alone() {
    let p = params(4, 1, 9, 9, 10, 2);
    let f = fill(&p, 10, 4);
    let mut rng = StdRng::seed_from_u64(5);
    let (slots, pos) = ([1u32, 0, 1, 0, 1], [7i32, 2, 8, 3, 9]);
    let q = random(9 * 4 * 5, &mut rng);
    let (k, v) = (KvCache::F32(&f.k), KvCache::F32(&f.v));
    let batched = run(&q, &slots, &pos, k, v, &p);
    let row = 9 * 4;
    for r in 0..5 {
        let alone = run(&q[r * row..][..row], &slots[r..=r], &pos[r..=r], k, v, &p);
        assert_eq!(&batched[r * row..][..row], &alone[..], "row {r}");
    }
}

#[test]
fn each_group_of_heads_alone_equals_the_whole_call() {
    // GQA 6/2 with sinks, softcap and a window, f16 K and f32 V: every (row, KV head) group
    // through attention_group is the matching part of attention's output, bit for bit.
    let sinks = [0.2f32, -0.4, 1.0, 0.0, -2.0, 0.7];
    let p = AttentionParams {
        softcap: Some(0.9),
        window: Some(6),
        sinks: Some(&sinks),
        ..params(6, 2, 7, 5, 16, 3)
    };
    let f = fill(&p, 12, 11);
    let mut rng = StdRng::seed_from_u64(12);
    let (slots, pos) = ([2u32, 0, 1], [11i32, 4, 9]);
    let q = random(7 * 6 * 3, &mut rng);
    let (k, v) = (KvCache::F16(&f.k16), KvCache::F32(&f.v));
    let whole = run(&q, &slots, &pos, k, v, &p);
    assert_close(
        &whole,
        &reference(&q, &slots, &pos, &widen16(&f.k16), &widen(&f.v), &p),
        1e-5,
    );
    for r in 0..3 {
        for kvh in 0..2 {
            let heads = r * 6 + kvh * 3;
            let mut out = vec![f32::NAN; 5 * 3];
            let q_group = &q[heads * 7..][..7 * 3];
            attention_group(q_group, r, slots[r], pos[r], kvh, k, v, &p, &mut out).unwrap();
            assert_eq!(
                &whole[heads * 5..][..5 * 3],
                &out[..],
                "row {r}, kv head {kvh}"
            );
        }
    }
    let mut out = vec![0.0; 5 * 3];
    let e = attention_group(&q[..7 * 3], 0, 0, 3, 2, k, v, &p, &mut out).unwrap_err();
    assert!(e.to_string().contains("kv head"), "{e}");
}

#[test]
fn causal_mask_and_window_are_respected() {
    let mut p = params(2, 1, 4, 3, 12, 1);
    let f = fill(&p, 12, 6);
    let mut rng = StdRng::seed_from_u64(7);
    let q = random(4 * 2, &mut rng);
    let (pos, window) = (8i32, 3usize);
    for w in [None, Some(window)] {
        p.window = w;
        let base = run(&q, &[0], &[pos], KvCache::F32(&f.k), KvCache::F32(&f.v), &p);
        assert_close(
            &base,
            &reference(&q, &[0], &[pos], &widen(&f.k), &widen(&f.v), &p),
            1e-5,
        );
        let first_visible = w.map_or(0, |w| pos as usize + 1 - w);
        for t in 0..12 {
            let mut v = f.v.clone();
            v[t * 3..][..3].iter_mut().for_each(|x| *x += 10.0);
            let moved = run(&q, &[0], &[pos], KvCache::F32(&f.k), KvCache::F32(&v), &p) != base;
            let visible = t >= first_visible && t <= pos as usize;
            assert_eq!(moved, visible, "window {w:?}, token {t}");
        }
    }
    // window smaller than the sequence on a ring cache of exactly the window: positions wrap
    let mut ring = params(2, 1, 4, 3, 3, 1);
    ring.window = Some(3);
    let fr = fill(&ring, 9, 6); // tokens 6, 7, 8 remain, at rows 0, 1, 2
    let got = run(
        &q,
        &[0],
        &[8],
        KvCache::F32(&fr.k),
        KvCache::F32(&fr.v),
        &ring,
    );
    assert_close(
        &got,
        &reference(&q, &[0], &[8], &widen(&fr.k), &widen(&fr.v), &ring),
        1e-5,
    );
    ring.window = None; // without the window, position 8 would need 9 rows
    let mut out = vec![0.0; 6];
    let r = attention(
        &q,
        &[0],
        &[8],
        KvCache::F32(&fr.k),
        KvCache::F32(&fr.v),
        &ring,
        &mut out,
    );
    assert!(matches!(r, Err(OpError::Parameter { .. })));
}

#[test]
fn sinks_shrink_the_output_by_the_sink_probability() {
    let mut p = params(2, 2, 6, 4, 8, 1);
    let f = fill(&p, 6, 8);
    let mut rng = StdRng::seed_from_u64(9);
    let q = random(6 * 2, &mut rng);
    let plain = run(&q, &[0], &[5], KvCache::F32(&f.k), KvCache::F32(&f.v), &p);
    let sinks = [0.3f32, -100.0];
    p.sinks = Some(&sinks);
    let sunk = run(&q, &[0], &[5], KvCache::F32(&f.k), KvCache::F32(&f.v), &p);
    assert_close(
        &sunk,
        &reference(&q, &[0], &[5], &widen(&f.k), &widen(&f.v), &p),
        1e-5,
    );
    // head 0: out = plain * Z / (Z + e^sink) with Z = Σ e^s; head 1's sink is negligible
    let (k, _) = (widen(&f.k), ());
    let z: f64 = (0..6)
        .map(|t| {
            let s: f64 = (0..6).map(|i| q[i] as f64 * k[t * 12 + i]).sum::<f64>() * p.scale as f64;
            s.exp()
        })
        .sum();
    let shrink = z / (z + 0.3f64.exp());
    for i in 0..4 {
        assert!((sunk[i] as f64 - plain[i] as f64 * shrink).abs() < 1e-5);
        assert!((sunk[4 + i] - plain[4 + i]).abs() < 1e-6);
    }
    let huge = [60.0f32, 60.0];
    p.sinks = Some(&huge);
    let gone = run(&q, &[0], &[5], KvCache::F32(&f.k), KvCache::F32(&f.v), &p);
    assert!(gone.iter().all(|x| x.abs() < 1e-20));
}

#[test]
fn store_writes_at_position_modulo_cache_len() {
    let mut cache = vec![0.0f32; 2 * 4 * 2];
    store_kv(
        &[1.0, 2.0, 3.0, 4.0],
        2,
        &[1, 0],
        &[5, 2],
        KvCacheMut::F32(&mut cache),
        4,
        2,
    )
    .unwrap();
    // slot 1, row 5 % 4 = 1 -> offset (1 * 4 + 1) * 2 = 10; slot 0 row 2 -> 4
    assert_eq!(&cache[10..12], &[1.0, 2.0]);
    assert_eq!(&cache[4..6], &[3.0, 4.0]);
    let mut c16 = vec![f16::ZERO; 16];
    store_kv(
        &[0.1, 65504.0],
        2,
        &[0],
        &[0],
        KvCacheMut::F16(&mut c16),
        4,
        2,
    )
    .unwrap();
    assert_eq!(c16[0], f16::from_f32(0.1));
    assert_eq!(c16[1].to_f32(), 65504.0);
    let bad_slot = store_kv(&[0.0; 2], 2, &[2], &[0], KvCacheMut::F32(&mut cache), 4, 2);
    assert!(matches!(bad_slot, Err(OpError::Index { .. })));
    let neg = store_kv(&[0.0; 2], 2, &[0], &[-1], KvCacheMut::F32(&mut cache), 4, 2);
    assert!(matches!(neg, Err(OpError::Parameter { .. })));
    let short = store_kv(
        &[0.0; 2],
        2,
        &[0],
        &[0],
        KvCacheMut::F32(&mut cache[..15]),
        4,
        2,
    );
    assert!(matches!(short, Err(OpError::Length { .. })));
}

#[test]
fn bad_shapes_are_named_errors() {
    let p = params(4, 3, 2, 2, 4, 1);
    let kv = vec![0.0f32; 2 * 3 * 4];
    let mut out = vec![0.0f32; 8];
    let r = attention(
        &[0.0; 8],
        &[0],
        &[0],
        KvCache::F32(&kv),
        KvCache::F32(&kv),
        &p,
        &mut out,
    );
    assert!(matches!(r, Err(OpError::Parameter { .. })));
    let p = params(2, 1, 2, 2, 4, 1);
    let kv = vec![0.0f32; 2 * 4];
    let mut out = vec![0.0f32; 4];
    let q = [0.0f32; 4];
    let r = attention(
        &q,
        &[1],
        &[0],
        KvCache::F32(&kv),
        KvCache::F32(&kv),
        &p,
        &mut out,
    );
    assert!(matches!(r, Err(OpError::Index { .. })));
    let r = attention(
        &q,
        &[0],
        &[0, 1],
        KvCache::F32(&kv),
        KvCache::F32(&kv),
        &p,
        &mut out,
    );
    assert!(matches!(r, Err(OpError::Length { .. })));
    let r = attention(
        &q,
        &[0],
        &[4],
        KvCache::F32(&kv),
        KvCache::F32(&kv),
        &p,
        &mut out,
    );
    assert!(matches!(r, Err(OpError::Parameter { .. })));
    let r = attention(
        &q,
        &[0],
        &[0],
        KvCache::F32(&kv[..7]),
        KvCache::F32(&kv),
        &p,
        &mut out,
    );
    assert!(matches!(r, Err(OpError::Length { .. })));
}

/// `x` stored row by row into a fresh cache of quantized type `t` (`width` per row), and the
/// cache's bytes dequantized back to f64.
fn quantized(t: DType, x: &[f32], width: usize, rows: usize) -> (Vec<u8>, Vec<f64>) {
    let row = t.row_bytes(width as u64).unwrap() as usize;
    let mut bytes = vec![0u8; row * rows];
    for r in 0..rows {
        store_kv(
            &x[r * width..][..width],
            width,
            &[0],
            &[r as i32],
            KvCacheMut::Quant(t, &mut bytes),
            rows,
            1,
        )
        .unwrap();
    }
    let mut back = vec![0f32; width * rows];
    quant::dequantize_row(t, &bytes, &mut back).unwrap();
    (bytes, widen(&back))
}

#[test]
fn quantized_caches_match_f64_over_their_dequantized_values() {
    // 4 heads over 2 KV heads of 64, 40 positions of one slot; K and V of independent types.
    let p = params(4, 2, 64, 64, 40, 1);
    let f = fill(&p, 40, 9);
    let mut rng = StdRng::seed_from_u64(10);
    let q = random(3 * 4 * 64, &mut rng);
    let (slots, pos) = ([0u32, 0, 0], [0i32, 17, 39]);
    let types = &quant::KV_CACHE_TYPES[2..];
    for (i, &kt) in types.iter().enumerate() {
        // Every type as K, each beside another type as V (and F32/F16 beside Q8_0).
        let vt = types[(i + 1) % types.len()];
        let (kb, kd) = quantized(kt, &f.k, 128, 40);
        let (vb, vd) = quantized(vt, &f.v, 128, 40);
        let got = run(
            &q,
            &slots,
            &pos,
            KvCache::Quant(kt, &kb),
            KvCache::Quant(vt, &vb),
            &p,
        );
        // The scores take q quantized to Q8_0/Q8_1 (about 0.4% of each element): the output
        // moves by far less than the quantization of the cache itself.
        let want = reference(&q, &slots, &pos, &kd, &vd, &p);
        assert_close(&got, &want, 2e-2);
        let exact_f32 = run(&q, &slots, &pos, KvCache::F32(&f.k), KvCache::F32(&f.v), &p);
        let moved = got
            .iter()
            .zip(&exact_f32)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(moved > 0.0 && moved < 0.3, "{kt}/{vt}: {moved}");
    }
    let (vb, vd) = quantized(DType::Q8_0, &f.v, 128, 40);
    let got = run(
        &q,
        &slots,
        &pos,
        KvCache::F16(&f.k16),
        KvCache::Quant(DType::Q8_0, &vb),
        &p,
    );
    assert_close(
        &got,
        &reference(&q, &slots, &pos, &widen16(&f.k16), &vd, &p),
        1e-5,
    );
}

#[test]
fn quantized_store_writes_each_row_as_llama_cpp_quantizes_it() {
    let mut rng = StdRng::seed_from_u64(11);
    let width = 64;
    for t in &quant::KV_CACHE_TYPES[2..] {
        let row = t.row_bytes(width as u64).unwrap() as usize;
        let x = random(width * 3, &mut rng);
        // Three rows into slots 1, 0, 1 at positions 5, 2, 2 of a [64, 4, 2] cache.
        let mut cache = vec![0xaau8; row * 8];
        store_kv(
            &x,
            width,
            &[1, 0, 1],
            &[5, 2, 2],
            KvCacheMut::Quant(*t, &mut cache),
            4,
            2,
        )
        .unwrap();
        for (r, at) in [(0, 4 + 1), (1, 2), (2, 4 + 2)] {
            let mut want = vec![0u8; row];
            quant::quantize_kv_row(*t, &x[r * width..][..width], &mut want).unwrap();
            assert_eq!(&cache[at * row..][..row], &want[..], "{t} row {r}");
        }
        // Untouched rows keep their bytes.
        assert!(cache[..row].iter().all(|&b| b == 0xaa), "{t}");
        // A row that is not whole blocks is refused by name.
        let mut small = vec![0u8; 2 * row];
        let e = store_kv(
            &[0.0; 48],
            48,
            &[0],
            &[0],
            KvCacheMut::Quant(*t, &mut small),
            1,
            1,
        );
        assert!(e.unwrap_err().to_string().contains("multiple of 32"), "{t}");
    }
}

#[test]
fn q8_0_cache_rows_round_ties_to_even_as_llama_cpp_x86_store() {
    // max|x| = 127 makes x · (127 / max) = x exactly: 2.5 and -0.5 are ties, which llama.cpp's
    // x86 store rounds to even (2, -0), where the reference quantizer rounds away (3, -1).
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -0.5;
    let mut cache = vec![0u8; 34];
    store_kv(
        &x,
        32,
        &[0],
        &[0],
        KvCacheMut::Quant(DType::Q8_0, &mut cache),
        1,
        1,
    )
    .unwrap();
    assert_eq!([cache[2 + 1] as i8, cache[2 + 2] as i8], [2, 0]);
}

/// `x` stored row by row, rotated in chunks of `rot`, into a fresh cache of quantized type `t`.
fn quantized_rotated(t: DType, x: &[f32], width: usize, rows: usize, rot: usize) -> Vec<u8> {
    let row = t.row_bytes(width as u64).unwrap() as usize;
    let mut bytes = vec![0u8; row * rows];
    let slots = vec![0u32; rows];
    let pos: Vec<i32> = (0..rows as i32).collect();
    let cache = KvCacheMut::Quant(t, &mut bytes);
    store_kv_rotated(x, width, &slots, &pos, cache, rows, 1, rot).unwrap();
    bytes
}

#[test]
fn rotated_quantized_caches_attend_as_the_unrotated_values() {
    // Q4_0 K and V rotated in chunks of 64 (llama.cpp's rotation): attention rotates q before
    // scoring and each output back, so the result approximates attention over the f32 values,
    // as closely as the unrotated cache does; reading the rotated cache without the rotations
    // does not.
    let p = params(4, 2, 64, 64, 40, 1);
    let f = fill(&p, 40, 21);
    let mut rng = StdRng::seed_from_u64(22);
    let q = random(3 * 4 * 64, &mut rng);
    let (slots, pos) = ([0u32, 0, 0], [0i32, 17, 39]);
    let exact = run(&q, &slots, &pos, KvCache::F32(&f.k), KvCache::F32(&f.v), &p);
    let dist = |a: &[f32]| {
        a.iter()
            .zip(&exact)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let t = DType::Q4_0;
    let (kr, vr) = (
        quantized_rotated(t, &f.k, 128, 40, 64),
        quantized_rotated(t, &f.v, 128, 40, 64),
    );
    let rotated = AttentionParams {
        rot_k: 64,
        rot_v: 64,
        ..p
    };
    let (kc, vc) = (KvCache::Quant(t, &kr), KvCache::Quant(t, &vr));
    let with = run(&q, &slots, &pos, kc, vc, &rotated);
    let without = run(&q, &slots, &pos, kc, vc, &p);
    let (kp, vp) = (
        quantized_rotated(t, &f.k, 128, 40, 0),
        quantized_rotated(t, &f.v, 128, 40, 0),
    );
    let plain = run(
        &q,
        &slots,
        &pos,
        KvCache::Quant(t, &kp),
        KvCache::Quant(t, &vp),
        &p,
    );
    let (d_with, d_plain, d_without) = (dist(&with), dist(&plain), dist(&without));
    assert!(d_with < 0.3 && d_plain < 0.3, "{d_with} {d_plain}");
    assert!(d_without > 3.0 * d_with, "{d_without} vs {d_with}");
    // A chunk that is not a power of two dividing the head is refused.
    let bad = AttentionParams { rot_k: 48, ..p };
    let mut out = vec![0f32; 3 * 4 * 64];
    assert!(attention(&q, &slots, &pos, kc, vc, &bad, &mut out).is_err());
    let mut bytes = vec![0u8; 40 * 72];
    let cache = KvCacheMut::Quant(t, &mut bytes);
    assert!(store_kv_rotated(&f.k[..128], 128, &[0], &[0], cache, 40, 1, 96).is_err());
}
