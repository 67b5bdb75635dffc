//! A strided `Copy` and the `L2Norm` of its result (q and k split out of the DeltaNet
//! convolution) as one kernel (`bl_copy_l2_norm_f32` in `cu/norm.cuh`), writing both results.

use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::plain;
use crate::ops::norm::row_threads;
use crate::ops::{cfg, driver_err, Buffers, Launcher};

impl Launcher {
    /// `c = copy(x); out = l2_norm(c)` for an f32 source whose rows (ne0) are contiguous.
    pub(super) fn copy_l2_norm(
        &self,
        bufs: &dyn Buffers,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        copy: &OpCall,
        norm: &OpCall,
        eps: f32,
    ) -> Result<bool, PluginError> {
        let (x, c) = (copy.srcs()[0], copy.dst);
        let ne = c.ne;
        if norm.srcs()[0] != c || !plain(&c, ne) || !plain(&norm.dst, ne) {
            return Ok(false);
        }
        if x.dtype != DType::F32 || x.ne != ne || x.nb[0] != 4 || x.offset % 4 != 0 {
            return Ok(false);
        }
        let rows = c.rows();
        let fits = |v: u64| v <= i32::MAX as u64;
        if x.nb[1..].iter().any(|b| b % 4 != 0) || rows == 0 || !fits(ne[1]) || !fits(ne[2]) {
            return Ok(false);
        }
        // The source spans up to its last element.
        let span = (0..4).fold(4u64, |end, d| end + x.nb[d] * (x.ne[d] - 1));
        let px = bufs.address(x.buffer, x.offset, span)?;
        let (pc, po) = (addr(&c)?, addr(&norm.dst)?);
        let (nb1, nb2, nb3) = (
            (x.nb[1] / 4) as i64,
            (x.nb[2] / 4) as i64,
            (x.nb[3] / 4) as i64,
        );
        let (ne1, ne2, ncols) = (ne[1] as i32, ne[2] as i32, ne[0] as i32);
        let f = self.func("bl_copy_l2_norm_f32")?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&nb1)
            .arg(&nb2)
            .arg(&nb3)
            .arg(&ne1)
            .arg(&ne2)
            .arg(&pc)
            .arg(&po)
            .arg(&ncols)
            .arg(&eps);
        // SAFETY: every source row lies inside the span the buffer table checked; c and out
        // hold rows × ncols contiguous f32.
        unsafe { l.launch(cfg(rows as u32, row_threads(ne[0]))) }
            .map_err(driver_err("bl_copy_l2_norm_f32"))?;
        Ok(true)
    }
}
