//! The k-pool DSA indexer's selection (`Op::KPoolSelect`, `cu/kpool.cuh`): the pools a call's rows
//! complete are pooled into their last row's pooled section (a block per row), then each row's
//! complete pools are scored into ranking keys in the scratch (a block per row and 64 pools, a warp
//! per pool, the lanes over the heads) and sorted (a block per row), which writes the row's list.
//! Rows go in passes that keep the keys within [`KEYS_BYTES`]. f32 or f16 caches; sums in f64 and
//! scores ranked as f32, as the CPU reference takes them, so both list the same pools in the same
//! order.

use bloomery_plugin_api::op::{KPoolMode, KPoolParams, OpKind, OpSupport};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

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

/// Refuses the QSA pooling ([`KPoolMode::MeanNormRope`], Qwen3.8-Flash-Next), which no kernel
/// here runs.
pub(super) fn softmax_gate_only(p: &KPoolParams) -> Result<(), PluginError> {
    match p.mode {
        KPoolMode::SoftmaxGate => Ok(()),
        KPoolMode::MeanNormRope { .. } => Err(PluginError::unsupported(
            "KPoolSelect with the QSA pooling (MeanNormRope) on the CUDA bundles",
            &["SoftmaxGate"],
        )),
    }
}

/// The extents of a call, checked against each other and the kernels' limits: `(rows, len,
/// n_slots, n_sel)`.
pub(super) fn kpool_shape(
    p: &KPoolParams,
    [q, w, cache, ape, slots, pos]: [&TensorRef; 6],
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
    let fits = q.ne == [dh, nh, rows, 1]
        && w.ne == [nh, rows, 1, 1]
        && cache.ne[0] == 3 * dh
        && cache.ne[3] == 1
        && ape.ne == [dh, kpool, 1, 1]
        && slots.elements() == rows
        && pos.elements() == rows
        && dst.ne == [n_sel, rows, 1, 1];
    if !fits {
        return Err(PluginError::invalid(format!(
            "KPoolSelect of {nh} heads of {dh}, pools of {kpool}: q {:?}, w {:?}, cache {:?}, ape \
             {:?}, slots {:?}, positions {:?} into {:?}",
            q.ne, w.ne, cache.ne, ape.ne, slots.ne, pos.ne, dst.ne
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
        softmax_gate_only(&p)?;
        let t: [&TensorRef; 6] = [src(0)?, src(1)?, src(2)?, src(3)?, src(4)?, src(5)?];
        let [q, w, cache, ape, slots, pos] = t;
        for (x, what) in [
            (q, "KPoolSelect q"),
            (w, "KPoolSelect w"),
            (ape, "KPoolSelect ape"),
        ] {
            f32_only(x, what)?;
        }
        for (x, what) in [(slots, "slots"), (pos, "positions"), (&c.dst, "dst")] {
            if x.dtype != DType::I32 {
                return Err(PluginError::invalid(format!(
                    "KPoolSelect {what} must be I32"
                )));
            }
        }
        let (pool_k, scores_k) = match cache.dtype {
            DType::F32 => ("bl_kpool_pool_f32", "bl_kpool_scores_f32"),
            DType::F16 => ("bl_kpool_pool_f16", "bl_kpool_scores_f16"),
            d => {
                return Err(PluginError::unsupported(
                    format!("KPoolSelect over a {d} cache"),
                    &["F32", "F16"],
                ))
            }
        };
        let [rows, len, n_slots, n_sel] = kpool_shape(&p, t, &c.dst)?;
        let (pq, pw, pc, pa) = (
            addr(q, "q")?,
            addr(w, "w")?,
            addr(cache, "cache")?,
            addr(ape, "ape")?,
        );
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
        let pooling = self.func(pool_k)?;
        let scoring = self.func(scores_k)?;
        let selecting = self.func("bl_kpool_select")?;
        // The pools first, for every row: a later pass reads pools an earlier pass's rows complete.
        let mut l = self.args(&pooling);
        l.arg(&pc)
            .arg(&pa)
            .arg(&ps)
            .arg(&pp)
            .arg(&dh)
            .arg(&kpool)
            .arg(&len)
            .arg(&n_slots)
            .arg(&err);
        // SAFETY: a block per row; slots and positions are checked on the card before the cache
        // is addressed.
        unsafe { l.launch(cfg(rows as u32, POOL_THREADS)) }.map_err(driver_err(pool_k))?;
        for r0 in (0..rows).step_by(pass as usize) {
            let n = pass.min(rows - r0);
            let at = |base: u64, per_row: u64| base + r0 * per_row;
            let (pq, pw) = (
                at(pq, u64::from(p.head_dim) * u64::from(p.n_head) * 4),
                at(pw, u64::from(p.n_head) * 4),
            );
            let (ps, pp, po) = (at(ps, 4), at(pp, 4), at(po, n_sel as u64 * 4));
            let mut l = self.args(&scoring);
            l.arg(&pq)
                .arg(&pw)
                .arg(&pc)
                .arg(&ps)
                .arg(&pp)
                .arg(&keys)
                .arg(&nh)
                .arg(&dh)
                .arg(&kpool)
                .arg(&len)
                .arg(&n_slots)
                .arg(&stride);
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
        let all = [&q, &w, &cache, &ape, &slots, &pos];
        assert_eq!(
            kpool_shape(&p, all, &i([2051, 3, 1, 1])).unwrap(),
            [3, 8192, 2, 2051]
        );
        // A list without the tail's entries, and an ape of another pool size.
        assert!(kpool_shape(&p, all, &i([2048, 3, 1, 1])).is_err());
        let ape8 = f([128, 8, 1, 1]);
        assert!(kpool_shape(
            &p,
            [&q, &w, &cache, &ape8, &slots, &pos],
            &i([2051, 3, 1, 1])
        )
        .is_err());
        // Heads wider than a block stages are refused by name, not launched.
        let wide = KPoolParams { head_dim: 512, ..p };
        let (q, cache, ape) = (f([512, 32, 3, 1]), f([1536, 64, 2, 1]), f([512, 4, 1, 1]));
        let e = kpool_shape(
            &wide,
            [&q, &w, &cache, &ape, &slots, &pos],
            &i([2051, 3, 1, 1]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("KPoolSelect with 32 heads of 512"), "{e}");
        // The QSA pooling is refused by name.
        assert!(softmax_gate_only(&p).is_ok());
        let qsa = KPoolParams {
            mode: KPoolMode::MeanNormRope {
                eps: 1e-6,
                rope: bloomery_plugin_api::op::RopeParams {
                    mode: bloomery_plugin_api::op::RopeMode::Imrope,
                    n_dims: 64,
                    offset: 0,
                    sections: [11, 11, 10, 0],
                    freq_base: 1e7,
                    freq_scale: 1.0,
                    ext_factor: 0.0,
                    attn_factor: 1.0,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                    n_ctx_orig: 0,
                    inverse: false,
                },
                scale: 0.088,
            },
            ..p
        };
        let e = softmax_gate_only(&qsa).unwrap_err().to_string();
        assert!(e.contains("QSA pooling"), "{e}");
    }
}
