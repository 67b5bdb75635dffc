//! A `Unary` and the `Mul` of its result with a same-shape tensor (output gates) as one kernel
//! (`bl_unary_mul_f32` in `cu/elementwise.cuh`): `u = f(x)` is written as the Unary would write
//! it, `out = other · u` as the Mul would.

use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::PluginError;

use super::plain;
use crate::ops::{cfg, driver_err, Launcher};

impl Launcher {
    /// `u = f(x); out = other · u` for a `Mul` whose one operand is `u` and whose other has
    /// `u`'s shape.
    pub(super) fn unary_mul(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        unary: &OpCall,
        mul: &OpCall,
        code: i32,
    ) -> Result<bool, PluginError> {
        let u = unary.dst;
        let ne = u.ne;
        if mul.n_srcs != 2 || unary.n_srcs != 1 {
            return Ok(false);
        }
        let other = match (mul.srcs()[0] == u, mul.srcs()[1] == u) {
            (true, false) => mul.srcs()[1],
            (false, true) => mul.srcs()[0],
            _ => return Ok(false),
        };
        let x = unary.srcs()[0];
        if ![&x, &u, &other, &mul.dst].into_iter().all(|t| plain(t, ne)) {
            return Ok(false);
        }
        let n = u.elements() as i64;
        let (px, pu, po, pout) = (addr(&x)?, addr(&u)?, addr(&other)?, addr(&mul.dst)?);
        let f = self.func("bl_unary_mul_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&pu).arg(&po).arg(&pout).arg(&n).arg(&code);
        let blocks = (n as u64).div_ceil(256).clamp(1, 4096) as u32;
        // SAFETY: the four tensors hold n contiguous f32 each (checked spans).
        unsafe { l.launch(cfg(blocks, 256)) }.map_err(driver_err("bl_unary_mul_f32"))?;
        Ok(true)
    }
}
