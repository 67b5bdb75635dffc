//! The k-pool indexer's selection (`ops::kpool`) against the f64 numpy golden
//! (host/tests/fixtures/kpool_select.json, `tests/oracle/numpy_kpool.py`): selections equal outside
//! score ties, pooled keys within 1e-6; and its own properties: a prompt in one call equals the
//! same prompt in chunks of 1, 3 and 7 rows (pools completed across calls), slots independent,
//! earlier calls' pooled keys read from the cache, −1 padding written, f16 caches, bad shapes
//! refused by name.

use bloomery_kernels_cpu::linear::Serial;
use bloomery_kernels_cpu::ops::kpool::{
    kpool_select, CacheValue, KPoolInputs, KPoolShape, Pooling,
};
use bloomery_kernels_cpu::pool::Pool;
use half::f16;
use serde_json::Value;

/// The golden's input streams: splitmix64, `((z >> 40) / 2^23 − 1)·a` (numpy_kpool.py `draw`).
fn draw(seed: u64, n: usize, a: f32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u32 << 23) as f32 - 1.0) * a
        })
        .collect()
}

/// One call's inputs.
struct Inputs {
    s: KPoolShape,
    q: Vec<f32>,
    w: Vec<f32>,
    cache: Vec<f32>,
    ape: Vec<f32>,
    slots: Vec<u32>,
    positions: Vec<i32>,
}

impl Inputs {
    /// Random inputs of `seed` (the golden's streams), every pooled section NaN (so a read of a
    /// pool nobody wrote shows).
    fn new(s: KPoolShape, seed: u64, slots: Vec<u32>, positions: Vec<i32>) -> Inputs {
        let (dh, rows) = (s.head_dim, slots.len());
        let mut cache = draw(seed + 3, 3 * dh * s.len * s.n_slots, 2.0);
        for row in cache.chunks_exact_mut(3 * dh) {
            row[2 * dh..].fill(f32::NAN);
        }
        Inputs {
            q: draw(seed + 1, dh * s.n_head * rows, 1.0),
            w: draw(seed + 2, s.n_head * rows, 1.0),
            cache,
            ape: draw(seed + 4, dh * s.kpool, 1.0),
            slots,
            positions,
            s,
        }
    }

    /// Runs rows `r0..r1` as one call on `cache` with `pass` rows of scratch; their output.
    fn run_rows<T: CacheValue>(
        &self,
        cache: &mut [T],
        r0: usize,
        r1: usize,
        pass: usize,
    ) -> Vec<i32> {
        let (per_q, nh, n_sel) = (
            self.s.head_dim * self.s.n_head,
            self.s.n_head,
            self.s.n_sel(),
        );
        let mut keys = vec![0u64; pass * self.s.max_pools()];
        let mut out = vec![7777; n_sel * (r1 - r0)];
        let x = KPoolInputs {
            q: &self.q[r0 * per_q..r1 * per_q],
            pooling: Pooling::SoftmaxGate {
                w: &self.w[r0 * nh..r1 * nh],
                ape: &self.ape,
            },
            slots: &self.slots[r0..r1],
            positions: &self.positions[r0..r1],
        };
        kpool_select(&Serial, &x, cache, &self.s, &mut keys, &mut out).unwrap();
        out
    }

    /// Every row in calls of `chunk` rows, in order: the outputs and the cache after.
    fn run_chunked(&self, chunk: usize) -> (Vec<i32>, Vec<f32>) {
        let mut cache = self.cache.clone();
        let mut out = Vec::new();
        for r0 in (0..self.slots.len()).step_by(chunk) {
            let r1 = (r0 + chunk).min(self.slots.len());
            out.extend(self.run_rows(&mut cache, r0, r1, 2));
        }
        (out, cache)
    }
}

/// Rows of several slots from position 0, interleaved slot by slot (the golden's order).
fn interleave(lengths: &[usize]) -> (Vec<u32>, Vec<i32>) {
    let (mut slots, mut positions) = (Vec::new(), Vec::new());
    for p in 0..lengths.iter().copied().max().unwrap_or(0) {
        for (slot, &n) in lengths.iter().enumerate() {
            if p < n {
                slots.push(slot as u32);
                positions.push(p as i32);
            }
        }
    }
    (slots, positions)
}

fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../host/tests/fixtures/kpool_select.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("the golden")).expect("JSON")
}

fn int(v: &Value, k: &str) -> usize {
    v[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize
}

fn ints<T: TryFrom<i64>>(v: &Value) -> Vec<T> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| T::try_from(x.as_i64().unwrap()).ok().unwrap())
        .collect()
}

/// The selected pools of a row's output, in order (the first of each pool's positions / kpool).
fn pools_of(row: &[i32], s: &KPoolShape) -> Vec<i32> {
    row[..s.kpool * s.n_top]
        .chunks_exact(s.kpool)
        .map(|c| if c[0] < 0 { -1 } else { c[0] / s.kpool as i32 })
        .collect()
}

#[test]
fn selections_and_pooled_keys_match_the_numpy_golden() {
    let g = golden();
    for c in g["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let s = KPoolShape {
            n_head: int(c, "n_head"),
            head_dim: int(c, "head_dim"),
            kpool: int(c, "kpool"),
            n_top: int(c, "n_top"),
            tail: c["tail"].as_bool().unwrap(),
            len: int(c, "len"),
            n_slots: int(c, "n_slots"),
        };
        assert_eq!(s.n_sel(), int(c, "n_sel"), "{name}");
        let x = Inputs::new(
            s,
            c["seed"].as_u64().unwrap(),
            ints(&c["slots"]),
            ints(&c["positions"]),
        );
        let mut cache = x.cache.clone();
        let rows = x.slots.len();
        let out = x.run_rows(&mut cache, 0, rows, 3);
        let (mut ties, mut worst) = (0, 0f64);
        for (r, row) in out.chunks_exact(s.n_sel()).enumerate() {
            let want: Vec<i32> = ints(&c["selected"][r]);
            let scores: Vec<f64> = c["scores"][r]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let (got_p, want_p) = (pools_of(row, &s), pools_of(&want, &s));
            for (&a, &b) in got_p.iter().zip(&want_p) {
                if a != b {
                    // Another pool only where the two score the same to 1e-6 (a tie).
                    assert!(a >= 0 && b >= 0, "{name} row {r}: {row:?}, want {want:?}");
                    let (sa, sb) = (scores[a as usize], scores[b as usize]);
                    assert!(
                        (sa - sb).abs() <= 1e-6 * sa.abs().max(1.0),
                        "{name} row {r}: pool {a} ({sa}) for {b} ({sb})"
                    );
                    ties += 1;
                }
            }
            // Each pool's positions ascending, and the tail, exactly.
            for (j, &pool) in got_p.iter().enumerate() {
                let part = &row[j * s.kpool..(j + 1) * s.kpool];
                let expect: Vec<i32> = (0..s.kpool as i32)
                    .map(|t| {
                        if pool < 0 {
                            -1
                        } else {
                            pool * s.kpool as i32 + t
                        }
                    })
                    .collect();
                assert_eq!(part, expect, "{name} row {r}");
            }
            let pools_end = s.kpool * s.n_top;
            assert_eq!(row[pools_end..], want[pools_end..], "{name} row {r}: tail");
        }
        for (slot, pools) in c["pooled"].as_object().unwrap() {
            let slot: usize = slot.parse().unwrap();
            for (g, key) in pools.as_array().unwrap().iter().enumerate() {
                let last = (slot * s.len + g * s.kpool + s.kpool - 1) * 3 * s.head_dim;
                for (d, v) in key.as_array().unwrap().iter().enumerate() {
                    let (got, want) = (
                        f64::from(cache[last + 2 * s.head_dim + d]),
                        v.as_f64().unwrap(),
                    );
                    worst = worst.max((got - want).abs() / want.abs().max(1e-3));
                }
            }
        }
        eprintln!("{name}: {rows} rows, {ties} tie swaps, pooled keys worst relative {worst:.1e}");
        assert!(
            worst <= 1e-6,
            "{name}: pooled keys {worst:.1e} from the golden"
        );
    }
}

fn shape(n_head: usize, n_top: usize, tail: bool, len: usize, n_slots: usize) -> KPoolShape {
    KPoolShape {
        n_head,
        head_dim: 128,
        kpool: 4,
        n_top,
        tail,
        len,
        n_slots,
    }
}

#[test]
fn a_prompt_in_chunks_equals_the_prompt_in_one_call() {
    // Chunks of 3 and 7 end inside pools, so later calls read pools completed by earlier ones
    // and complete pools whose first rows an earlier call stored.
    let (slots, positions) = interleave(&[45, 30]);
    let x = Inputs::new(shape(32, 4, true, 48, 2), 9, slots, positions);
    let (whole, whole_cache) = x.run_chunked(x.slots.len());
    for chunk in [1, 3, 7] {
        let (out, cache) = x.run_chunked(chunk);
        assert_eq!(out, whole, "chunks of {chunk}");
        let same = cache
            .iter()
            .zip(&whole_cache)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "chunks of {chunk}: the cache differs");
    }
}

#[test]
fn slots_are_independent_and_threads_change_nothing() {
    // Slot 1's rows alone give what they give beside slot 0's and slot 2's.
    let (slots, positions) = interleave(&[20, 33, 9]);
    let x = Inputs::new(
        shape(8, 2, true, 40, 3),
        21,
        slots.clone(),
        positions.clone(),
    );
    let (all, _) = x.run_chunked(x.slots.len());
    let mine: Vec<usize> = (0..slots.len()).filter(|&r| slots[r] == 1).collect();
    let per_q = 128 * 8;
    let alone = Inputs {
        q: mine
            .iter()
            .flat_map(|&r| x.q[r * per_q..(r + 1) * per_q].to_vec())
            .collect(),
        w: mine
            .iter()
            .flat_map(|&r| x.w[r * 8..(r + 1) * 8].to_vec())
            .collect(),
        slots: mine.iter().map(|&r| slots[r]).collect(),
        positions: mine.iter().map(|&r| positions[r]).collect(),
        cache: x.cache.clone(),
        ape: x.ape.clone(),
        s: x.s,
    };
    let (got, _) = alone.run_chunked(mine.len());
    let n_sel = x.s.n_sel();
    for (i, &r) in mine.iter().enumerate() {
        assert_eq!(
            got[i * n_sel..(i + 1) * n_sel],
            all[r * n_sel..(r + 1) * n_sel],
            "row {r}"
        );
    }
    // The worker pool's split (pool chunks of one row, rows of a pass) gives the same lists.
    let pool = Pool::with_threads(2).unwrap();
    let mut cache = x.cache.clone();
    let mut keys = vec![0u64; 5 * x.s.max_pools()];
    let mut out = vec![0; all.len()];
    let inputs = KPoolInputs {
        q: &x.q,
        pooling: Pooling::SoftmaxGate {
            w: &x.w,
            ape: &x.ape,
        },
        slots: &x.slots,
        positions: &x.positions,
    };
    kpool_select(&pool, &inputs, &mut cache, &x.s, &mut keys, &mut out).unwrap();
    assert_eq!(out, all);
}

#[test]
fn earlier_pools_are_read_from_the_cache_and_unused_entries_are_minus_one() {
    // One decode row at position 14 of slot 0: pools 0..=2 complete before this call. Their
    // pooled keys are read where earlier calls wrote them: pool 1's is set to a key that wins.
    let s = shape(2, 2, true, 16, 1);
    let mut x = Inputs::new(s, 5, vec![0], vec![14]);
    x.w = vec![1.0, 1.0];
    for g in 0..3 {
        let last = (g * 4 + 3) * 3 * 128;
        let v = if g == 1 { 1.0 } else { -1.0 };
        x.cache[last + 256..last + 384].fill(v);
    }
    x.q = vec![0.5; 256];
    let mut cache = x.cache.clone();
    let out = x.run_rows(&mut cache, 0, 1, 1);
    // Pool 1 (score 2·64), then pools 0 and 2 tie at 0: the lower, pool 0; tail 12, 13, 14.
    assert_eq!(out, [4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14]);
    // Position 1 sees no complete pool: every pool entry −1, the tail 0, 1, then −1.
    let x = Inputs::new(s, 5, vec![0], vec![1]);
    let out = x.run_rows(&mut x.cache.clone(), 0, 1, 1);
    assert_eq!(out, [-1, -1, -1, -1, -1, -1, -1, -1, 0, 1, -1]);
    // Without the tail, position 4 sees pool 0 only.
    let x = Inputs::new(
        shape(2, 2, false, 16, 1),
        5,
        vec![0, 0, 0, 0, 0],
        vec![0, 1, 2, 3, 4],
    );
    let out = x.run_rows(&mut x.cache.clone(), 0, 5, 1);
    assert_eq!(out[4 * 8..], [0, 1, 2, 3, -1, -1, -1, -1]);
    assert!(out[..3 * 8].iter().all(|&v| v == -1));
}

#[test]
fn an_f16_cache_gives_the_f32_selection_of_its_rounded_rows() {
    let (slots, positions) = interleave(&[26, 17]);
    let x = Inputs::new(shape(16, 4, true, 32, 2), 77, slots, positions);
    let rows = x.slots.len();
    let mut c16: Vec<f16> = x.cache.iter().map(|&v| f16::from_f32(v)).collect();
    let out16 = x.run_rows(&mut c16, 0, rows, 4);
    // The same rows rounded to f16, in an f32 cache: pooled keys differ by f16's rounding only.
    let mut c32: Vec<f32> = c16.iter().map(|v| v.to_f32()).collect();
    let out32 = x.run_rows(&mut c32, 0, rows, 4);
    let d = 3 * 128;
    let mut worst = 0f32;
    for (a, b) in c16.chunks_exact(d).zip(c32.chunks_exact(d)) {
        for (u, v) in a[256..].iter().zip(&b[256..]) {
            if !v.is_nan() {
                worst = worst.max((u.to_f32() - v).abs());
            }
        }
    }
    assert!(worst <= 2e-3, "f16 pooled keys {worst} from f32's");
    let same = out16.iter().zip(&out32).filter(|(a, b)| a == b).count();
    assert!(
        same * 100 >= out16.len() * 97,
        "{same} of {} entries equal",
        out16.len()
    );
}

#[test]
fn bad_calls_are_refused_by_name_before_any_write() {
    let s = shape(2, 2, true, 16, 2);
    let x = Inputs::new(s, 5, vec![0, 1], vec![3, 15]);
    let refuse = |slots: &[u32], positions: &[i32], s: &KPoolShape, keys: usize, q_len: usize| {
        let mut cache = x.cache.clone();
        let mut keys = vec![0u64; keys];
        let mut out = vec![0; s.n_sel() * slots.len()];
        let inputs = KPoolInputs {
            q: &x.q[..q_len],
            pooling: Pooling::SoftmaxGate {
                w: &x.w,
                ape: &x.ape,
            },
            slots,
            positions,
        };
        let e = kpool_select(&Serial, &inputs, &mut cache, s, &mut keys, &mut out)
            .unwrap_err()
            .to_string();
        let untouched = cache
            .iter()
            .zip(&x.cache)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(untouched, "{e}: the cache was written");
        e
    };
    let e = refuse(&[0, 1], &[3, 16], &s, 4, 512);
    assert!(
        e.contains("kpool_select: position 16 is out of range 0..16"),
        "{e}"
    );
    let e = refuse(&[0, 2], &[3, 15], &s, 4, 512);
    assert!(e.contains("slot 2 is out of range 0..2"), "{e}");
    let e = refuse(&[0, 1], &[3, -1], &s, 4, 512);
    assert!(e.contains("position -1"), "{e}");
    let e = refuse(&[0, 1], &[3, 15], &s, 4, 500);
    assert!(e.contains("`q` has 500 values, expected 512"), "{e}");
    let e = refuse(&[0, 1], &[3, 15], &s, 3, 512);
    assert!(e.contains("`keys` has 3 values, expected 4"), "{e}");
    let mut bad = s;
    bad.kpool = 0;
    let e = refuse(&[0, 1], &[3, 15], &bad, 4, 512);
    assert!(e.contains("must be positive"), "{e}");
}
