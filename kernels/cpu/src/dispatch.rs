//! Runs one op call on the CPU: checks every tensor against the buffer table, views it as a slice
//! and calls the reference op (or the backend's faster row kernel for products). The list of what
//! is implemented here is [`capabilities`], so the two cannot drift apart.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::op::{Gating, GluKind, Op, OpKind, OpSupport, UnaryFn};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use crate::linear::{self, ExpertStacks, Parallel, RowsDot};
use crate::linear_heads;
use crate::memory::Buffers;
use crate::ops::{self, OpError};
use crate::quant;
use crate::tensors::{bytes, f16s, f16s_mut, f32s, f32s_mut, i32s, i32s_mut};

mod compressed;
mod hyper;

/// What a CPU plugin plugs into the shared dispatch.
pub struct Backend<'a> {
    /// The buffer table.
    pub buffers: &'a Buffers,
    /// The worker pool.
    pub par: &'a dyn Parallel,
    /// The row dot-product kernel.
    pub dot: RowsDot,
}

fn op_err(e: OpError) -> PluginError {
    PluginError::invalid(e.to_string())
}

/// Weight types the products and gathers accept: every type with a dequantizer and a dot product.
pub fn weight_types() -> Vec<DType> {
    DType::ALL
        .iter()
        .copied()
        .filter(|&t| quant::vec_dot_type(t).is_some() && !matches!(t, DType::Q8_1 | DType::Q8_K))
        .collect()
}

/// Every `(op, dtype)` pair [`run`] implements.
pub fn capabilities() -> RVec<OpSupport> {
    let f32_only = [
        OpKind::Concat,
        OpKind::Add,
        OpKind::Mul,
        OpKind::Scale,
        OpKind::Unary,
        OpKind::Glu,
        OpKind::RmsNorm,
        OpKind::LayerNorm,
        OpKind::L2Norm,
        OpKind::Softmax,
        OpKind::Rope,
        OpKind::TopK,
        OpKind::RouterTopK,
        OpKind::RouterWeights,
        OpKind::ConvCausal,
        OpKind::DeltaRule,
        OpKind::AttentionDense,
        OpKind::SpanMean,
        OpKind::Sinkhorn,
        OpKind::StreamMix,
        OpKind::StreamUpdate,
        OpKind::GroupDotGate,
        OpKind::Compress,
        OpKind::CompSelect,
        OpKind::EngramGate,
    ];
    let mut list: Vec<OpSupport> = f32_only
        .iter()
        .map(|&op| OpSupport {
            op,
            dtypes: vec![DType::F32].into(),
        })
        .collect();
    let weights = weight_types();
    for op in [OpKind::MatMul, OpKind::GetRows, OpKind::MoeExperts] {
        let mut dtypes = weights.clone();
        // Integer gathers (hash routing's `tid2eid[token]`) copy i32 rows.
        if op == OpKind::GetRows {
            dtypes.push(DType::I32);
        }
        list.push(OpSupport {
            op,
            dtypes: dtypes.into(),
        });
    }
    list.push(OpSupport {
        op: OpKind::KPoolSelect,
        dtypes: vec![DType::F32, DType::F16].into(),
    });
    for op in [OpKind::CacheStore, OpKind::Attention] {
        list.push(OpSupport {
            op,
            dtypes: crate::quant::KV_CACHE_TYPES.to_vec().into(),
        });
    }
    // I32: contiguous moves only (the tiered executor packs expert ids).
    list.push(OpSupport {
        op: OpKind::Copy,
        dtypes: vec![DType::F32, DType::F16, DType::I32].into(),
    });
    list.sort_by_key(|s| s.op);
    list.into()
}

fn usz(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn src<'c>(c: &'c OpCall, i: usize, op: &str) -> Result<&'c TensorRef, PluginError> {
    c.srcs()
        .get(i)
        .ok_or_else(|| PluginError::invalid(format!("{op}: missing source {i}")))
}

/// Runs one call.
pub fn run(b: &Backend<'_>, c: &OpCall) -> Result<(), PluginError> {
    let buf = b.buffers;
    match c.op {
        Op::MatMul => {
            let (w, x) = (src(c, 0, "MatMul")?, src(c, 1, "MatMul")?);
            let xs = f32s(buf, x, "MatMul x")?;
            if w.ne[2] > 1 {
                return matmul_heads(b, c, w, x, xs);
            }
            let (k, n, m) = (usz(w.ne[0]), usz(w.ne[1]), usz(x.rows()));
            if usz(x.ne[0]) != k
                || c.dst.ne[0] != w.ne[1]
                || usz(c.dst.rows()) != m
                || w.rows() != w.ne[1]
            {
                return Err(PluginError::invalid(format!(
                    "MatMul shapes {:?} x {:?} -> {:?}",
                    w.ne, x.ne, c.dst.ne
                )));
            }
            let acts = linear::quantize_acts(w.dtype, k, xs, m)?;
            let y = f32s_mut(buf, &c.dst, "MatMul dst")?;
            linear::matmul(
                b.par,
                b.dot,
                w.dtype,
                bytes(buf, w)?,
                usz(w.nb[1]),
                k,
                n,
                &acts,
                y,
            )
        }
        Op::GetRows => {
            let (t, ids) = (src(c, 0, "GetRows")?, src(c, 1, "GetRows")?);
            let ids = i32s(buf, ids, "GetRows ids")?;
            if t.dtype == DType::I32 {
                let (n, table) = (usz(t.ne[0]), i32s(buf, t, "GetRows table")?);
                let out = i32s_mut(buf, &c.dst, "GetRows dst")?;
                return ops::embedding::get_rows_with(usz(t.rows()), n, ids, out, |r, dst| {
                    dst.copy_from_slice(&table[r * n..(r + 1) * n]);
                })
                .map_err(op_err);
            }
            let table = bytes(buf, t)?;
            let (n, stride) = (usz(t.ne[0]), usz(t.nb[1]));
            let row = usz(t.dtype.row_bytes(t.ne[0]).unwrap_or(0));
            let out = f32s_mut(buf, &c.dst, "GetRows dst")?;
            let mut failed = None;
            ops::embedding::get_rows_with(usz(t.rows()), n, ids, out, |r, dst| {
                if let Err(e) =
                    quant::dequantize_row(t.dtype, &table[r * stride..r * stride + row], dst)
                {
                    failed = Some(e);
                }
            })
            .map_err(op_err)?;
            failed.map_or(Ok(()), |e| Err(PluginError::invalid(e.to_string())))
        }
        Op::MoeExperts(p) => moe(b, c, p),
        Op::Add | Op::Mul => {
            let (a, bb) = (src(c, 0, "Add")?, src(c, 1, "Add")?);
            let rhs = f32s(buf, bb, "b")?;
            // `[1, m]`: one value per row of `a` (when `a`'s rows are one value wide, every rule
            // means the same).
            let per_row = bb.ne[0] == 1 && a.ne[0] != 1;
            if per_row && bb.elements() != a.rows() {
                return Err(PluginError::invalid(format!(
                    "Add/Mul of {:?} by {:?}: one value per row needs {} values",
                    a.ne,
                    bb.ne,
                    a.rows()
                )));
            }
            let out = copy_in(buf, c, "Add")?;
            match (c.op, per_row) {
                (Op::Add, false) => ops::elementwise::add(out, rhs),
                (Op::Add, true) => ops::elementwise::add_per_row(out, rhs),
                (_, false) => ops::elementwise::mul(out, rhs),
                (_, true) => ops::elementwise::mul_per_row(out, rhs),
            }
            .map_err(op_err)
        }
        Op::ConvCausal { taps, dilation } => conv_causal(b, c, taps, dilation),
        Op::DeltaRule(p) => delta_rule(b, c, p),
        Op::Scale { s } => {
            let out = copy_in(buf, c, "Scale")?;
            ops::elementwise::scale(out, s);
            Ok(())
        }
        Op::Unary { f } => {
            let out = copy_in(buf, c, "Unary")?;
            match f {
                UnaryFn::Silu => ops::activations::silu(out),
                UnaryFn::Sigmoid => ops::activations::sigmoid(out),
                UnaryFn::Gelu => ops::activations::gelu_tanh(out),
                UnaryFn::GeluErf => ops::activations::gelu_erf(out),
                UnaryFn::Softplus => out.iter_mut().for_each(|v| *v = softplus(*v)),
                UnaryFn::Tanh => out.iter_mut().for_each(|v| *v = v.tanh()),
                UnaryFn::Exp => out.iter_mut().for_each(|v| *v = v.exp()),
                UnaryFn::Relu => out.iter_mut().for_each(|v| *v = v.max(0.0)),
            }
            Ok(())
        }
        Op::Glu { kind, limit } => {
            let g = f32s(buf, src(c, 0, "Glu")?, "gate")?;
            let u = f32s(buf, src(c, 1, "Glu")?, "up")?;
            glu(kind, limit, g, u, f32s_mut(buf, &c.dst, "Glu dst")?)
        }
        Op::RmsNorm { eps } => {
            let w = match c.srcs().get(1) {
                Some(t) => Some(f32s(buf, t, "RmsNorm weight")?),
                None => None,
            };
            let n = usz(c.dst.ne[0]);
            let out = copy_in(buf, c, "RmsNorm")?;
            ops::norms::rms_norm(out, n, eps, w).map_err(op_err)
        }
        Op::LayerNorm { eps } => {
            let w = c
                .srcs()
                .get(1)
                .map(|t| f32s(buf, t, "LayerNorm weight"))
                .transpose()?;
            let bias = c
                .srcs()
                .get(2)
                .map(|t| f32s(buf, t, "LayerNorm bias"))
                .transpose()?;
            let n = usz(c.dst.ne[0]);
            let out = copy_in(buf, c, "LayerNorm")?;
            ops::norms::layer_norm(out, n, eps, w, bias).map_err(op_err)
        }
        Op::L2Norm { eps } => {
            let n = usz(c.dst.ne[0]);
            let out = copy_in(buf, c, "L2Norm")?;
            ops::norms::l2_norm(out, n, eps, ops::norms::L2Epsilon::AddSquared).map_err(op_err)
        }
        Op::Softmax { scale } => {
            let mask = c
                .srcs()
                .get(1)
                .map(|t| f32s(buf, t, "Softmax mask"))
                .transpose()?;
            let n = usz(c.dst.ne[0]);
            let out = copy_in(buf, c, "Softmax")?;
            ops::softmax::softmax(out, n, scale, mask).map_err(op_err)
        }
        Op::Rope(p) => {
            let pos = i32s(buf, src(c, 1, "Rope")?, "positions")?;
            let (hd, nh) = (usz(c.dst.ne[0]), usz(c.dst.ne[1]));
            let params = ops::rope::RopeParams::from_abi(&p);
            let out = copy_in(buf, c, "Rope")?;
            ops::rope::rope(out, hd, nh, pos, &params).map_err(op_err)
        }
        Op::CacheStore { rot } => cache_store(buf, c, rot as usize),
        Op::Attention(p) => attention(b, c, p),
        Op::TopK { k } => {
            let x = f32s(buf, src(c, 0, "TopK")?, "x")?;
            let n = usz(c.srcs()[0].ne[0]);
            let out = i32s_mut(buf, &c.dst, "TopK dst")?;
            top_k(x, n, k as usize, out)
        }
        Op::RouterTopK(p) | Op::RouterWeights(p) => router(b, c, p),
        Op::Copy => copy(buf, c),
        Op::Concat => {
            let (a, bb) = (src(c, 0, "Concat")?, src(c, 1, "Concat")?);
            let (na, nb, m) = (usz(a.ne[0]), usz(bb.ne[0]), usz(a.rows()));
            let (xa, xb) = (f32s(buf, a, "a")?, f32s(buf, bb, "b")?);
            let out = f32s_mut(buf, &c.dst, "Concat dst")?;
            if out.len() != (na + nb) * m || xb.len() != nb * m {
                return Err(PluginError::invalid("Concat shapes"));
            }
            for r in 0..m {
                out[r * (na + nb)..r * (na + nb) + na].copy_from_slice(&xa[r * na..(r + 1) * na]);
                out[r * (na + nb) + na..(r + 1) * (na + nb)]
                    .copy_from_slice(&xb[r * nb..(r + 1) * nb]);
            }
            Ok(())
        }
        Op::AttentionDense { scale, causal } => attention_dense(buf, c, scale, causal),
        Op::KPoolSelect(p) => kpool_select(b, c, p),
        Op::SpanMean => {
            let (x, spans) = (src(c, 0, "SpanMean")?, src(c, 1, "SpanMean")?);
            let n = usz(x.ne[0]);
            let (x, spans) = (f32s(buf, x, "x")?, i32s(buf, spans, "spans")?);
            let out = f32s_mut(buf, &c.dst, "SpanMean dst")?;
            ops::span_mean::span_mean(x, n, spans, out).map_err(op_err)
        }
        Op::Sinkhorn { iters, eps } => hyper::sinkhorn(b, c, iters, eps),
        Op::StreamMix => hyper::stream_mix(b, c),
        Op::StreamUpdate => hyper::stream_update(b, c),
        Op::GroupDotGate { scale, floor } => hyper::group_dot_gate(b, c, scale, floor),
        Op::Compress(p) => compressed::compress(b, c, p),
        Op::CompSelect(p) => compressed::comp_select(b, c, p),
        Op::EngramGate { eps, scale, floor } => {
            let gate = ops::engram::EngramGate { eps, scale, floor };
            hyper::engram_gate(b, c, gate)
        }
    }
}

/// Dense attention: srcs `[q [dk, n_head, n_q], k [dk, n_head_kv, n_k], v [dv, n_head_kv, n_k]]`.
fn attention_dense(buf: &Buffers, c: &OpCall, scale: f32, causal: bool) -> Result<(), PluginError> {
    let (q, k, v) = (
        src(c, 0, "AttentionDense")?,
        src(c, 1, "AttentionDense")?,
        src(c, 2, "AttentionDense")?,
    );
    let shape = ops::attention_dense::DenseShape {
        dk: usz(q.ne[0]),
        dv: usz(v.ne[0]),
        n_head: usz(q.ne[1]),
        n_head_kv: usz(k.ne[1]),
        n_q: usz(q.ne[2]),
        n_k: usz(k.ne[2]),
        scale,
        causal,
    };
    let (q, k, v) = (f32s(buf, q, "q")?, f32s(buf, k, "k")?, f32s(buf, v, "v")?);
    let out = f32s_mut(buf, &c.dst, "AttentionDense dst")?;
    // Scratch for one row of scores: a decision head's call has tens to thousands of keys, far
    // from the decode path.
    let mut scores = vec![0f64; shape.n_k];
    ops::attention_dense::attention_dense(q, k, v, out, shape, &mut scores).map_err(op_err)
}

/// MatMul over a stack of per-head matrices: `w [k, n, h]`, `x [k, h, m]` → `[n, h, m]`.
fn matmul_heads(
    b: &Backend<'_>,
    c: &OpCall,
    w: &TensorRef,
    x: &TensorRef,
    xs: &[f32],
) -> Result<(), PluginError> {
    let (k, n, h) = (w.ne[0], w.ne[1], w.ne[2]);
    let m = x.ne[2] * x.ne[3];
    if w.ne[3] != 1 || x.ne[0] != k || x.ne[1] != h || c.dst.ne != [n, h, m, 1] {
        return Err(PluginError::invalid(format!(
            "per-head MatMul shapes {:?} x {:?} -> {:?} (want w [k, n, h], x [k, h, m] -> [n, h, m])",
            w.ne, x.ne, c.dst.ne
        )));
    }
    let y = f32s_mut(b.buffers, &c.dst, "MatMul dst")?;
    let stack = linear_heads::HeadStack {
        dtype: w.dtype,
        bytes: bytes(b.buffers, w)?,
        row_stride: usz(w.nb[1]),
        head_stride: usz(w.nb[2]),
    };
    let shape = linear_heads::HeadsShape {
        k: usz(k),
        n: usz(n),
        heads: usz(h),
        cols: usz(m),
    };
    linear_heads::matmul_heads(b.par, b.dot, stack, shape, xs, y)
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Copies source 0 into the destination and returns the destination (same shape, f32).
fn copy_in<'a>(buf: &Buffers, c: &OpCall, op: &str) -> Result<&'a mut [f32], PluginError> {
    let x = f32s(buf, src(c, 0, op)?, op)?;
    let out = f32s_mut(buf, &c.dst, op)?;
    if x.len() != out.len() {
        return Err(PluginError::invalid(format!(
            "{op}: {} values into {}",
            x.len(),
            out.len()
        )));
    }
    out.copy_from_slice(x);
    Ok(out)
}

fn glu(
    kind: GluKind,
    limit: f32,
    g: &[f32],
    u: &[f32],
    out: &mut [f32],
) -> Result<(), PluginError> {
    if limit.is_nan() || limit < 0.0 || (limit > 0.0 && kind == GluKind::GeGlu) {
        return Err(PluginError::unsupported(
            format!("a GLU limit of {limit} with {kind:?} (a clamp is SwiGlu's, and 0 or more)"),
            &[],
        ));
    }
    match kind {
        GluKind::SwiGlu => {
            let clamp = if limit > 0.0 {
                ops::activations::SwigluClamp::GateInput { limit }
            } else {
                ops::activations::SwigluClamp::None
            };
            ops::activations::swiglu(g, u, out, clamp).map_err(op_err)
        }
        GluKind::GeGlu => {
            if g.len() != out.len() || u.len() != out.len() {
                return Err(PluginError::invalid("GeGlu shapes"));
            }
            out.copy_from_slice(g);
            ops::activations::gelu_tanh(out);
            out.iter_mut().zip(u).for_each(|(o, v)| *o *= v);
            Ok(())
        }
    }
}

/// The `k` largest entries of each row of `x` (`n` a row), largest first in
/// [`f32::total_cmp`]'s order, ties to the lower index: one scan keeping the best `k` in order,
/// an entry that cannot enter them dismissed by one compare (a draft step's row is the whole
/// vocabulary, 248,320 logits for Qwen3.6, where sorting every index cost tens of ms).
fn top_k(x: &[f32], n: usize, k: usize, out: &mut [i32]) -> Result<(), PluginError> {
    if n == 0 || k > n || out.len() != k * (x.len() / n) {
        return Err(PluginError::invalid(format!(
            "TopK of {k} over rows of {n}"
        )));
    }
    if k == 0 {
        return Ok(());
    }
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(k)) {
        best.clear();
        for (i, &v) in row.iter().enumerate() {
            // An equal entry already kept has the lower index, so it stays ahead.
            if best.len() == k && v.total_cmp(&best[k - 1].0).is_le() {
                continue;
            }
            let at = best.partition_point(|&(b, _)| b.total_cmp(&v).is_ge());
            best.insert(at, (v, i));
            best.truncate(k);
        }
        for (d, &(_, i)) in o.iter_mut().zip(&best) {
            *d = i as i32;
        }
    }
    Ok(())
}

fn moe(
    b: &Backend<'_>,
    c: &OpCall,
    p: bloomery_plugin_api::op::MoeParams,
) -> Result<(), PluginError> {
    let buf = b.buffers;
    let x = f32s(buf, src(c, 0, "MoeExperts")?, "x")?;
    let ids = i32s(buf, src(c, 1, "MoeExperts")?, "ids")?;
    let w = f32s(buf, src(c, 2, "MoeExperts")?, "weights")?;
    let gate = src(c, 3, "MoeExperts")?;
    let (up, down_i) = if p.fused_gate_up {
        (None, 4)
    } else {
        let up = src(c, 4, "MoeExperts")?;
        (Some((bytes(buf, up)?, up.dtype)), 5)
    };
    let down = src(c, down_i, "MoeExperts")?;
    let map = if p.expert_map {
        Some(i32s(buf, src(c, down_i + 1, "MoeExperts")?, "expert map")?)
    } else {
        None
    };
    let stacks = ExpertStacks {
        gate: bytes(buf, gate)?,
        gate_t: gate.dtype,
        up,
        down: bytes(buf, down)?,
        down_t: down.dtype,
        n_embd: usz(gate.ne[0]),
        n_ff: p.n_ff as usize,
        n_expert: usz(gate.ne[2]),
    };
    let out = f32s_mut(buf, &c.dst, "MoeExperts dst")?;
    let act = |g: &[f32], u: &[f32], o: &mut [f32]| glu(p.glu, p.limit, g, u, o);
    linear::moe_experts(
        b.par,
        b.dot,
        &stacks,
        x,
        ids,
        w,
        p.k as usize,
        map,
        &act,
        out,
    )
}

/// The slots as unsigned indices, without copying (checked non-negative; the ops check the upper
/// bound). Called per layer per step, so it must not allocate.
fn slots_u32(s: &[i32]) -> Result<&[u32], PluginError> {
    if let Some(v) = s.iter().find(|&&v| v < 0) {
        return Err(PluginError::invalid(format!("negative slot {v}")));
    }
    // SAFETY: i32 and u32 have the same size and alignment, every value is non-negative so it
    // means the same as u32, and the result borrows `s`.
    Ok(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u32>(), s.len()) })
}

/// Source `i`, a state the op updates in place besides writing its destination, as a mutable
/// slice: refused when its bytes overlap any other tensor of the call, so no view of this call
/// aliases it.
fn state_mut<'a>(
    buf: &Buffers,
    c: &OpCall,
    i: usize,
    what: &str,
) -> Result<&'a mut [f32], PluginError> {
    alone(buf, c, i, what)?;
    f32s_mut(buf, src(c, i, what)?, what)
}

/// Refuses a call whose source `i` (updated in place) overlaps any other tensor of the call.
fn alone(buf: &Buffers, c: &OpCall, i: usize, what: &str) -> Result<(), PluginError> {
    let span = |t: &TensorRef| -> Result<(usize, usize), PluginError> {
        let start = buf.check_tensor(t)? as usize;
        Ok((start, start + usz(t.span_bytes().unwrap_or(0))))
    };
    let state = src(c, i, what)?;
    let (lo, hi) = span(state)?;
    let others = c.srcs().iter().enumerate().filter(|&(j, _)| j != i);
    for (j, t) in others.map(|(j, t)| (Some(j), t)).chain([(None, &c.dst)]) {
        let (a, b) = span(t)?;
        if a < hi && lo < b {
            let other = j.map_or("the destination".to_owned(), |j| format!("source {j}"));
            return Err(PluginError::invalid(format!(
                "{what} (source {i}) overlaps {other}"
            )));
        }
    }
    Ok(())
}

/// The k-pool indexer's selection: srcs `[q [dh, n_head, rows], w [n_head, rows], cache [3·dh,
/// len, n_slots] f32 or f16 (updated in place), ape [dh, kpool], slots, positions]` (DSA) or `[q,
/// k_norm [dh], cache [2·dh, len, n_slots], slots, positions]` (QSA) → i32 `[n_sel, rows]`.
fn kpool_select(
    b: &Backend<'_>,
    c: &OpCall,
    p: bloomery_plugin_api::op::KPoolParams,
) -> Result<(), PluginError> {
    use bloomery_plugin_api::op::KPoolMode;
    const OP: &str = "KPoolSelect";
    let buf = b.buffers;
    let (q, cache) = (src(c, 0, OP)?, src(c, 2, OP)?);
    let s = ops::kpool::KPoolShape {
        n_head: p.n_head as usize,
        head_dim: p.head_dim as usize,
        kpool: p.kpool as usize,
        n_top: p.n_top as usize,
        tail: p.tail,
        len: usz(cache.ne[1]),
        n_slots: usz(cache.ne[2]),
    };
    let (dh, nh, rows) = (u64::from(p.head_dim), u64::from(p.n_head), q.ne[2]);
    let (pooling, sections, (fits_srcs, srcs_ne), at) = match p.mode {
        KPoolMode::SoftmaxGate => {
            let (w, ape) = (src(c, 1, OP)?, src(c, 3, OP)?);
            let pooling = ops::kpool::Pooling::SoftmaxGate {
                w: f32s(buf, w, "w")?,
                ape: f32s(buf, ape, "ape")?,
            };
            let fits = w.ne == [nh, rows, 1, 1] && ape.ne == [dh, u64::from(p.kpool), 1, 1];
            (
                pooling,
                3,
                (fits, format!("w {:?}, ape {:?}", w.ne, ape.ne)),
                4,
            )
        }
        KPoolMode::MeanNormRope { eps, rope, scale } => {
            let k_norm = src(c, 1, OP)?;
            let pooling = ops::kpool::Pooling::MeanNormRope {
                k_norm: f32s(buf, k_norm, "k_norm")?,
                eps,
                rope: ops::rope::RopeParams::from_abi(&rope),
                scale,
            };
            let fits = k_norm.ne == [dh, 1, 1, 1];
            (pooling, 2, (fits, format!("k_norm {:?}", k_norm.ne)), 3)
        }
    };
    let fits = fits_srcs
        && q.ne == [dh, nh, rows, 1]
        && cache.ne[0] == sections * dh
        && cache.ne[3] == 1
        && c.dst.ne == [s.n_sel() as u64, rows, 1, 1];
    if !fits {
        return Err(PluginError::invalid(format!(
            "{OP} of {} heads of {dh}, pools of {}: q {:?}, {srcs_ne}, cache {:?} into {:?}",
            p.n_head, p.kpool, q.ne, cache.ne, c.dst.ne
        )));
    }
    let x = ops::kpool::KPoolInputs {
        q: f32s(buf, q, "q")?,
        pooling,
        slots: slots_u32(i32s(buf, src(c, at, OP)?, "slots")?)?,
        positions: i32s(buf, src(c, at + 1, OP)?, "positions")?,
    };
    alone(buf, c, 2, "KPoolSelect cache")?;
    let out = i32s_mut(buf, &c.dst, "KPoolSelect dst")?;
    // Scratch for the ranking keys of up to 64 rows at a time (a prompt's rows in passes).
    let mut keys = vec![0u64; s.max_pools().max(1) * usz(rows).clamp(1, 64)];
    let keys = &mut keys;
    match cache.dtype {
        DType::F32 => {
            let cache = f32s_mut(buf, cache, "KPoolSelect cache")?;
            ops::kpool::kpool_select(b.par, &x, cache, &s, keys, out)
        }
        DType::F16 => {
            let cache = f16s_mut(buf, cache, "KPoolSelect cache")?;
            ops::kpool::kpool_select(b.par, &x, cache, &s, keys, out)
        }
        t => {
            return Err(PluginError::unsupported(
                format!("{OP} over a {t} cache"),
                &["F32", "F16"],
            ))
        }
    }
    .map_err(op_err)
}

fn conv_causal(b: &Backend<'_>, c: &OpCall, taps: u32, dilation: u32) -> Result<(), PluginError> {
    let buf = b.buffers;
    let (x, w) = (src(c, 0, "ConvCausal")?, src(c, 1, "ConvCausal")?);
    let st = src(c, 2, "ConvCausal")?;
    if w.ne[0] != u64::from(taps) || w.ne[1] != x.ne[0] {
        return Err(PluginError::invalid(format!(
            "ConvCausal weights {:?} for {taps} taps over {} channels",
            w.ne, x.ne[0]
        )));
    }
    let p = ops::conv::ConvParams {
        ch: usz(x.ne[0]),
        taps: taps as usize,
        dilation: dilation as usize,
        n_slots: usz(st.rows()),
    };
    let slots = slots_u32(i32s(buf, src(c, 3, "ConvCausal")?, "slots")?)?;
    let pos = i32s(buf, src(c, 4, "ConvCausal")?, "positions")?;
    let (xs, ws) = (f32s(buf, x, "ConvCausal x")?, f32s(buf, w, "ConvCausal w")?);
    let state = state_mut(buf, c, 2, "ConvCausal state")?;
    let out = f32s_mut(buf, &c.dst, "ConvCausal dst")?;
    let rows = row_states(buf, c, 5, "ConvCausal")?;
    ops::conv::conv_causal_rows(b.par, xs, ws, state, slots, pos, &p, out, rows).map_err(op_err)
}

/// The optional per-row state source `i` of a state op (a verify pass's row states): written,
/// so it may overlap nothing else of the call. More sources than that are refused.
fn row_states<'a>(
    buf: &Buffers,
    c: &OpCall,
    i: usize,
    op: &str,
) -> Result<Option<&'a mut [f32]>, PluginError> {
    match c.srcs().len() {
        n if n == i => Ok(None),
        n if n == i + 1 => state_mut(buf, c, i, &format!("{op} row states")).map(Some),
        n => Err(PluginError::invalid(format!(
            "{op} takes {i} sources, or {} with row states, not {n}",
            i + 1
        ))),
    }
}

fn delta_rule(
    b: &Backend<'_>,
    c: &OpCall,
    p: bloomery_plugin_api::op::DeltaRuleParams,
) -> Result<(), PluginError> {
    const OP: &str = "DeltaRule";
    let buf = b.buffers;
    let f = |i: usize, what: &str| f32s(buf, src(c, i, OP)?, what);
    let x = ops::delta_rule::DeltaRuleInputs {
        q: f(0, "DeltaRule q")?,
        k: f(1, "DeltaRule k")?,
        v: f(2, "DeltaRule v")?,
        gate: f(3, "DeltaRule gate")?,
        beta: f(4, "DeltaRule beta")?,
        slots: slots_u32(i32s(buf, src(c, 6, OP)?, "slots")?)?,
        positions: i32s(buf, src(c, 7, OP)?, "positions")?,
    };
    let params = ops::delta_rule::DeltaRuleParams {
        n_head_k: p.n_head_k as usize,
        n_head_v: p.n_head_v as usize,
        dk: p.dk as usize,
        dv: p.dv as usize,
        n_slots: usz(src(c, 5, OP)?.rows()),
        scale: p.scale,
        beta_scale: p.beta_scale,
        per_dim_gate: p.per_dim_gate,
        form: ops::delta_rule::Form::Auto,
    };
    let state = state_mut(buf, c, 5, "DeltaRule state")?;
    let out = f32s_mut(buf, &c.dst, "DeltaRule dst")?;
    let rows = row_states(buf, c, 8, OP)?;
    ops::delta_rule::delta_rule_rows(b.par, &x, &params, state, out, rows).map_err(op_err)
}

/// The names of [`crate::quant::KV_CACHE_TYPES`], for refusals.
const KV_CACHE_NAMES: [&str; 8] = [
    "F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL",
];

fn cache_store(buf: &Buffers, c: &OpCall, rot: usize) -> Result<(), PluginError> {
    let rows = f32s(buf, src(c, 0, "CacheStore")?, "rows")?;
    let cache = src(c, 1, "CacheStore")?;
    if *cache != c.dst {
        return Err(PluginError::invalid(
            "CacheStore must write the cache it names",
        ));
    }
    let slots = slots_u32(i32s(buf, src(c, 2, "CacheStore")?, "slots")?)?;
    let pos = i32s(buf, src(c, 3, "CacheStore")?, "positions")?;
    let (width, len, n_slots) = (usz(cache.ne[0]), usz(cache.ne[1]), usz(cache.ne[2]));
    let target = match cache.dtype {
        DType::F32 => ops::attention::KvCacheMut::F32(f32s_mut(buf, &c.dst, "cache")?),
        DType::F16 => ops::attention::KvCacheMut::F16(f16s_mut(buf, &c.dst, "cache")?),
        t if crate::quant::KV_CACHE_TYPES.contains(&t) => {
            ops::attention::KvCacheMut::Quant(t, crate::tensors::bytes_mut(buf, &c.dst)?)
        }
        t => {
            return Err(PluginError::unsupported(
                format!("CacheStore into {t}"),
                &KV_CACHE_NAMES,
            ))
        }
    };
    ops::attention::store_kv_rotated(rows, width, slots, pos, target, len, n_slots, rot)
        .map_err(op_err)
}

fn kv<'a>(buf: &Buffers, t: &TensorRef) -> Result<ops::attention::KvCache<'a>, PluginError> {
    Ok(match t.dtype {
        DType::F32 => ops::attention::KvCache::F32(f32s(buf, t, "cache")?),
        DType::F16 => ops::attention::KvCache::F16(f16s(buf, t, "cache")?),
        d if crate::quant::KV_CACHE_TYPES.contains(&d) => {
            ops::attention::KvCache::Quant(d, crate::tensors::bytes(buf, t)?)
        }
        d => {
            return Err(PluginError::unsupported(
                format!("attention over a {d} cache"),
                &KV_CACHE_NAMES,
            ))
        }
    })
}

fn attention(
    b: &Backend<'_>,
    c: &OpCall,
    p: bloomery_plugin_api::op::AttentionParams,
) -> Result<(), PluginError> {
    let buf = b.buffers;
    let q = f32s(buf, src(c, 0, "Attention")?, "q")?;
    let kc = src(c, 1, "Attention")?;
    let vc = src(c, 2, "Attention")?;
    if p.v_from_k && vc != kc {
        return Err(PluginError::invalid(
            "Attention with v_from_k: the V source must be the K cache again",
        ));
    }
    let slots = slots_u32(i32s(buf, src(c, 3, "Attention")?, "slots")?)?;
    let pos = i32s(buf, src(c, 4, "Attention")?, "positions")?;
    let sinks = if p.sinks {
        Some(f32s(buf, src(c, 5, "Attention")?, "sinks")?)
    } else {
        None
    };
    let selected = if p.selected {
        let at = 5 + usize::from(p.sinks);
        let t = src(c, at, "Attention")?;
        if t.rows() != slots.len() as u64 {
            return Err(PluginError::invalid(format!(
                "Attention selection {:?} for {} rows (want i32 [n_sel, rows])",
                t.ne,
                slots.len()
            )));
        }
        Some(ops::attention_select::Selection {
            ids: i32s(buf, t, "selected")?,
            n_sel: usz(t.ne[0]),
        })
    } else {
        None
    };
    let comp = if p.comp > 0 {
        let at = 5 + usize::from(p.sinks) + usize::from(p.selected);
        let t = src(c, at, "Attention")?;
        if t.ne[0] != u64::from(p.dk * p.n_head_kv) || t.ne[2] != kc.ne[2] || t.ne[3] != 1 {
            return Err(PluginError::invalid(format!(
                "Attention compressed rows {:?} beside a cache {:?}",
                t.ne, kc.ne
            )));
        }
        let selected = if p.comp_selected {
            let ids = src(c, at + 1, "Attention")?;
            if ids.rows() != slots.len() as u64 {
                return Err(PluginError::invalid(format!(
                    "Attention compressed-row lists {:?} for {} rows (want i32 [n, rows])",
                    ids.ne,
                    slots.len()
                )));
            }
            Some(ops::attention_select::Selection {
                ids: i32s(buf, ids, "comp_ids")?,
                n_sel: usz(ids.ne[0]),
            })
        } else {
            None
        };
        Some(ops::attention::CompRows {
            cache: f32s(buf, t, "comp")?,
            len: usz(t.ne[1]),
            ratio: p.comp as usize,
            selected,
        })
    } else if p.comp_selected {
        return Err(PluginError::invalid(
            "Attention: comp_selected without compressed rows (comp 0)",
        ));
    } else {
        None
    };
    let params = ops::attention::AttentionParams {
        n_head: p.n_head as usize,
        n_head_kv: p.n_head_kv as usize,
        head_dim_k: p.dk as usize,
        head_dim_v: p.dv as usize,
        cache_len: usz(kc.ne[1]),
        n_slots: usz(kc.ne[2]),
        scale: p.scale,
        softcap: (p.softcap > 0.0).then_some(p.softcap),
        window: (p.window > 0).then_some(p.window as usize),
        sinks,
        rot_k: p.rot_k as usize,
        rot_v: p.rot_v as usize,
        v_from_k: p.v_from_k,
        selected,
        comp,
    };
    let (kcache, vcache) = (kv(buf, kc)?, kv(buf, vc)?);
    let out = f32s_mut(buf, &c.dst, "Attention dst")?;
    let rows = slots.len();
    let (qrow, orow) = (
        p.dk as usize * p.n_head as usize,
        p.dv as usize * p.n_head as usize,
    );
    if q.len() != qrow * rows || out.len() != orow * rows {
        return Err(PluginError::invalid("Attention shapes"));
    }
    let out_ptr = SharedOut(out.as_mut_ptr());
    let failed = std::sync::Mutex::new(None);
    // A task per (row, KV head): decode's one row still spreads over the threads, and each task
    // reads its KV head's cached rows once for the query heads that share it.
    let n_kv = params.n_head_kv.max(1);
    let (qg, og) = (qrow / n_kv, orow / n_kv);
    b.par.for_each(rows * n_kv, &|task| {
        let (r, kvh) = (task / n_kv, task % n_kv);
        // SAFETY: task (r, kvh) writes only its heads' part of output row r, disjoint from every
        // other task's, inside `out`, which outlives the parallel loop.
        let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.at(task * og), og) };
        let res = ops::attention::attention_group(
            &q[task * qg..][..qg],
            r,
            slots[r],
            pos[r],
            kvh,
            kcache,
            vcache,
            &params,
            o,
        );
        if let Err(e) = res {
            if let Ok(mut f) = failed.lock() {
                *f = Some(e);
            }
        }
    });
    match failed.into_inner() {
        Ok(Some(e)) => Err(op_err(e)),
        _ => Ok(()),
    }
}

#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: used only to hand disjoint output rows to parallel tasks.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The address of element `i` (a method, so closures capture the whole wrapper).
    fn at(&self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

fn router(
    b: &Backend<'_>,
    c: &OpCall,
    p: bloomery_plugin_api::op::RouterParams,
) -> Result<(), PluginError> {
    let buf = b.buffers;
    let logits = f32s(buf, src(c, 0, "Router")?, "logits")?;
    let (n, k) = (p.n_expert as usize, p.k as usize);
    let gating = match p.gating {
        Gating::Softmax => ops::router::Gating::Softmax,
        Gating::Sigmoid => ops::router::Gating::Sigmoid,
        Gating::SoftmaxSelected => ops::router::Gating::SoftmaxSelected,
        Gating::SqrtSoftplus => ops::router::Gating::SqrtSoftplus,
    };
    let renorm = if p.norm {
        ops::router::Renorm::SumAtLeast(p.norm_min)
    } else {
        ops::router::Renorm::Off
    };
    let rows = logits.len() / n.max(1);
    match c.op {
        Op::RouterTopK(_) => {
            let bias = if p.bias {
                Some(f32s(buf, src(c, 1, "RouterTopK")?, "bias")?)
            } else {
                None
            };
            let params = ops::router::RouterParams {
                n_expert: n,
                k,
                gating,
                bias,
                groups: (p.n_group > 1).then_some(ops::router::Groups {
                    n_group: p.n_group as usize,
                    topk_group: p.topk_group as usize,
                }),
                renorm,
                scale: p.scale,
            };
            let ids = i32s_mut(buf, &c.dst, "RouterTopK dst")?;
            let mut scratch = vec![0f32; k * rows];
            ops::router::route(logits, &params, ids, &mut scratch).map_err(op_err)
        }
        _ => {
            let ids = i32s(buf, src(c, 1, "RouterWeights")?, "ids")?;
            let out = f32s_mut(buf, &c.dst, "RouterWeights dst")?;
            router_weights(logits, ids, n, k, gating, p, out)
        }
    }
}

/// Weights of given expert choices: gating scores of the chosen experts, renormalised and scaled.
fn router_weights(
    logits: &[f32],
    ids: &[i32],
    n: usize,
    k: usize,
    gating: ops::router::Gating,
    p: bloomery_plugin_api::op::RouterParams,
    out: &mut [f32],
) -> Result<(), PluginError> {
    let rows = logits.len() / n.max(1);
    if ids.len() != k * rows || out.len() != k * rows {
        return Err(PluginError::invalid("RouterWeights shapes"));
    }
    // Scores of a whole row, for gatings over all experts (not the softmax over the chosen,
    // which a vocabulary-wide top-k readout uses).
    let mut scores = Vec::new();
    for r in 0..rows {
        let row = &logits[r * n..(r + 1) * n];
        let chosen = &ids[r * k..(r + 1) * k];
        let o = &mut out[r * k..(r + 1) * k];
        let pick = |i: i32| -> Result<usize, PluginError> {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < n)
                .ok_or_else(|| PluginError::invalid(format!("expert id {i} of {n}")))
        };
        match gating {
            ops::router::Gating::SoftmaxSelected => {
                for (d, &i) in o.iter_mut().zip(chosen) {
                    *d = row[pick(i)?];
                }
                ops::softmax::softmax_row(o).map_err(op_err)?;
            }
            g => {
                scores.clear();
                scores.extend_from_slice(row);
                match g {
                    ops::router::Gating::Softmax => {
                        ops::softmax::softmax_row(&mut scores).map_err(op_err)?
                    }
                    ops::router::Gating::Sigmoid => ops::activations::sigmoid(&mut scores),
                    _ => scores.iter_mut().for_each(|v| *v = softplus(*v).sqrt()),
                }
                for (d, &i) in o.iter_mut().zip(chosen) {
                    *d = scores[pick(i)?];
                }
            }
        }
        if p.norm {
            let sum: f32 = o.iter().sum();
            let sum = sum.max(p.norm_min);
            o.iter_mut().for_each(|v| *v /= sum);
        }
        if p.scale != 0.0 && p.scale != 1.0 {
            o.iter_mut().for_each(|v| *v *= p.scale);
        }
    }
    Ok(())
}

fn copy(buf: &Buffers, c: &OpCall) -> Result<(), PluginError> {
    let x = src(c, 0, "Copy")?;
    if x.ne != c.dst.ne {
        return Err(PluginError::invalid(format!(
            "Copy {:?} into {:?}",
            x.ne, c.dst.ne
        )));
    }
    if x.dtype == c.dst.dtype && x.is_contiguous() && c.dst.is_contiguous() {
        let n = usz(x.span_bytes().unwrap_or(0));
        let s = buf.check_tensor(x)?;
        let d = buf.check_tensor(&c.dst)?;
        // SAFETY: both spans were checked (the same length: same shape and dtype, contiguous);
        // `copy` allows them to overlap (an in-place copy), and no reference to either exists.
        unsafe { std::ptr::copy(s, d, n) };
        return Ok(());
    }
    match (x.dtype, c.dst.dtype) {
        (DType::F32, DType::F16) | (DType::F16, DType::F32) | (DType::F32, DType::F32) => {}
        (DType::I32, DType::I32) => return copy_i32(buf, x, c),
        (a, d) => {
            return Err(PluginError::unsupported(
                format!("Copy {a} to {d}"),
                &["F32<->F16", "I32 to I32"],
            ))
        }
    }
    let base = buf.check_tensor(x)?;
    let n0 = usz(x.ne[0]);
    let total = usz(x.rows());
    let mut row = vec![0f32; n0];
    for r in 0..total {
        let (i1, i2, i3) = (
            r % usz(x.ne[1]),
            (r / usz(x.ne[1])) % usz(x.ne[2]),
            r / usz(x.ne[1] * x.ne[2]),
        );
        let off = (i1 as u64 * x.nb[1] + i2 as u64 * x.nb[2] + i3 as u64 * x.nb[3]) as usize;
        for (i, v) in row.iter_mut().enumerate() {
            let p = off + i * usz(x.nb[0]);
            // SAFETY: `check_tensor` proved every element of the strided source is in bounds;
            // reads are unaligned-safe.
            *v = unsafe {
                match x.dtype {
                    DType::F16 => {
                        half::f16::from_bits(std::ptr::read_unaligned(base.add(p) as *const u16))
                            .to_f32()
                    }
                    _ => std::ptr::read_unaligned(base.add(p) as *const f32),
                }
            };
        }
        match c.dst.dtype {
            DType::F16 => {
                let d = f16s_mut(buf, &c.dst, "Copy dst")?;
                for (o, v) in d[r * n0..(r + 1) * n0].iter_mut().zip(&row) {
                    *o = half::f16::from_f32(*v);
                }
            }
            _ => f32s_mut(buf, &c.dst, "Copy dst")?[r * n0..(r + 1) * n0].copy_from_slice(&row),
        }
    }
    Ok(())
}

/// A strided I32 source into its contiguous destination of the same shape (DeepSeek-V4.1's
/// Engram row ids of one site out of every site's).
fn copy_i32(buf: &Buffers, x: &TensorRef, c: &OpCall) -> Result<(), PluginError> {
    let base = buf.check_tensor(x)?;
    let n0 = usz(x.ne[0]);
    let out = i32s_mut(buf, &c.dst, "Copy dst")?;
    for (r, dst) in out.chunks_exact_mut(n0.max(1)).enumerate() {
        let (i1, i2, i3) = (
            r % usz(x.ne[1]),
            (r / usz(x.ne[1])) % usz(x.ne[2]),
            r / usz(x.ne[1] * x.ne[2]),
        );
        let off = (i1 as u64 * x.nb[1] + i2 as u64 * x.nb[2] + i3 as u64 * x.nb[3]) as usize;
        for (i, v) in dst.iter_mut().enumerate() {
            // SAFETY: `check_tensor` proved every element of the strided source is in bounds;
            // reads are unaligned-safe.
            *v =
                unsafe { std::ptr::read_unaligned(base.add(off + i * usz(x.nb[0])) as *const i32) };
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;
