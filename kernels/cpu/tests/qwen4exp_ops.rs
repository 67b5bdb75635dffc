//! The ops Qwen3.8-Flash-Next adds (per-element StreamMix, StreamUpdate with the identity comb,
//! GroupDotGate, dilated ConvCausal, KPoolSelect with the QSA pooling) against transformers 5.24's
//! own `qwen4_exp` modules (fixtures/qwen4exp/: the decoder layer's n-gram table layer and
//! attention mixer, made by `tests/oracle/hf_qwen4exp_ops.py`; the QSA indexer, made by
//! `tests/oracle/hf_qwen4exp_qsa.py`), each run through the CPU dispatch as a graph node would be,
//! rows split over a pool of three workers.

use bloomery_kernels_cpu::dispatch::{self, Backend};
use bloomery_kernels_cpu::linear::reference_rows_dot;
use bloomery_kernels_cpu::memory::Buffers;
use bloomery_kernels_cpu::pool::Pool;
use bloomery_plugin_api::op::{KPoolMode, KPoolParams, Op, RopeMode, RopeParams, UnaryFn};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::DType;
use serde_json::Value;

fn golden() -> Value {
    serde_json::from_str(include_str!("fixtures/qwen4exp/ops_hf.json")).expect("the golden")
}

fn floats(v: &Value) -> Vec<f32> {
    let a = v.as_array().expect("a list of numbers");
    a.iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

/// Buffers, a pool of three workers and the calls run on them.
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

    /// A tensor of `dtype` and extents `ne` holding `bytes`, in a fresh buffer.
    fn raw(&self, dtype: DType, ne: [u64; 4], bytes: &[u8]) -> TensorRef {
        let handle = self.buf.alloc(bytes.len() as u64).unwrap();
        self.buf.write(handle, 0, bytes).unwrap();
        TensorRef {
            buffer: handle,
            offset: 0,
            dtype,
            ne,
            nb: TensorRef::contiguous_strides(dtype, ne).unwrap(),
        }
    }

    /// An f32 tensor of extents `ne` holding `data`.
    fn f32s(&self, ne: [u64; 4], data: &[f32]) -> TensorRef {
        assert_eq!(ne.iter().product::<u64>() as usize, data.len(), "{ne:?}");
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.raw(DType::F32, ne, &bytes)
    }

    /// The values of i32 tensor `t`.
    fn read_i32(&self, t: &TensorRef) -> Vec<i32> {
        let mut bytes = vec![0u8; t.span_bytes().unwrap() as usize];
        self.buf.read(t.buffer, 0, &mut bytes).unwrap();
        bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Runs `op` on `srcs` into a fresh i32 destination of extents `dst`.
    fn run_i32(&self, op: Op, srcs: &[TensorRef], dst: [u64; 4]) -> Result<TensorRef, String> {
        let n = dst.iter().product::<u64>() as usize;
        let bytes = vec![0x55u8; 4 * n];
        let out = self.raw(DType::I32, dst, &bytes);
        let b = Backend {
            buffers: &self.buf,
            par: &self.pool,
            dot: reference_rows_dot,
        };
        dispatch::run(&b, &OpCall::new(op, srcs, out)).map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// An i32 tensor `[len]` holding `data`.
    fn i32s(&self, data: &[i32]) -> TensorRef {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.raw(DType::I32, [data.len() as u64, 1, 1, 1], &bytes)
    }

    /// Runs `op` on `srcs` into a fresh (NaN-poisoned) destination of extents `dst`.
    fn run(&self, op: Op, srcs: &[TensorRef], dst: [u64; 4]) -> Result<TensorRef, String> {
        let n = dst.iter().product::<u64>() as usize;
        let out = self.f32s(dst, &vec![f32::NAN; n]);
        let b = Backend {
            buffers: &self.buf,
            par: &self.pool,
            dot: reference_rows_dot,
        };
        dispatch::run(&b, &OpCall::new(op, srcs, out)).map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// The values of f32 tensor `t`.
    fn read(&self, t: &TensorRef) -> Vec<f32> {
        let mut bytes = vec![0u8; t.span_bytes().unwrap() as usize];
        self.buf.read(t.buffer, 0, &mut bytes).unwrap();
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
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

/// One golden case's extents and tensors.
struct Case {
    name: String,
    rows: u64,
    n: u64,
    s: u64,
    v: Value,
}

impl Case {
    fn f(&self, key: &str) -> Vec<f32> {
        floats(&self.v[key])
    }

    fn dim(&self, key: &str) -> u64 {
        self.v[key].as_u64().unwrap()
    }
}

fn cases() -> Vec<Case> {
    let g = golden();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| Case {
            name: v["name"].as_str().unwrap().to_owned(),
            rows: v["rows"].as_u64().unwrap(),
            n: v["n_embd"].as_u64().unwrap(),
            s: v["n_streams"].as_u64().unwrap(),
            v: v.clone(),
        })
        .collect()
}

#[test]
fn the_ple_gate_matches_transformers() {
    for c in cases() {
        let t = Session::new();
        let (n, s, rows) = (c.n, c.s, c.rows);
        let streams = [n, s, rows, 1];
        let (kn, qn) = (t.f32s(streams, &c.f("kn")), t.f32s(streams, &c.f("qn")));
        let op = Op::GroupDotGate {
            scale: 1.0 / (n as f32).sqrt(),
            floor: 1e-6,
        };
        let gate = t.run(op, &[kn, qn], [s, rows, 1, 1]).unwrap();
        // The gated value σ(d_j)·value for each stream: the identity update of zero streams.
        let zeros = t.f32s(streams, &vec![0.0; (n * s * rows) as usize]);
        let value = t.f32s([n, rows, 1, 1], &c.f("value"));
        let gated = t
            .run(Op::StreamUpdate, &[zeros, gate, value], streams)
            .unwrap();
        check(
            &format!("{}: PLE gated value", c.name),
            &t.read(&gated),
            &c.f("gated"),
            1e-6,
        );
    }
}

#[test]
fn the_dilated_ple_conv_matches_transformers_across_calls() {
    for c in cases() {
        let t = Session::new();
        let (ch, rows) = (c.n * c.s, c.rows);
        let (taps, dilation) = (c.dim("taps"), c.dim("dilation"));
        let op = Op::ConvCausal {
            taps: taps as u32,
            dilation: dilation as u32,
        };
        let w = t.f32s([taps, ch, 1, 1], &c.f("conv_w"));
        // Two slots of garbage: the sequence (slot 1) starts at position 0, so it reads zeros.
        let hist = ch * (taps - 1) * dilation;
        let state = t.f32s([hist, 1, 2, 1], &vec![7.0; 2 * hist as usize]);
        let x = c.f("gated_normed");
        let (mut conv, mut start) = (Vec::new(), 0);
        // A prompt in two calls (5 rows, then the rest), as chunked prefill would run it.
        for end in [5.min(rows), rows] {
            if end == start {
                continue;
            }
            let part = &x[(start * ch) as usize..(end * ch) as usize];
            let srcs = [
                t.f32s([ch, end - start, 1, 1], part),
                w,
                state,
                t.i32s(&vec![1; (end - start) as usize]),
                t.i32s(&(start as i32..end as i32).collect::<Vec<_>>()),
            ];
            let out = t.run(op, &srcs, [ch, end - start, 1, 1]).unwrap();
            conv.extend(t.read(&out));
            start = end;
        }
        check(
            &format!("{}: dilated conv", c.name),
            &conv,
            &c.f("conv"),
            1e-6,
        );
        // The slot keeps its last (taps − 1)·dilation inputs (zeros before the start), slot 0 is
        // untouched.
        let kept = t.read(&state);
        assert!(kept[..hist as usize].iter().all(|&v| v == 7.0));
        let from = x.len().saturating_sub(hist as usize);
        let tail = &kept[hist as usize + (hist as usize - (x.len() - from))..];
        assert_eq!(tail, &x[from..], "{}: the state", c.name);
        // The layer's output: gated + silu(conv).
        let conv = t.f32s([ch, rows, 1, 1], &conv);
        let act = t
            .run(Op::Unary { f: UnaryFn::Silu }, &[conv], [ch, rows, 1, 1])
            .unwrap();
        let gated = t.f32s([ch, rows, 1, 1], &c.f("gated"));
        let out = t.run(Op::Add, &[gated, act], [ch, rows, 1, 1]).unwrap();
        check(
            &format!("{}: PLE output", c.name),
            &t.read(&out),
            &c.f("ple_out"),
            1e-6,
        );
    }
}

#[test]
fn the_gated_mixer_and_identity_combine_match_transformers() {
    for c in cases() {
        let t = Session::new();
        let (n, s, rows) = (c.n, c.s, c.rows);
        let streams = [n, s, rows, 1];
        let g = t.f32s(streams, &c.f("g"));
        let sig = t
            .run(
                Op::Unary {
                    f: UnaryFn::Sigmoid,
                },
                &[g],
                streams,
            )
            .unwrap();
        let w = t
            .run(Op::Scale { s: 1.0 / s as f32 }, &[sig], streams)
            .unwrap();
        let xn = t.f32s(streams, &c.f("xn"));
        let mixed = t.run(Op::StreamMix, &[xn, w], [n, rows, 1, 1]).unwrap();
        check(
            &format!("{}: gated mean", c.name),
            &t.read(&mixed),
            &c.f("mixed"),
            1e-6,
        );
        let srcs = [
            t.f32s(streams, &c.f("streams")),
            t.f32s([s, rows, 1, 1], &c.f("inject")),
            t.f32s([n, rows, 1, 1], &c.f("y")),
        ];
        let combined = t.run(Op::StreamUpdate, &srcs, streams).unwrap();
        check(
            &format!("{}: identity combine", c.name),
            &t.read(&combined),
            &c.f("combined"),
            1e-6,
        );
    }
}

/// The QSA selection's parameters: `n_head` heads of `dh`, blocks of `ratio`, `budget` tokens, the
/// model's rope (IMROPE [11, 11, 10, 0] on the first `rope_dims` dims).
fn qsa(n_head: u32, dh: u32, ratio: u32, budget: u32, rope_dims: u32, eps: f32) -> KPoolParams {
    let rope = RopeParams::unscaled(RopeMode::Imrope, rope_dims, [11, 11, 10, 0], 1e7);
    KPoolParams {
        n_head,
        head_dim: dh,
        kpool: ratio,
        n_top: budget / ratio,
        tail: true,
        mode: KPoolMode::MeanNormRope {
            eps,
            rope,
            scale: 1.0 / (dh as f32).sqrt(),
        },
    }
}

#[test]
fn the_qsa_block_selection_matches_transformers_across_calls() {
    let g: Value =
        serde_json::from_str(include_str!("fixtures/qwen4exp/qsa_hf.json")).expect("the golden");
    for v in g["cases"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let dim = |k: &str| v[k].as_u64().unwrap();
        let (rows, nh, dh) = (dim("rows"), dim("n_head"), dim("head_dim"));
        let (ratio, budget) = (dim("ratio") as u32, dim("budget") as u32);
        let eps = v["eps"].as_f64().unwrap() as f32;
        let p = qsa(
            nh as u32,
            dh as u32,
            ratio,
            budget,
            dim("rope_dims") as u32,
            eps,
        );
        let n_sel = u64::from(ratio * (budget / ratio) + ratio - 1);
        let t = Session::new();
        // Slot 1 holds the sequence (raw keys in the first half of each row; NaN in the pooled
        // half until the op writes it); slot 0 is NaN throughout and must stay so.
        let len = 64;
        let mut cache = vec![f32::NAN; (2 * dh * len * 2) as usize];
        let raw = floats(&v["raw_keys"]);
        for (pos, key) in raw.chunks_exact(dh as usize).enumerate() {
            let at = ((len + pos as u64) * 2 * dh) as usize;
            cache[at..at + dh as usize].copy_from_slice(key);
        }
        let cache = t.f32s([2 * dh, len, 2, 1], &cache);
        let k_norm = t.f32s([dh, 1, 1, 1], &floats(&v["k_norm"]));
        let q = floats(&v["q"]);
        let per_q = (nh * dh) as usize;
        let mut got = Vec::new();
        // A prompt in two calls, split inside a block.
        let split = rows / 2 + 1;
        for (r0, r1) in [(0, split), (split, rows)] {
            let n = r1 - r0;
            let srcs = [
                t.f32s([dh, nh, n, 1], &q[r0 as usize * per_q..r1 as usize * per_q]),
                k_norm,
                cache,
                t.i32s(&vec![1; n as usize]),
                t.i32s(&(r0 as i32..r1 as i32).collect::<Vec<_>>()),
            ];
            let out = t.run_i32(Op::KPoolSelect(p), &srcs, [n_sel, n, 1, 1]);
            got.extend(t.read_i32(&out.unwrap()));
        }
        for (r, want) in v["selected"].as_array().unwrap().iter().enumerate() {
            let mut sel: Vec<i64> = got[r * n_sel as usize..(r + 1) * n_sel as usize]
                .iter()
                .filter(|&&e| e >= 0)
                .map(|&e| i64::from(e))
                .collect();
            sel.sort_unstable();
            let want: Vec<i64> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_i64().unwrap())
                .collect();
            assert_eq!(sel, want, "{name}: row {r}");
        }
        let kept = t.read(&cache);
        assert!(
            kept[..(2 * dh * len) as usize].iter().all(|v| v.is_nan()),
            "{name}: slot 0"
        );
        eprintln!(
            "{name}: {rows} rows select as transformers' indexer (smallest gap {})",
            v["min_gap"]
        );
    }
}

#[test]
fn mismatched_new_forms_are_refused_by_name() {
    let t = Session::new();
    let v = vec![0.5f32; 64];
    // Per-element weights of 3 streams for 4; an identity update whose post has 3 streams.
    let x = t.f32s([4, 4, 2, 1], &v[..32]);
    let err = t
        .run(
            Op::StreamMix,
            &[x, t.f32s([4, 3, 2, 1], &v[..24])],
            [4, 2, 1, 1],
        )
        .unwrap_err();
    assert!(err.contains("StreamMix: sources"), "{err}");
    let err = t
        .run(
            Op::StreamUpdate,
            &[
                x,
                t.f32s([3, 2, 1, 1], &v[..6]),
                t.f32s([4, 2, 1, 1], &v[..8]),
            ],
            [4, 4, 2, 1],
        )
        .unwrap_err();
    assert!(err.contains("StreamUpdate: sources"), "{err}");
    let gate = |floor: f32, b: TensorRef, dst: [u64; 4]| {
        let op = Op::GroupDotGate { scale: 1.0, floor };
        t.run(op, &[x, b], dst).unwrap_err()
    };
    let err = gate(1e-6, t.f32s([4, 4, 1, 1], &v[..16]), [4, 2, 1, 1]);
    assert!(err.contains("GroupDotGate: sources"), "{err}");
    let err = gate(-1.0, x, [4, 2, 1, 1]);
    assert!(err.contains("GroupDotGate: floor -1"), "{err}");
    let err = t
        .run(
            Op::ConvCausal {
                taps: 4,
                dilation: 0,
            },
            &[
                t.f32s([2, 1, 1, 1], &v[..2]),
                t.f32s([4, 2, 1, 1], &v[..8]),
                t.f32s([6, 1, 1, 1], &v[..6]),
                t.i32s(&[0]),
                t.i32s(&[0]),
            ],
            [2, 1, 1, 1],
        )
        .unwrap_err();
    assert!(err.contains("dilation 0"), "{err}");
    // A QSA cache of DSA rows (3·dh).
    let p = qsa(1, 4, 2, 4, 4, 1e-6);
    let srcs = [
        t.f32s([4, 1, 1, 1], &v[..4]),
        t.f32s([4, 1, 1, 1], &v[..4]),
        t.f32s([12, 4, 1, 1], &v[..48]),
        t.i32s(&[0]),
        t.i32s(&[0]),
    ];
    let err = t
        .run_i32(Op::KPoolSelect(p), &srcs, [5, 1, 1, 1])
        .unwrap_err();
    assert!(err.contains("KPoolSelect of 1 heads of 4"), "{err}");
}
