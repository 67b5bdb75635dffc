//! A per-head `RmsNorm` and the `Rope` of its result, with the K and V cache stores that follow
//! it, as one kernel (`bl_norm_rope_f32`, `bl_norm_rope_f16` in `cu/rope.cuh`). A group without
//! stores (Q) followed by another of the same rows, positions, norm and rope (K, with its stores)
//! goes into the same launch: the graph builders emit q's norm and rope, then k's, then the
//! stores. The norm's own result is written only when a later call reads its bytes.

use bloomery_plugin_api::op::{Op, RopeParams};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::{plain, read_later};
use crate::ops::rope::{rope_args, RopeArgs};
use crate::ops::{cfg, driver_err, Launcher};

/// One (RmsNorm, Rope) pair that `bl_norm_rope_*` runs, with the K and V cache stores that follow
/// it: device addresses, the rope's kernel arguments, and the byte spans it reads and writes.
struct NormRopeGroup {
    x: u64,
    w: u64,
    normed: u64,
    out: u64,
    pos: TensorRef,
    pos_addr: u64,
    rope: RopeArgs,
    /// K cache, slots, cache length, slots in the cache, cache type.
    k_store: Option<(u64, u64, i32, i32, DType)>,
    /// V rows, V cache, V row width.
    v_store: Option<(u64, u64, i32)>,
    /// Byte ranges written, and every range read or written.
    writes: Vec<(u64, u64)>,
    touches: Vec<(u64, u64)>,
    /// Calls the group covers.
    taken: usize,
}

/// Whether no range of `a` meets a range of `b`.
fn disjoint(a: &[(u64, u64)], b: &[(u64, u64)]) -> bool {
    a.iter()
        .all(|&(s, e)| b.iter().all(|&(s2, e2)| e <= s2 || e2 <= s))
}

/// The (RmsNorm, Rope [, K store [, V store]]) group at the head of `calls`, or `None` when they
/// do not form one.
fn norm_rope_group(
    addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
    calls: &[OpCall],
    p: RopeParams,
) -> Result<Option<NormRopeGroup>, PluginError> {
    let (norm, rope) = (&calls[0], &calls[1]);
    if rope.n_srcs != 2 || norm.n_srcs == 0 {
        return Ok(None);
    }
    let (x, out) = (norm.srcs()[0], rope.dst);
    let ne = out.ne;
    if rope.srcs()[0] != norm.dst || ![&x, &norm.dst, &out].into_iter().all(|t| plain(t, ne)) {
        return Ok(None);
    }
    let pos = rope.srcs()[1];
    // The fused kernel rotates from dim 0 and forward only: other forms run as separate calls.
    let Ok(r) = rope_args(&p, &norm.dst, &pos, &out) else {
        return Ok(None);
    };
    if r.offset != 0 || r.inverse != 0 {
        return Ok(None);
    }
    let (hd, nh, rows) = (ne[0], ne[1], ne[2] * ne[3]);
    let threads = (hd / 2).div_ceil(32) * 32;
    if r.rows == 0 || threads > 1024 || !pos.is_contiguous() {
        return Ok(None);
    }
    let span = |t: &TensorRef| -> Result<(u64, u64), PluginError> {
        let a = addr(t)?;
        Ok((a, a + t.span_bytes().unwrap_or(u64::MAX - a)))
    };
    let mut touches = vec![span(&x)?, span(&pos)?];
    let w = match norm.srcs().get(1) {
        Some(w) if plain(w, [hd, 1, 1, 1]) => {
            touches.push(span(w)?);
            addr(w)?
        }
        Some(_) => return Ok(None),
        None => 0u64,
    };
    // The norm's own result is written only when a later call reads it.
    let normed_read = read_later(&norm.dst, &calls[2..]);
    let mut writes = vec![span(&out)?];
    if normed_read {
        writes.push(span(&norm.dst)?);
    }
    // A store of `out` (reshaped to [hd·nh, rows]) into a cache.
    let store_of = |c: &OpCall, rows_ok: &dyn Fn(&TensorRef) -> bool| -> Option<TensorRef> {
        if !matches!(c.op, Op::CacheStore { .. }) || c.n_srcs != 4 {
            return None;
        }
        let (t, cache, slots, at) = (c.srcs()[0], c.srcs()[1], c.srcs()[2], c.srcs()[3]);
        let ok = rows_ok(&t)
            && cache == c.dst
            && matches!(cache.dtype, DType::F32 | DType::F16)
            && cache.is_contiguous()
            && cache.ne[0] == t.ne[0]
            && at == pos
            && slots.dtype == DType::I32
            && slots.is_contiguous()
            && slots.elements() == rows;
        ok.then_some(cache)
    };
    let k_rows = |t: &TensorRef| {
        t.buffer == out.buffer && t.offset == out.offset && plain(t, [hd * nh, rows, 1, 1])
    };
    let k_cache = calls.get(2).and_then(|c| store_of(c, &k_rows));
    let v = match (k_cache, calls.get(3)) {
        (Some(kc), Some(c)) => {
            let v_rows =
                |t: &TensorRef| t.dtype == DType::F32 && t.is_contiguous() && t.rows() == rows;
            store_of(c, &v_rows)
                .filter(|vc| vc.dtype == kc.dtype && c.srcs()[2] == calls[2].srcs()[2])
                .map(|vc| (c.srcs()[0], vc))
        }
        _ => None,
    };
    let k_store = match k_cache {
        Some(kc) => {
            let slots = calls[2].srcs()[2];
            touches.push(span(&slots)?);
            writes.push(span(&kc)?);
            Some((
                addr(&kc)?,
                addr(&slots)?,
                kc.ne[1] as i32,
                kc.ne[2] as i32,
                kc.dtype,
            ))
        }
        None => None,
    };
    let v_store = match v {
        Some((v, vc)) => {
            touches.push(span(&v)?);
            writes.push(span(&vc)?);
            Some((addr(&v)?, addr(&vc)?, v.ne[0] as i32))
        }
        None => None,
    };
    touches.extend_from_slice(&writes);
    Ok(Some(NormRopeGroup {
        x: addr(&x)?,
        w,
        normed: if normed_read { addr(&norm.dst)? } else { 0 },
        out: addr(&out)?,
        pos,
        pos_addr: addr(&pos)?,
        rope: r,
        k_store,
        v_store,
        writes,
        touches,
        taken: 2 + usize::from(k_store.is_some()) + usize::from(v_store.is_some()),
    }))
}

impl Launcher {
    /// `normed = rms_norm(x) · w` per head, `out = rope(normed)`, and when the next calls store
    /// `out` into a K cache and another tensor into a V cache of the same rows, those stores too:
    /// one kernel. A group without stores (Q) followed by another of the same rows, positions,
    /// norm and rope (K, with its stores) goes into the same launch. Returns how many calls it
    /// took (0: the pattern does not hold).
    pub(super) fn norm_rope(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
        eps: f32,
        p: RopeParams,
    ) -> Result<usize, PluginError> {
        let Some(first) = norm_rope_group(addr, calls, p)? else {
            return Ok(0);
        };
        // The second group, when the first has no stores and the next calls form one with the
        // same shape and parameters whose tensors the first group's writes leave alone.
        let second = match (first.k_store, calls.get(2).map(|c| c.op)) {
            (None, Some(Op::RmsNorm { eps: e2 })) if e2 == eps => {
                match (calls.get(3).map(|c| c.op), calls.get(2..)) {
                    (Some(Op::Rope(p2)), Some(rest)) if p2 == p => norm_rope_group(addr, rest, p2)?
                        .filter(|g| {
                            g.rope.head_dim == first.rope.head_dim
                                && g.rope.rows == first.rope.rows
                                && g.pos == first.pos
                                && disjoint(&first.writes, &g.touches)
                                && disjoint(&g.writes, &first.touches)
                        }),
                    _ => None,
                }
            }
            _ => None,
        };
        let (q, main) = match second {
            Some(k) => (Some(first), k),
            None => (None, first),
        };
        let name = match main.k_store.map(|k| k.4) {
            Some(DType::F16) => "bl_norm_rope_f16",
            _ => "bl_norm_rope_f32",
        };
        let r = &main.rope;
        let (pk, slots, len, n_slots, _) = main.k_store.unwrap_or((0, 0, 0, 0, DType::F32));
        let (pv, pvc, vw) = main.v_store.unwrap_or((0, 0, 0));
        let (qx, qw, qn, qo, qnh) = q.as_ref().map_or((0, 0, 0, 0, 0), |g| {
            (g.x, g.w, g.normed, g.out, g.rope.n_head)
        });
        let err = self.error_word;
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&main.x)
            .arg(&main.w)
            .arg(&main.normed)
            .arg(&main.out)
            .arg(&main.pos_addr);
        l.arg(&r.head_dim).arg(&r.n_head).arg(&r.rows).arg(&eps);
        l.arg(&r.neox)
            .arg(&r.n_dims)
            .arg(&r.log2_base)
            .arg(&p.freq_scale);
        l.arg(&p.ext_factor)
            .arg(&r.corr[0])
            .arg(&r.corr[1])
            .arg(&r.mscale);
        l.arg(&pk).arg(&slots).arg(&len).arg(&n_slots);
        l.arg(&pv).arg(&pvc).arg(&vw).arg(&err);
        l.arg(&qx).arg(&qw).arg(&qn).arg(&qo).arg(&qnh);
        let rows = r.rows as u64;
        let blocks =
            rows * (main.rope.n_head + qnh) as u64 + if main.v_store.is_some() { rows } else { 0 };
        let threads = (r.head_dim as u32 / 2).div_ceil(32) * 32;
        // SAFETY: one block per (row, head) of the checked contiguous tensors of each group (and
        // per V row); slots and positions are checked on the card before any cache row is
        // written; the groups' writes were checked not to meet the other group's tensors.
        unsafe { l.launch(cfg(blocks as u32, threads)) }.map_err(driver_err(name))?;
        Ok(q.map_or(0, |g| g.taken) + main.taken)
    }
}
