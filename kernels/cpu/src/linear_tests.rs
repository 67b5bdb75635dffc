//! Routed experts: the result equals a plain per-pick computation bit for bit, serially and on
//! a pool, and does not depend on where the experts sit in the stacks.

use bloomery_plugin_api::{DType, PluginError};

use crate::linear::{moe_experts, quantize_acts, reference_rows_dot, ExpertStacks, GluFn, Serial};
use crate::pool::Pool;
use crate::quant::{self, vec_dot};

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn swiglu(g: &[f32], u: &[f32], o: &mut [f32]) -> Result<(), PluginError> {
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
    Ok(())
}

/// The experts of `(gate, up, down)` rearranged so that expert `e` sits at slot `slots[e]`.
fn permuted(stack: &[f32], per_expert: usize, slots: &[usize]) -> Vec<f32> {
    let mut out = vec![0f32; stack.len()];
    for (e, &s) in slots.iter().enumerate() {
        out[s * per_expert..(s + 1) * per_expert]
            .copy_from_slice(&stack[e * per_expert..(e + 1) * per_expert]);
    }
    out
}

#[test]
fn the_sum_does_not_depend_on_where_experts_sit() {
    let (n_embd, n_ff, n_expert, rows, k) = (32, 16, 6, 5, 3);
    let gate = values(n_embd * n_ff * n_expert, 1);
    let up = values(n_embd * n_ff * n_expert, 2);
    let down = values(n_ff * n_embd * n_expert, 3);
    let x = values(n_embd * rows, 4);
    // Every row picks three experts, some rows the same ones in another order.
    let ids: Vec<i32> = vec![0, 3, 5, 5, 0, 3, 1, 2, 4, 4, 2, 1, 3, 0, 5];
    let weights: Vec<f32> = values(rows * k, 5).iter().map(|w| w.abs() + 0.1).collect();
    let run = |g: &[f32], u: &[f32], d: &[f32], map: Option<&[i32]>| {
        let (g, u, d) = (bytes(g), bytes(u), bytes(d));
        let stacks = ExpertStacks {
            gate: &g,
            gate_t: DType::F32,
            up: Some((&u, DType::F32)),
            down: &d,
            down_t: DType::F32,
            n_embd,
            n_ff,
            n_expert,
        };
        let mut out = vec![0f32; n_embd * rows];
        moe_experts(
            &Serial,
            reference_rows_dot,
            &stacks,
            &x,
            &ids,
            &weights,
            k,
            map,
            &swiglu,
            &mut out,
        )
        .unwrap();
        out
    };
    let plain = run(&gate, &up, &down, None);
    // The same experts in reversed slots (as a tier's arena or a residency move places them).
    let slots: Vec<usize> = (0..n_expert).rev().collect();
    let map: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
    let moved = run(
        &permuted(&gate, n_embd * n_ff, &slots),
        &permuted(&up, n_embd * n_ff, &slots),
        &permuted(&down, n_ff * n_embd, &slots),
        Some(&map),
    );
    let same = plain
        .iter()
        .zip(&moved)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "results differ when the experts move");
}

/// `v` as weights of type `t`, in rows of `n`: quantized where the type has a quantizer, else
/// (the k-quants) random payload bytes from `v` with small f16 scales.
fn quantized(t: DType, v: &[f32], n: usize) -> Vec<u8> {
    let row = t.row_bytes(n as u64).unwrap() as usize;
    let mut out = vec![0u8; v.len() / n * row];
    for (src, dst) in v.chunks_exact(n).zip(out.chunks_exact_mut(row)) {
        if quant::quantize_row(t, src, dst).is_ok() {
            continue;
        }
        let scales: &[usize] = match t {
            DType::Q4_K => &[0, 2],
            DType::Q6_K => &[208],
            _ => panic!("no weights for {t}"),
        };
        let bytes = t.layout().unwrap().bytes as usize;
        for (d, s) in dst.iter_mut().zip(src.iter().cycle()) {
            *d = (s * 127.0) as i8 as u8;
        }
        for b in dst.chunks_exact_mut(bytes) {
            for &o in scales {
                b[o..o + 2].copy_from_slice(&crate::quant::bits::f32_to_f16(1e-2).to_le_bytes());
            }
        }
    }
    out
}

/// The routed FFN one pick at a time with the same quantizations and dot products, summed in
/// pick order: what `moe_experts` must equal exactly.
#[allow(clippy::too_many_arguments)]
fn per_pick(
    s: &ExpertStacks<'_>,
    x: &[f32],
    ids: &[i32],
    w: &[f32],
    k: usize,
    map: &[i32],
) -> Vec<f32> {
    let (e_dim, ff) = (s.n_embd, s.n_ff);
    let rows = x.len() / e_dim;
    let (up, up_t) = s.up.unwrap_or((s.gate, s.gate_t));
    let gate_rows = if s.up.is_some() { ff } else { 2 * ff };
    let (g_row, u_row, d_row) = (
        s.gate_t.row_bytes(e_dim as u64).unwrap() as usize,
        up_t.row_bytes(e_dim as u64).unwrap() as usize,
        s.down_t.row_bytes(ff as u64).unwrap() as usize,
    );
    let mut out = vec![0f32; rows * e_dim];
    for r in 0..rows {
        let xr = &x[r * e_dim..(r + 1) * e_dim];
        let (xg, xu) = (
            quantize_acts(s.gate_t, e_dim, xr, 1).unwrap(),
            quantize_acts(up_t, e_dim, xr, 1).unwrap(),
        );
        for j in 0..k {
            let slot = map[ids[r * k + j] as usize];
            if slot < 0 {
                continue;
            }
            let e = slot as usize;
            let mut h = vec![0f32; ff];
            for (f, h) in h.iter_mut().enumerate() {
                let g = &s.gate[(e * gate_rows + f) * g_row..][..g_row];
                let u = match s.up {
                    Some(_) => &up[(e * ff + f) * u_row..][..u_row],
                    None => &s.gate[(e * gate_rows + ff + f) * g_row..][..g_row],
                };
                let gv = vec_dot(s.gate_t, e_dim, g, &xg.data).unwrap();
                let uv = vec_dot(up_t, e_dim, u, &xu.data).unwrap();
                let mut o = [0f32];
                swiglu(&[gv], &[uv], &mut o).unwrap();
                *h = o[0];
            }
            let hq = quantize_acts(s.down_t, ff, &h, 1).unwrap();
            for o in 0..e_dim {
                let d = &s.down[(e * e_dim + o) * d_row..][..d_row];
                out[r * e_dim + o] += w[r * k + j] * vec_dot(s.down_t, ff, d, &hq.data).unwrap();
            }
        }
    }
    out
}

#[test]
fn quantized_experts_equal_the_per_pick_computation_serially_and_on_pools() {
    let (n_embd, n_ff, n_expert, rows, k) = (512, 256, 6, 4, 3);
    // Three workers split the experts' rows into tasks that straddle two experts; four do not.
    let pools = [
        Pool::with_threads(3).unwrap(),
        Pool::with_threads(4).unwrap(),
    ];
    for (gate_t, up_t, down_t, fused) in [
        (DType::Q4_K, DType::Q4_K, DType::Q6_K, false),
        (DType::Q8_0, DType::Q4_0, DType::Q8_0, false),
        (DType::Q4_K, DType::Q4_K, DType::Q4_K, true),
    ] {
        let gate_rows = if fused { 2 * n_ff } else { n_ff };
        let gate = quantized(gate_t, &values(n_embd * gate_rows * n_expert, 11), n_embd);
        let up = quantized(up_t, &values(n_embd * n_ff * n_expert, 12), n_embd);
        let down = quantized(down_t, &values(n_ff * n_embd * n_expert, 13), n_ff);
        let x = values(n_embd * rows, 14);
        // Rows share experts, one pick is skipped by the map (expert 4 is not held).
        let ids: Vec<i32> = vec![0, 3, 5, 5, 0, 3, 1, 2, 4, 4, 2, 1];
        let map: Vec<i32> = vec![0, 1, 2, 3, -1, 5];
        let weights: Vec<f32> = values(rows * k, 15).iter().map(|w| w.abs() + 0.1).collect();
        let stacks = ExpertStacks {
            gate: &gate,
            gate_t,
            up: (!fused).then_some((&up[..], up_t)),
            down: &down,
            down_t,
            n_embd,
            n_ff,
            n_expert,
        };
        let want = per_pick(&stacks, &x, &ids, &weights, k, &map);
        for par in [
            &Serial as &dyn crate::linear::Parallel,
            &pools[0],
            &pools[1],
        ] {
            let mut out = vec![f32::NAN; n_embd * rows];
            moe_experts(
                par,
                reference_rows_dot,
                &stacks,
                &x,
                &ids,
                &weights,
                k,
                Some(&map),
                &swiglu,
                &mut out,
            )
            .unwrap();
            let differ = out
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(differ.count(), 0, "{gate_t}/{up_t}/{down_t} fused={fused}");
        }
    }
}

/// Experts with no FFN rows (a malformed file) give zeros, on a pool too, rather than a panic.
#[test]
fn experts_without_ffn_rows_give_zeros() {
    let (n_embd, n_expert, rows, k) = (8, 2, 2, 1);
    let down = vec![0u8; 0];
    let stacks = ExpertStacks {
        gate: &[],
        gate_t: DType::F32,
        up: Some((&[], DType::F32)),
        down: &down,
        down_t: DType::F32,
        n_embd,
        n_ff: 0,
        n_expert,
    };
    let pool = Pool::with_threads(2).unwrap();
    for par in [&Serial as &dyn crate::linear::Parallel, &pool] {
        let mut out = vec![f32::NAN; n_embd * rows];
        moe_experts(
            par,
            reference_rows_dot,
            &stacks,
            &values(n_embd * rows, 1),
            &[0, 1],
            &[1.0; 2],
            k,
            None,
            &swiglu,
            &mut out,
        )
        .unwrap();
        assert!(out.iter().all(|&v| v == 0.0), "{out:?}");
    }
}

/// A gate/up task that panics (here in the activation) fails the call with its panic instead of
/// leaving the down tasks of its expert waiting: the pool stays usable afterwards.
#[test]
fn a_panicking_expert_task_fails_the_call_without_hanging() {
    let (n_embd, n_ff, n_expert, k) = (256, 256, 4, 2);
    let pool = Pool::with_threads(3).unwrap();
    let gate = quantized(DType::Q8_0, &values(n_embd * n_ff * n_expert, 21), n_embd);
    let up = quantized(DType::Q8_0, &values(n_embd * n_ff * n_expert, 22), n_embd);
    let down = quantized(DType::Q8_0, &values(n_ff * n_embd * n_expert, 23), n_ff);
    let stacks = ExpertStacks {
        gate: &gate,
        gate_t: DType::Q8_0,
        up: Some((&up[..], DType::Q8_0)),
        down: &down,
        down_t: DType::Q8_0,
        n_embd,
        n_ff,
        n_expert,
    };
    let x = values(n_embd, 24);
    let (ids, weights) = (vec![0, 2], vec![0.5, 0.5]);
    let calls = std::sync::atomic::AtomicUsize::new(0);
    // The first task to apply the activation panics.
    let failing = |g: &[f32], u: &[f32], h: &mut [f32]| {
        if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            panic!("planted");
        }
        swiglu(g, u, h)
    };
    let call = |glu: GluFn<'_>, out: &mut [f32]| {
        moe_experts(
            &pool,
            reference_rows_dot,
            &stacks,
            &x,
            &ids,
            &weights,
            k,
            None,
            glu,
            out,
        )
    };
    let mut out = vec![0f32; n_embd];
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(&failing, &mut out)));
    assert!(run.is_err(), "the planted panic reaches the caller");
    // The same pool computes the next call.
    let mut again = vec![0f32; n_embd];
    call(&swiglu, &mut again).unwrap();
    assert!(again.iter().any(|&v| v != 0.0));
}
