//! The hyper-connection ops and clamped SwiGLU against transformers 5.24's own `glm5_next` code
//! (fixtures/hyper/: `Glm5NextTextHyperConnection`'s Sinkhorn, collapse and the decoder layer's
//! stream update, `Glm5NextTextHyperHead`'s mean, `Glm5NextTextExperts._apply_gate`), each run
//! through the CPU dispatch as a graph node would be, rows split over a pool of three workers.

use bloomery_kernels_cpu::dispatch::{self, Backend};
use bloomery_kernels_cpu::linear::reference_rows_dot;
use bloomery_kernels_cpu::memory::Buffers;
use bloomery_kernels_cpu::pool::Pool;
use bloomery_plugin_api::op::{GluKind, Op};
use bloomery_plugin_api::tensor::{OpCall, TensorRef, MAX_SRCS};
use bloomery_plugin_api::DType;
use serde_json::Value;

fn golden() -> Value {
    serde_json::from_str(include_str!("fixtures/hyper/glm5_next_hf.json")).expect("the golden")
}

fn floats(v: &Value) -> Vec<f32> {
    let a = v.as_array().expect("a list of numbers");
    a.iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

/// An f32 tensor of extents `ne` holding `data`, in a fresh buffer.
fn tensor(buf: &Buffers, ne: [u64; 4], data: &[f32]) -> TensorRef {
    assert_eq!(ne.iter().product::<u64>() as usize, data.len(), "{ne:?}");
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    let handle = buf.alloc(bytes.len() as u64).unwrap();
    buf.write(handle, 0, &bytes).unwrap();
    TensorRef {
        buffer: handle,
        offset: 0,
        dtype: DType::F32,
        ne,
        nb: TensorRef::contiguous_strides(DType::F32, ne).unwrap(),
    }
}

/// Runs `op` on `srcs` into a fresh (NaN-poisoned) destination of extents `dst` and returns it.
fn run(op: Op, srcs: &[(&[f32], [u64; 4])], dst: [u64; 4]) -> Vec<f32> {
    try_run(op, srcs, dst).unwrap()
}

/// [`run`], or the dispatch's error.
fn try_run(op: Op, srcs: &[(&[f32], [u64; 4])], dst: [u64; 4]) -> Result<Vec<f32>, String> {
    let buf = Buffers::default();
    let pool = Pool::with_threads(3).unwrap();
    let mut refs = [TensorRef::default(); MAX_SRCS];
    for (r, (data, ne)) in refs.iter_mut().zip(srcs) {
        *r = tensor(&buf, *ne, data);
    }
    let out = tensor(
        &buf,
        dst,
        &vec![f32::NAN; dst.iter().product::<u64>() as usize],
    );
    let call = OpCall {
        op,
        n_srcs: srcs.len() as u32,
        srcs: refs,
        dst: out,
    };
    let b = Backend {
        buffers: &buf,
        par: &pool,
        dot: reference_rows_dot,
    };
    dispatch::run(&b, &call).map_err(|e| e.to_string())?;
    let mut bytes = vec![0u8; out.span_bytes().unwrap() as usize];
    buf.read(out.buffer, 0, &mut bytes).unwrap();
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
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

#[test]
fn hyper_connection_ops_match_transformers() {
    let g = golden();
    for case in g["hyper"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let dim = |k: &str| case[k].as_u64().unwrap();
        let (rows, s, n) = (dim("rows"), dim("n_streams"), dim("n_embd"));
        let f = |k: &str| floats(&case[k]);
        let op = Op::Sinkhorn {
            iters: dim("iters") as u32,
            eps: case["eps"].as_f64().unwrap() as f32,
        };
        let comb = run(op, &[(&f("sinkhorn_in"), [s, s, rows, 1])], [s, s, rows, 1]);
        check(
            &format!("{name}: Sinkhorn"),
            &comb,
            &f("sinkhorn_out"),
            1e-6,
        );

        let streams = f("streams");
        let mix = run(
            Op::StreamMix,
            &[(&streams, [n, s, rows, 1]), (&f("pre"), [s, rows, 1, 1])],
            [n, rows, 1, 1],
        );
        check(&format!("{name}: StreamMix"), &mix, &f("mix_out"), 1e-6);

        // transformers' final collapse is the streams' mean: StreamMix with weights 1/s.
        let quarter = vec![1.0 / s as f32; (s * rows) as usize];
        let mean = run(
            Op::StreamMix,
            &[(&streams, [n, s, rows, 1]), (&quarter, [s, rows, 1, 1])],
            [n, rows, 1, 1],
        );
        check(&format!("{name}: stream mean"), &mean, &f("mean_out"), 1e-6);

        let update = run(
            Op::StreamUpdate,
            &[
                (&streams, [n, s, rows, 1]),
                (&f("sinkhorn_out"), [s, s, rows, 1]),
                (&f("post"), [s, rows, 1, 1]),
                (&f("y"), [n, rows, 1, 1]),
            ],
            [n, s, rows, 1],
        );
        check(
            &format!("{name}: StreamUpdate"),
            &update,
            &f("update_out"),
            1e-6,
        );
    }
}

#[test]
fn clamped_swiglu_matches_transformers() {
    let g = golden();
    for case in g["swiglu_clamp"].as_array().unwrap() {
        let (rows, n_ff) = (
            case["rows"].as_u64().unwrap(),
            case["n_ff"].as_u64().unwrap(),
        );
        let op = Op::Glu {
            kind: GluKind::SwiGlu,
            limit: case["limit"].as_f64().unwrap() as f32,
        };
        let ne = [n_ff, rows, 1, 1];
        let out = run(
            op,
            &[(&floats(&case["gate"]), ne), (&floats(&case["up"]), ne)],
            ne,
        );
        check("clamped SwiGLU", &out, &floats(&case["out"]), 1e-6);
    }
}

#[test]
fn mismatched_shapes_are_refused_by_name() {
    let v = vec![0.5f32; 64];
    // A comb of 3 rows for streams of 2 rows; weights of 3 streams for 4.
    let err = try_run(
        Op::StreamUpdate,
        &[
            (&v[..32], [4, 4, 2, 1]),
            (&v[..48], [4, 4, 3, 1]),
            (&v[..8], [4, 2, 1, 1]),
            (&v[..8], [4, 2, 1, 1]),
        ],
        [4, 4, 2, 1],
    )
    .unwrap_err();
    assert!(err.contains("StreamUpdate: sources"), "{err}");
    let err = try_run(
        Op::StreamMix,
        &[(&v[..32], [4, 4, 2, 1]), (&v[..6], [3, 2, 1, 1])],
        [4, 2, 1, 1],
    )
    .unwrap_err();
    assert!(err.contains("StreamMix: sources"), "{err}");
    let op = Op::Sinkhorn {
        iters: 0,
        eps: 1e-6,
    };
    let err = try_run(op, &[(&v[..32], [4, 4, 2, 1])], [4, 4, 2, 1]).unwrap_err();
    assert!(err.contains("0 iterations"), "{err}");
}

#[test]
fn a_limit_is_refused_on_geglu_and_below_zero() {
    let v = [0.5f32; 8];
    let ne = [8, 1, 1, 1];
    for (kind, limit) in [
        (GluKind::GeGlu, 7.0),
        (GluKind::SwiGlu, -1.0),
        (GluKind::SwiGlu, f32::NAN),
    ] {
        let err = try_run(Op::Glu { kind, limit }, &[(&v, ne), (&v, ne)], ne).unwrap_err();
        assert!(err.contains("GLU limit"), "{kind:?} {limit}: {err}");
    }
    assert!(try_run(
        Op::Glu {
            kind: GluKind::GeGlu,
            limit: 0.0
        },
        &[(&v, ne), (&v, ne)],
        ne
    )
    .is_ok());
}
