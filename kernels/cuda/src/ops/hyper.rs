//! The hyper-connection ops of GLM-5.3's residual streams (`cu/hyper.cuh`): Sinkhorn
//! normalisation of each token's `[n, n]` mixing matrix (a block per matrix, a thread per
//! element), the weighted sum of a token's streams and the streams' update (a thread per output
//! element), with Qwen3.8-Flash-Next's forms (per-element StreamMix weights, StreamUpdate's
//! identity comb), the sigmoid gate of a group's dot product (GroupDotGate, a block per
//! group) and DeepSeek-V4.1's Engram gated read (EngramGate, a block per row and stream). f32,
//! rounded as the CPU reference but for `expf`.

use bloomery_plugin_api::op::{OpKind, OpSupport};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::{cfg, claim, driver_err, f32_only, grid, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![
        claim(OpKind::Sinkhorn, &[DType::F32]),
        claim(OpKind::StreamMix, &[DType::F32]),
        claim(OpKind::StreamUpdate, &[DType::F32]),
        claim(OpKind::GroupDotGate, &[DType::F32]),
        claim(OpKind::EngramGate, &[DType::F32]),
    ]
}

/// The most streams a Sinkhorn block takes (`HC_MAX_STREAMS` in cu/hyper.cuh).
pub(super) const HC_MAX_STREAMS: u64 = 32;

/// Threads of the stream kernels' blocks.
const STREAM_THREADS: u32 = 256;
/// Threads of a GroupDotGate block (one group).
const GATE_THREADS: u32 = 128;

/// Refuses a call whose extents do not fit together, naming them.
fn bad(op: &str, srcs: &[&TensorRef], dst: &TensorRef) -> PluginError {
    let ne: Vec<_> = srcs.iter().map(|t| t.ne).collect();
    PluginError::invalid(format!("{op}: sources {ne:?} into {:?}", dst.ne))
}

/// `(n, matrices)` of a Sinkhorn call of `x` into `dst`, checked.
pub(super) fn sinkhorn_shape(
    x: &TensorRef,
    dst: &TensorRef,
    iters: u32,
) -> Result<(u64, u64), PluginError> {
    let (n, m) = (x.ne[0], x.ne[2] * x.ne[3]);
    if x.ne[1] != n || dst.ne != x.ne {
        return Err(bad("Sinkhorn", &[x], dst));
    }
    if n == 0 || n > HC_MAX_STREAMS || m > i32::MAX as u64 {
        return Err(PluginError::unsupported(
            format!(
                "Sinkhorn of {m} matrices of {n} streams on the CUDA bundles (1 to \
                 {HC_MAX_STREAMS} streams)"
            ),
            &[],
        ));
    }
    if iters == 0 {
        return Err(PluginError::invalid(
            "Sinkhorn of 0 iterations (the first normalisation is iteration 1)",
        ));
    }
    Ok((n, m))
}

/// `(n, s, rows, per_element)` of a StreamMix call of streams `x` and weights `w` (`[s, rows]`,
/// or `[n, s, rows]` per element) into `dst`, checked.
pub(super) fn stream_mix_shape(
    x: &TensorRef,
    w: &TensorRef,
    dst: &TensorRef,
) -> Result<(u64, u64, u64, bool), PluginError> {
    let (n, s, rows) = (x.ne[0], x.ne[1], x.ne[2] * x.ne[3]);
    let per_element = w.ne == [n, s, rows, 1];
    let per_stream = w.ne[0] == s && w.rows() == rows;
    if !(per_element || per_stream) || dst.ne[0] != n || dst.rows() != rows {
        return Err(bad("StreamMix", &[x, w], dst));
    }
    small_streams("StreamMix", n, s)?;
    Ok((n, s, rows, per_element))
}

/// `(n, s, rows)` of a StreamUpdate call of streams `x`, `comb` (`None`: the identity), `post`
/// and block output `y` into `dst`, checked.
pub(super) fn stream_update_shape(
    x: &TensorRef,
    comb: Option<&TensorRef>,
    post: &TensorRef,
    y: &TensorRef,
    dst: &TensorRef,
) -> Result<(u64, u64, u64), PluginError> {
    let (n, s, rows) = (x.ne[0], x.ne[1], x.ne[2] * x.ne[3]);
    let fits = comb.is_none_or(|m| m.ne[0] == s && m.ne[1] == s && m.ne[2] * m.ne[3] == rows)
        && post.ne[0] == s
        && post.rows() == rows
        && y.ne[0] == n
        && y.rows() == rows
        && dst.ne == x.ne;
    if !fits {
        let srcs: Vec<&TensorRef> = [Some(x), comb, Some(post), Some(y)]
            .into_iter()
            .flatten()
            .collect();
        return Err(bad("StreamUpdate", &srcs, dst));
    }
    small_streams("StreamUpdate", n, s)?;
    Ok((n, s, rows))
}

/// `(n, groups)` of a GroupDotGate call of `a` and `b` (`[n, s, rows]`) into `dst` (`[s, rows]`),
/// checked.
pub(super) fn group_dot_gate_shape(
    a: &TensorRef,
    b: &TensorRef,
    dst: &TensorRef,
    floor: f32,
) -> Result<(u64, u64), PluginError> {
    let (n, groups) = (a.ne[0], a.ne[1] * a.ne[2] * a.ne[3]);
    if b.ne != a.ne || dst.ne[0] != a.ne[1] || dst.elements() != groups {
        return Err(bad("GroupDotGate", &[a, b], dst));
    }
    if !(floor.is_finite() && floor >= 0.0) {
        return Err(PluginError::invalid(format!(
            "GroupDotGate: floor {floor} (must be finite and not negative)"
        )));
    }
    if n == 0 || n > i32::MAX as u64 {
        return Err(PluginError::unsupported(
            format!("GroupDotGate over groups of {n} on the CUDA bundles"),
            &[],
        ));
    }
    Ok((n, groups))
}

/// `(n, s, rows)` of an EngramGate call of streams `x` (`[n, s, rows]`), `kv` (`[n·(s+1),
/// rows]`) and norm weights `qn`, `kn` (`[n, s]`) into `dst`, checked.
pub(super) fn engram_gate_shape(
    [x, kv, qn, kn]: [&TensorRef; 4],
    dst: &TensorRef,
    floor: f32,
) -> Result<(u64, u64, u64), PluginError> {
    let (n, s, rows) = (x.ne[0], x.ne[1], x.ne[2] * x.ne[3]);
    let fits = kv.ne[0] == n * (s + 1)
        && kv.rows() == rows
        && qn.ne == [n, s, 1, 1]
        && kn.ne == [n, s, 1, 1]
        && dst.ne == x.ne;
    if !fits {
        return Err(bad("EngramGate", &[x, kv, qn, kn], dst));
    }
    if !(floor.is_finite() && floor >= 0.0) {
        return Err(PluginError::invalid(format!(
            "EngramGate: floor {floor} (must be finite and not negative)"
        )));
    }
    small_streams("EngramGate", n * (s + 1), s)?;
    Ok((n, s, rows))
}

/// Refuses stream widths and counts the kernels' `int`s cannot hold.
fn small_streams(op: &str, n: u64, s: u64) -> Result<(), PluginError> {
    if n > i32::MAX as u64 || s > i32::MAX as u64 {
        return Err(PluginError::unsupported(
            format!("{op} of {s} streams of {n} values on the CUDA bundles"),
            &[],
        ));
    }
    Ok(())
}

impl Launcher {
    /// Sinkhorn normalisation of each `[n, n]` matrix of source 0.
    pub(super) fn sinkhorn<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        iters: u32,
        eps: f32,
    ) -> Result<(), PluginError> {
        let x = src(0)?;
        f32_only(x, "Sinkhorn")?;
        f32_only(&c.dst, "Sinkhorn")?;
        let (n, m) = sinkhorn_shape(x, &c.dst, iters)?;
        let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
        if m == 0 {
            return Ok(());
        }
        let (n, iters) = (n as i32, iters as i32);
        let f = self.func("bl_sinkhorn_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&po).arg(&n).arg(&iters).arg(&eps);
        let threads = ((n * n) as u32).div_ceil(32) * 32;
        // SAFETY: a block per matrix of n·n elements inside x and dst (checked), n ≤
        // HC_MAX_STREAMS so the block's threads cover it and its shared matrix holds it.
        unsafe { l.launch(cfg(m as u32, threads)) }.map_err(driver_err("bl_sinkhorn_f32"))
    }

    /// The weighted sum of the streams of source 0 by the weights of source 1.
    pub(super) fn stream_mix<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
    ) -> Result<(), PluginError> {
        let (x, w) = (src(0)?, src(1)?);
        for t in [x, w, &c.dst] {
            f32_only(t, "StreamMix")?;
        }
        let (n, s, rows, per_element) = stream_mix_shape(x, w, &c.dst)?;
        let (px, pw, po) = (addr(x, "streams")?, addr(w, "w")?, addr(&c.dst, "dst")?);
        let total = n * rows;
        if total == 0 {
            return Ok(());
        }
        let (n, s, rows) = (n as i32, s as i32, rows as i64);
        let name = if per_element {
            "bl_stream_mix_el_f32"
        } else {
            "bl_stream_mix_f32"
        };
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&pw).arg(&po).arg(&n).arg(&s).arg(&rows);
        // SAFETY: a thread per output element (grid-stride), every read inside x and w (checked,
        // w of the form the kernel reads).
        unsafe { l.launch(cfg(grid(total, 256).min(4096), STREAM_THREADS)) }
            .map_err(driver_err(name))
    }

    /// The streams of source 0 updated by `comb`, `post` and the block output `y` (sources 1-3),
    /// or with three sources by the identity comb, `post` and `y` (sources 1-2).
    pub(super) fn stream_update<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
    ) -> Result<(), PluginError> {
        if c.srcs().len() == 3 {
            return self.stream_update_identity(addr, src, c);
        }
        let (x, comb, post, y) = (src(0)?, src(1)?, src(2)?, src(3)?);
        for t in [x, comb, post, y, &c.dst] {
            f32_only(t, "StreamUpdate")?;
        }
        let (n, s, rows) = stream_update_shape(x, Some(comb), post, y, &c.dst)?;
        let (px, pc) = (addr(x, "streams")?, addr(comb, "comb")?);
        let (pp, py, po) = (addr(post, "post")?, addr(y, "y")?, addr(&c.dst, "dst")?);
        let total = c.dst.elements();
        if total == 0 {
            return Ok(());
        }
        let (n, s, rows) = (n as i32, s as i32, rows as i64);
        let f = self.func("bl_stream_update_f32")?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&pc)
            .arg(&pp)
            .arg(&py)
            .arg(&po)
            .arg(&n)
            .arg(&s)
            .arg(&rows);
        // SAFETY: a thread per output element (grid-stride), every read inside its source
        // (checked).
        unsafe { l.launch(cfg(grid(total, 256).min(4096), STREAM_THREADS)) }
            .map_err(driver_err("bl_stream_update_f32"))
    }

    /// The streams of source 0 plus `post` (source 1) times the block output `y` (source 2).
    fn stream_update_identity<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
    ) -> Result<(), PluginError> {
        let (x, post, y) = (src(0)?, src(1)?, src(2)?);
        for t in [x, post, y, &c.dst] {
            f32_only(t, "StreamUpdate")?;
        }
        let (n, s, rows) = stream_update_shape(x, None, post, y, &c.dst)?;
        let (px, pp, py) = (addr(x, "streams")?, addr(post, "post")?, addr(y, "y")?);
        let po = addr(&c.dst, "dst")?;
        let total = c.dst.elements();
        if total == 0 {
            return Ok(());
        }
        let (n, s, rows) = (n as i32, s as i32, rows as i64);
        let f = self.func("bl_stream_update_id_f32")?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&pp)
            .arg(&py)
            .arg(&po)
            .arg(&n)
            .arg(&s)
            .arg(&rows);
        // SAFETY: a thread per output element (grid-stride), every read inside its source
        // (checked).
        unsafe { l.launch(cfg(grid(total, 256).min(4096), STREAM_THREADS)) }
            .map_err(driver_err("bl_stream_update_id_f32"))
    }

    /// The sigmoid gate of each group's dot product of sources 0 and 1.
    pub(super) fn group_dot_gate<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        scale: f32,
        floor: f32,
    ) -> Result<(), PluginError> {
        let (a, b) = (src(0)?, src(1)?);
        for t in [a, b, &c.dst] {
            f32_only(t, "GroupDotGate")?;
        }
        let (n, groups) = group_dot_gate_shape(a, b, &c.dst, floor)?;
        let (pa, pb, po) = (addr(a, "a")?, addr(b, "b")?, addr(&c.dst, "dst")?);
        if groups == 0 {
            return Ok(());
        }
        let (n, groups) = (n as i32, groups as i64);
        let f = self.func("bl_group_dot_gate_f32")?;
        let mut l = self.args(&f);
        l.arg(&pa)
            .arg(&pb)
            .arg(&po)
            .arg(&n)
            .arg(&groups)
            .arg(&scale)
            .arg(&floor);
        // SAFETY: a block per group (grid-stride over groups), every read inside a and b and
        // every write inside dst (checked).
        unsafe { l.launch(cfg(grid(groups as u64, 1).min(4096), GATE_THREADS)) }
            .map_err(driver_err("bl_group_dot_gate_f32"))
    }

    /// The Engram gated read: sources `[streams, kv, q_norm, k_norm]`.
    pub(super) fn engram_gate<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        (eps, scale, floor): (f32, f32, f32),
    ) -> Result<(), PluginError> {
        let srcs = [src(0)?, src(1)?, src(2)?, src(3)?];
        for t in srcs.iter().copied().chain([&c.dst]) {
            f32_only(t, "EngramGate")?;
        }
        let (n, s, rows) = engram_gate_shape(srcs, &c.dst, floor)?;
        let [x, kv, qn, kn] = srcs;
        let (px, pkv) = (addr(x, "streams")?, addr(kv, "kv")?);
        let (pq, pk, po) = (
            addr(qn, "q_norm")?,
            addr(kn, "k_norm")?,
            addr(&c.dst, "dst")?,
        );
        let groups = rows * s;
        if groups == 0 || n == 0 {
            return Ok(());
        }
        let (n, s, rows) = (n as i32, s as i32, rows as i64);
        let f = self.func("bl_engram_gate_f32")?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&pkv)
            .arg(&pq)
            .arg(&pk)
            .arg(&po)
            .arg(&n)
            .arg(&s)
            .arg(&rows)
            .arg(&eps)
            .arg(&scale)
            .arg(&floor);
        // SAFETY: a block per (row, stream) group (grid-stride over rows·s), every read inside
        // its source and every write inside dst (shapes checked).
        unsafe { l.launch(cfg(grid(groups, 1).min(4096), GATE_THREADS)) }
            .map_err(driver_err("bl_engram_gate_f32"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::{define_in, tensor_at};

    #[test]
    fn launch_constants_match_the_kernels() {
        let src = include_str!("../../cu/hyper.cuh");
        assert_eq!(HC_MAX_STREAMS, define_in(src, "HC_MAX_STREAMS"));
    }

    #[test]
    fn shapes_are_checked_and_limits_named() {
        let t = |ne| tensor_at(1, 0, DType::F32, ne);
        assert_eq!(
            sinkhorn_shape(&t([4, 4, 7, 1]), &t([4, 4, 7, 1]), 20).unwrap(),
            (4, 7)
        );
        assert!(sinkhorn_shape(&t([4, 3, 7, 1]), &t([4, 3, 7, 1]), 20).is_err());
        assert!(sinkhorn_shape(&t([4, 4, 7, 1]), &t([4, 4, 6, 1]), 20).is_err());
        assert!(sinkhorn_shape(&t([4, 4, 7, 1]), &t([4, 4, 7, 1]), 0).is_err());
        let wide = sinkhorn_shape(&t([33, 33, 1, 1]), &t([33, 33, 1, 1]), 1)
            .unwrap_err()
            .to_string();
        assert!(wide.contains("1 to 32 streams"), "{wide}");

        let (x, w) = (t([64, 4, 3, 1]), t([4, 3, 1, 1]));
        assert_eq!(
            stream_mix_shape(&x, &w, &t([64, 3, 1, 1])).unwrap(),
            (64, 4, 3, false)
        );
        assert_eq!(
            stream_mix_shape(&x, &t([64, 4, 3, 1]), &t([64, 3, 1, 1])).unwrap(),
            (64, 4, 3, true)
        );
        assert!(stream_mix_shape(&x, &t([64, 3, 3, 1]), &t([64, 3, 1, 1])).is_err());
        assert!(stream_mix_shape(&x, &t([4, 2, 1, 1]), &t([64, 3, 1, 1])).is_err());
        assert!(stream_mix_shape(&x, &w, &t([64, 4, 3, 1])).is_err());

        let (comb, post, y) = (t([4, 4, 3, 1]), t([4, 3, 1, 1]), t([64, 3, 1, 1]));
        assert_eq!(
            stream_update_shape(&x, Some(&comb), &post, &y, &x).unwrap(),
            (64, 4, 3)
        );
        assert!(stream_update_shape(&x, Some(&t([4, 4, 2, 1])), &post, &y, &x).is_err());
        assert!(stream_update_shape(&x, Some(&comb), &post, &t([32, 3, 1, 1]), &x).is_err());
        assert!(stream_update_shape(&x, Some(&comb), &post, &y, &y).is_err());
    }

    #[test]
    fn qwen4exp_forms_are_checked() {
        let t = |ne| tensor_at(1, 0, DType::F32, ne);
        let (x, post, y) = (t([64, 4, 3, 1]), t([4, 3, 1, 1]), t([64, 3, 1, 1]));
        assert_eq!(
            stream_update_shape(&x, None, &post, &y, &x).unwrap(),
            (64, 4, 3)
        );
        assert!(stream_update_shape(&x, None, &t([4, 2, 1, 1]), &y, &x).is_err());
        let gate = t([4, 3, 1, 1]);
        assert_eq!(group_dot_gate_shape(&x, &x, &gate, 1e-6).unwrap(), (64, 12));
        assert!(group_dot_gate_shape(&x, &y, &gate, 1e-6).is_err());
        assert!(group_dot_gate_shape(&x, &x, &t([3, 4, 1, 1]), 1e-6).is_err());
        let e = group_dot_gate_shape(&x, &x, &gate, -1.0).unwrap_err();
        assert!(e.to_string().contains("floor -1"), "{e}");
    }

    #[test]
    fn the_engram_gate_is_checked() {
        let t = |ne| tensor_at(1, 0, DType::F32, ne);
        let (x, kv, w) = (t([64, 4, 3, 1]), t([320, 3, 1, 1]), t([64, 4, 1, 1]));
        assert_eq!(
            engram_gate_shape([&x, &kv, &w, &w], &x, 1e-6).unwrap(),
            (64, 4, 3)
        );
        // A kv of the streams' width only (no value), norm weights of one stream, a wrong dst.
        assert!(engram_gate_shape([&x, &t([256, 3, 1, 1]), &w, &w], &x, 1e-6).is_err());
        assert!(engram_gate_shape([&x, &kv, &t([64, 1, 1, 1]), &w], &x, 1e-6).is_err());
        assert!(engram_gate_shape([&x, &kv, &w, &w], &kv, 1e-6).is_err());
        let e = engram_gate_shape([&x, &kv, &w, &w], &x, -1.0).unwrap_err();
        assert!(e.to_string().contains("floor -1"), "{e}");
    }
}
