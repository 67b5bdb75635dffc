//! DeepSeek-V4.1-Flash's Engram against the f64 numpy reference written from DeepSeek's published
//! Engram math (fixtures/deepseek41/engram_np.json, made by `tests/oracle/numpy_engram.py`): the
//! host-computed row ids (plugin-api `NgramSpec` with a token map, no end-id cut, one table per
//! Engram layer) exactly, and the gated read (GetRows of the table, MatMul by `engram_wkv`,
//! `Op::EngramGate`) run through the CPU dispatch as graph nodes would be.

use bloomery_kernels_cpu::dispatch::{self, Backend};
use bloomery_kernels_cpu::linear::reference_rows_dot;
use bloomery_kernels_cpu::memory::Buffers;
use bloomery_kernels_cpu::pool::Pool;
use bloomery_plugin_api::ngram::NgramSpec;
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::DType;
use serde_json::Value;

fn golden() -> Value {
    serde_json::from_str(include_str!("fixtures/deepseek41/engram_np.json")).expect("the golden")
}

fn u64s(v: &Value) -> Vec<u64> {
    let a = v.as_array().expect("a list of integers");
    a.iter().map(|x| x.as_u64().expect("an integer")).collect()
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key}"))
}

/// The golden's input streams: splitmix64, `((z >> 40) / 2^23 − 1)·a` (numpy_engram.py `draw`).
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

/// The row-id constants of the golden's `sites` (one hash table each), as the model plugin
/// would declare them.
fn spec(g: &Value, sites: &[&Value]) -> NgramSpec {
    let all = |key: &str| -> Vec<u64> { sites.iter().flat_map(|s| u64s(&s[key])).collect() };
    let map = u64s(&g["token_map"]).into_iter().map(|v| v as u32);
    NgramSpec {
        ngram_size: num(g, "max_ngram") as u32,
        heads_per_ngram: num(g, "heads") as u32,
        end_id: num(g, "pad_id") as u32,
        cut_at_end: false,
        tables: sites.len() as u32,
        token_map: map.collect::<Vec<_>>().into(),
        multipliers: all("multipliers").into(),
        head_sizes: all("primes").into(),
        head_offsets: all("offsets").into(),
    }
}

fn tokens(g: &Value) -> Vec<u32> {
    u64s(&g["tokens"]).into_iter().map(|t| t as u32).collect()
}

/// The golden's ids of `site`, `[T, 24]` token after token.
fn site_ids(site: &Value) -> Vec<i32> {
    u64s(&site["ids"]).into_iter().map(|v| v as i32).collect()
}

/// Fails naming the first token and column where `got` and `want` (`per` ids a token) differ.
fn same_ids(got: &[i32], want: &[i32], per: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: id count");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        let (t, c) = (i / per, i % per);
        panic!(
            "{what}: token {t} column {c}: {} where the reference has {}",
            got[i], want[i]
        );
    }
}

#[test]
fn row_ids_are_the_references_at_every_position_and_chunking() {
    let g = golden();
    let sites: Vec<&Value> = g["sites"].as_array().unwrap().iter().collect();
    let seq = tokens(&g);
    for (i, site) in sites.iter().enumerate() {
        let n = spec(&g, &[site]);
        n.check().unwrap();
        let want = site_ids(site);
        for cuts in [vec![], vec![1, 2, 3], vec![4, 17, 18], vec![26, 40]] {
            let mut got = Vec::new();
            let mut at = 0;
            for end in cuts.iter().copied().chain([seq.len()]) {
                n.extend_rows(&seq[..at], &seq[at..end], &mut got);
                at = end;
            }
            same_ids(
                &got,
                &want,
                n.n_ids(),
                &format!("site {i}, cut at {cuts:?}"),
            );
        }
    }
    // Both sites in one spec: each token's ids are site 0's then site 1's.
    let both = spec(&g, &sites);
    both.check().unwrap();
    let mut got = Vec::new();
    both.extend_rows(&[], &seq, &mut got);
    let (a, b) = (site_ids(sites[0]), site_ids(sites[1]));
    let per = both.per_table();
    let want: Vec<i32> = a
        .chunks_exact(per)
        .zip(b.chunks_exact(per))
        .flat_map(|(x, y)| x.iter().chain(y).copied())
        .collect();
    same_ids(&got, &want, both.n_ids(), "two tables");
}

/// Buffers and a pool of three workers, and the calls run on them.
struct Session {
    buf: Buffers,
    pool: Pool,
}

impl Session {
    fn tensor(&self, dtype: DType, ne: [u64; 4], bytes: Vec<u8>) -> TensorRef {
        let handle = self.buf.alloc(bytes.len().max(4) as u64).unwrap();
        self.buf.write(handle, 0, &bytes).unwrap();
        TensorRef {
            buffer: handle,
            offset: 0,
            dtype,
            ne,
            nb: TensorRef::contiguous_strides(dtype, ne).unwrap(),
        }
    }

    fn f32s(&self, ne: [u64; 4], data: &[f32]) -> TensorRef {
        assert_eq!(ne.iter().product::<u64>() as usize, data.len(), "{ne:?}");
        self.tensor(
            DType::F32,
            ne,
            data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    fn i32s(&self, ne: [u64; 4], data: &[i32]) -> TensorRef {
        self.tensor(
            DType::I32,
            ne,
            data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// Runs `op` into a fresh f32 destination of extents `ne`, poisoned with NaN.
    fn run(&self, op: Op, srcs: &[TensorRef], ne: [u64; 4]) -> Result<TensorRef, String> {
        let dst = self.f32s(ne, &vec![f32::NAN; ne.iter().product::<u64>() as usize]);
        let b = Backend {
            buffers: &self.buf,
            par: &self.pool,
            dot: reference_rows_dot,
        };
        dispatch::run(&b, &OpCall::new(op, srcs, dst)).map_err(|e| e.to_string())?;
        Ok(dst)
    }

    fn read(&self, t: &TensorRef) -> Vec<f32> {
        let mut bytes = vec![0u8; t.span_bytes().unwrap() as usize];
        self.buf.read(t.buffer, 0, &mut bytes).unwrap();
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// `max |got − want| / max |want|` (∞ for a value that is not finite).
fn rel_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f32, |m, w| m.max(w.abs()));
    let worst = got.iter().zip(want).fold(0.0f32, |m, (g, w)| {
        m.max(if g.is_finite() {
            (g - w).abs()
        } else {
            f32::INFINITY
        })
    });
    worst / scale
}

/// One site's gated read through the dispatch: the table rows of its ids, `engram_wkv`, the
/// gate; the new streams and `(n, hc, T)`.
fn gated_read(t: &Session, g: &Value, site: &Value) -> (Vec<f32>, TensorRef) {
    let (d, n, hc) = (num(g, "d"), num(g, "n_embd"), num(g, "hc"));
    let rows = num(site, "rows");
    let ids = site_ids(site);
    let per = (num(g, "max_ngram") - 1) * num(g, "heads");
    let tok = ids.len() as u64 / per;
    let base = 100 * num(site, "layer");
    let table = t.f32s([d, rows, 1, 1], &draw(base + 1, (d * rows) as usize, 0.5));
    let wkv_ne = [per * d, (hc + 1) * n, 1, 1];
    let wkv = t.f32s(
        wkv_ne,
        &draw(base + 2, (wkv_ne[0] * wkv_ne[1]) as usize, 0.0625),
    );
    let q_norm = t.f32s([n, hc, 1, 1], &draw(base + 3, (n * hc) as usize, 2.0));
    let k_norm = t.f32s([n, hc, 1, 1], &draw(base + 4, (n * hc) as usize, 2.0));
    let h = t.f32s(
        [n, hc, tok, 1],
        &draw(base + 5, (n * hc * tok) as usize, 2.0),
    );
    let ids_t = t.i32s([ids.len() as u64, 1, 1, 1], &ids);
    let gathered = t
        .run(Op::GetRows, &[table, ids_t], [d, ids.len() as u64, 1, 1])
        .unwrap();
    // The 24 rows of a token side by side: the same memory as [24·d, T].
    let flat = TensorRef {
        ne: [per * d, tok, 1, 1],
        nb: TensorRef::contiguous_strides(DType::F32, [per * d, tok, 1, 1]).unwrap(),
        ..gathered
    };
    let kv = t
        .run(Op::MatMul, &[wkv, flat], [(hc + 1) * n, tok, 1, 1])
        .unwrap();
    let gate = Op::EngramGate {
        eps: g["eps"].as_f64().unwrap() as f32,
        scale: 1.0 / (n as f32).sqrt(),
        floor: g["floor"].as_f64().unwrap() as f32,
    };
    let out = t
        .run(gate, &[h, kv, q_norm, k_norm], [n, hc, tok, 1])
        .unwrap();
    (t.read(&out), h)
}

#[test]
fn the_gated_read_matches_the_f64_reference() {
    let g = golden();
    let t = Session {
        buf: Buffers::default(),
        pool: Pool::with_threads(3).unwrap(),
    };
    for site in g["sites"].as_array().unwrap() {
        let (got, h) = gated_read(&t, &g, site);
        let want: Vec<f32> = site["out"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let err = rel_error(&got, &want);
        // What the gate added, against what the reference added.
        let before = t.read(&h);
        let added = |o: &[f32]| -> Vec<f32> { o.iter().zip(&before).map(|(a, b)| a - b).collect() };
        let err_added = rel_error(&added(&got), &added(&want));
        let layer = num(site, "layer");
        eprintln!("layer {layer}: streams {err:.2e}, the added values {err_added:.2e}");
        assert!(err <= 2e-6, "layer {layer}: streams {err:.2e}");
        assert!(err_added <= 2e-5, "layer {layer}: added {err_added:.2e}");
    }
}

#[test]
fn the_gate_refuses_a_kv_of_another_width_and_a_negative_floor() {
    let t = Session {
        buf: Buffers::default(),
        pool: Pool::with_threads(1).unwrap(),
    };
    let (n, s, rows) = (4u64, 2u64, 3u64);
    let h = t.f32s([n, s, rows, 1], &draw(1, (n * s * rows) as usize, 1.0));
    let w = t.f32s([n, s, 1, 1], &draw(2, (n * s) as usize, 1.0));
    let gate = |floor| Op::EngramGate {
        eps: 1e-6,
        scale: 0.5,
        floor,
    };
    let narrow = t.f32s([n * s, rows, 1, 1], &draw(3, (n * s * rows) as usize, 1.0));
    let e = t
        .run(gate(1e-6), &[h, narrow, w, w], [n, s, rows, 1])
        .unwrap_err();
    assert!(e.contains("EngramGate"), "{e}");
    let kv = t.f32s(
        [n * (s + 1), rows, 1, 1],
        &draw(4, (n * (s + 1) * rows) as usize, 1.0),
    );
    let e = t
        .run(gate(-1.0), &[h, kv, w, w], [n, s, rows, 1])
        .unwrap_err();
    assert!(e.contains("floor"), "{e}");
    t.run(gate(1e-6), &[h, kv, w, w], [n, s, rows, 1]).unwrap();
}
