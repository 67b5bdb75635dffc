//! Tests of the dispatch of the recurrent ops (a state written besides the destination), of the
//! one-value-per-row broadcast of Add and Mul, of same-type copies, of the k-pool selection and
//! of TopK.

use super::*;
use crate::linear::{reference_rows_dot, Serial};
use bloomery_plugin_api::op::DeltaRuleParams;

/// An f32 or i32 tensor of shape `ne` in a fresh buffer, holding `data` (as little-endian bytes).
fn tensor(buf: &Buffers, dtype: DType, ne: [u64; 4], data: &[u8]) -> TensorRef {
    let handle = buf.alloc(data.len() as u64).unwrap();
    buf.write(handle, 0, data).unwrap();
    TensorRef {
        buffer: handle,
        offset: 0,
        dtype,
        ne,
        nb: TensorRef::contiguous_strides(dtype, ne).unwrap(),
    }
}

fn f32_tensor(buf: &Buffers, ne: [u64; 4], v: &[f32]) -> TensorRef {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    tensor(buf, DType::F32, ne, &bytes)
}

fn i32_tensor(buf: &Buffers, v: &[i32]) -> TensorRef {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    tensor(buf, DType::I32, [v.len() as u64, 1, 1, 1], &bytes)
}

fn read(buf: &Buffers, t: &TensorRef) -> Vec<f32> {
    let mut bytes = vec![0u8; t.span_bytes().unwrap() as usize];
    buf.read(t.buffer, t.offset, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

const DR: DeltaRuleParams = DeltaRuleParams {
    n_head_k: 1,
    n_head_v: 2,
    dk: 4,
    dv: 3,
    scale: 0.5,
    per_dim_gate: false,
    beta_scale: 1.0,
};

/// The delta rule's sources for 2 rows of slot 1 at positions 5 and 6, over a 2-slot state.
fn delta_rule_srcs(buf: &Buffers) -> Vec<TensorRef> {
    vec![
        f32_tensor(buf, [4, 1, 2, 1], &values(8, 1)),
        f32_tensor(buf, [4, 1, 2, 1], &values(8, 2)),
        f32_tensor(buf, [3, 2, 2, 1], &values(12, 3)),
        f32_tensor(buf, [2, 2, 1, 1], &[-0.1, -0.2, -0.3, -0.4]),
        f32_tensor(buf, [2, 2, 1, 1], &[0.9, 0.5, 0.3, 0.7]),
        f32_tensor(buf, [4 * 3 * 2, 1, 2, 1], &values(48, 6)),
        i32_tensor(buf, &[1, 1]),
        i32_tensor(buf, &[5, 6]),
    ]
}

/// The serial reference backend over `buf`.
fn backend(buf: &Buffers) -> Backend<'_> {
    Backend {
        buffers: buf,
        par: &Serial,
        dot: reference_rows_dot,
    }
}

#[test]
fn delta_rule_writes_its_output_and_its_state() {
    let buf = Buffers::default();
    let b = backend(&buf);
    let srcs = delta_rule_srcs(&buf);
    let dst = f32_tensor(&buf, [3, 2, 2, 1], &[f32::NAN; 12]);
    run(&b, &OpCall::new(Op::DeltaRule(DR), &srcs, dst)).unwrap();
    let mut state = values(48, 6);
    let mut out = vec![0f32; 12];
    let (q, k, v) = (values(8, 1), values(8, 2), values(12, 3));
    let x = ops::delta_rule::DeltaRuleInputs {
        q: &q,
        k: &k,
        v: &v,
        gate: &[-0.1, -0.2, -0.3, -0.4],
        beta: &[0.9, 0.5, 0.3, 0.7],
        slots: &[1, 1],
        positions: &[5, 6],
    };
    let p = ops::delta_rule::DeltaRuleParams {
        n_head_k: 1,
        n_head_v: 2,
        dk: 4,
        dv: 3,
        n_slots: 2,
        scale: 0.5,
        beta_scale: 1.0,
        per_dim_gate: false,
        form: ops::delta_rule::Form::Steps,
    };
    ops::delta_rule::delta_rule(&Serial, &x, &p, &mut state, &mut out).unwrap();
    assert_eq!(read(&buf, &dst), out);
    assert_eq!(read(&buf, &srcs[5]), state);
    assert_ne!(&state[24..], &values(48, 6)[24..], "slot 1 moved");
    assert_eq!(&state[..24], &values(48, 6)[..24], "slot 0 untouched");
}

#[test]
fn a_state_overlapping_another_tensor_is_refused() {
    let buf = Buffers::default();
    let b = backend(&buf);
    let srcs = delta_rule_srcs(&buf);
    // The output written over the state's first bytes.
    let dst = TensorRef {
        ne: [3, 2, 2, 1],
        nb: TensorRef::contiguous_strides(DType::F32, [3, 2, 2, 1]).unwrap(),
        ..srcs[5]
    };
    let err = run(&b, &OpCall::new(Op::DeltaRule(DR), &srcs, dst)).unwrap_err();
    assert!(
        err.to_string().contains("overlaps the destination"),
        "{err}"
    );
    // The state given again as the queries.
    let mut aliased = srcs.clone();
    aliased[0] = TensorRef {
        ne: [4, 1, 2, 1],
        nb: TensorRef::contiguous_strides(DType::F32, [4, 1, 2, 1]).unwrap(),
        offset: 16,
        ..srcs[5]
    };
    let dst = f32_tensor(&buf, [3, 2, 2, 1], &[0.0; 12]);
    let err = run(&b, &OpCall::new(Op::DeltaRule(DR), &aliased, dst)).unwrap_err();
    assert!(err.to_string().contains("overlaps source 0"), "{err}");
    assert_eq!(read(&buf, &srcs[5]), values(48, 6), "nothing written");
}

#[test]
fn conv_causal_writes_its_output_and_its_state() {
    let buf = Buffers::default();
    let b = backend(&buf);
    // 2 channels, 3 taps, one row of slot 0 at position 4 over a 1-slot state.
    let srcs = [
        f32_tensor(&buf, [2, 1, 1, 1], &[10.0, 20.0]),
        f32_tensor(&buf, [3, 2, 1, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        f32_tensor(&buf, [4, 1, 1, 1], &[0.5, 0.25, 1.5, 1.25]),
        i32_tensor(&buf, &[0]),
        i32_tensor(&buf, &[4]),
    ];
    let dst = f32_tensor(&buf, [2, 1, 1, 1], &[f32::NAN; 2]);
    run(
        &b,
        &OpCall::new(
            Op::ConvCausal {
                taps: 3,
                dilation: 1,
            },
            &srcs,
            dst,
        ),
    )
    .unwrap();
    // channel 0: 1·0.5 + 2·1.5 + 3·10; channel 1: 4·0.25 + 5·1.25 + 6·20
    assert_eq!(read(&buf, &dst), vec![33.5, 127.25]);
    assert_eq!(read(&buf, &srcs[2]), vec![1.5, 1.25, 10.0, 20.0]);
    let short = TensorRef {
        ne: [2, 2, 1, 1],
        nb: TensorRef::contiguous_strides(DType::F32, [2, 2, 1, 1]).unwrap(),
        ..srcs[1]
    };
    let err = run(
        &b,
        &OpCall::new(
            Op::ConvCausal {
                taps: 3,
                dilation: 1,
            },
            &[srcs[0], short, srcs[2], srcs[3], srcs[4]],
            dst,
        ),
    );
    assert!(err.is_err());
}

#[test]
fn add_and_mul_broadcast_one_value_per_row() {
    let buf = Buffers::default();
    let b = backend(&buf);
    let a = f32_tensor(&buf, [3, 2, 1, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let per_row = f32_tensor(&buf, [1, 2, 1, 1], &[10.0, -1.0]);
    let one_row = f32_tensor(&buf, [3, 1, 1, 1], &[1.0, 0.0, -1.0]);
    let dst = f32_tensor(&buf, [3, 2, 1, 1], &[f32::NAN; 6]);
    run(&b, &OpCall::new(Op::Mul, &[a, per_row], dst)).unwrap();
    assert_eq!(read(&buf, &dst), vec![10.0, 20.0, 30.0, -4.0, -5.0, -6.0]);
    run(&b, &OpCall::new(Op::Add, &[a, per_row], dst)).unwrap();
    assert_eq!(read(&buf, &dst), vec![11.0, 12.0, 13.0, 3.0, 4.0, 5.0]);
    run(&b, &OpCall::new(Op::Add, &[a, one_row], dst)).unwrap();
    assert_eq!(read(&buf, &dst), vec![2.0, 2.0, 2.0, 5.0, 5.0, 5.0]);
    // One value wide rows: per row and same shape coincide.
    let column = f32_tensor(&buf, [1, 2, 1, 1], &[3.0, 4.0]);
    let dst1 = f32_tensor(&buf, [1, 2, 1, 1], &[f32::NAN; 2]);
    run(&b, &OpCall::new(Op::Mul, &[column, per_row], dst1)).unwrap();
    assert_eq!(read(&buf, &dst1), vec![30.0, -4.0]);
    let three = f32_tensor(&buf, [1, 3, 1, 1], &[1.0, 2.0, 3.0]);
    assert!(run(&b, &OpCall::new(Op::Add, &[a, three], dst)).is_err());
}

#[test]
fn copies_move_i32_and_may_overlap() {
    let buf = Buffers::default();
    let b = backend(&buf);
    // I32 ids keep every bit, denormal-looking values as f32 included.
    let ids = i32_tensor(&buf, &[1, 7, 1 << 20, -1]);
    let dst = i32_tensor(&buf, &[0; 4]);
    run(&b, &OpCall::new(Op::Copy, &[ids], dst)).unwrap();
    let bits = |t: &TensorRef| {
        read(&buf, t)
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&dst), vec![1, 7, 1 << 20, u32::MAX]);
    // A copy onto itself, and one shifted by a value within the same buffer, move as memmove does.
    run(&b, &OpCall::new(Op::Copy, &[dst], dst)).unwrap();
    assert_eq!(bits(&dst), vec![1, 7, 1 << 20, u32::MAX]);
    let whole = f32_tensor(&buf, [4, 1, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
    let view = |offset: u64| TensorRef {
        offset,
        ne: [3, 1, 1, 1],
        nb: TensorRef::contiguous_strides(DType::F32, [3, 1, 1, 1]).unwrap(),
        ..whole
    };
    run(&b, &OpCall::new(Op::Copy, &[view(0)], view(4))).unwrap();
    assert_eq!(read(&buf, &whole), vec![1.0, 1.0, 2.0, 3.0]);
    // A strided I32 view (the second pair of each 4-id row) into a contiguous destination.
    let rows = i32_tensor(&buf, &[1, 2, 3, 4, 5, 6, 7, -8]);
    let pairs = TensorRef {
        offset: 8,
        ne: [2, 2, 1, 1],
        nb: [4, 16, 32, 32],
        ..rows
    };
    let dst = TensorRef {
        ne: [2, 2, 1, 1],
        nb: TensorRef::contiguous_strides(DType::I32, [2, 2, 1, 1]).unwrap(),
        ..i32_tensor(&buf, &[0; 4])
    };
    run(&b, &OpCall::new(Op::Copy, &[pairs], dst)).unwrap();
    assert_eq!(bits(&dst), vec![3, 4, 7, (-8i32) as u32]);
}

const KP: bloomery_plugin_api::op::KPoolParams = bloomery_plugin_api::op::KPoolParams {
    n_head: 2,
    head_dim: 4,
    kpool: 2,
    n_top: 1,
    tail: true,
    mode: bloomery_plugin_api::op::KPoolMode::SoftmaxGate,
};

/// The k-pool selection's sources for rows at positions 0..=2 of slot 1 over a 2-slot cache of 4
/// rows, as f32 or f16 cache values.
fn kpool_srcs(buf: &Buffers, cache: DType) -> Vec<TensorRef> {
    let rows = values(12 * 8, 4);
    let cache = match cache {
        DType::F16 => {
            let b: Vec<u8> = rows
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect();
            tensor(buf, DType::F16, [12, 4, 2, 1], &b)
        }
        _ => f32_tensor(buf, [12, 4, 2, 1], &rows),
    };
    vec![
        f32_tensor(buf, [4, 2, 3, 1], &values(24, 1)),
        f32_tensor(buf, [2, 3, 1, 1], &[1.0, 0.5, 1.0, 0.5, 1.0, 0.5]),
        cache,
        f32_tensor(buf, [4, 2, 1, 1], &values(8, 3)),
        i32_tensor(buf, &[1, 1, 1]),
        i32_tensor(buf, &[0, 1, 2]),
    ]
}

fn read_i32(buf: &Buffers, t: &TensorRef) -> Vec<i32> {
    read(buf, t)
        .into_iter()
        .map(f32::to_bits)
        .map(|b| b as i32)
        .collect()
}

#[test]
fn kpool_select_runs_on_either_cache_type_and_refuses_bad_calls_by_name() {
    for cache in [DType::F32, DType::F16] {
        let buf = Buffers::default();
        let b = backend(&buf);
        let srcs = kpool_srcs(&buf, cache);
        let dst = tensor(&buf, DType::I32, [3, 3, 1, 1], &[0x55; 36]);
        run(&b, &OpCall::new(Op::KPoolSelect(KP), &srcs, dst)).unwrap();
        // Position 0: no pool, tail 0; 1: pool 0, no tail; 2: pool 0, tail 2.
        assert_eq!(
            read_i32(&buf, &dst),
            [-1, -1, 0, 0, 1, -1, 0, 1, 2],
            "{cache}"
        );
    }
    let buf = Buffers::default();
    let b = backend(&buf);
    let srcs = kpool_srcs(&buf, DType::F32);
    let dst = tensor(&buf, DType::I32, [4, 3, 1, 1], &[0; 48]);
    let err = run(&b, &OpCall::new(Op::KPoolSelect(KP), &srcs, dst)).unwrap_err();
    assert!(
        err.to_string().contains("KPoolSelect of 2 heads of 4"),
        "{err}"
    );
    // The destination written over the cache's first bytes.
    let dst = TensorRef {
        dtype: DType::I32,
        ne: [3, 3, 1, 1],
        nb: TensorRef::contiguous_strides(DType::I32, [3, 3, 1, 1]).unwrap(),
        ..srcs[2]
    };
    let err = run(&b, &OpCall::new(Op::KPoolSelect(KP), &srcs, dst)).unwrap_err();
    assert!(
        err.to_string()
            .contains("cache (source 2) overlaps the destination"),
        "{err}"
    );
    let mut bad = srcs.clone();
    bad[2].dtype = DType::I32;
    let dst = tensor(&buf, DType::I32, [3, 3, 1, 1], &[0; 36]);
    let err = run(&b, &OpCall::new(Op::KPoolSelect(KP), &bad, dst)).unwrap_err();
    assert!(
        err.to_string().contains("KPoolSelect over a I32 cache"),
        "{err}"
    );
}

/// TopK gives what sorting every index of a row gives (largest first in `total_cmp`'s order,
/// ties to the lower index): rows with few distinct values (ties across the k-th place), many,
/// a NaN, infinities; k of 1, 10 and the whole row.
#[test]
fn top_k_equals_a_full_sort_of_each_row() {
    let mut rows: Vec<Vec<f32>> = vec![
        values(500, 3).iter().map(|v| (v * 8.0).round()).collect(),
        values(500, 4),
        values(7, 5),
        vec![
            1.0,
            f32::NAN,
            3.0,
            f32::NEG_INFINITY,
            3.0,
            f32::INFINITY,
            -0.0,
            0.0,
        ],
    ];
    rows[1][17] = -7.0;
    for row in &rows {
        let n = row.len();
        for k in [1, 10.min(n), n] {
            let mut idx: Vec<usize> = (0..n).collect();
            idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let want: Vec<i32> = idx[..k].iter().map(|&i| i as i32).collect();
            let mut got = vec![-1; k];
            top_k(row, n, k, &mut got).unwrap();
            assert_eq!(got, want, "k {k} of {n}");
        }
    }
    // Two rows at once, and the refusals.
    let two = [rows[1].clone(), rows[0].clone()].concat();
    let mut got = vec![-1; 20];
    top_k(&two, 500, 10, &mut got).unwrap();
    let (mut a, mut b) = (vec![-1; 10], vec![-1; 10]);
    top_k(&rows[1], 500, 10, &mut a).unwrap();
    top_k(&rows[0], 500, 10, &mut b).unwrap();
    assert_eq!(got, [a, b].concat());
    assert!(top_k(&rows[2], 7, 8, &mut [0; 8]).is_err());
}
