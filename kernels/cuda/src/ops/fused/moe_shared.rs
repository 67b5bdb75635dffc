//! A decode pass's sigmoid-gated shared expert run inside the routed experts' kernels: its gate
//! and up products, GLU and down product, the routed experts, and the gated sum `moe + sh ·
//! sigmoid(w · x)` (nine calls, seven launches) become three: the routed gate/up kernel with the
//! shared expert as one more slot (and a warp per row for the gate's logit), the quantization of
//! the hidden rows, and the down kernel adding the gated slot to the routed sum.
//! Taken for rows below the tiled products' batch when every stack has a pair form (Q8_0, Q4_K)
//! and no later call reads the results the kernels skip.

use bloomery_plugin_api::op::{GluKind, Op};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::PluginError;

use super::gated_add::gated_add_calls;
use super::{plain, skipped_read_later};
use crate::ops::activations::Quantized;
use crate::ops::matmul::MMQ_MIN_ROWS;
use crate::ops::moe::{moe_shared_kernels, SharedSlot};
use crate::ops::quant::{pairs_ok, weight_code};
use crate::ops::{contiguous_address, Buffers, Launcher};

/// Calls of the group: the shared expert's four, the routed experts, the gated sum's four.
const CALLS: usize = 9;

/// What the kernels take of a matched group.
struct Group {
    /// The shared expert's gate, up and down weights.
    gate: TensorRef,
    up: TensorRef,
    down: TensorRef,
    /// The gate's F32 weights, the rows every product reads, and the sum's output.
    gate_w: TensorRef,
    x: TensorRef,
    out: TensorRef,
}

/// The group at the head of `calls`, when its calls, shapes and types fit the fused kernels and
/// no call after it reads a result they skip. The output must not meet the routing's ids or
/// weights (other warps of its row read them while one writes).
fn group(calls: &[OpCall]) -> Option<Group> {
    let [g, u, glu, d, moe, gated @ ..] = calls else {
        return None;
    };
    let Op::MoeExperts(p) = moe.op else {
        return None;
    };
    let [w, gx, sh, sum, out] = gated_add_calls(gated)?;
    if g.op != Op::MatMul
        || u.op != Op::MatMul
        || d.op != Op::MatMul
        || glu.op
            != (Op::Glu {
                kind: GluKind::SwiGlu,
                limit: 0.0,
            })
        || [g, u, glu, d].iter().any(|c| c.n_srcs != 2)
        || p.glu != GluKind::SwiGlu
        || p.limit != 0.0
    {
        return None;
    }
    let x = g.srcs()[1];
    let (n_embd, rows, n_ff) = (x.ne[0], x.rows(), u64::from(p.n_ff));
    let (wg, wu, wd) = (g.srcs()[0], u.srcs()[0], d.srcs()[0]);
    let shaped = |t: &TensorRef, ne: [u64; 4]| t.ne == ne && t.is_contiguous();
    // The routed stacks' types: gate and up alike, each stack's type with a pair form.
    let code = |t: &TensorRef| weight_code(t.dtype).map(|c| c.0);
    let (gate, up, down) = if p.fused_gate_up {
        (moe.srcs().get(3), moe.srcs().get(3), moe.srcs().get(4))
    } else {
        (moe.srcs().get(3), moe.srcs().get(4), moe.srcs().get(5))
    };
    let kernels = match (gate.and_then(code), up.and_then(code), down.and_then(code)) {
        (Some(g), Some(u), Some(d)) if g == u => {
            code(&wg).and_then(|s| moe_shared_kernels(g, d, s))
        }
        _ => None,
    };
    let holds = u.srcs()[1] == x
        && glu.srcs()[0] == g.dst
        && glu.srcs()[1] == u.dst
        && d.srcs()[1] == glu.dst
        && moe.srcs().first() == Some(&x)
        && gx == x
        && sh == d.dst
        && sum == moe.dst
        && plain(&x, [n_embd, rows, 1, 1])
        && [&g.dst, &u.dst, &glu.dst]
            .into_iter()
            .all(|t| plain(t, [n_ff, rows, 1, 1]))
        && shaped(&wg, [n_embd, n_ff, 1, 1])
        && shaped(&wu, [n_embd, n_ff, 1, 1])
        && shaped(&wd, [n_ff, n_embd, 1, 1])
        && wu.dtype == wg.dtype
        && wd.dtype == wg.dtype
        && kernels.is_some()
        && moe.srcs()[1..].iter().all(|t| !t.shares_bytes(&out))
        && (1..MMQ_MIN_ROWS).contains(&rows)
        && n_ff <= i32::MAX as u64;
    let skipped = || skipped_read_later(&calls[..CALLS], &[out], &calls[CALLS..], None);
    (holds && !skipped()).then_some(Group {
        gate: wg,
        up: wu,
        down: wd,
        gate_w: w,
        x,
        out,
    })
}

/// Where the calls of a pass start a shared expert that the bundles run inside the routed
/// experts' decode kernels (for tests of the graphs and memory plans that must keep this form).
/// The stacks' alignment, which the launcher also checks, is not known from the calls.
pub fn shared_moes(calls: &[OpCall]) -> Vec<usize> {
    (0..calls.len())
        .filter(|&i| group(&calls[i..]).is_some())
        .collect()
}

impl Launcher {
    /// Launches the group at the head of `calls` (see [`group`]), returning how many calls it
    /// took (0: they do not form one, or a stack lacks the pair form's alignment).
    pub(super) fn moe_shared(
        &self,
        bufs: &dyn Buffers,
        calls: &[OpCall],
        held: Option<Quantized>,
    ) -> Result<usize, PluginError> {
        let Some(grp) = group(calls) else {
            return Ok(0);
        };
        let moe = &calls[4];
        let Op::MoeExperts(p) = moe.op else {
            return Ok(0);
        };
        let addr = |t: &TensorRef, what: &str| contiguous_address(bufs, t, what);
        // Every stack's rows aligned for the pair form.
        let srcs = moe.srcs();
        let down = srcs[if p.fused_gate_up { 4 } else { 5 }];
        let code = |t: &TensorRef| weight_code(t.dtype).map_or(-1, |c| c.0);
        let ws = code(&grp.gate);
        let stack = |t: &TensorRef, k: u64| -> Result<(u64, bool), PluginError> {
            let a = addr(t, "shared expert")?;
            Ok((a, pairs_ok(ws, a, t.nb[1] as i64, 0, k)))
        };
        let n_ff = u64::from(p.n_ff);
        let (pg, g_ok) = stack(&grp.gate, grp.x.ne[0])?;
        let (pu, u_ok) = stack(&grp.up, grp.x.ne[0])?;
        let (pd, d_ok) = stack(&grp.down, n_ff)?;
        let routed_down = addr(&down, "down")?;
        let (d_row, d_exp) = (down.nb[1] as i64, down.nb[2] as i64);
        if !(g_ok && u_ok && d_ok && pairs_ok(code(&down), routed_down, d_row, d_exp, n_ff)) {
            return Ok(0);
        }
        let slot = SharedSlot {
            gate: (pg, grp.gate.nb[1] as i64),
            up: (pu, grp.up.nb[1] as i64),
            down: (pd, grp.down.nb[1] as i64),
            wtype: ws,
            gate_w: addr(&grp.gate_w, "shared expert gate")?,
            x: addr(&grp.x, "x")?,
            out: addr(&grp.out, "dst")?,
            after_routing: self
                .after_routing
                .load(std::sync::atomic::Ordering::Relaxed),
        };
        let src = |i: usize| {
            srcs.get(i)
                .ok_or_else(|| PluginError::invalid(format!("MoeExperts: missing source {i}")))
        };
        self.moe(&addr, &src, moe, p, held, Some(&slot))?;
        Ok(CALLS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::op::{MoeParams, UnaryFn};
    use bloomery_plugin_api::DType;

    use crate::ops::tests::tensor_at as at;

    /// A qwen35moe decode group of `rows` rows (256 values, shared and routed experts of 64,
    /// Q8_0 stacks), its sum written to `out`: activations in buffer 1, the skipped results in
    /// buffer 2, the routing in buffer 3, weights in buffers 10 and above.
    fn calls(rows: u64, out: TensorRef) -> Vec<OpCall> {
        let act = |b, off, n| at(b, off, DType::F32, [n, rows, 1, 1]);
        let x = act(1, 0, 256);
        let (wg, wu, wd) = (
            at(10, 0, DType::Q8_0, [256, 64, 1, 1]),
            at(11, 0, DType::Q8_0, [256, 64, 1, 1]),
            at(12, 0, DType::Q8_0, [64, 256, 1, 1]),
        );
        let (g, u, h) = (act(2, 0, 64), act(2, 4096, 64), act(2, 8192, 64));
        let sh = act(1, 65536, 256);
        let ids = at(3, 0, DType::I32, [2, rows, 1, 1]);
        let weights = at(3, 4096, DType::F32, [2, rows, 1, 1]);
        let stack = |b, ne0, ne1| at(b, 0, DType::Q8_0, [ne0, ne1, 4, 1]);
        let moe = act(1, 131072, 256);
        let p = MoeParams {
            n_expert: 4,
            k: 2,
            n_ff: 64,
            glu: GluKind::SwiGlu,
            limit: 0.0,
            fused_gate_up: false,
            expert_map: false,
        };
        let gw = at(13, 0, DType::F32, [256, 1, 1, 1]);
        let (logit, gate, gated) = (act(2, 16384, 1), act(2, 20480, 1), act(2, 24576, 256));
        let swiglu = Op::Glu {
            kind: GluKind::SwiGlu,
            limit: 0.0,
        };
        vec![
            OpCall::new(Op::MatMul, &[wg, x], g),
            OpCall::new(Op::MatMul, &[wu, x], u),
            OpCall::new(swiglu, &[g, u], h),
            OpCall::new(Op::MatMul, &[wd, h], sh),
            OpCall::new(
                Op::MoeExperts(p),
                &[
                    x,
                    ids,
                    weights,
                    stack(14, 256, 64),
                    stack(15, 256, 64),
                    stack(16, 64, 256),
                ],
                moe,
            ),
            OpCall::new(Op::MatMul, &[gw, x], logit),
            OpCall::new(
                Op::Unary {
                    f: UnaryFn::Sigmoid,
                },
                &[logit],
                gate,
            ),
            OpCall::new(Op::Mul, &[sh, gate], gated),
            OpCall::new(Op::Add, &[moe, gated], out),
        ]
    }

    fn out(rows: u64) -> TensorRef {
        at(1, 196608, DType::F32, [256, rows, 1, 1])
    }

    #[test]
    fn a_decode_groups_shared_expert_joins_the_routed_kernels() {
        for rows in [1, 4, 15] {
            assert_eq!(shared_moes(&calls(rows, out(rows))), vec![0], "{rows} rows");
        }
        // Over the activations (the down kernel reads none of them) as well.
        assert!(group(&calls(1, at(1, 0, DType::F32, [256, 1, 1, 1]))).is_some());
    }

    #[test]
    fn a_group_is_refused_off_the_kernels_forms() {
        // A batch for the tiled products.
        assert!(group(&calls(16, out(16))).is_none());
        // The output over the routing weights, which other warps of its row read.
        let over_weights = at(3, 4096, DType::F32, [256, 1, 1, 1]);
        assert!(group(&calls(1, over_weights)).is_none());
        // A later call reads the shared expert's product, which the kernels skip.
        let mut read = calls(1, out(1));
        let sh = read[3].dst;
        read.push(OpCall::new(Op::Add, &[sh, sh], out(1)));
        assert!(group(&read).is_none());
        // The GLU's gate and up swapped.
        let mut swapped = calls(1, out(1));
        let (g, u) = (swapped[0].dst, swapped[1].dst);
        swapped[2] = OpCall::new(swapped[2].op, &[u, g], swapped[2].dst);
        assert!(group(&swapped).is_none());
        // Shared stacks of a type without a pair form.
        let mut f32_shared = calls(1, out(1));
        for (i, ne) in [
            (0, [256, 64, 1, 1]),
            (1, [256, 64, 1, 1]),
            (3, [64, 256, 1, 1]),
        ] {
            let c = f32_shared[i];
            let w = at(10 + i as u64, 0, DType::F32, ne);
            f32_shared[i] = OpCall::new(c.op, &[w, c.srcs()[1]], c.dst);
        }
        assert!(group(&f32_shared).is_none());
    }
}
