//! A sigmoid-gated shared expert's sum, `out = moe + sh · sigmoid(w · x)` (its gate's one-output
//! F32 product, the sigmoid, the Mul and the Add), as one kernel (`bl_gated_add_f32` in
//! `cu/router.cuh`) that writes only `out`: taken only when no later call reads the three results
//! it skips.

use bloomery_plugin_api::op::{Op, UnaryFn};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::{plain, skipped_read_later};
use crate::ops::{driver_err, Launcher};

/// The weights, input, shared expert, routed sum and output of a sigmoid-gated shared expert's
/// sum at the head of `calls` (`out = moe + sh · sigmoid(w · x)` per row: a one-output F32
/// product, its sigmoid, the Mul and the Add), which `bl_gated_add_f32` runs writing only `out`:
/// taken when no later call reads the three results it skips, and `out` is each input exactly or
/// meets none of them (each thread writes only indices its row has read).
pub(super) fn gated_add_calls(calls: &[OpCall]) -> Option<[TensorRef; 5]> {
    let [mm, sig, mul, add, rest @ ..] = calls else {
        return None;
    };
    if mm.op != Op::MatMul
        || mm.n_srcs != 2
        || sig.op
            != (Op::Unary {
                f: UnaryFn::Sigmoid,
            })
        || sig.n_srcs != 1
        || mul.op != Op::Mul
        || mul.n_srcs != 2
        || add.op != Op::Add
        || add.n_srcs != 2
    {
        return None;
    }
    let (w, x) = (mm.srcs()[0], mm.srcs()[1]);
    let (k, rows) = (x.ne[0], x.rows());
    let (ne, one) = ([k, rows, 1, 1], [1, rows, 1, 1]);
    let other = |c: &OpCall, t: &TensorRef| match (c.srcs()[0] == *t, c.srcs()[1] == *t) {
        (true, false) => Some(c.srcs()[1]),
        (false, true) => Some(c.srcs()[0]),
        _ => None,
    };
    let (sh, moe) = (other(mul, &sig.dst)?, other(add, &mul.dst)?);
    let out = add.dst;
    let clear =
        |t: &TensorRef| !t.shares_bytes(&out) || (t.buffer == out.buffer && t.offset == out.offset);
    let holds = w.dtype == DType::F32
        && w.is_contiguous()
        && w.ne[0] == k
        && w.elements() == k
        && plain(&x, ne)
        && plain(&mm.dst, one)
        && sig.srcs()[0] == mm.dst
        && plain(&sig.dst, one)
        && [&sh, &mul.dst, &moe, &out]
            .into_iter()
            .all(|t| plain(t, ne))
        && [&x, &sh, &moe].into_iter().all(clear)
        && (1..=u64::from(u32::MAX)).contains(&rows)
        && k <= i32::MAX as u64;
    (holds && !skipped_read_later(&calls[..4], &[out], rest, None)).then_some([w, x, sh, moe, out])
}

/// Where the calls of a pass start a sigmoid-gated shared expert's sum that the bundles launch as
/// one kernel (for tests of the graphs and memory plans that must keep these calls in this form).
pub fn gated_adds(calls: &[OpCall]) -> Vec<usize> {
    (0..calls.len())
        .filter(|&i| gated_add_calls(&calls[i..]).is_some())
        .collect()
}

impl Launcher {
    /// Launches a sigmoid-gated shared expert's sum (see [`gated_add_calls`]) at the head of
    /// `calls`, returning whether they formed one.
    pub(super) fn gated_add(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
    ) -> Result<bool, PluginError> {
        let Some([w, x, sh, moe, out]) = gated_add_calls(calls) else {
            return Ok(false);
        };
        let (pw, px, psh, pm, po) = (addr(&w)?, addr(&x)?, addr(&sh)?, addr(&moe)?, addr(&out)?);
        let k = x.ne[0];
        // Blocks of 256 threads, each writing a slice of its row when out is not x's memory (a
        // block would otherwise write x while another of its row reads it).
        let slices = if x.shares_bytes(&out) {
            1
        } else {
            k.div_ceil(256)
        };
        let ki = k as i32;
        let f = self.func("bl_gated_add_f32")?;
        let mut l = self.args(&f);
        l.arg(&pw).arg(&px).arg(&psh).arg(&pm).arg(&po).arg(&ki);
        let launch = LaunchConfig {
            grid_dim: (x.rows() as u32, slices as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: blocks (row, slice) read their row of k contiguous f32 in each tensor (checked
        // spans; w holds k) and write their slice of out's row; out meets x only with one slice.
        unsafe { l.launch(launch) }.map_err(driver_err("bl_gated_add_f32"))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::tensor_at;

    fn tensor(buffer: u64, dtype: DType, ne: [u64; 4]) -> TensorRef {
        tensor_at(buffer, 0, dtype, ne)
    }

    /// A gated shared expert's sum over 8 values of 2 rows, its output at `out_at` of buffer 1
    /// (shared expert at 0, routed sum at 256, input at 512; the skipped results in buffer 2).
    fn gated_sum(out_at: u64) -> Vec<OpCall> {
        let at = |buffer, offset, ne| TensorRef {
            offset,
            ..tensor(buffer, DType::F32, ne)
        };
        let (x, sh, moe) = (
            at(1, 512, [8, 2, 1, 1]),
            at(1, 0, [8, 2, 1, 1]),
            at(1, 256, [8, 2, 1, 1]),
        );
        let w = tensor(3, DType::F32, [8, 1, 1, 1]);
        let (logit, gate, gated) = (
            at(2, 0, [1, 2, 1, 1]),
            at(2, 64, [1, 2, 1, 1]),
            at(2, 128, [8, 2, 1, 1]),
        );
        vec![
            OpCall::new(Op::MatMul, &[w, x], logit),
            OpCall::new(
                Op::Unary {
                    f: UnaryFn::Sigmoid,
                },
                &[logit],
                gate,
            ),
            OpCall::new(Op::Mul, &[sh, gate], gated),
            OpCall::new(Op::Add, &[moe, gated], at(1, out_at, [8, 2, 1, 1])),
        ]
    }

    #[test]
    fn a_gated_sum_is_taken_when_its_output_is_an_input_exactly_or_apart() {
        assert!(gated_add_calls(&gated_sum(1024)).is_some());
        // Over the shared expert's own memory (each thread reads where it writes)...
        assert!(gated_add_calls(&gated_sum(0)).is_some());
        // ...but not shifted against it, where a thread would write another's input.
        assert!(gated_add_calls(&gated_sum(4)).is_none());
        // Nor when a later call reads the sigmoid it skips.
        let mut calls = gated_sum(1024);
        let gate = calls[1].dst;
        calls.push(OpCall::new(
            Op::Add,
            &[gate, gate],
            tensor(4, DType::F32, gate.ne),
        ));
        assert!(gated_add_calls(&calls).is_none());
        assert_eq!(gated_adds(&gated_sum(1024)), vec![0]);
    }
}
