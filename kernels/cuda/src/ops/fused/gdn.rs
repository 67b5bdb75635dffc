//! A Gated DeltaNet mixer's decode step in two launches instead of about fifteen: the seventeen
//! calls from β's and α's products (the fifteen from β's sigmoid when the kernel cannot form
//! those) to the gated output, in the order the qwen35 graph emits them, when every segment of
//! the batch is shorter than the delta rule's chunk. `bl_conv_causal_step` forms the
//! conv's outputs in the scratch and updates the conv state; `bl_gdn_step` (cu/recurrent.cuh)
//! does the rest per (row, value head) and writes the result to the scratch as well: only its Q8_1
//! copy when the next call is a quantized product of it, else as f32, copied to the output after.
//! No arena memory is written while other blocks read, so the memory plan may reuse the inputs'
//! bytes for the intermediates as freely as it likes; the intermediates themselves are never
//! written, so the group is taken only when no later call reads bytes they would have left.
//! In a verify pass (the conv and the delta rule each with its row states as a last source) the
//! two kernels write every row's conv window and recurrent state there as well.

use bloomery_plugin_api::op::{DeltaRuleParams, Op, UnaryFn};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::{result, LaunchConfig};

use super::{plain, skipped_read_later};
use crate::ops::activations::{quantized_reader, Quantized};
use crate::ops::{driver_err, Launcher};

/// Calls of the group from β's sigmoid on (two more when the kernel forms β and α itself).
const CALLS: usize = 15;
/// Segments of this many rows or more take the chunked delta rule (`DR_CHUNK`).
const DR_CHUNK: u64 = 64;
/// Largest key and value head dim of `bl_gdn_step` (`GDN_MAX_D`).
const MAX_D: u64 = 128;
/// Threads per state column of `bl_gdn_step` (`DR_GROUP`).
const GROUP: u64 = 8;
/// Most taps of a causal conv (`CONV_MAX_TAPS`).
const MAX_TAPS: u32 = 16;

/// The tensors and parameters of a matched group.
#[derive(Debug)]
pub(super) struct GdnGroup {
    /// The conv's input, weights `[taps, ch]` and state.
    x: TensorRef,
    conv_w: TensorRef,
    conv_state: TensorRef,
    taps: u32,
    slots: TensorRef,
    pos: TensorRef,
    /// β and α before their functions, and the decay's bias and scale.
    beta: TensorRef,
    alpha: TensorRef,
    dt: TensorRef,
    a: TensorRef,
    /// The output gate before its SiLU, the output norm's weight, the recurrent state.
    z: TensorRef,
    norm_w: TensorRef,
    state: TensorRef,
    /// The gated output.
    out: TensorRef,
    /// The weights of β's and α's products and their input, when the kernel forms them.
    products: Option<[TensorRef; 3]>,
    /// Calls the group covers.
    calls: usize,
    p: DeltaRuleParams,
    /// Key heads, value heads, key and value head dims; rows; the conv's channels.
    dims: [u64; 4],
    rows: u64,
    ch: u64,
    l2_eps: f32,
    rms_eps: f32,
    /// Only the Q8_1 copy of `out` is written: the next call, a quantized product, is its only
    /// reader.
    copy_only: bool,
    /// A verify pass's row states of the conv and of the delta rule.
    row_states: Option<[TensorRef; 2]>,
}

/// The weights and input of β's and α's products at the head of `calls` when the kernel can form
/// them (F32 weights of the same outputs over one input).
fn products(calls: &[OpCall]) -> Option<[TensorRef; 3]> {
    let [pb, pa, ..] = calls else {
        return None;
    };
    let [wb, x] = pb.srcs() else {
        return None;
    };
    let [wa, xa] = pa.srcs() else {
        return None;
    };
    let n = x.ne[0];
    let weights = |w: &TensorRef| w.dtype == DType::F32 && w.is_contiguous() && w.ne[0] == n;
    (pb.op == Op::MatMul
        && pa.op == Op::MatMul
        && x == xa
        && plain(x, [n, x.rows(), 1, 1])
        && n <= i32::MAX as u64
        && weights(wb)
        && weights(wa)
        && wb.ne == wa.ne)
        .then_some([*wb, *wa, *x])
}

/// The group at the head of `calls`, when the calls form one the kernels take: from β's and α's
/// products when the kernel can form them, else from β's sigmoid.
pub(super) fn find(calls: &[OpCall]) -> Option<GdnGroup> {
    find_after(calls, products(calls))
}

/// The group of `calls`: β's sigmoid first, or (with `products`) third after the two products.
fn find_after(calls: &[OpCall], products: Option<[TensorRef; 3]>) -> Option<GdnGroup> {
    let before = if products.is_some() { 2 } else { 0 };
    let [sig, add, sp, mul_a, conv, silu, cq, l2q, ck, l2k, cv, dr, rms, zs, mul_z, rest @ ..] =
        calls.get(before..)?
    else {
        return None;
    };
    let unary = |c: &OpCall, f: UnaryFn| c.op == (Op::Unary { f }) && c.n_srcs == 1;
    let one = |c: &OpCall, op: Op| c.op == op && c.n_srcs == 1;
    let two = |c: &OpCall, op: Op| c.op == op && c.n_srcs == 2;
    if !(unary(sig, UnaryFn::Sigmoid)
        && two(add, Op::Add)
        && unary(sp, UnaryFn::Softplus)
        && two(mul_a, Op::Mul)
        && unary(silu, UnaryFn::Silu)
        && one(cq, Op::Copy)
        && one(ck, Op::Copy)
        && one(cv, Op::Copy)
        && unary(zs, UnaryFn::Silu)
        && two(mul_z, Op::Mul))
    {
        return None;
    }
    let (Op::ConvCausal { taps, dilation: 1 }, Op::DeltaRule(p)) = (conv.op, dr.op) else {
        return None;
    };
    let (Op::L2Norm { eps: l2_eps }, Op::L2Norm { eps: k_eps }, Op::RmsNorm { eps: rms_eps }) =
        (l2q.op, l2k.op, rms.op)
    else {
        return None;
    };
    let (conv_srcs, conv_rows) = match conv.srcs() {
        [srcs @ .., r] if srcs.len() == 5 => (srcs, Some(*r)),
        srcs => (srcs, None),
    };
    let (dr_srcs, dr_rows) = match dr.srcs() {
        [srcs @ .., r] if srcs.len() == 8 => (srcs, Some(*r)),
        srcs => (srcs, None),
    };
    let [x, conv_w, conv_state, slots, pos] = conv_srcs else {
        return None;
    };
    let [q_in, k_in, v_in, gate_in, beta_in, state, dr_slots, dr_pos] = dr_srcs else {
        return None;
    };
    let [o_in, norm_w] = rms.srcs() else {
        return None;
    };
    let (hk, hv, dk, dv) = (
        u64::from(p.n_head_k),
        u64::from(p.n_head_v),
        u64::from(p.dk),
        u64::from(p.dv),
    );
    let rows = slots.elements();
    if p.per_dim_gate
        || l2_eps.to_bits() != k_eps.to_bits()
        || hk == 0
        || hv % hk != 0
        || hv > 65_535
        || !(1..=MAX_D).contains(&dk)
        || !(4..=MAX_D).contains(&dv)
        || dv % 4 != 0
        || !(1..=MAX_TAPS).contains(&taps)
        || !(1..DR_CHUNK).contains(&rows)
    {
        return None;
    }
    let ch = 2 * dk * hk + dv * hv;
    let t = u64::from(taps);
    let (by_head, bias) = ([hv, rows, 1, 1], [hv, 1, 1, 1]);
    let o_ne = [dv, hv, rows, 1];
    let ints = |u: &TensorRef| u.dtype == DType::I32 && u.is_contiguous() && u.elements() == rows;
    let beta = sig.srcs()[0];
    let (alpha, dt) = (add.srcs()[0], add.srcs()[1]);
    let a = match (mul_a.srcs()[0] == sp.dst, mul_a.srcs()[1] == sp.dst) {
        (true, false) => mul_a.srcs()[1],
        (false, true) => mul_a.srcs()[0],
        _ => return None,
    };
    let decay = [&beta, &sig.dst, &alpha, &add.dst, &sp.dst, &mul_a.dst]
        .into_iter()
        .all(|u| plain(u, by_head))
        && plain(&dt, bias)
        && plain(&a, bias)
        && sp.srcs()[0] == add.dst;
    let conv_ok = plain(x, [ch, rows, 1, 1])
        && conv_w.dtype == DType::F32
        && conv_w.is_contiguous()
        && conv_w.ne[0] == t
        && conv_w.elements() == t * ch
        && conv_state.dtype == DType::F32
        && conv_state.is_contiguous()
        && conv_state.ne[0] == ch * (t - 1)
        && ints(slots)
        && ints(pos)
        && plain(&conv.dst, [ch, rows, 1, 1])
        && silu.srcs()[0] == conv.dst
        && plain(&silu.dst, [ch, rows, 1, 1]);
    // q, k and v: strided copies out of the conv's SiLU at their channel offsets.
    let s = silu.dst;
    let split = |c: &OpCall, first: u64, d: u64, heads: u64| {
        let v = c.srcs()[0];
        v.buffer == s.buffer
            && v.offset == s.offset + 4 * first
            && v.dtype == DType::F32
            && v.ne == [d, heads, rows, 1]
            && v.nb[..3] == [4, 4 * d, 4 * ch]
            && plain(&c.dst, [d, heads, rows, 1])
    };
    let qkv = split(cq, 0, dk, hk)
        && split(ck, dk * hk, dk, hk)
        && split(cv, 2 * dk * hk, dv, hv)
        && l2q.srcs()[0] == cq.dst
        && l2k.srcs()[0] == ck.dst
        && plain(&l2q.dst, [dk, hk, rows, 1])
        && plain(&l2k.dst, [dk, hk, rows, 1]);
    let rule = *q_in == l2q.dst
        && *k_in == l2k.dst
        && *v_in == cv.dst
        && *gate_in == mul_a.dst
        && *beta_in == sig.dst
        && dr_slots == slots
        && dr_pos == pos
        && state.dtype == DType::F32
        && state.is_contiguous()
        && state.ne[0] == dk * dv * hv
        && state.rows() == conv_state.rows()
        && plain(&dr.dst, o_ne);
    let z = zs.srcs()[0];
    let gated = *o_in == dr.dst
        && norm_w.dtype == DType::F32
        && norm_w.is_contiguous()
        && norm_w.elements() == dv
        && plain(&rms.dst, o_ne)
        && plain(&z, o_ne)
        && plain(&zs.dst, o_ne)
        && plain(&mul_z.dst, o_ne)
        && ((mul_z.srcs()[0] == rms.dst && mul_z.srcs()[1] == zs.dst)
            || (mul_z.srcs()[1] == rms.dst && mul_z.srcs()[0] == zs.dst));
    let row_states = match (conv_rows, dr_rows) {
        (None, None) => None,
        (Some(c), Some(d))
            if t > 1
                && plain(&c, [ch * (t - 1), rows, 1, 1])
                && plain(&d, [dk * dv * hv, rows, 1, 1]) =>
        {
            Some([c, d])
        }
        _ => return None,
    };
    if !(decay && conv_ok && qkv && rule && gated) {
        return None;
    }
    let out = mul_z.dst;
    let copy_only = dv % 32 == 0
        && rest.first().is_some_and(|c| c.op == Op::MatMul)
        && quantized_reader(&out, &rest[..1]);
    // The kernels write no result but the f32 output (and not that one for the copy), and the
    // product that takes the copy does not read the output itself.
    let written: &[TensorRef] = if copy_only { &[] } else { &[out] };
    // (The products' results are skipped too.)
    if skipped_read_later(
        &calls[..before + CALLS],
        written,
        rest,
        copy_only.then_some(&out),
    ) {
        return None;
    }
    // The products make the sigmoid's and the Add's inputs: hv outputs over rows rows.
    if let Some([wb, _, x]) = products {
        if calls[0].dst != beta || calls[1].dst != alpha || wb.ne[1] != hv || x.rows() != rows {
            return None;
        }
    }
    Some(GdnGroup {
        x: *x,
        conv_w: *conv_w,
        conv_state: *conv_state,
        taps,
        slots: *slots,
        pos: *pos,
        beta,
        alpha,
        dt,
        a,
        z,
        norm_w: *norm_w,
        state: *state,
        out,
        products,
        calls: before + CALLS,
        p,
        dims: [hk, hv, dk, dv],
        rows,
        ch,
        l2_eps,
        rms_eps,
        copy_only,
        row_states,
    })
}

/// Where the calls of a pass start a GDN decode step that the bundles launch as two kernels (taken
/// in order, as the launcher takes them), with the calls it covers and whether it writes only the
/// Q8_1 copy of its result (for tests of the graphs and memory plans
/// that must keep these calls in this form).
pub fn gdn_steps(calls: &[OpCall]) -> Vec<(usize, usize, bool)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < calls.len() {
        match find(&calls[i..]) {
            Some(g) => {
                found.push((i, g.calls, g.copy_only));
                i += g.calls;
            }
            None => i += 1,
        }
    }
    found
}

impl Launcher {
    /// Launches the group at the head of `calls` when they form one (see the module doc): the
    /// calls taken and the Q8_1 copy the scratch then holds.
    pub(super) fn gdn_step(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
    ) -> Result<Option<(usize, Option<Quantized>)>, PluginError> {
        let Some(g) = find(calls) else {
            return Ok(None);
        };
        let p = g.p;
        let [hk, hv, dk, dv] = g.dims;
        let (rows, ch) = (g.rows, g.ch);
        // The scratch: the result (its Q8_1 copy, or f32), then the conv's outputs.
        let nblocks = g.out.elements() / 32;
        let out_bytes = g.out.elements() * 4;
        let result_bytes = if g.copy_only { nblocks * 36 } else { out_bytes };
        let conv_at = result_bytes.div_ceil(256) * 256;
        let base = self.scratch(conv_at + ch * rows * 4)?;
        let conv_out = base + conv_at;
        let (px, pw, ps, pp) = (
            addr(&g.x)?,
            addr(&g.conv_w)?,
            addr(&g.slots)?,
            addr(&g.pos)?,
        );
        // A conv of one tap keeps no state.
        let pcs = if g.taps > 1 { addr(&g.conv_state)? } else { 0 };
        let n_slots = g.state.rows() as i32;
        let (chi, tapsi, ri, err) = (ch as i32, g.taps as i32, rows as i32, self.error_word);
        let (prc, prd) = match &g.row_states {
            Some([c, d]) => (addr(c)?, addr(d)?),
            None => (0, 0),
        };
        let f = self.func("bl_conv_causal_step")?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&pw)
            .arg(&pcs)
            .arg(&ps)
            .arg(&pp)
            .arg(&conv_out)
            .arg(&prc);
        l.arg(&chi).arg(&tapsi).arg(&ri).arg(&n_slots).arg(&err);
        let launch = LaunchConfig {
            grid_dim: (rows as u32, ch.div_ceil(256) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: a thread per (segment, channel) reads its rows of x and writes them in the
        // scratch (sized above) and, in a verify pass, its rows' channel of the row states
        // (checked to hold every row); a row's slot is checked on the card before the state is
        // touched, and each (slot, channel) of it belongs to one thread.
        unsafe { l.launch(launch) }.map_err(driver_err("bl_conv_causal_step"))?;
        let (pout, pq) = if g.copy_only {
            (0u64, base)
        } else {
            (base, 0u64)
        };
        let (pdt, pda) = (addr(&g.dt)?, addr(&g.a)?);
        // β and α from the products' input, or as the products wrote them.
        let (pb, pa, px_in, pwb, pwa, n_embd) = match g.products {
            Some([wb, wa, x]) => (0, 0, addr(&x)?, addr(&wb)?, addr(&wa)?, x.ne[0] as i32),
            None => (addr(&g.beta)?, addr(&g.alpha)?, 0, 0, 0, 0),
        };
        let (pz, pn, pst) = (addr(&g.z)?, addr(&g.norm_w)?, addr(&g.state)?);
        let (hki, hvi, dki, dvi) = (hk as i32, hv as i32, dk as i32, dv as i32);
        let f = self.func("bl_gdn_step")?;
        let mut l = self.args(&f);
        l.arg(&conv_out)
            .arg(&pb)
            .arg(&pa)
            .arg(&px_in)
            .arg(&pwb)
            .arg(&pwa)
            .arg(&n_embd)
            .arg(&pdt)
            .arg(&pda)
            .arg(&pz);
        l.arg(&pn)
            .arg(&pst)
            .arg(&ps)
            .arg(&pp)
            .arg(&pout)
            .arg(&pq)
            .arg(&prd);
        l.arg(&hki)
            .arg(&hvi)
            .arg(&dki)
            .arg(&dvi)
            .arg(&ri)
            .arg(&n_slots);
        l.arg(&g.l2_eps)
            .arg(&g.rms_eps)
            .arg(&p.scale)
            .arg(&p.beta_scale)
            .arg(&err);
        let launch = LaunchConfig {
            grid_dim: (rows as u32, hv as u32, 1),
            block_dim: ((GROUP * dv) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: block (row, head) reads its segment's rows of the conv outputs (scratch), β and
        // α (or the products' input and its head's weight rows), z and the per-head weights, and
        // writes its rows and head of the result (scratch, before the conv outputs) and, in a
        // verify pass, of the row states (checked to hold every row); each (slot, head) of the
        // state belongs to one block; slots are checked on the card before it is touched.
        unsafe { l.launch(launch) }.map_err(driver_err("bl_gdn_step"))?;
        let pout = addr(&g.out)?;
        if g.copy_only {
            return Ok(Some((
                g.calls,
                Some(Quantized {
                    x: pout,
                    nblocks,
                    q: base,
                }),
            )));
        }
        // SAFETY: out_bytes of the scratch to the output, whose span the buffer table checked;
        // ordered after the kernel on the same stream.
        unsafe {
            result::memcpy_dtod_async(pout, base, out_bytes as usize, self.stream.cu_stream())
        }
        .map_err(driver_err("copying a GDN step's output"))?;
        Ok(Some((g.calls, None)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HK: u64 = 2;
    const HV: u64 = 4;
    const D: u64 = 32;
    const TAPS: u64 = 4;
    const CH: u64 = 2 * D * HK + D * HV;

    use crate::ops::tests::tensor_at as at;

    /// Arena tensors (buffer 1) of the group, by offset.
    fn arena(offset: u64, ne: [u64; 4]) -> TensorRef {
        at(1, offset, DType::F32, ne)
    }

    /// Where the chain's tensors sit; tests move some of them.
    struct Layout {
        rows: u64,
        out: u64,
        /// β's and α's products first, with weights of this type.
        products: Option<DType>,
        /// The product after the group has quantized weights.
        quantized: bool,
    }

    impl Layout {
        fn new(rows: u64) -> Layout {
            Layout {
                rows,
                out: 69_632,
                products: None,
                quantized: true,
            }
        }
    }

    /// The fifteen calls as the qwen35 graph emits them, then the output product.
    fn chain(l: &Layout) -> Vec<OpCall> {
        let rows = l.rows;
        let by_head = [HV, rows, 1, 1];
        let o_ne = [D, HV, rows, 1];
        let w = |offset, ne| at(2, offset, DType::F32, ne);
        let (dt, a) = (w(0, [HV, 1, 1, 1]), w(64, [HV, 1, 1, 1]));
        let conv_w = w(1024, [TAPS, CH, 1, 1]);
        let norm_w = w(8192, [D, 1, 1, 1]);
        let conv_state = at(4, 0, DType::F32, [CH * (TAPS - 1), 1, 2, 1]);
        let state = at(5, 0, DType::F32, [D * D * HV, 1, 2, 1]);
        let slots = at(6, 0, DType::I32, [rows, 1, 1, 1]);
        let pos = at(7, 0, DType::I32, [rows, 1, 1, 1]);
        let (beta_raw, alpha_raw) = (arena(0, by_head), arena(1024, by_head));
        let (beta, alpha_b, alpha_sp, gate) = (
            arena(2048, by_head),
            arena(3072, by_head),
            arena(4096, by_head),
            arena(5120, by_head),
        );
        let x = arena(8192, [CH, rows, 1, 1]);
        let conv = arena(16_384, [CH, rows, 1, 1]);
        let silu = arena(24_576, [CH, rows, 1, 1]);
        let view = |first: u64, d: u64, heads: u64| TensorRef {
            buffer: 1,
            offset: silu.offset + 4 * first,
            dtype: DType::F32,
            ne: [d, heads, rows, 1],
            nb: [4, 4 * d, 4 * CH, 4 * CH * rows],
        };
        let (q, qn) = (
            arena(32_768, [D, HK, rows, 1]),
            arena(36_864, [D, HK, rows, 1]),
        );
        let (k, kn) = (
            arena(40_960, [D, HK, rows, 1]),
            arena(45_056, [D, HK, rows, 1]),
        );
        let v = arena(49_152, o_ne);
        let (o, on) = (arena(53_248, o_ne), arena(57_344, o_ne));
        let (z, zs, out) = (arena(61_440, o_ne), arena(65_536, o_ne), arena(l.out, o_ne));
        let p = DeltaRuleParams {
            n_head_k: HK as u32,
            n_head_v: HV as u32,
            dk: D as u32,
            dv: D as u32,
            scale: 0.25,
            per_dim_gate: false,
            beta_scale: 1.0,
        };
        let unary = |f, x, y| OpCall::new(Op::Unary { f }, &[x], y);
        let wout = if l.quantized {
            at(3, 0, DType::Q8_0, [D * HV, 64, 1, 1])
        } else {
            at(3, 0, DType::F32, [D * HV, 64, 1, 1])
        };
        let out_rows = TensorRef {
            ne: [D * HV, rows, 1, 1],
            nb: TensorRef::contiguous_strides(DType::F32, [D * HV, rows, 1, 1]).unwrap(),
            ..out
        };
        let products = l.products.map(|t| {
            let x = arena(100_000, [256, rows, 1, 1]);
            let (wb, wa) = (
                at(8, 0, t, [256, HV, 1, 1]),
                at(8, 8192, t, [256, HV, 1, 1]),
            );
            [
                OpCall::new(Op::MatMul, &[wb, x], beta_raw),
                OpCall::new(Op::MatMul, &[wa, x], alpha_raw),
            ]
        });
        let chain = vec![
            unary(UnaryFn::Sigmoid, beta_raw, beta),
            OpCall::new(Op::Add, &[alpha_raw, dt], alpha_b),
            unary(UnaryFn::Softplus, alpha_b, alpha_sp),
            OpCall::new(Op::Mul, &[alpha_sp, a], gate),
            OpCall::new(
                Op::ConvCausal {
                    taps: TAPS as u32,
                    dilation: 1,
                },
                &[x, conv_w, conv_state, slots, pos],
                conv,
            ),
            unary(UnaryFn::Silu, conv, silu),
            OpCall::new(Op::Copy, &[view(0, D, HK)], q),
            OpCall::new(Op::L2Norm { eps: 1e-6 }, &[q], qn),
            OpCall::new(Op::Copy, &[view(D * HK, D, HK)], k),
            OpCall::new(Op::L2Norm { eps: 1e-6 }, &[k], kn),
            OpCall::new(Op::Copy, &[view(2 * D * HK, D, HV)], v),
            OpCall::new(
                Op::DeltaRule(p),
                &[qn, kn, v, gate, beta, state, slots, pos],
                o,
            ),
            OpCall::new(Op::RmsNorm { eps: 1e-6 }, &[o, norm_w], on),
            unary(UnaryFn::Silu, z, zs),
            OpCall::new(Op::Mul, &[on, zs], out),
            OpCall::new(
                Op::MatMul,
                &[wout, out_rows],
                arena(131_072, [64, rows, 1, 1]),
            ),
        ];
        products.into_iter().flatten().chain(chain).collect()
    }

    #[test]
    fn a_decode_step_is_found_and_writes_only_the_copy_a_quantized_product_reads() {
        let g = find(&chain(&Layout::new(1))).expect("the group");
        assert!(g.copy_only);
        assert_eq!((g.taps, g.p.dk, g.out.offset), (4, 32, 69_632));
        let f32 = Layout {
            quantized: false,
            ..Layout::new(3)
        };
        assert!(!find(&chain(&f32)).expect("the group").copy_only);
        // Rows of one long segment take the chunked rule.
        assert!(find(&chain(&Layout::new(64))).is_none());
    }

    /// A verify pass's conv and delta rule, each with its row states, form the group, which then
    /// carries them; one without the other, or row states of another shape, do not.
    #[test]
    fn a_verify_pass_fuses_with_its_row_states() {
        let rows = 4;
        let conv_rows = at(10, 0, DType::F32, [CH * (TAPS - 1), rows, 1, 1]);
        let dr_rows = at(11, 0, DType::F32, [D * D * HV, rows, 1, 1]);
        let with = |conv: Option<TensorRef>, dr: Option<TensorRef>| {
            let mut calls = chain(&Layout::new(rows));
            for c in calls.iter_mut() {
                let extra = match c.op {
                    Op::ConvCausal { .. } => conv,
                    Op::DeltaRule(_) => dr,
                    _ => None,
                };
                if let Some(t) = extra {
                    let mut srcs = c.srcs().to_vec();
                    srcs.push(t);
                    *c = OpCall::new(c.op, &srcs, c.dst);
                }
            }
            find(&calls)
        };
        let g = with(Some(conv_rows), Some(dr_rows)).expect("the group");
        assert_eq!(g.row_states, Some([conv_rows, dr_rows]));
        assert!(with(None, None).expect("the group").row_states.is_none());
        assert!(with(Some(conv_rows), None).is_none());
        assert!(with(None, Some(dr_rows)).is_none());
        assert!(with(Some(dr_rows), Some(conv_rows)).is_none());
    }

    #[test]
    fn a_dilated_conv_is_not_fused() {
        let mut calls = chain(&Layout::new(1));
        let conv = calls
            .iter_mut()
            .find(|c| matches!(c.op, Op::ConvCausal { .. }));
        conv.expect("the conv").op = Op::ConvCausal {
            taps: TAPS as u32,
            dilation: 3,
        };
        assert!(find(&calls).is_none());
    }

    #[test]
    fn the_group_is_refused_when_a_later_call_reads_bytes_it_skips() {
        let reader = |t: TensorRef| OpCall::new(Op::Add, &[t, t], arena(200_000, t.ne));
        // A later reader of the decay (the Mul's result), which the kernels never write...
        let mut calls = chain(&Layout::new(1));
        let gate = calls[3].dst;
        calls.push(reader(gate));
        assert!(find(&calls).is_none());
        // ...unless a call wrote over those bytes first.
        let mut calls = chain(&Layout::new(1));
        let other = at(9, 0, DType::F32, gate.ne);
        calls.push(OpCall::new(Op::Add, &[other, other], gate));
        calls.push(reader(gate));
        assert!(find(&calls).is_some());
        // Bytes of an intermediate the output was placed over hold the output (f32 path)...
        let over_gate = Layout {
            out: 5_120,
            quantized: false,
            ..Layout::new(1)
        };
        let mut calls = chain(&over_gate);
        calls.push(reader(gate));
        assert!(!find(&calls).expect("the group").copy_only);
        // ...and a later reader of the output besides the quantized product sees the f32 result
        // only if it is written.
        let mut calls = chain(&Layout::new(1));
        let out = calls[14].dst;
        calls.push(reader(out));
        assert!(find(&calls).is_none());
        let f32 = Layout {
            quantized: false,
            ..Layout::new(1)
        };
        let mut calls = chain(&f32);
        calls.push(reader(out));
        assert!(find(&calls).is_some());
    }

    #[test]
    fn beta_and_alpha_products_of_f32_weights_join_the_group() {
        let f32 = Layout {
            products: Some(DType::F32),
            ..Layout::new(2)
        };
        let calls = chain(&f32);
        let g = find(&calls).expect("the group");
        assert_eq!((g.calls, g.products.is_some()), (17, true));
        assert_eq!(gdn_steps(&calls), vec![(0, 17, true)]);
        // Quantized products are launched apart: the group starts at the sigmoid.
        let q8 = Layout {
            products: Some(DType::Q8_0),
            ..Layout::new(2)
        };
        let calls = chain(&q8);
        assert!(find(&calls).is_none());
        assert_eq!(find(&calls[2..]).expect("the group").calls, 15);
        assert_eq!(gdn_steps(&calls), vec![(2, 15, true)]);
        // A product whose result is not the sigmoid's input is not one of them.
        let mut calls = chain(&f32);
        calls.swap(0, 1);
        assert!(find(&calls).is_none());
    }

    #[test]
    fn q_k_and_v_must_be_read_at_their_channel_offsets() {
        let mut calls = chain(&Layout::new(2));
        let (q_src, k_src) = (calls[6].srcs[0], calls[8].srcs[0]);
        calls[6].srcs[0] = k_src;
        calls[8].srcs[0] = q_src;
        assert!(find(&calls).is_none());
        // Another order of the calls (β's sigmoid before α's product) is not the group.
        let mut calls = chain(&Layout::new(1));
        calls.swap(0, 1);
        assert!(find(&calls).is_none());
    }
}
