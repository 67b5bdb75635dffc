//! Elementwise ops (`cu/elementwise.cuh`): Add and Mul (same shape, a row broadcast over the rows,
//! or one value per row), Scale, the GLUs (SwiGLU with an optional clamp, GeGLU) and the unary
//! functions, each a grid-stride loop over the elements. A GLU whose result a quantized product
//! reads next writes its Q8_1 copy as well.

use std::sync::atomic::Ordering;

use bloomery_plugin_api::op::{GluKind, Op, OpKind, OpSupport, UnaryFn};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};

use super::{cfg, claim, driver_err, f32_only, grid, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![
        claim(OpKind::Add, &[DType::F32]),
        claim(OpKind::Mul, &[DType::F32]),
        claim(OpKind::Scale, &[DType::F32]),
        claim(OpKind::Glu, &[DType::F32]),
        claim(OpKind::Unary, &[DType::F32]),
    ]
}

/// The `f` of `bl_unary_f32` and `bl_unary_mul_f32` for a unary function.
pub(super) fn unary_code(which: UnaryFn) -> i32 {
    match which {
        UnaryFn::Silu => 0,
        UnaryFn::Sigmoid => 1,
        UnaryFn::Gelu => 2,
        UnaryFn::GeluErf => 3,
        UnaryFn::Softplus => 4,
        UnaryFn::Tanh => 5,
        UnaryFn::Exp => 6,
        UnaryFn::Relu => 7,
    }
}

/// The kernels' code of a GLU (`kind` in cu/elementwise.cuh and cu/moe.cuh: 0 SwiGLU, 1 GeGLU),
/// refusing a negative limit and a limit on GeGLU (the clamp is SwiGLU's) by name.
pub(super) fn glu_code(kind: GluKind, limit: f32) -> Result<i32, PluginError> {
    if limit.is_nan() || limit < 0.0 || (limit > 0.0 && kind == GluKind::GeGlu) {
        return Err(PluginError::unsupported(
            format!("a GLU limit of {limit} with {kind:?} (a clamp is SwiGlu's, and 0 or more)"),
            &[],
        ));
    }
    Ok(match kind {
        GluKind::SwiGlu => 0,
        GluKind::GeGlu => 1,
    })
}

impl Launcher {
    /// `a + b` or `a · b` (the call's op), `b` broadcast as [`Op::Add`] allows.
    pub(super) fn add_mul<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
    ) -> Result<(), PluginError> {
        let (a, b) = (src(0)?, src(1)?);
        for t in [a, b, &c.dst] {
            f32_only(t, "Add/Mul")?;
        }
        let (n, nb) = (c.dst.elements() as i64, b.elements() as i64);
        if a.elements() as i64 != n || nb == 0 || n % nb != 0 {
            return Err(PluginError::invalid(format!(
                "Add/Mul shapes {:?} and {:?} into {:?}",
                a.ne, b.ne, c.dst.ne
            )));
        }
        // b is read at (i / bdiv) % nb: one value per row when it is [1, rows].
        let per_row = b.ne[0] == 1 && a.ne[0] != 1 && b.elements() == a.rows();
        let bdiv = if per_row { a.ne[0] as i64 } else { 1 };
        let (pa, pb, po) = (addr(a, "a")?, addr(b, "b")?, addr(&c.dst, "dst")?);
        let name = if matches!(c.op, Op::Add) {
            "bl_add_f32"
        } else {
            "bl_mul_f32"
        };
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&pa).arg(&pb).arg(&po).arg(&n).arg(&nb).arg(&bdiv);
        // SAFETY: every pointer covers the elements the kernel touches (checked above).
        unsafe { l.launch(cfg(grid(n as u64, 256).min(4096), 256)) }.map_err(driver_err(name))?;
        Ok(())
    }

    /// `s · x`.
    pub(super) fn scale<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        s: f32,
    ) -> Result<(), PluginError> {
        let x = src(0)?;
        f32_only(x, "Scale")?;
        f32_only(&c.dst, "Scale")?;
        let n = c.dst.elements() as i64;
        if x.elements() as i64 != n {
            return Err(PluginError::invalid("Scale shapes"));
        }
        let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
        let f = self.func("bl_scale_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&po).arg(&s).arg(&n);
        // SAFETY: both pointers cover n elements.
        unsafe { l.launch(cfg(grid(n as u64, 256).min(4096), 256)) }
            .map_err(driver_err("bl_scale_f32"))?;
        Ok(())
    }

    /// A gated linear unit of `kind`, clamped at `limit` (0: none).
    pub(super) fn glu<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        kind: GluKind,
        limit: f32,
    ) -> Result<(), PluginError> {
        let (g, u) = (src(0)?, src(1)?);
        for t in [g, u, &c.dst] {
            f32_only(t, "Glu")?;
        }
        let n = c.dst.elements() as i64;
        if g.elements() as i64 != n || u.elements() as i64 != n {
            return Err(PluginError::invalid("Glu shapes"));
        }
        let k = glu_code(kind, limit)?;
        let (pg, pu, po) = (addr(g, "gate")?, addr(u, "up")?, addr(&c.dst, "dst")?);
        // The output's Q8_1 copy too, when a quantized product reads it next.
        let wanted = self.product_next.load(Ordering::Relaxed);
        let copy = self.copy_slot(wanted, po, c.dst.elements())?;
        let q = copy.map_or(0u64, |c| c.q);
        let f = self.func("bl_glu_f32")?;
        let mut l = self.args(&f);
        l.arg(&pg)
            .arg(&pu)
            .arg(&po)
            .arg(&q)
            .arg(&n)
            .arg(&k)
            .arg(&limit);
        // SAFETY: all three pointers cover n elements, q (when given) n / 32 blocks.
        unsafe { l.launch(cfg(grid(n as u64, 256).min(4096), 256)) }
            .map_err(driver_err("bl_glu_f32"))?;
        if let Some(copy) = copy {
            self.keep_quantized(copy)?;
        }
        Ok(())
    }

    /// A unary function of every element.
    pub(super) fn unary<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        which: UnaryFn,
    ) -> Result<(), PluginError> {
        let x = src(0)?;
        f32_only(x, "Unary")?;
        f32_only(&c.dst, "Unary")?;
        let n = c.dst.elements() as i64;
        if x.elements() as i64 != n {
            return Err(PluginError::invalid("Unary shapes"));
        }
        let code = unary_code(which);
        let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
        let f = self.func("bl_unary_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&po).arg(&n).arg(&code);
        // SAFETY: both pointers cover n elements.
        unsafe { l.launch(cfg(grid(n as u64, 256).min(4096), 256)) }
            .map_err(driver_err("bl_unary_f32"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glu_limit_is_swiglus_and_not_negative() {
        assert_eq!(glu_code(GluKind::SwiGlu, 7.0).unwrap(), 0);
        assert_eq!(glu_code(GluKind::GeGlu, 0.0).unwrap(), 1);
        for (kind, limit) in [
            (GluKind::GeGlu, 7.0),
            (GluKind::SwiGlu, -1.0),
            (GluKind::SwiGlu, f32::NAN),
        ] {
            let err = glu_code(kind, limit).unwrap_err().to_string();
            assert!(err.contains("GLU limit"), "{kind:?} {limit}: {err}");
        }
    }
}
