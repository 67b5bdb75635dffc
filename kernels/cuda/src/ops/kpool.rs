//! The k-pool DSA indexer's selection (`Op::KPoolSelect`, `cu/kpool.cuh`): the pools a call's rows
//! complete are pooled into their last row's pooled section (a block per row), then each row's
//! complete pools are scored into ranking keys in the scratch (a block per row and 64 pools, a warp
//! per pool, the lanes over the heads) and sorted (a block per row), which writes the row's list.
//! Rows go in passes that keep the keys within [`KEYS_BYTES`]. f32 or f16 caches; sums in f64 and
//! scores ranked as f32, as the CPU reference takes them, so both list the same pools in the same
//! order.

use bloomery_plugin_api::op::{KPoolMode, KPoolParams, OpKind, OpSupport, RopeParams};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::rope::{rope_args, RopeArgs};
use super::{cfg, claim, driver_err, f32_only, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements (the dtype is the cache's).
pub(super) fn claims() -> Vec<OpSupport> {
    vec![claim(OpKind::KPoolSelect, &[DType::F32, DType::F16])]
}

/// Threads of a score block (`KPOOL_THREADS` in cu/kpool.cuh).
const KPOOL_THREADS: u32 = 256;
/// Pools a score block scores (`KPOOL_BLOCK_POOLS`).
const KPOOL_BLOCK_POOLS: u64 = 64;
/// The most q values a score block stages, rows padded by one (`KPOOL_Q_MAX`).
const KPOOL_Q_MAX: u64 = 8448;
/// The widest head a score block stages (`KPOOL_DH_MAX`).
const KPOOL_DH_MAX: u64 = 256;
/// Threads of a pooling block (a thread per dimension).
const POOL_THREADS: u32 = 128;
/// Threads of a select block (`KPOOL_SELECT_THREADS`).
const KPOOL_SELECT_THREADS: u32 = 512;
/// The scratch a pass of rows keeps its ranking keys in.
const KEYS_BYTES: u64 = 16 << 20;

/// A call's sources past the queries, by pooling.
#[derive(Clone, Copy)]
pub(super) enum Pool<'t> {
    /// DSA: the head weights `w [n_head, rows]` and the pool's position embedding `ape [dh, kpool]`.
    SoftmaxGate {
        /// Head weights.
        w: &'t TensorRef,
        /// Position embedding.
        ape: &'t TensorRef,
    },
    /// QSA: the RMS norm's gamma `k_norm [dh]`, with the mode's ε, rope and head weight.
    MeanNormRope {
        /// The norm's gamma.
        k_norm: &'t TensorRef,
        /// The norm's ε.
        eps: f32,
        /// The pooled key's rope.
        rope: RopeParams,
        /// Every head's weight.
        scale: f32,
    },
}

impl Pool<'_> {
    /// Sections of `dh` values in a cache row.
    fn sections(&self) -> u64 {
        match self {
            Pool::SoftmaxGate { .. } => 3,
            Pool::MeanNormRope { .. } => 2,
        }
    }
}

/// The extents of a call, checked against each other and the kernels' limits: `(rows, len,
/// n_slots, n_sel)`.
pub(super) fn kpool_shape(
    p: &KPoolParams,
    [q, cache, slots, pos]: [&TensorRef; 4],
    pool: Pool<'_>,
    dst: &TensorRef,
) -> Result<[u64; 4], PluginError> {
    let (dh, nh, kpool, n_top) = (
        u64::from(p.head_dim),
        u64::from(p.n_head),
        u64::from(p.kpool),
        u64::from(p.n_top),
    );
    if dh == 0 || nh == 0 || kpool == 0 || n_top == 0 {
        return Err(PluginError::invalid(format!(
            "KPoolSelect of {nh} heads of {dh}, pools of {kpool}, {n_top} kept (all must be positive)"
        )));
    }
    let n_sel = kpool * n_top + if p.tail { kpool - 1 } else { 0 };
    let (rows, len, n_slots) = (q.ne[2], cache.ne[1], cache.ne[2]);
    let sources_fit = match pool {
        Pool::SoftmaxGate { w, ape } => w.ne == [nh, rows, 1, 1] && ape.ne == [dh, kpool, 1, 1],
        Pool::MeanNormRope { k_norm, .. } => k_norm.ne == [dh, 1, 1, 1],
    };
    let fits = sources_fit
        && q.ne == [dh, nh, rows, 1]
        && cache.ne[0] == pool.sections() * dh
        && cache.ne[3] == 1
        && slots.elements() == rows
        && pos.elements() == rows
        && dst.ne == [n_sel, rows, 1, 1];
    if !fits {
        let sources = match pool {
            Pool::SoftmaxGate { w, ape } => format!("w {:?}, ape {:?}", w.ne, ape.ne),
            Pool::MeanNormRope { k_norm, .. } => format!("k_norm {:?}", k_norm.ne),
        };
        return Err(PluginError::invalid(format!(
            "KPoolSelect of {nh} heads of {dh}, pools of {kpool}: q {:?}, {sources}, cache {:?}, \
             slots {:?}, positions {:?} into {:?}",
            q.ne, cache.ne, slots.ne, pos.ne, dst.ne
        )));
    }
    if dh > KPOOL_DH_MAX || nh * (dh + 1) > KPOOL_Q_MAX {
        return Err(PluginError::unsupported(
            format!(
                "KPoolSelect with {nh} heads of {dh} on the CUDA bundles (heads of at most \
                 {KPOOL_DH_MAX}, heads × (width + 1) at most {KPOOL_Q_MAX})"
            ),
            &[],
        ));
    }
    if rows > i32::MAX as u64
        || len > i32::MAX as u64
        || n_slots > i32::MAX as u64
        || n_sel > i32::MAX as u64
    {
        return Err(PluginError::invalid(format!(
            "KPoolSelect of {rows} rows over {n_slots} slots of {len}"
        )));
    }
    Ok([rows, len, n_slots, n_sel])
}

/// The QSA pooled key's rope as the kernels take it, checked as a Rope call over one head of
/// `dh` at one position would be.
fn pooled_rope(rope: &RopeParams, dh: u32) -> Result<RopeArgs, PluginError> {
    let one = |dtype, ne: [u64; 4]| -> Result<TensorRef, PluginError> {
        let nb = TensorRef::contiguous_strides(dtype, ne)
            .ok_or_else(|| PluginError::invalid("KPoolSelect rope extents"))?;
        Ok(TensorRef {
            buffer: 0,
            offset: 0,
            dtype,
            ne,
            nb,
        })
    };
    let key = one(DType::F32, [u64::from(dh), 1, 1, 1])?;
    let pos = one(DType::I32, [1, 1, 1, 1])?;
    let args = rope_args(rope, &key, &pos, &key).map_err(|e| {
        PluginError::unsupported(
            format!("KPoolSelect's pooled-key rope on the CUDA bundles: {e}"),
            &[],
        )
    })?;
    // The pooling kernel rotates from dim 0 forwards: a Rope call may take an offset or the
    // inverse (DeepSeek V4's), the pooled key may not.
    if args.offset != 0 || args.inverse != 0 {
        return Err(PluginError::unsupported(
            "KPoolSelect's pooled-key rope on the CUDA bundles: a dimension offset or the inverse rope",
            &[],
        ));
    }
    Ok(args)
}

impl Launcher {
    /// The k-pool selection of every row into the I32 destination; the cache (source 2) is
    /// updated in place.
    pub(super) fn kpool_select<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: KPoolParams,
    ) -> Result<(), PluginError> {
        let (q, cache) = (src(0)?, src(2)?);
        let (pool, slots, pos) = match p.mode {
            KPoolMode::SoftmaxGate => (
                Pool::SoftmaxGate {
                    w: src(1)?,
                    ape: src(3)?,
                },
                src(4)?,
                src(5)?,
            ),
            KPoolMode::MeanNormRope { eps, rope, scale } => (
                Pool::MeanNormRope {
                    k_norm: src(1)?,
                    eps,
                    rope,
                    scale,
                },
                src(3)?,
                src(4)?,
            ),
        };
        f32_only(q, "KPoolSelect q")?;
        match pool {
            Pool::SoftmaxGate { w, ape } => {
                f32_only(w, "KPoolSelect w")?;
                f32_only(ape, "KPoolSelect ape")?;
            }
            Pool::MeanNormRope { k_norm, .. } => f32_only(k_norm, "KPoolSelect k_norm")?,
        }
        for (x, what) in [(slots, "slots"), (pos, "positions"), (&c.dst, "dst")] {
            if x.dtype != DType::I32 {
                return Err(PluginError::invalid(format!(
                    "KPoolSelect {what} must be I32"
                )));
            }
        }
        let f16 = match cache.dtype {
            DType::F32 => false,
            DType::F16 => true,
            d => {
                return Err(PluginError::unsupported(
                    format!("KPoolSelect over a {d} cache"),
                    &["F32", "F16"],
                ))
            }
        };
        let [rows, len, n_slots, n_sel] = kpool_shape(&p, [q, cache, slots, pos], pool, &c.dst)?;
        let (pq, pc) = (addr(q, "q")?, addr(cache, "cache")?);
        let (ps, pp, po) = (
            addr(slots, "slots")?,
            addr(pos, "positions")?,
            addr(&c.dst, "dst")?,
        );
        if rows == 0 {
            return Ok(());
        }
        let max_pools = len / u64::from(p.kpool);
        // A row's keys at a power-of-two stride: the select block sorts them in place there when
        // they outgrow its shared memory.
        let stride = max_pools.max(1).next_power_of_two();
        // At most 65,535 rows a pass: a score launch's grid y is the pass's rows.
        let pass = (KEYS_BYTES / (stride * 8)).clamp(1, rows.min(65_535));
        let keys = self.scratch(pass * stride * 8)?;
        let [dh, nh, kpool, n_top] = [p.head_dim, p.n_head, p.kpool, p.n_top].map(|v| v as i32);
        let (len, n_slots, n_sel, tail) =
            (len as i32, n_slots as i32, n_sel as i32, i32::from(p.tail));
        let (stride, err) = (stride as i64, self.error_word);
        let sections = pool.sections() as i32;
        // The pools first, for every row: a later pass reads pools an earlier pass's rows complete.
        // QSA passes no head weights (a null list: every head weighs `scale`).
        let (pw, scale) = match pool {
            Pool::SoftmaxGate { w, ape } => {
                self.pool_softmax_gate(
                    f16,
                    [pc, addr(ape, "ape")?, ps, pp],
                    [dh, kpool, len, n_slots],
                    rows,
                )?;
                (Some(addr(w, "w")?), 0f32)
            }
            Pool::MeanNormRope {
                k_norm,
                eps,
                rope,
                scale,
            } => {
                let r = pooled_rope(&rope, p.head_dim)?;
                let pk = addr(k_norm, "k_norm")?;
                let name = if f16 {
                    "bl_kpool_pool_qsa_f16"
                } else {
                    "bl_kpool_pool_qsa_f32"
                };
                let f = self.func(name)?;
                let mut l = self.args(&f);
                l.arg(&pc).arg(&pk).arg(&ps).arg(&pp);
                l.arg(&dh).arg(&kpool).arg(&len).arg(&n_slots).arg(&eps);
                l.arg(&r.n_dims).arg(&r.log2_base);
                l.arg(&rope.freq_scale).arg(&rope.ext_factor);
                l.arg(&r.corr[0]).arg(&r.corr[1]).arg(&r.mscale).arg(&err);
                // SAFETY: a block per row, its key of at most KPOOL_DH_MAX values (checked by
                // kpool_shape) staged in shared memory; slots and positions are checked on the
                // card before the cache is addressed.
                unsafe { l.launch(cfg(rows as u32, POOL_THREADS)) }.map_err(driver_err(name))?;
                (None, scale)
            }
        };
        let scores_k = if f16 {
            "bl_kpool_scores_f16"
        } else {
            "bl_kpool_scores_f32"
        };
        let scoring = self.func(scores_k)?;
        let selecting = self.func("bl_kpool_select")?;
        for r0 in (0..rows).step_by(pass as usize) {
            let n = pass.min(rows - r0);
            let at = |base: u64, per_row: u64| base + r0 * per_row;
            let pq = at(pq, u64::from(p.head_dim) * u64::from(p.n_head) * 4);
            let pw = pw.map_or(0, |b| at(b, u64::from(p.n_head) * 4));
            let (ps, pp, po) = (at(ps, 4), at(pp, 4), at(po, n_sel as u64 * 4));
            let mut l = self.args(&scoring);
            l.arg(&pq).arg(&pw).arg(&scale).arg(&pc).arg(&ps).arg(&pp);
            l.arg(&keys).arg(&nh).arg(&dh).arg(&sections).arg(&kpool);
            l.arg(&len).arg(&n_slots).arg(&stride);
            let chunks = max_pools.div_ceil(KPOOL_BLOCK_POOLS).max(1) as u32;
            // SAFETY: a block per (pool chunk, row of the pass); each row's keys lie inside the
            // pass's scratch at its stride, and rows outside the cache return before reading.
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: (chunks, n as u32, 1),
                    block_dim: (KPOOL_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(driver_err(scores_k))?;
            let mut l = self.args(&selecting);
            l.arg(&keys)
                .arg(&ps)
                .arg(&pp)
                .arg(&po)
                .arg(&kpool)
                .arg(&n_top)
                .arg(&tail)
                .arg(&n_sel)
                .arg(&len)
                .arg(&n_slots)
                .arg(&stride);
            // SAFETY: a block per row of the pass, writing its n_sel entries of dst.
            unsafe { l.launch(cfg(n as u32, KPOOL_SELECT_THREADS)) }
                .map_err(driver_err("bl_kpool_select"))?;
        }
        Ok(())
    }

    /// The DSA pooling launch: `[cache, ape, slots, positions]` addresses and `[dh, kpool, len,
    /// n_slots]`, a block per row.
    fn pool_softmax_gate(
        &self,
        f16: bool,
        [pc, pa, ps, pp]: [u64; 4],
        [dh, kpool, len, n_slots]: [i32; 4],
        rows: u64,
    ) -> Result<(), PluginError> {
        let name = if f16 {
            "bl_kpool_pool_f16"
        } else {
            "bl_kpool_pool_f32"
        };
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&pc).arg(&pa).arg(&ps).arg(&pp);
        l.arg(&dh)
            .arg(&kpool)
            .arg(&len)
            .arg(&n_slots)
            .arg(&self.error_word);
        // SAFETY: a block per row; slots and positions are checked on the card before the cache
        // is addressed.
        unsafe { l.launch(cfg(rows as u32, POOL_THREADS)) }.map_err(driver_err(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::{define_in, tensor_at};

    #[test]
    fn launch_constants_match_the_kernels() {
        let src = include_str!("../../cu/kpool.cuh");
        assert_eq!(u64::from(KPOOL_THREADS), define_in(src, "KPOOL_THREADS"));
        assert_eq!(
            u64::from(KPOOL_SELECT_THREADS),
            define_in(src, "KPOOL_SELECT_THREADS")
        );
        assert_eq!(KPOOL_BLOCK_POOLS, define_in(src, "KPOOL_BLOCK_POOLS"));
        assert_eq!(KPOOL_Q_MAX, define_in(src, "KPOOL_Q_MAX"));
        assert_eq!(KPOOL_DH_MAX, define_in(src, "KPOOL_DH_MAX"));
    }

    #[test]
    fn shapes_are_checked_and_limits_named() {
        let f = |ne| tensor_at(1, 0, DType::F32, ne);
        let i = |ne| tensor_at(1, 0, DType::I32, ne);
        let p = KPoolParams {
            n_head: 32,
            head_dim: 128,
            kpool: 4,
            n_top: 512,
            tail: true,
            mode: KPoolMode::SoftmaxGate,
        };
        let (q, w, cache, ape) = (
            f([128, 32, 3, 1]),
            f([32, 3, 1, 1]),
            f([384, 8192, 2, 1]),
            f([128, 4, 1, 1]),
        );
        let (slots, pos) = (i([3, 1, 1, 1]), i([3, 1, 1, 1]));
        let dsa = |ape| Pool::SoftmaxGate { w: &w, ape };
        let all = [&q, &cache, &slots, &pos];
        assert_eq!(
            kpool_shape(&p, all, dsa(&ape), &i([2051, 3, 1, 1])).unwrap(),
            [3, 8192, 2, 2051]
        );
        // A list without the tail's entries, and an ape of another pool size.
        assert!(kpool_shape(&p, all, dsa(&ape), &i([2048, 3, 1, 1])).is_err());
        let ape8 = f([128, 8, 1, 1]);
        assert!(kpool_shape(&p, all, dsa(&ape8), &i([2051, 3, 1, 1])).is_err());
        // Heads wider than a block stages are refused by name, not launched.
        let wide = KPoolParams { head_dim: 512, ..p };
        let (q5, cache5, ape5) = (f([512, 32, 3, 1]), f([1536, 64, 2, 1]), f([512, 4, 1, 1]));
        let e = kpool_shape(
            &wide,
            [&q5, &cache5, &slots, &pos],
            dsa(&ape5),
            &i([2051, 3, 1, 1]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("KPoolSelect with 32 heads of 512"), "{e}");
        // QSA: rows of [raw key | pooled] and a gamma of dh; a DSA-wide cache is refused.
        let rope = RopeParams::unscaled(
            bloomery_plugin_api::op::RopeMode::Imrope,
            64,
            [11, 11, 10, 0],
            1e7,
        );
        let k_norm = f([128, 1, 1, 1]);
        let qsa = Pool::MeanNormRope {
            k_norm: &k_norm,
            eps: 1e-6,
            rope,
            scale: 0.088,
        };
        let (q4, cache2) = (f([128, 4, 3, 1]), f([256, 8192, 2, 1]));
        let p4 = KPoolParams { n_head: 4, ..p };
        assert_eq!(
            kpool_shape(&p4, [&q4, &cache2, &slots, &pos], qsa, &i([2051, 3, 1, 1])).unwrap(),
            [3, 8192, 2, 2051]
        );
        assert!(kpool_shape(&p4, [&q4, &cache, &slots, &pos], qsa, &i([2051, 3, 1, 1])).is_err());
        // The pooled key's rope: IMROPE at one position is taken; a rope from a dim offset is not.
        assert_eq!(pooled_rope(&rope, 128).unwrap().n_dims, 64);
        let e = pooled_rope(&RopeParams { offset: 64, ..rope }, 128)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("pooled-key rope"), "{e}");
    }
}
