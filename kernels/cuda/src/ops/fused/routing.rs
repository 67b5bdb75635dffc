//! RouterTopK and RouterWeights of the same logits as one kernel (`bl_router_topk_weights`: a
//! block per row, an expert's rank counted in one pass), and with the router's F32 product before
//! them (`bl_router_logits_topk`: a block per logit, the last of each row choosing its experts),
//! both in `cu/router.cuh`.

use bloomery_plugin_api::op::{Op, RouterParams};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::plain;
use crate::ops::matmul::{F32_SPLIT_MAX_TASKS, F32_SPLIT_THREADS};
use crate::ops::router::gating_code;
use crate::ops::{attention, cfg, driver_err, Launcher};

/// What the routing kernels take of a RouterTopK + RouterWeights pair: device addresses (bias 0
/// when none) and the parameters as kernel arguments.
struct RouterArgs {
    logits: u64,
    bias: u64,
    ids: u64,
    weights: u64,
    n: u32,
    k: u32,
    rows: u64,
    gating: i32,
    norm: i32,
    norm_min: f32,
    scale: f32,
}

impl Launcher {
    /// The arguments of a RouterTopK + RouterWeights pair over the same logits that the routing
    /// kernels take, or `None` when the pair does not suit them.
    fn router_args(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        topk: &OpCall,
        weights: &OpCall,
        p: RouterParams,
    ) -> Result<Option<RouterArgs>, PluginError> {
        let logits = topk.srcs()[0];
        let (n, k) = (p.n_expert, p.k);
        let rows = logits.rows();
        let fits = p.n_group <= 1 && n <= 512 && k <= 32 && k <= n && rows <= i32::MAX as u64;
        if !fits
            || weights.n_srcs != 2
            || weights.srcs()[0] != logits
            || weights.srcs()[1] != topk.dst
            || !plain(&logits, [u64::from(n), rows, 1, 1])
            || !plain(&weights.dst, [u64::from(k), rows, 1, 1])
            || topk.dst.dtype != DType::I32
            || !topk.dst.is_contiguous()
            || topk.dst.elements() != u64::from(k) * rows
        {
            return Ok(None);
        }
        let bias = if p.bias {
            match topk.srcs().get(1) {
                Some(b) if plain(b, [u64::from(n), 1, 1, 1]) => addr(b)?,
                _ => return Ok(None),
            }
        } else {
            0u64
        };
        Ok(Some(RouterArgs {
            logits: addr(&logits)?,
            bias,
            ids: addr(&topk.dst)?,
            weights: addr(&weights.dst)?,
            n,
            k,
            rows,
            gating: gating_code(p.gating),
            norm: i32::from(p.norm),
            norm_min: p.norm_min,
            scale: p.scale,
        }))
    }

    /// The chosen experts and their weights from the same logits in one kernel: a block per row.
    pub(super) fn router(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        topk: &OpCall,
        weights: &OpCall,
        p: RouterParams,
    ) -> Result<bool, PluginError> {
        let Some(a) = self.router_args(addr, topk, weights, p)? else {
            return Ok(false);
        };
        let (ni, ki, ri, err) = (a.n as i32, a.k as i32, a.rows as i32, self.error_word);
        let f = self.func("bl_router_topk_weights")?;
        let mut l = self.args(&f);
        l.arg(&a.logits)
            .arg(&a.bias)
            .arg(&a.ids)
            .arg(&a.weights)
            .arg(&ni)
            .arg(&ki)
            .arg(&ri);
        l.arg(&a.gating)
            .arg(&a.norm)
            .arg(&a.norm_min)
            .arg(&a.scale)
            .arg(&err);
        // SAFETY: one block per row of the checked logits, ids and weights, a thread per expert
        // (n <= 512 checked above).
        unsafe { l.launch(cfg((a.rows as u32).max(1), a.n.div_ceil(32) * 32)) }
            .map_err(driver_err("bl_router_topk_weights"))?;
        Ok(true)
    }

    /// The router's logits (an F32 product with few outputs) and the RouterTopK + RouterWeights
    /// pair on them in one kernel (`bl_router_logits_topk`): a block per logit, the last of each
    /// row choosing its experts. Returns whether it launched.
    pub(super) fn router_logits(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
        p: RouterParams,
    ) -> Result<bool, PluginError> {
        let [matmul, topk, weights, ..] = calls else {
            return Ok(false);
        };
        if !matches!(weights.op, Op::RouterWeights(q) if q == p) || matmul.n_srcs != 2 {
            return Ok(false);
        }
        let (w, x) = (matmul.srcs()[0], matmul.srcs()[1]);
        let (n_embd, rows) = (w.ne[0], x.rows());
        let few = u64::from(p.n_expert) * rows <= F32_SPLIT_MAX_TASKS
            && rows <= attention::SPLIT_COUNTERS;
        if !few
            || topk.srcs()[0] != matmul.dst
            || w.dtype != DType::F32
            || w.nb[0] != 4
            || w.ne != [n_embd, u64::from(p.n_expert), 1, 1]
            || !plain(&x, [n_embd, rows, 1, 1])
            || n_embd > i32::MAX as u64
        {
            return Ok(false);
        }
        let Some(a) = self.router_args(addr, topk, weights, p)? else {
            return Ok(false);
        };
        let (pw, px, stride) = (addr(&w)?, addr(&x)?, w.nb[1] as i64);
        let (ei, ni, ki, err) = (n_embd as i32, a.n as i32, a.k as i32, self.error_word);
        let f = self.func("bl_router_logits_topk")?;
        let mut l = self.args(&f);
        l.arg(&pw).arg(&stride).arg(&px).arg(&ei);
        l.arg(&a.logits)
            .arg(&a.bias)
            .arg(&a.ids)
            .arg(&a.weights)
            .arg(&ni)
            .arg(&ki);
        l.arg(&a.gating)
            .arg(&a.norm)
            .arg(&a.norm_min)
            .arg(&a.scale)
            .arg(&err)
            .arg(&self.split_counters);
        let threads = (a.n.div_ceil(32) * 32).max(F32_SPLIT_THREADS);
        // SAFETY: a block per (row, expert) of the checked weights, activations and logits, each
        // row's last block writing that row's ids and weights; rows <= the zeroed counters, which
        // the last blocks set back to zero.
        unsafe { l.launch(cfg((u64::from(a.n) * a.rows) as u32, threads)) }
            .map_err(driver_err("bl_router_logits_topk"))?;
        Ok(true)
    }
}
