//! The dispatch of the hyper-connection ops (`Op::Sinkhorn`, `Op::StreamMix`,
//! `Op::StreamUpdate`) and of the gates `Op::GroupDotGate` and `Op::EngramGate`: their tensors' shapes checked against each
//! other, then the reference ops of [`crate::ops::hyper`].

use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::PluginError;

use super::{copy_in, op_err, src, usz, Backend};
use crate::ops;
use crate::tensors::{f32s, f32s_mut};

/// Refuses a call whose extents do not fit together, naming them.
fn shapes(op: &str, ok: bool, c: &OpCall) -> Result<(), PluginError> {
    if ok {
        return Ok(());
    }
    let srcs: Vec<_> = c.srcs().iter().map(|t| t.ne).collect();
    Err(PluginError::invalid(format!(
        "{op}: sources {srcs:?} into {:?}",
        c.dst.ne
    )))
}

/// Sinkhorn normalisation: srcs `[x [n, n, m]]` → `[n, n, m]`.
pub(super) fn sinkhorn(
    b: &Backend<'_>,
    c: &OpCall,
    iters: u32,
    eps: f32,
) -> Result<(), PluginError> {
    let x = src(c, 0, "Sinkhorn")?;
    shapes("Sinkhorn", x.ne[0] == x.ne[1] && c.dst.ne == x.ne, c)?;
    let out = copy_in(b.buffers, c, "Sinkhorn")?;
    ops::hyper::sinkhorn(out, usz(x.ne[0]), iters, eps).map_err(op_err)
}

/// Weighted sum of streams: srcs `[streams [n, s, rows], w [s, rows] or [n, s, rows]]` →
/// `[n, rows]`.
pub(super) fn stream_mix(b: &Backend<'_>, c: &OpCall) -> Result<(), PluginError> {
    use ops::hyper::MixWeights;
    let (x, w) = (src(c, 0, "StreamMix")?, src(c, 1, "StreamMix")?);
    let (n, s, rows) = (x.ne[0], x.ne[1], x.ne[2] * x.ne[3]);
    let form = if w.ne == [n, s, rows, 1] {
        MixWeights::PerElement
    } else {
        MixWeights::PerStream
    };
    let fits = (form == MixWeights::PerElement || (w.ne[0] == s && w.rows() == rows))
        && c.dst.ne[0] == n
        && c.dst.rows() == rows;
    shapes("StreamMix", fits, c)?;
    let buf = b.buffers;
    let (xs, ws) = (
        f32s(buf, x, "StreamMix streams")?,
        f32s(buf, w, "StreamMix w")?,
    );
    let out = f32s_mut(buf, &c.dst, "StreamMix dst")?;
    ops::hyper::stream_mix(b.par, xs, ws, (usz(n), usz(s), form), out).map_err(op_err)
}

/// Stream update: srcs `[streams [n, s, rows], comb [s, s, rows], post [s, rows], y [n, rows]]`,
/// or `[streams, post, y]` for the identity comb → `[n, s, rows]`.
pub(super) fn stream_update(b: &Backend<'_>, c: &OpCall) -> Result<(), PluginError> {
    const OP: &str = "StreamUpdate";
    let x = src(c, 0, OP)?;
    let (comb, post, y) = match c.srcs().len() {
        3 => (None, src(c, 1, OP)?, src(c, 2, OP)?),
        _ => (Some(src(c, 1, OP)?), src(c, 2, OP)?, src(c, 3, OP)?),
    };
    let (n, s, rows) = (x.ne[0], x.ne[1], x.ne[2] * x.ne[3]);
    let comb_fits = comb.is_none_or(|m| m.ne[0] == s && m.ne[1] == s && m.ne[2] * m.ne[3] == rows);
    let fits = comb_fits
        && post.ne[0] == s
        && post.rows() == rows
        && y.ne[0] == n
        && y.rows() == rows
        && c.dst.ne == x.ne;
    shapes(OP, fits, c)?;
    let buf = b.buffers;
    let out = f32s_mut(buf, &c.dst, "StreamUpdate dst")?;
    let inputs = ops::hyper::UpdateInputs {
        streams: f32s(buf, x, "StreamUpdate streams")?,
        comb: comb
            .map(|m| f32s(buf, m, "StreamUpdate comb"))
            .transpose()?,
        post: f32s(buf, post, "StreamUpdate post")?,
        y: f32s(buf, y, "StreamUpdate y")?,
    };
    ops::hyper::stream_update(b.par, &inputs, usz(n), usz(s), out).map_err(op_err)
}

/// The gate of each group's dot product: srcs `[a [n, s, rows], b [n, s, rows]]` → `[s, rows]`.
pub(super) fn group_dot_gate(
    b: &Backend<'_>,
    c: &OpCall,
    scale: f32,
    floor: f32,
) -> Result<(), PluginError> {
    const OP: &str = "GroupDotGate";
    let (a, bt) = (src(c, 0, OP)?, src(c, 1, OP)?);
    let groups = a.ne[1] * a.ne[2] * a.ne[3];
    let fits = bt.ne == a.ne && c.dst.ne[0] * c.dst.rows() == groups && c.dst.ne[0] == a.ne[1];
    shapes(OP, fits, c)?;
    if !(floor.is_finite() && floor >= 0.0) {
        return Err(PluginError::invalid(format!(
            "{OP}: floor {floor} (must be finite and not negative)"
        )));
    }
    let buf = b.buffers;
    let (xa, xb) = (
        f32s(buf, a, "GroupDotGate a")?,
        f32s(buf, bt, "GroupDotGate b")?,
    );
    let out = f32s_mut(buf, &c.dst, "GroupDotGate dst")?;
    ops::hyper::group_dot_gate(xa, xb, usz(a.ne[0]), (scale, floor), out).map_err(op_err)
}

/// The Engram gated read: srcs `[streams [n, s, rows], kv [n·(s+1), rows], q_norm [n, s],
/// k_norm [n, s]]` → `[n, s, rows]`.
pub(super) fn engram_gate(
    b: &Backend<'_>,
    c: &OpCall,
    gate: ops::engram::EngramGate,
) -> Result<(), PluginError> {
    const OP: &str = "EngramGate";
    let x = src(c, 0, OP)?;
    let (kv, qn, kn) = (src(c, 1, OP)?, src(c, 2, OP)?, src(c, 3, OP)?);
    let (n, s, rows) = (x.ne[0], x.ne[1], x.ne[2] * x.ne[3]);
    let fits = kv.ne[0] == n * (s + 1)
        && kv.rows() == rows
        && qn.ne == [n, s, 1, 1]
        && kn.ne == [n, s, 1, 1]
        && c.dst.ne == x.ne;
    shapes(OP, fits, c)?;
    let buf = b.buffers;
    let inputs = ops::engram::EngramInputs {
        streams: f32s(buf, x, "EngramGate streams")?,
        kv: f32s(buf, kv, "EngramGate kv")?,
        q_norm: f32s(buf, qn, "EngramGate q_norm")?,
        k_norm: f32s(buf, kn, "EngramGate k_norm")?,
    };
    let out = f32s_mut(buf, &c.dst, "EngramGate dst")?;
    ops::engram::engram_gate(b.par, &inputs, (usz(n), usz(s)), gate, out).map_err(op_err)
}
