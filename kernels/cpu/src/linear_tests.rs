//! Routed experts: where the experts sit in the stacks does not change the result.

use bloomery_plugin_api::{DType, PluginError};

use crate::linear::{moe_experts, ExpertStacks, Serial};
use crate::quant::vec_dot;

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
            &Serial, vec_dot, &stacks, &x, &ids, &weights, k, map, &swiglu, &mut out,
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
