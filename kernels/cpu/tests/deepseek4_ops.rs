//! The ops DeepSeek-V4's forward pass adds (Rope with a dimension offset and inverse, GetRows of an
//! i32 table, Compress in its three forms, CompSelect) against transformers 5.24's own `deepseek_v4` modules
//! (fixtures/deepseek4/ops_hf.json, made by `tests/oracle/hf_deepseek4_ops.py`), each run through
//! the CPU dispatch as a graph node would be.

use bloomery_kernels_cpu::dispatch::{self, Backend};
use bloomery_kernels_cpu::linear::reference_rows_dot;
use bloomery_kernels_cpu::memory::Buffers;
use bloomery_kernels_cpu::pool::Pool;
use bloomery_plugin_api::op::{
    CompSelectParams, CompressForm, CompressParams, Op, RopeMode, RopeParams,
};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::DType;
use serde_json::Value;

fn golden() -> Value {
    serde_json::from_str(include_str!("fixtures/deepseek4/ops_hf.json")).expect("the golden")
}

fn floats(v: &Value) -> Vec<f32> {
    let a = v.as_array().expect("a list of numbers");
    a.iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

fn ints(v: &Value) -> Vec<i32> {
    let a = v.as_array().expect("a list of integers");
    a.iter()
        .map(|x| x.as_i64().expect("an integer") as i32)
        .collect()
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key}"))
}

/// Buffers and a pool of three workers, and the calls run on them.
struct Session {
    buf: Buffers,
    pool: Pool,
}

impl Session {
    fn new() -> Session {
        Session {
            buf: Buffers::default(),
            pool: Pool::with_threads(3).unwrap(),
        }
    }

    fn raw(&self, dtype: DType, ne: [u64; 4], bytes: &[u8]) -> TensorRef {
        let handle = self.buf.alloc(bytes.len().max(4) as u64).unwrap();
        self.buf.write(handle, 0, bytes).unwrap();
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
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.raw(DType::F32, ne, &bytes)
    }

    fn i32s(&self, ne: [u64; 4], data: &[i32]) -> TensorRef {
        assert_eq!(ne.iter().product::<u64>() as usize, data.len(), "{ne:?}");
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.raw(DType::I32, ne, &bytes)
    }

    fn run_into(&self, op: Op, srcs: &[TensorRef], dst: TensorRef) -> Result<(), String> {
        let b = Backend {
            buffers: &self.buf,
            par: &self.pool,
            dot: reference_rows_dot,
        };
        dispatch::run(&b, &OpCall::new(op, srcs, dst)).map_err(|e| e.to_string())
    }

    /// Runs `op` into a fresh destination of `dtype` and extents `ne`, poisoned (NaN, or
    /// 0x55555555 for i32).
    fn run(&self, op: Op, srcs: &[TensorRef], dtype: DType, ne: [u64; 4]) -> TensorRef {
        let n = ne.iter().product::<u64>() as usize;
        let out = self.raw(dtype, ne, &vec![0x55u8; 4 * n]);
        let out = match dtype {
            DType::F32 => self.f32s(ne, &vec![f32::NAN; n]),
            _ => out,
        };
        self.run_into(op, srcs, out).unwrap();
        out
    }

    fn bytes(&self, t: &TensorRef) -> Vec<u8> {
        let mut bytes = vec![0u8; t.span_bytes().unwrap() as usize];
        self.buf.read(t.buffer, 0, &mut bytes).unwrap();
        bytes
    }

    fn read(&self, t: &TensorRef) -> Vec<f32> {
        let b = self.bytes(t);
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn read_i32(&self, t: &TensorRef) -> Vec<i32> {
        let b = self.bytes(t);
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// `max |got − want| / max |want|` (∞ for a value that is not finite); fails above `tol`.
fn check(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0.0f32, |m, w| m.max(w.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_finite() {
                (g - w).abs()
            } else {
                f32::INFINITY
            }
        })
        .fold(0.0f32, f32::max)
        / scale;
    eprintln!("{what}: max |error| / max |value| {worst:.2e}");
    assert!(worst <= tol, "{what}: {worst:.2e} > {tol:.0e}");
}

/// The model's rope of `kind` ("main": θ 1e4 plain; "compress": the compressed θ with YaRN and
/// llama.cpp's `dsv4_rope_attn_factor`) on the last `rope_dims` dims of heads of `head_dim`.
fn model_rope(g: &Value, kind: &str, head_dim: u64) -> RopeParams {
    let r = num(g, "rope_dims") as u32;
    let factor = g["yarn_factor"].as_f64().unwrap() as f32;
    let plain = RopeParams {
        mode: RopeMode::Norm,
        n_dims: r,
        offset: head_dim as u32 - r,
        sections: [0; 4],
        freq_base: g["rope_theta"].as_f64().unwrap() as f32,
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 0,
        inverse: false,
    };
    match kind {
        "main" => plain,
        "compress" => RopeParams {
            freq_base: g["compress_theta"].as_f64().unwrap() as f32,
            freq_scale: 1.0 / factor,
            ext_factor: 1.0,
            attn_factor: 1.0 / (1.0 + 0.1 * factor.ln()),
            n_ctx_orig: num(g, "yarn_orig_ctx") as u32,
            ..plain
        },
        other => panic!("rope kind {other}"),
    }
}

#[test]
fn the_tail_rope_and_its_inverse_match_transformers() {
    let g = golden();
    let (h, d) = (num(&g, "n_head"), num(&g, "head_dim"));
    for c in g["rope"].as_array().unwrap() {
        let t = Session::new();
        let kind = c["kind"].as_str().unwrap();
        let rows = num(c, "rows");
        let ne = [d, h, rows, 1];
        let x = t.f32s(ne, &floats(&c["x"]));
        let pos = t.i32s([rows, 1, 1, 1], &ints(&c["pos"]));
        let p = model_rope(&g, kind, d);
        for (inverse, key) in [(false, "fwd"), (true, "inv")] {
            let op = Op::Rope(RopeParams { inverse, ..p });
            let out = t.run(op, &[x, pos], DType::F32, ne);
            // transformers forms the angles in f32 (position × f32 inverse frequency), the kernel
            // in f64: about 2e-6 apart at positions below 600.
            check(
                &format!("{kind} rope {key}"),
                &t.read(&out),
                &floats(&c[key]),
                5e-6,
            );
        }
    }
}

#[test]
fn hash_routing_gathers_the_i32_table_as_transformers() {
    let g = golden();
    let c = &g["hash"];
    let t = Session::new();
    let (vocab, k) = (num(c, "vocab"), num(c, "k"));
    let tokens = ints(&c["tokens"]);
    let n = tokens.len() as u64;
    let table = t.i32s([k, vocab, 1, 1], &ints(&c["table"]));
    let ids = t.i32s([n, 1, 1, 1], &tokens);
    let out = t.run(Op::GetRows, &[table, ids], DType::I32, [k, n, 1, 1]);
    assert_eq!(t.read_i32(&out), ints(&c["ids"]));
}

/// Runs the compressor of `width` over one sequence's `rows` in calls ending at `cuts`, from a
/// raw state of `len_raw` rows in slot 1 of two; returns the compressed cache's slot 1 rows.
#[allow(clippy::too_many_arguments)]
fn run_compress(
    t: &Session,
    p: CompressParams,
    kv: &[f32],
    score: &[f32],
    ape: &[f32],
    norm: &[f32],
    len_raw: u64,
    n_rows_out: u64,
    cuts: &[u64],
) -> Vec<f32> {
    let sw = u64::from(if p.overlap { 2 * p.width } else { p.width });
    let w = u64::from(p.width);
    let ape = t.f32s([sw, u64::from(p.ratio), 1, 1], ape);
    let norm = t.f32s([w, 1, 1, 1], norm);
    // Garbage in both slots: slot 0 must stay as it was, slot 1's stale rows must not be read.
    let raw = t.f32s(
        [2 * sw, len_raw, 2, 1],
        &vec![3.0; (4 * sw * len_raw) as usize],
    );
    let len_comp = n_rows_out + 1;
    let comp = t.f32s([w, len_comp, 2, 1], &vec![5.0; (2 * w * len_comp) as usize]);
    let mut start = 0;
    for &end in cuts {
        let n = end - start;
        let (a, b) = ((start * sw) as usize, (end * sw) as usize);
        let srcs = [
            t.f32s([sw, n, 1, 1], &kv[a..b]),
            t.f32s([sw, n, 1, 1], &score[a..b]),
            ape,
            norm,
            raw,
            comp,
            t.i32s([n, 1, 1, 1], &vec![1; n as usize]),
            t.i32s(
                [n, 1, 1, 1],
                &(start as i32..end as i32).collect::<Vec<_>>(),
            ),
        ];
        t.run_into(Op::Compress(p), &srcs, comp).unwrap();
        start = end;
    }
    let all = t.read(&comp);
    let (slot0, slot1) = all.split_at((w * len_comp) as usize);
    assert!(
        slot0.iter().all(|&v| v == 5.0),
        "slot 0 of the cache was written"
    );
    assert!(
        slot1[(w * n_rows_out) as usize..].iter().all(|&v| v == 5.0),
        "a row past the complete ones was written"
    );
    slot1[..(w * n_rows_out) as usize].to_vec()
}

#[test]
fn both_compressors_match_transformers_across_calls() {
    let g = golden();
    let (d, di) = (num(&g, "head_dim"), num(&g, "index_dim"));
    let eps = g["eps"].as_f64().unwrap() as f32;
    for c in g["compress"].as_array().unwrap() {
        let name = c["layer_type"].as_str().unwrap();
        let (rows, ratio, n_out) = (num(c, "rows"), num(c, "ratio"), num(c, "n_compressed"));
        let overlap = ratio == 4;
        let p = CompressParams {
            ratio: ratio as u32,
            overlap,
            width: d as u32,
            eps,
            rope: model_rope(&g, "compress", d),
            form: CompressForm::Pool,
        };
        let span = if overlap { 2 * ratio } else { ratio };
        // One call, then calls cut inside windows (the ring smaller than a call when overlapped).
        let splits: Vec<Vec<u64>> = vec![vec![rows], vec![ratio + 1, ratio + 2, rows - 3, rows]];
        for cuts in &splits {
            let t = Session::new();
            let got = run_compress(
                &t,
                p,
                &floats(&c["kv"]),
                &floats(&c["score"]),
                &floats(&c["ape"]),
                &floats(&c["norm"]),
                span,
                n_out,
                cuts,
            );
            let what = format!("{name} rows, calls ending at {cuts:?}");
            check(&what, &got, &floats(&c["compressed"]), 1e-6);
            if !overlap {
                continue;
            }
            let ip = CompressParams {
                width: di as u32,
                rope: model_rope(&g, "compress", di),
                ..p
            };
            let keys = run_compress(
                &t,
                ip,
                &floats(&c["i_kv"]),
                &floats(&c["i_score"]),
                &floats(&c["i_ape"]),
                &floats(&c["i_norm"]),
                span,
                n_out,
                cuts,
            );
            check(
                &format!("{name} index keys, calls ending at {cuts:?}"),
                &keys,
                &floats(&c["i_keys"]),
                1e-6,
            );
        }
    }
}

/// DeepSeek-V4.1's index keys (`v41_keys`): per call, the `Plain` rows (read before the `Pool`
/// call that stores the call's rows in raw), then `wk` by MatMul, then the `Store` form into a
/// key cache; in one call and in calls cut inside windows.
#[test]
fn v41_index_keys_match_transformers_across_calls() {
    let g = golden();
    let (d, di) = (num(&g, "head_dim"), num(&g, "index_dim"));
    let eps = g["eps"].as_f64().unwrap() as f32;
    for c in g["v41_keys"].as_array().unwrap() {
        let (rows, ratio, n_out) = (num(c, "rows"), num(c, "ratio"), num(c, "n_compressed"));
        let pool = CompressParams {
            ratio: ratio as u32,
            overlap: false,
            width: d as u32,
            eps,
            rope: model_rope(&g, "compress", d),
            form: CompressForm::Pool,
        };
        let plain = CompressParams {
            form: CompressForm::Plain,
            ..pool
        };
        let store = CompressParams {
            width: di as u32,
            rope: model_rope(&g, "compress", di),
            form: CompressForm::Store,
            ..pool
        };
        let (kv, score, want_plain) = (floats(&c["kv"]), floats(&c["score"]), floats(&c["plain"]));
        for cuts in [vec![rows], vec![1, ratio + 2, rows - 3, rows]] {
            let t = Session::new();
            let ape = t.f32s([d, ratio, 1, 1], &vec![0.0; (d * ratio) as usize]);
            let norm = t.f32s([d, 1, 1, 1], &floats(&c["norm"]));
            let raw = t.f32s([2 * d, ratio, 2, 1], &vec![3.0; (4 * d * ratio) as usize]);
            let comp = t.f32s(
                [d, n_out + 1, 2, 1],
                &vec![5.0; (2 * d * (n_out + 1)) as usize],
            );
            let keys = t.f32s(
                [di, n_out + 1, 2, 1],
                &vec![7.0; (2 * di * (n_out + 1)) as usize],
            );
            let wk = t.f32s([d, di, 1, 1], &floats(&c["wk"]));
            let k_norm = t.f32s([di, 1, 1, 1], &floats(&c["k_norm"]));
            let mut got_plain = Vec::new();
            let mut start = 0;
            for &end in &cuts {
                let n = end - start;
                let (a, b) = ((start * d) as usize, (end * d) as usize);
                let slots = t.i32s([n, 1, 1, 1], &vec![1; n as usize]);
                let pos = t.i32s(
                    [n, 1, 1, 1],
                    &(start as i32..end as i32).collect::<Vec<_>>(),
                );
                let (x_kv, x_score) = (
                    t.f32s([d, n, 1, 1], &kv[a..b]),
                    t.f32s([d, n, 1, 1], &score[a..b]),
                );
                let srcs = [x_kv, x_score, ape, norm, raw, slots, pos];
                let u = t.run(Op::Compress(plain), &srcs, DType::F32, [d, n, 1, 1]);
                let u_rows = t.read(&u);
                for (i, p) in (start..end).enumerate() {
                    let col = &u_rows[i * d as usize..(i + 1) * d as usize];
                    if (p + 1) % ratio == 0 {
                        got_plain.extend_from_slice(col);
                    } else {
                        assert!(
                            col.iter().all(|&v| v == 0.0),
                            "position {p} completes no row"
                        );
                    }
                }
                let srcs = [x_kv, x_score, ape, norm, raw, comp, slots, pos];
                t.run_into(Op::Compress(pool), &srcs, comp).unwrap();
                let k = t.run(Op::MatMul, &[wk, u], DType::F32, [di, n, 1, 1]);
                t.run_into(Op::Compress(store), &[k, k_norm, keys, slots, pos], keys)
                    .unwrap();
                start = end;
            }
            let what = format!("ratio {ratio}, calls ending at {cuts:?}");
            check(
                &format!("{what}: plain rows"),
                &got_plain,
                &want_plain,
                1e-6,
            );
            let cache = t.read(&comp)[(d * (n_out + 1)) as usize..].to_vec();
            check(
                &format!("{what}: rows"),
                &cache[..(d * n_out) as usize],
                &floats(&c["compressed"]),
                1e-6,
            );
            let all = t.read(&keys);
            let (slot0, slot1) = all.split_at((di * (n_out + 1)) as usize);
            assert!(slot0
                .iter()
                .chain(&slot1[(di * n_out) as usize..])
                .all(|&v| v == 7.0));
            check(
                &format!("{what}: keys"),
                &slot1[..(di * n_out) as usize],
                &floats(&c["keys"]),
                1e-6,
            );
        }
    }
}

#[test]
fn the_indexer_picks_the_rows_transformers_picks() {
    let g = golden();
    let (ih, di, top_k) = (
        num(&g, "index_heads"),
        num(&g, "index_dim"),
        num(&g, "top_k"),
    );
    let c = &g["compress"][0];
    let (rows, ratio, n_out) = (num(c, "rows"), num(c, "ratio"), num(c, "n_compressed"));
    let t = Session::new();
    let q = t.f32s([di, ih, rows, 1], &floats(&c["i_q"]));
    let scale = c["i_scale"].as_f64().unwrap() as f32;
    let w: Vec<f32> = floats(&c["i_w"]).iter().map(|v| v * scale).collect();
    let w = t.f32s([ih, rows, 1, 1], &w);
    // The keys in slot 1 of two, slot 0 garbage.
    let mut keys = vec![9.0; (di * n_out) as usize];
    keys.extend(floats(&c["i_keys"]));
    let keys = t.f32s([di, n_out, 2, 1], &keys);
    let p = CompSelectParams {
        n_head: ih as u32,
        head_dim: di as u32,
        ratio: ratio as u32,
        top_k: top_k as u32,
    };
    let srcs = [
        q,
        w,
        keys,
        t.i32s([rows, 1, 1, 1], &vec![1; rows as usize]),
        t.i32s([rows, 1, 1, 1], &(0..rows as i32).collect::<Vec<_>>()),
    ];
    let out = t.run(Op::CompSelect(p), &srcs, DType::I32, [top_k, rows, 1, 1]);
    let (got, want) = (t.read_i32(&out), ints(&c["i_ids"]));
    for r in 0..rows as usize {
        let k = top_k as usize;
        assert_eq!(got[r * k..(r + 1) * k], want[r * k..(r + 1) * k], "row {r}");
    }
}

/// One attention golden's caches, in slot 1 of two (slot 0 garbage): the window rows in a cache
/// of `len` rows per slot holding positions `lo..=hi` at `position % len`, and the compressed rows.
fn attention_caches(t: &Session, c: &Value, d: u64, len: u64, lo: u64, hi: u64) -> [TensorRef; 2] {
    let kv = floats(&c["kv"]);
    let mut cache = vec![f32::NAN; (2 * d * len) as usize];
    for q in lo..=hi {
        let at = ((len + q % len) * d) as usize;
        cache[at..at + d as usize].copy_from_slice(&kv[(q * d) as usize..((q + 1) * d) as usize]);
    }
    let n_comp = num(c, "n_compressed");
    let mut comp = vec![7.0; (d * n_comp) as usize];
    comp.extend(floats(&c["compressed"]));
    [
        t.f32s([d, len, 2, 1], &cache),
        t.f32s([d, n_comp, 2, 1], &comp),
    ]
}

#[test]
fn two_source_attention_matches_transformers() {
    let g = golden();
    let (h, d, top_k) = (num(&g, "n_head"), num(&g, "head_dim"), num(&g, "top_k"));
    for c in g["attention"].as_array().unwrap() {
        let name = c["layer_type"].as_str().unwrap();
        let (rows, window, n_comp) = (num(c, "rows"), num(c, "window"), num(c, "n_compressed"));
        let kept: Vec<i32> = ints(&c["kept"]);
        let n = kept.len();
        let selected = name == "compressed_sparse_attention";
        let ratio = if selected { 4 } else { 128 };
        let p = bloomery_plugin_api::op::AttentionParams {
            v_from_k: true,
            sinks: true,
            window: window as u32,
            scale: c["scale"].as_f64().unwrap() as f32,
            comp: ratio,
            comp_selected: selected,
            ..bloomery_plugin_api::op::AttentionParams::gqa(h as u32, 1, d as u32)
        };
        // The indexer's picks as the mask shows them (for the CSA layer), listed from the highest
        // row down and padded with −1, as CompSelect lists them in its own order.
        let visible = ints(&c["comp_visible"]);
        let lists: Vec<i32> = (0..n)
            .flat_map(|i| {
                let row = &visible[i * n_comp as usize..(i + 1) * n_comp as usize];
                let mut l: Vec<i32> = (0..n_comp as i32)
                    .rev()
                    .filter(|&j| row[j as usize] == 1)
                    .collect();
                assert!(l.len() <= top_k as usize, "row {i}: {} picks", l.len());
                l.resize(top_k as usize, -1);
                l
            })
            .collect();
        let want = floats(&c["out"]);
        let row_len = (d * h) as usize;
        let q = floats(&c["q"]);
        let run = |t: &Session, caches: &[TensorRef; 2], rs: std::ops::Range<usize>| {
            let m = rs.len() as u64;
            let mut srcs = vec![
                t.f32s([d, h, m, 1], &q[rs.start * row_len..rs.end * row_len]),
                caches[0],
                caches[0],
                t.i32s([m, 1, 1, 1], &vec![1; m as usize]),
                t.i32s([m, 1, 1, 1], &kept[rs.clone()]),
                t.f32s([h, 1, 1, 1], &floats(&c["sinks"])),
                caches[1],
            ];
            if selected {
                let l = &lists[rs.start * top_k as usize..rs.end * top_k as usize];
                srcs.push(t.i32s([top_k, m, 1, 1], l));
            }
            let out = t.run(Op::Attention(p), &srcs, DType::F32, [d, h, m, 1]);
            t.read(&out)
        };
        // All kept rows in one call over a cache holding every position.
        let t = Session::new();
        let full = attention_caches(&t, c, d, rows, 0, rows - 1);
        check(
            &format!("{name}, one call"),
            &run(&t, &full, 0..n),
            &want,
            1e-6,
        );
        // Each row alone over a ring of `window` rows holding only its window.
        for i in 0..n {
            let t = Session::new();
            let pos = kept[i] as u64;
            let ring = attention_caches(&t, c, d, window, (pos + 1).saturating_sub(window), pos);
            let got = run(&t, &ring, i..i + 1);
            let what = format!("{name}, position {pos} over the ring");
            check(&what, &got, &want[i * row_len..(i + 1) * row_len], 1e-6);
        }
    }
}

/// The caches Compress writes in place may not overlap its other tensors: a raw state that is
/// the compressed cache, or a compressed cache that is an input, is refused by name.
#[test]
fn compress_refuses_overlapping_caches() {
    let t = Session::new();
    let (w, r) = (4u64, 2u64);
    let p = CompressParams {
        ratio: r as u32,
        overlap: false,
        width: w as u32,
        eps: 1e-6,
        rope: RopeParams {
            n_dims: 2,
            offset: 2,
            ..model_rope(&golden(), "main", 16)
        },
        form: CompressForm::Pool,
    };
    let x = t.f32s([w, 2, 1, 1], &[0.5; 8]);
    let ape = t.f32s([w, r, 1, 1], &[0.0; 8]);
    let norm = t.f32s([w, 1, 1, 1], &[1.0; 4]);
    let raw = t.f32s([2 * w, 4, 1, 1], &[0.0; 32]);
    let comp = t.f32s([w, 4, 1, 1], &[0.0; 16]);
    let (slots, pos) = (t.i32s([2, 1, 1, 1], &[0, 0]), t.i32s([2, 1, 1, 1], &[0, 1]));
    let ok = [x, x, ape, norm, raw, comp, slots, pos];
    t.run_into(Op::Compress(p), &ok, comp).unwrap();
    // The compressed cache viewed as the raw state's first rows.
    let raw_on_comp = TensorRef {
        ne: [2 * w, 1, 1, 1],
        nb: TensorRef::contiguous_strides(DType::F32, [2 * w, 1, 1, 1]).unwrap(),
        ..comp
    };
    let e = t
        .run_into(
            Op::Compress(p),
            &[x, x, ape, norm, raw_on_comp, comp, slots, pos],
            comp,
        )
        .unwrap_err();
    assert!(e.contains("raw state") && e.contains("overlaps"), "{e}");
    let comp_on_x = TensorRef {
        ne: [w, 2, 1, 1],
        nb: TensorRef::contiguous_strides(DType::F32, [w, 2, 1, 1]).unwrap(),
        ..x
    };
    let e = t
        .run_into(
            Op::Compress(p),
            &[x, x, ape, norm, raw, comp_on_x, slots, pos],
            comp_on_x,
        )
        .unwrap_err();
    assert!(e.contains("compressed cache overlaps source 0"), "{e}");
}
