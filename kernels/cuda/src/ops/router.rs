//! MoE routing (`cu/router.cuh`): RouterTopK (the top k experts of each row's logits, by the
//! gating function, with an optional selection bias) and RouterWeights (the chosen experts'
//! weights, optionally renormalised and scaled), a warp per row, up to 32 of 512 experts (of any
//! number with the softmax over the chosen, which reads only theirs), ids checked on the card.
//! The pair over the same logits, and the router's F32 product before it, go in one launch
//! (`fused::routing`). Also TopK (the k largest of each row, k at most 16, a block per row, rows
//! as long as a vocabulary: a draft step's choice).

use bloomery_plugin_api::op::{Gating, Op, OpKind, OpSupport, RouterParams};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};

use super::{cfg, claim, driver_err, f32_only, grid, Addr, Launcher, Src, BLOCK, WARPS};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![
        claim(OpKind::RouterTopK, &[DType::F32]),
        claim(OpKind::RouterWeights, &[DType::F32]),
        claim(OpKind::TopK, &[DType::F32]),
    ]
}

/// Most entries TopK keeps a row on the CUDA bundles (`TOPK_MAX` of `cu/router.cuh`).
const TOPK_MAX: u32 = 16;

/// Threads of a TopK block (`TOPK_THREADS` of `cu/router.cuh`).
const TOPK_THREADS: u32 = 1024;

impl Launcher {
    /// RouterTopK or RouterWeights (the call's op) of the logits of source 0 with parameters `p`.
    pub(super) fn route<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: RouterParams,
    ) -> Result<(), PluginError> {
        if p.n_group > 1 {
            return Err(PluginError::unsupported(
                "grouped routing on the CUDA bundles",
                &[],
            ));
        }
        let logits = src(0)?;
        f32_only(logits, "router logits")?;
        let (n, k) = (p.n_expert as i32, p.k as i32);
        let rows = logits.rows() as i32;
        if logits.ne[0] != u64::from(p.n_expert)
            || k < 0
            || k > n
            || c.dst.elements() != (k as u64) * rows as u64
        {
            return Err(PluginError::invalid("router shapes"));
        }
        // The softmax over the chosen reads only their logits: any number of them to choose from.
        let any_n = matches!(c.op, Op::RouterWeights(_)) && p.gating == Gating::SoftmaxSelected;
        if (n > 512 && !any_n) || k > 32 {
            return Err(PluginError::unsupported(
                format!("routing {k} of {n} experts on the CUDA bundles (at most 32 of 512)"),
                &[],
            ));
        }
        let gating = gating_code(p.gating);
        let pl = addr(logits, "logits")?;
        let po = addr(&c.dst, "dst")?;
        let blocks = cfg(grid(rows.max(1) as u64, WARPS), BLOCK);
        if matches!(c.op, Op::RouterTopK(_)) {
            let pb = if p.bias {
                let b = src(1)?;
                f32_only(b, "router bias")?;
                addr(b, "bias")?
            } else {
                0u64
            };
            let f = self.func("bl_router_topk")?;
            let mut l = self.args(&f);
            l.arg(&pl)
                .arg(&pb)
                .arg(&po)
                .arg(&n)
                .arg(&k)
                .arg(&rows)
                .arg(&gating);
            // SAFETY: one warp per row inside the checked spans.
            unsafe { l.launch(blocks) }.map_err(driver_err("bl_router_topk"))?;
        } else {
            let ids = addr(src(1)?, "ids")?;
            let (norm, err) = (i32::from(p.norm), self.error_word);
            let f = self.func("bl_router_weights")?;
            let mut l = self.args(&f);
            l.arg(&pl)
                .arg(&ids)
                .arg(&po)
                .arg(&n)
                .arg(&k)
                .arg(&rows)
                .arg(&gating);
            l.arg(&norm).arg(&p.norm_min).arg(&p.scale).arg(&err);
            // SAFETY: one warp per row; ids are checked on the card.
            unsafe { l.launch(blocks) }.map_err(driver_err("bl_router_weights"))?;
        }
        Ok(())
    }
}

impl Launcher {
    /// TopK of `k` over the rows of source 0: i32 ids, largest first, ties to the lower index.
    pub(super) fn top_k<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        k: u32,
    ) -> Result<(), PluginError> {
        let x = src(0)?;
        f32_only(x, "TopK source")?;
        let (n, rows) = (x.ne[0], x.rows());
        if n == 0 || u64::from(k) > n || n > i32::MAX as u64 || c.dst.dtype != DType::I32 {
            return Err(PluginError::invalid(format!(
                "TopK of {k} over rows of {n}"
            )));
        }
        if c.dst.elements() != u64::from(k) * rows {
            return Err(PluginError::invalid("TopK shapes"));
        }
        if k > TOPK_MAX {
            return Err(PluginError::unsupported(
                format!("TopK of {k} on the CUDA bundles (at most {TOPK_MAX})"),
                &[],
            ));
        }
        if rows == 0 || k == 0 {
            return Ok(());
        }
        let (px, po) = (addr(x, "TopK source")?, addr(&c.dst, "TopK dst")?);
        let (n, k) = (n as i32, k as i32);
        let f = self.func("bl_top_k")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&po).arg(&n).arg(&k);
        // SAFETY: one block per row of n entries, writing that row's k ids inside the checked
        // spans.
        unsafe { l.launch(cfg(rows as u32, TOPK_THREADS)) }.map_err(driver_err("bl_top_k"))?;
        Ok(())
    }
}

/// The routers' gating function as the kernels number it.
pub(super) fn gating_code(g: Gating) -> i32 {
    match g {
        Gating::Softmax => 0,
        Gating::Sigmoid => 1,
        Gating::SoftmaxSelected => 2,
        Gating::SqrtSoftplus => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::{TOPK_MAX, TOPK_THREADS};
    use crate::ops::tests::define_in;

    #[test]
    fn top_k_launch_constants_match_the_kernel() {
        let src = include_str!("../../cu/router.cuh");
        assert_eq!(u64::from(TOPK_MAX), define_in(src, "TOPK_MAX"));
        assert_eq!(u64::from(TOPK_THREADS), define_in(src, "TOPK_THREADS"));
    }
}
