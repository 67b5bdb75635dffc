//! A residual `Add` and the `RmsNorm` of its result (`bl_add_rms_norm_f32`), or two Adds and the
//! `RmsNorm` of the second's result (`bl_add2_rms_norm_f32`: a MoE layer's parts summed, then the
//! residual), as one kernel of `cu/norm.cuh`: every sum is written as the Adds would write it and
//! normed exactly as `bl_rms_norm_f32` norms it, with the norm's Q8_1 copy too when a quantized
//! product reads it next.

use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::{plain, quantized_reader};
use crate::ops::activations::Quantized;
use crate::ops::norm::norm_shape;
use crate::ops::{cfg, driver_err, Launcher};

/// The tensors of two adds and an RMS norm at the head of `calls` that `bl_add2_rms_norm_f32`
/// runs (a MoE layer's parts summed, then the residual and the next norm): `m = a + b`, `d = c + m`
/// (the second Add reading `m` as either source), `out = rms_norm(d) · w`, all contiguous f32 of
/// one shape (`w` one row, or none). Each of `m`, `d` and `out` is an input exactly or meets none
/// of them (a thread reads an index's inputs before it writes that index). Returns
/// `[a, b, c, m, d, out]` and `w`.
pub(super) fn add2_norm_calls(calls: &[OpCall]) -> Option<([TensorRef; 6], Option<TensorRef>)> {
    let [first, second, norm, ..] = calls else {
        return None;
    };
    let Op::RmsNorm { .. } = norm.op else {
        return None;
    };
    if first.op != Op::Add || second.op != Op::Add || first.n_srcs != 2 || second.n_srcs != 2 {
        return None;
    }
    let (a, b, m) = (first.srcs()[0], first.srcs()[1], first.dst);
    let c = match (second.srcs()[0] == m, second.srcs()[1] == m) {
        (true, false) => second.srcs()[1],
        (false, true) => second.srcs()[0],
        _ => return None,
    };
    let (d, out) = (second.dst, norm.dst);
    if norm.srcs().first() != Some(&d) {
        return None;
    }
    let w = match norm.srcs().get(1) {
        Some(w) if w.dtype == DType::F32 && w.is_contiguous() && w.elements() == d.ne[0] => {
            Some(*w)
        }
        Some(_) => return None,
        None => None,
    };
    let ne = d.ne;
    let clear = |t: &TensorRef, inputs: &[&TensorRef]| {
        inputs
            .iter()
            .all(|u| !t.shares_bytes(u) || (t.buffer == u.buffer && t.offset == u.offset))
    };
    let holds = [&a, &b, &c, &m, &d, &out].into_iter().all(|t| plain(t, ne))
        && clear(&m, &[&a, &b, &c])
        && clear(&d, &[&a, &b, &c, &m])
        && clear(&out, &[&a, &b, &c, &m, &d])
        && w.is_none_or(|w| !out.shares_bytes(&w))
        && d.ne[0] <= i32::MAX as u64;
    holds.then_some(([a, b, c, m, d, out], w))
}

/// Where the calls of a pass start two adds and an RMS norm that the bundles launch as one kernel
/// ([`add2_norm_calls`]: a tiered layer's parts summed, then the residual and the next norm).
pub fn add2_norms(calls: &[OpCall]) -> Vec<usize> {
    (0..calls.len())
        .filter(|&i| add2_norm_calls(&calls[i..]).is_some())
        .collect()
}

impl Launcher {
    /// `d = a + b; out = rms_norm(d) · w` for same-shape `a`, `b`; with `quantize`, also the
    /// Q8_1 copy of `out` in the scratch. `None`: the pattern does not hold; else the copy
    /// written, if any.
    pub(super) fn add_rms_norm(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        add: &OpCall,
        norm: &OpCall,
        eps: f32,
        quantize: bool,
    ) -> Result<Option<Option<Quantized>>, PluginError> {
        let ne = add.dst.ne;
        if add.n_srcs != 2 || norm.srcs()[0] != add.dst {
            return Ok(None);
        }
        let (a, b) = (&add.srcs()[0], &add.srcs()[1]);
        if ![a, b, &add.dst, &norm.dst]
            .into_iter()
            .all(|t| plain(t, ne))
        {
            return Ok(None);
        }
        let ncols = ne[0];
        let pw = match norm.srcs().get(1) {
            Some(w) if w.dtype == DType::F32 && w.is_contiguous() && w.elements() == ncols => {
                addr(w)?
            }
            Some(_) => return Ok(None),
            None => 0u64,
        };
        let (pa, pb, pd, po) = (addr(a)?, addr(b)?, addr(&add.dst)?, addr(&norm.dst)?);
        let n = ncols as i32;
        let f = self.func("bl_add_rms_norm_f32")?;
        let mut l = self.args(&f);
        // Each warp of the kernel holds whole 32-value blocks when rows are whole blocks.
        let copy = self.copy_slot(
            quantize && ncols.is_multiple_of(32),
            po,
            norm.dst.elements(),
        )?;
        let q = copy.map_or(0u64, |c| c.q);
        let (threads, quads) = norm_shape(ncols, &[pa, pb, pd, pw, po]);
        l.arg(&pa)
            .arg(&pb)
            .arg(&pd)
            .arg(&pw)
            .arg(&po)
            .arg(&q)
            .arg(&n)
            .arg(&eps)
            .arg(&quads);
        // SAFETY: one block per row of ncols contiguous f32 in each tensor, whose spans the
        // buffer table checked.
        unsafe { l.launch(cfg(norm.dst.rows() as u32, threads)) }
            .map_err(driver_err("bl_add_rms_norm_f32"))?;
        Ok(Some(copy))
    }

    /// Two adds and an RMS norm (see [`add2_norm_calls`]) at the head of `calls` as one kernel,
    /// with the Q8_1 copy of the norm's output when a quantized product reads it next. `None`:
    /// the pattern does not hold; else the copy written, if any.
    pub(super) fn add2_rms_norm(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
    ) -> Result<Option<Option<Quantized>>, PluginError> {
        let Some(([a, b, c, m, d, out], w)) = add2_norm_calls(calls) else {
            return Ok(None);
        };
        let Op::RmsNorm { eps } = calls[2].op else {
            return Ok(None);
        };
        let ncols = d.ne[0];
        let pw = w.map(|w| addr(&w)).transpose()?.unwrap_or(0);
        let (pa, pb, pc, pm, pd, po) = (
            addr(&a)?,
            addr(&b)?,
            addr(&c)?,
            addr(&m)?,
            addr(&d)?,
            addr(&out)?,
        );
        let quantize = quantized_reader(&out, &calls[3..]);
        let copy = self.copy_slot(quantize && ncols.is_multiple_of(32), po, out.elements())?;
        let q = copy.map_or(0u64, |c| c.q);
        let (threads, quads) = norm_shape(ncols, &[pa, pb, pc, pm, pd, pw, po]);
        let n = ncols as i32;
        let f = self.func("bl_add2_rms_norm_f32")?;
        let mut l = self.args(&f);
        l.arg(&pa)
            .arg(&pb)
            .arg(&pc)
            .arg(&pm)
            .arg(&pd)
            .arg(&pw)
            .arg(&po)
            .arg(&q)
            .arg(&n)
            .arg(&eps)
            .arg(&quads);
        // SAFETY: one block per row of ncols contiguous f32 in each tensor, whose spans the
        // buffer table checked.
        unsafe { l.launch(cfg(out.rows() as u32, threads)) }
            .map_err(driver_err("bl_add2_rms_norm_f32"))?;
        Ok(Some(copy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::tensor_at;

    fn tensor(buffer: u64, dtype: DType, ne: [u64; 4]) -> TensorRef {
        tensor_at(buffer, 0, dtype, ne)
    }

    #[test]
    fn two_adds_and_a_norm_fuse_only_when_each_result_is_clear_of_the_inputs() {
        let row = [64, 1, 1, 1];
        let at = |buffer, offset| TensorRef {
            offset,
            ..tensor(buffer, DType::F32, row)
        };
        let add = |x: TensorRef, y: TensorRef, d: TensorRef| OpCall::new(Op::Add, &[x, y], d);
        let norm = |x: TensorRef, w: TensorRef, d: TensorRef| {
            OpCall::new(Op::RmsNorm { eps: 1e-6 }, &[x, w], d)
        };
        // A tiered layer's end: the bus share's part plus the host's (page-locked, buffer 9),
        // then the residual (the second Add reads the sum as its second source), then the norm.
        let (bus, host, res, w) = (at(1, 0), at(9, 0), at(2, 0), at(3, 0));
        let (sum, x, normed) = (at(4, 0), at(4, 256), at(4, 512));
        let calls = [add(bus, host, sum), add(res, sum, x), norm(x, w, normed)];
        let (t, weight) = add2_norm_calls(&calls).expect("the pattern");
        assert_eq!(t, [bus, host, res, sum, x, normed]);
        assert_eq!(weight, Some(w));
        // The sum as the second Add's first source: the same.
        let swapped = [calls[0], add(sum, res, x), calls[2]];
        assert_eq!(add2_norm_calls(&swapped).unwrap().0[2], res);
        // A result exactly over an input is fine; one partly over it is not.
        let over = [add(bus, host, bus), add(res, bus, x), norm(x, w, normed)];
        assert!(add2_norm_calls(&over).is_some());
        let partly = [
            add(bus, host, at(2, 128)),
            add(res, at(2, 128), x),
            norm(x, w, normed),
        ];
        assert!(add2_norm_calls(&partly).is_none());
        // The second Add not reading the sum, or the norm not reading the second Add's result.
        let apart = [calls[0], add(res, bus, x), calls[2]];
        assert!(add2_norm_calls(&apart).is_none());
        let other = [calls[0], calls[1], norm(res, w, normed)];
        assert!(add2_norm_calls(&other).is_none());
        // A broadcast add is not this kernel's.
        let one = TensorRef {
            ne: [1, 1, 1, 1],
            nb: [4, 4, 4, 4],
            ..at(5, 0)
        };
        let broadcast = [add(bus, one, sum), calls[1], calls[2]];
        assert!(add2_norm_calls(&broadcast).is_none());
    }
}
