//! Launches of MatMul over a stack of per-head matrices (`cu/matmul_heads.cuh`): `w [k, n, h]`
//! times `x [k, h, m]` gives `[n, h, m]`, one product per head (latent attention's absorbed
//! `attn_k_b`/`attn_v_b`). F32 weights read the f32 activations; weights of [`QUANT_TYPES`] read
//! their Q8_1 copy in the scratch (the one the previous kernel left there when it matches). One
//! warp per (output row, head, column).
//!
//! [`QUANT_TYPES`]: super::QUANT_TYPES

use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::activations::Quantized;
use super::quant::weight_code;
use super::{cfg, driver_err, grid, Addr, Launcher, BLOCK, WARPS};

/// Whether a MatMul's weights are a stack of per-head matrices.
pub(super) fn is_per_head(w: &TensorRef) -> bool {
    w.ne[2] > 1 || w.ne[3] > 1
}

impl Launcher {
    /// `y[:, j, r] = W_j·x[:, j, r]` for the weight stack `w` and the f32 activations `x`; `held`
    /// is the Q8_1 copy the scratch holds.
    pub(super) fn matmul_heads(
        &self,
        addr: Addr<'_>,
        w: &TensorRef,
        x: &TensorRef,
        c: &OpCall,
        held: Option<Quantized>,
    ) -> Result<(), PluginError> {
        let (k, n, h) = (w.ne[0], w.ne[1], w.ne[2]);
        let m = x.ne[2] * x.ne[3];
        if w.ne[3] != 1
            || x.ne[0] != k
            || x.ne[1] != h
            || c.dst.ne != [n, h, m, 1]
            || !x.is_contiguous()
            || !c.dst.is_contiguous()
            || n * h * m > i32::MAX as u64
        {
            return Err(PluginError::invalid(format!(
                "per-head MatMul shapes {:?} x {:?} -> {:?} (want w [k, n, h], x [k, h, m] -> \
                 [n, h, m], contiguous)",
                w.ne, x.ne, c.dst.ne
            )));
        }
        let (wtype, block) = weight_code(w.dtype).ok_or_else(|| {
            PluginError::unsupported(
                format!("MatMul with {} weights", w.dtype),
                &["f32 and the quantized types of the CUDA bundles"],
            )
        })?;
        let (pw, px, py) = (addr(w, "w")?, addr(x, "x")?, addr(&c.dst, "dst")?);
        let x_row = if w.dtype == DType::F32 {
            (k * 4) as i64
        } else {
            if k % block.max(32) != 0 {
                return Err(PluginError::invalid(format!(
                    "{} rows must be whole blocks",
                    w.dtype
                )));
            }
            ((k / 32) * 36) as i64
        };
        let xs = if w.dtype == DType::F32 {
            px
        } else {
            let copy = self.quantize_in_scratch(px, (k / 32) * h * m, held)?;
            // The next product may reuse the copy unless this one overwrites x.
            let (x_end, y_end) = (px + x.elements() * 4, py + c.dst.elements() * 4);
            if y_end <= px || x_end <= py {
                self.keep_quantized(copy)?;
            }
            copy.q
        };
        let (w_stride, w_head) = (w.nb[1] as i64, w.nb[2] as i64);
        let (ki, ni, hi, mi) = (k as i32, n as i32, h as i32, m as i32);
        let name = "bl_matmul_heads";
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&pw)
            .arg(&w_stride)
            .arg(&w_head)
            .arg(&xs)
            .arg(&x_row)
            .arg(&py)
            .arg(&ki)
            .arg(&ni)
            .arg(&hi)
            .arg(&mi)
            .arg(&wtype);
        // SAFETY: one warp per (row, head, column), striding over the n·h·m tasks; the weight
        // stack, the activations (or their Q8_1 copy, x_row bytes a column) and y hold the
        // shapes checked above.
        unsafe { l.launch(cfg(grid(n * h * m, WARPS), BLOCK)) }.map_err(driver_err(name))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stacks_of_several_matrices_are_per_head() {
        let t = |ne| TensorRef {
            buffer: 0,
            offset: 0,
            dtype: DType::Q8_0,
            ne,
            nb: TensorRef::contiguous_strides(DType::Q8_0, ne).unwrap(),
        };
        assert!(is_per_head(&t([256, 512, 64, 1])));
        assert!(!is_per_head(&t([256, 512, 1, 1])));
    }
}
