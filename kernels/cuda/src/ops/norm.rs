//! Row norms (`cu/norm.cuh`): RMSNorm (with an optional weight) and L2 norm, one block per row,
//! the sums in f64 as the CPU reference takes them. Rows of whole quads with 16-byte aligned
//! pointers take the RMSNorm's register form (the row held as quads, every load issued before the
//! one reduction). An RMSNorm whose result a quantized product reads next writes its Q8_1 copy as
//! well. The fused forms that end in a norm are in `fused::add_norm` and `fused::copy_l2_norm`.

use std::sync::atomic::Ordering;

use bloomery_plugin_api::op::{OpKind, OpSupport};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};

use super::{cfg, claim, driver_err, f32_only, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![
        claim(OpKind::RmsNorm, &[DType::F32]),
        claim(OpKind::L2Norm, &[DType::F32]),
    ]
}

/// Threads of a row kernel with `ncols` columns: a thread per 2 columns, 32 to 1024.
pub(super) fn row_threads(ncols: u64) -> u32 {
    (ncols as u32).div_ceil(64).clamp(1, 32) * 32
}

/// Quads (4 floats) per thread of the norms' register form (`NORM_QUADS` in cu/norm.cuh).
pub(super) const NORM_QUADS: u64 = 4;

/// Threads per row of `bl_rms_norm_f32` / `bl_add_rms_norm_f32` and their `quads` argument: the
/// register form (`rms_norm_quads`) when rows are whole quads that 1,024 threads can hold and
/// every row pointer is 16-byte aligned, else a thread per 2 columns.
pub(super) fn norm_shape(ncols: u64, ptrs: &[u64]) -> (u32, i32) {
    let quads = ncols.is_multiple_of(4)
        && ncols <= 4 * NORM_QUADS * 1024
        && ptrs.iter().all(|p| p.is_multiple_of(16));
    if quads {
        let threads = (ncols / 4).div_ceil(NORM_QUADS).div_ceil(32).clamp(1, 32) as u32 * 32;
        (threads, 1)
    } else {
        (row_threads(ncols), 0)
    }
}

impl Launcher {
    /// `x / rms(x)`, times the weight when the call has one (source 1), per row.
    pub(super) fn rms_norm<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        eps: f32,
    ) -> Result<(), PluginError> {
        let x = src(0)?;
        f32_only(x, "RmsNorm")?;
        let ncols = c.dst.ne[0] as i32;
        let rows = c.dst.rows();
        if x.elements() != c.dst.elements() {
            return Err(PluginError::invalid("RmsNorm shapes"));
        }
        let pw = match c.srcs().get(1) {
            Some(w) => {
                f32_only(w, "RmsNorm weight")?;
                if w.elements() != c.dst.ne[0] {
                    return Err(PluginError::invalid("RmsNorm weight length"));
                }
                addr(w, "weight")?
            }
            None => 0u64,
        };
        let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
        // The output's Q8_1 copy too, when a quantized product reads it next.
        let wanted = self.product_next.load(Ordering::Relaxed) && ncols % 32 == 0;
        let copy = self.copy_slot(wanted, po, c.dst.elements())?;
        let q = copy.map_or(0u64, |c| c.q);
        let f = self.func("bl_rms_norm_f32")?;
        let mut l = self.args(&f);
        let (threads, quads) = norm_shape(ncols as u64, &[px, pw, po]);
        l.arg(&px)
            .arg(&pw)
            .arg(&po)
            .arg(&q)
            .arg(&ncols)
            .arg(&eps)
            .arg(&quads);
        // SAFETY: one block per row of ncols elements, all inside the checked spans.
        unsafe { l.launch(cfg(rows as u32, threads)) }.map_err(driver_err("bl_rms_norm_f32"))?;
        if let Some(copy) = copy {
            self.keep_quantized(copy)?;
        }
        Ok(())
    }

    /// `x / sqrt(sum(x^2) + eps)` per row.
    pub(super) fn l2_norm<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        eps: f32,
    ) -> Result<(), PluginError> {
        let x = src(0)?;
        f32_only(x, "L2Norm")?;
        f32_only(&c.dst, "L2Norm")?;
        if x.ne != c.dst.ne {
            return Err(PluginError::invalid("L2Norm shapes"));
        }
        let (ncols, rows) = (c.dst.ne[0] as i32, c.dst.rows());
        let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
        let f = self.func("bl_l2_norm_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&po).arg(&ncols).arg(&eps);
        let threads = (ncols as u32).div_ceil(64).clamp(1, 32) * 32;
        if rows > 0 {
            // SAFETY: one block per row of ncols elements, all inside the checked spans.
            unsafe { l.launch(cfg(rows as u32, threads)) }.map_err(driver_err("bl_l2_norm_f32"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn launch_shapes_match_the_kernels() {
        assert_eq!(
            super::NORM_QUADS,
            crate::ops::tests::define_in(include_str!("../../cu/norm.cuh"), "NORM_QUADS"),
            "rows per thread of the norms"
        );
    }
}
