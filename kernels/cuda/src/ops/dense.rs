//! Ops over whole graph tensors, as decision heads use them (`cu/dense.cuh`): LayerNorm with an
//! optional weight and bias and Softmax with a scale and an optional mask (a block per row),
//! Concat along ne0, span means (a block per span and 128 columns), and dense attention between
//! graph tensors (a block per query row and head, keys in chunks under a running maximum). f32
//! throughout, sums in f64 as the CPU reference takes them.

use bloomery_plugin_api::op::{OpKind, OpSupport};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::norm::row_threads;
use super::{cfg, claim, driver_err, f32_only, grid, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![
        claim(OpKind::LayerNorm, &[DType::F32]),
        claim(OpKind::Softmax, &[DType::F32]),
        claim(OpKind::Concat, &[DType::F32]),
        claim(OpKind::AttentionDense, &[DType::F32]),
        claim(OpKind::SpanMean, &[DType::F32]),
    ]
}

/// Threads of a dense attention block (`DENSE_THREADS` in cu/dense.cuh).
pub(super) const DENSE_THREADS: u32 = 128;
/// Value elements a thread of a dense attention block holds (`DENSE_DV_PER`).
pub(super) const DENSE_DV_PER: u64 = 4;
/// The widest query row a dense attention block stages (`DENSE_DK_MAX`).
pub(super) const DENSE_DK_MAX: u64 = 512;
/// Columns per block of a span mean (a thread each).
const SPAN_COLUMNS: u32 = 128;

/// The extents of a dense attention call, checked against each other and the kernel's limits:
/// `(dk, dv, n_head, n_head_kv, n_q, n_k)`.
pub(super) fn attention_dense_shape(
    q: &TensorRef,
    k: &TensorRef,
    v: &TensorRef,
    dst: &TensorRef,
) -> Result<[u64; 6], PluginError> {
    let (dk, n_head, n_q) = (q.ne[0], q.ne[1], q.ne[2]);
    let (dv, n_head_kv, n_k) = (v.ne[0], k.ne[1], k.ne[2]);
    let bad = |what: String| Err(PluginError::invalid(format!("AttentionDense: {what}")));
    if q.ne[3] != 1 || k.ne[3] != 1 || v.ne[3] != 1 {
        return bad(format!("4-d q {:?}, k {:?}, v {:?}", q.ne, k.ne, v.ne));
    }
    if k.ne[0] != dk || v.ne[1] != n_head_kv || v.ne[2] != n_k {
        return bad(format!("q {:?}, k {:?}, v {:?}", q.ne, k.ne, v.ne));
    }
    if n_head_kv == 0 || n_k == 0 || !n_head.is_multiple_of(n_head_kv) {
        return bad(format!(
            "{n_head} query heads, {n_head_kv} key heads, {n_k} keys"
        ));
    }
    if dst.ne != [dv, n_head, n_q, 1] {
        return bad(format!(
            "dst {:?}, expected [{dv}, {n_head}, {n_q}, 1]",
            dst.ne
        ));
    }
    if dk == 0 || dk > DENSE_DK_MAX || dv == 0 || dv > u64::from(DENSE_THREADS) * DENSE_DV_PER {
        return Err(PluginError::unsupported(
            format!(
                "AttentionDense with heads of {dk} keys and {dv} values on the CUDA bundles (at \
                 most {DENSE_DK_MAX} and {})",
                u64::from(DENSE_THREADS) * DENSE_DV_PER
            ),
            &[],
        ));
    }
    if n_head > 65_535 || n_q > 65_535 || n_k > i32::MAX as u64 {
        return bad(format!("{n_head} heads of {n_q} queries over {n_k} keys"));
    }
    Ok([dk, dv, n_head, n_head_kv, n_q, n_k])
}

impl Launcher {
    /// LayerNorm of every row, times the weight (source 1) and plus the bias (source 2) when
    /// the call has them.
    pub(super) fn layer_norm<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        eps: f32,
    ) -> Result<(), PluginError> {
        let x = src(0)?;
        f32_only(x, "LayerNorm")?;
        f32_only(&c.dst, "LayerNorm")?;
        if x.ne != c.dst.ne {
            return Err(PluginError::invalid("LayerNorm shapes"));
        }
        let ncols = c.dst.ne[0];
        let affine = |i: usize, what: &str| -> Result<u64, PluginError> {
            match c.srcs().get(i) {
                Some(t) => {
                    f32_only(t, what)?;
                    if t.elements() != ncols {
                        return Err(PluginError::invalid(format!(
                            "LayerNorm {what} of {} values for rows of {ncols}",
                            t.elements()
                        )));
                    }
                    addr(t, what)
                }
                None => Ok(0),
            }
        };
        let (pw, pb) = (affine(1, "weight")?, affine(2, "bias")?);
        let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
        let (rows, ncols) = (c.dst.rows(), ncols as i32);
        if rows == 0 {
            return Ok(());
        }
        let f = self.func("bl_layer_norm_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&pw).arg(&pb).arg(&po).arg(&ncols).arg(&eps);
        // SAFETY: one block per row of ncols elements, all inside the checked spans.
        unsafe { l.launch(cfg(rows as u32, row_threads(ncols as u64))) }
            .map_err(driver_err("bl_layer_norm_f32"))
    }

    /// `softmax(scale · x + mask)` of every row; mask row `r % mask_rows` (source 1) when given.
    pub(super) fn softmax<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        scale: f32,
    ) -> Result<(), PluginError> {
        let x = src(0)?;
        f32_only(x, "Softmax")?;
        f32_only(&c.dst, "Softmax")?;
        if x.ne != c.dst.ne {
            return Err(PluginError::invalid("Softmax shapes"));
        }
        let (ncols, rows) = (c.dst.ne[0], c.dst.rows());
        let (pm, mask_rows) = match c.srcs().get(1) {
            Some(m) => {
                f32_only(m, "Softmax mask")?;
                let mrows = m.rows();
                if m.ne[0] != ncols || mrows == 0 || !rows.is_multiple_of(mrows) {
                    return Err(PluginError::invalid(format!(
                        "Softmax mask {:?} for rows {:?}",
                        m.ne, c.dst.ne
                    )));
                }
                (addr(m, "mask")?, mrows as i32)
            }
            None => (0u64, 1),
        };
        let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
        if rows == 0 {
            return Ok(());
        }
        let ncols = ncols as i32;
        let f = self.func("bl_softmax_f32")?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&pm)
            .arg(&po)
            .arg(&ncols)
            .arg(&mask_rows)
            .arg(&scale);
        // SAFETY: one block per row of ncols elements; the mask's rows are checked above.
        unsafe { l.launch(cfg(rows as u32, row_threads(ncols as u64))) }
            .map_err(driver_err("bl_softmax_f32"))
    }

    /// `[a, b]` along ne0, row by row.
    pub(super) fn concat<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
    ) -> Result<(), PluginError> {
        let (a, b) = (src(0)?, src(1)?);
        for t in [a, b, &c.dst] {
            f32_only(t, "Concat")?;
        }
        let rows = a.rows();
        if b.rows() != rows || c.dst.ne[0] != a.ne[0] + b.ne[0] || c.dst.rows() != rows {
            return Err(PluginError::invalid(format!(
                "Concat {:?} and {:?} into {:?}",
                a.ne, b.ne, c.dst.ne
            )));
        }
        let (pa, pb, po) = (addr(a, "a")?, addr(b, "b")?, addr(&c.dst, "dst")?);
        let (na, nb, rows) = (a.ne[0] as i64, b.ne[0] as i64, rows as i64);
        let n = c.dst.elements();
        if n == 0 {
            return Ok(());
        }
        let f = self.func("bl_concat_f32")?;
        let mut l = self.args(&f);
        l.arg(&pa).arg(&pb).arg(&po).arg(&na).arg(&nb).arg(&rows);
        // SAFETY: a thread per output element; a, b and dst cover their rows (checked above).
        unsafe { l.launch(cfg(grid(n, 256).min(4096), 256)) }.map_err(driver_err("bl_concat_f32"))
    }

    /// The mean of each span of rows of `x` (source 0) given by the I32 `[2, spans]` source 1.
    pub(super) fn span_mean<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
    ) -> Result<(), PluginError> {
        let (x, spans) = (src(0)?, src(1)?);
        f32_only(x, "SpanMean")?;
        f32_only(&c.dst, "SpanMean")?;
        if spans.dtype != DType::I32 {
            return Err(PluginError::invalid("SpanMean spans must be I32"));
        }
        let (n, n_spans) = (x.ne[0], spans.elements() / 2);
        if spans.ne[0] != 2 || c.dst.ne[0] != n || c.dst.rows() != n_spans {
            return Err(PluginError::invalid(format!(
                "SpanMean of {:?} by spans {:?} into {:?}",
                x.ne, spans.ne, c.dst.ne
            )));
        }
        let rows = x.rows();
        if n > i32::MAX as u64 || rows > i32::MAX as u64 || n_spans > 65_535 {
            return Err(PluginError::invalid(format!(
                "SpanMean of {n} columns, {rows} rows, {n_spans} spans"
            )));
        }
        let (px, ps, po) = (addr(x, "x")?, addr(spans, "spans")?, addr(&c.dst, "dst")?);
        if n_spans == 0 || n == 0 {
            return Ok(());
        }
        let (n, rows, err) = (n as i32, rows as i32, self.error_word);
        let f = self.func("bl_span_mean_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&ps).arg(&po).arg(&n).arg(&rows).arg(&err);
        let col_blocks = (n as u32).div_ceil(SPAN_COLUMNS);
        // SAFETY: spans are checked against x's rows on the card; a thread per (span, column)
        // inside dst.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (n_spans as u32, col_blocks, 1),
                block_dim: (SPAN_COLUMNS, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver_err("bl_span_mean_f32"))
    }

    /// Dense attention of queries (source 0) over keys and values (sources 1, 2).
    pub(super) fn attention_dense<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        scale: f32,
        causal: bool,
    ) -> Result<(), PluginError> {
        let (q, k, v) = (src(0)?, src(1)?, src(2)?);
        for t in [q, k, v, &c.dst] {
            f32_only(t, "AttentionDense")?;
        }
        let [dk, dv, n_head, n_head_kv, n_q, n_k] = attention_dense_shape(q, k, v, &c.dst)?;
        let (pq, pk, pv, po) = (
            addr(q, "q")?,
            addr(k, "k")?,
            addr(v, "v")?,
            addr(&c.dst, "dst")?,
        );
        if n_q == 0 {
            return Ok(());
        }
        let [dk, dv, nh, nkv, nq, nk] = [dk, dv, n_head, n_head_kv, n_q, n_k].map(|x| x as i32);
        let causal = i32::from(causal);
        let f = self.func("bl_attention_dense_f32")?;
        let mut l = self.args(&f);
        l.arg(&pq)
            .arg(&pk)
            .arg(&pv)
            .arg(&po)
            .arg(&dk)
            .arg(&dv)
            .arg(&nh)
            .arg(&nkv)
            .arg(&nq)
            .arg(&nk)
            .arg(&scale)
            .arg(&causal);
        // SAFETY: a block per (head, query row); every row index stays inside the extents
        // checked by attention_dense_shape.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (nh as u32, nq as u32, 1),
                block_dim: (DENSE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver_err("bl_attention_dense_f32"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::{define_in, tensor_at};

    #[test]
    fn launch_constants_match_the_kernels() {
        let src = include_str!("../../cu/dense.cuh");
        assert_eq!(u64::from(DENSE_THREADS), define_in(src, "DENSE_THREADS"));
        assert_eq!(DENSE_DV_PER, define_in(src, "DENSE_DV_PER"));
        assert_eq!(DENSE_DK_MAX, define_in(src, "DENSE_DK_MAX"));
    }

    #[test]
    fn attention_shapes_are_checked_and_limits_named() {
        let t = |ne| tensor_at(1, 0, DType::F32, ne);
        let (q, k, v) = (t([16, 4, 3, 1]), t([16, 2, 7, 1]), t([8, 2, 7, 1]));
        assert_eq!(
            attention_dense_shape(&q, &k, &v, &t([8, 4, 3, 1])).unwrap(),
            [16, 8, 4, 2, 3, 7]
        );
        // Wrong destination, 3 query heads over 2 key heads, keys and values of other lengths.
        assert!(attention_dense_shape(&q, &k, &v, &t([8, 4, 2, 1])).is_err());
        assert!(attention_dense_shape(&t([16, 3, 3, 1]), &k, &v, &t([8, 3, 3, 1])).is_err());
        assert!(attention_dense_shape(&q, &k, &t([8, 2, 6, 1]), &t([8, 4, 3, 1])).is_err());
        // Heads wider than a block holds are refused by name, not launched.
        let wide = attention_dense_shape(
            &t([16, 4, 3, 1]),
            &k,
            &t([513, 2, 7, 1]),
            &t([513, 4, 3, 1]),
        )
        .unwrap_err()
        .to_string();
        assert!(wide.contains("AttentionDense with heads"), "{wide}");
    }
}
