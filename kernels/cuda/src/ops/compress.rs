//! DeepSeek-V4's compressed rows (`cu/compress.cuh`): Compress pools every `ratio` positions of a
//! sequence into a normed, roped row (a block per call row, then a second launch storing the
//! rows' `[kv | score]` into the raw ring once every pooled row has read it), and CompSelect ranks
//! a row's visible compressed rows by the indexer score (a block per row, the scores in shared
//! memory). Slots, positions and rows outside a cache are reported by the card (error 11).

use bloomery_plugin_api::op::{CompSelectParams, CompressForm, CompressParams, OpKind, OpSupport};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::rope::{rope_args, RopeArgs};
use super::{cfg, claim, driver_err, f32_only, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![
        claim(OpKind::Compress, &[DType::F32]),
        claim(OpKind::CompSelect, &[DType::F32]),
    ]
}

/// The widest compressed row a Compress block pools (`COMP_MAX_WIDTH` in cu/compress.cuh).
const COMP_MAX_WIDTH: u64 = 1024;
/// The most compressed rows a CompSelect block ranks (`COMP_MAX_ROWS` in cu/compress.cuh).
const COMP_MAX_ROWS: u64 = 8192;
/// Threads of both kernels' blocks.
const THREADS: u32 = 256;

/// A contiguous f32 or i32 tensor of extents `ne` for the shape checks.
fn shaped(dtype: DType, ne: [u64; 4]) -> Result<TensorRef, PluginError> {
    Ok(TensorRef {
        buffer: 0,
        offset: 0,
        dtype,
        ne,
        nb: TensorRef::contiguous_strides(dtype, ne)
            .ok_or_else(|| PluginError::invalid(format!("extents {ne:?}")))?,
    })
}

/// Refuses a call whose extents do not fit together, naming them.
fn bad(op: &str, srcs: &[&TensorRef], dst: &TensorRef) -> PluginError {
    let ne: Vec<_> = srcs.iter().map(|t| t.ne).collect();
    PluginError::invalid(format!("{op}: sources {ne:?} into {:?}", dst.ne))
}

/// The rope arguments of a compressed row of `p.width` values, which must be even and at most
/// `COMP_MAX_WIDTH`.
fn comp_rope(p: &CompressParams) -> Result<RopeArgs, PluginError> {
    let w = u64::from(p.width);
    if w > COMP_MAX_WIDTH || w % 2 != 0 {
        return Err(PluginError::unsupported(
            format!("Compress into rows of {w} values on the CUDA bundles"),
            &["even widths up to 1024"],
        ));
    }
    let one = shaped(DType::F32, [w, 1, 1, 1])?;
    rope_args(&p.rope, &one, &shaped(DType::I32, [1, 1, 1, 1])?, &one)
}

impl Launcher {
    /// Compress by its form: `Pool` srcs `[kv, score, ape, norm, raw, comp, slots, positions]`,
    /// dst = `comp`; `Plain` the same without `comp`, dst f32 `[width, rows]`; `Store`
    /// ([`Self::comp_store`]).
    pub(super) fn compress<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: CompressParams,
    ) -> Result<(), PluginError> {
        if p.form == CompressForm::Store {
            return self.comp_store(addr, src, c, p);
        }
        let plain = p.form == CompressForm::Plain;
        let (kv, score, ape, norm) = (src(0)?, src(1)?, src(2)?, src(3)?);
        let raw = src(4)?;
        let (comp, slots, pos) = if plain {
            (&c.dst, src(5)?, src(6)?)
        } else {
            (src(5)?, src(6)?, src(7)?)
        };
        for (t, what) in [(kv, "kv"), (score, "score"), (ape, "ape"), (norm, "norm")] {
            f32_only(t, &format!("Compress {what}"))?;
        }
        for (t, what) in [(raw, "raw"), (comp, "comp"), (&c.dst, "dst")] {
            f32_only(t, &format!("Compress {what}"))?;
        }
        let (w, r) = (u64::from(p.width), u64::from(p.ratio));
        let sw = if p.overlap { 2 * w } else { w };
        let rows = kv.rows();
        let span = if p.overlap { 2 * r } else { r };
        let (len_raw, n_slots) = (raw.ne[1], raw.ne[2]);
        let len_comp = if plain { 0 } else { comp.ne[1] };
        let fits = r > 0
            && w > 0
            && kv.ne[0] == sw
            && score.ne == kv.ne
            && ape.ne[0] == sw
            && ape.rows() == r
            && norm.elements() == w
            && raw.ne[0] == 2 * sw
            && if plain {
                c.dst.ne == [w, rows, 1, 1]
            } else {
                comp.ne[0] == w && comp.ne[2] == n_slots && c.dst == *comp
            }
            && slots.elements() == rows
            && pos.elements() == rows
            && slots.dtype == DType::I32
            && pos.dtype == DType::I32;
        if !fits {
            return Err(bad("Compress", &[kv, score, ape, norm, raw, comp], &c.dst));
        }
        if len_raw < span {
            return Err(PluginError::invalid(format!(
                "Compress: a raw ring of {len_raw} rows cannot hold the {span} positions a row reads"
            )));
        }
        let rp = comp_rope(&p)?;
        let names = ["kv", "score", "ape", "norm", "raw", "slots", "positions"];
        let mut at = [0u64; 7];
        for (i, t) in [kv, score, ape, norm, raw, slots, pos].iter().enumerate() {
            at[i] = addr(t, names[i])?;
        }
        let (comp_at, plain_at) = if plain {
            (0u64, addr(&c.dst, "out")?)
        } else {
            (addr(comp, "comp")?, 0u64)
        };
        if rows == 0 {
            return Ok(());
        }
        let err = self.error_word;
        let (ratio, overlap) = (p.ratio as i32, i32::from(p.overlap));
        let (wi, lr, lc, ns) = (w as i32, len_raw as i32, len_comp as i32, n_slots as i32);
        let f = self.func("bl_compress_f32")?;
        let mut l = self.args(&f);
        l.arg(&at[0]).arg(&at[1]).arg(&at[2]).arg(&at[3]);
        l.arg(&at[4])
            .arg(&comp_at)
            .arg(&plain_at)
            .arg(&at[5])
            .arg(&at[6]);
        l.arg(&ratio)
            .arg(&overlap)
            .arg(&wi)
            .arg(&lr)
            .arg(&lc)
            .arg(&ns);
        l.arg(&p.eps).arg(&rp.neox).arg(&rp.n_dims).arg(&rp.offset);
        l.arg(&rp.log2_base)
            .arg(&p.rope.freq_scale)
            .arg(&p.rope.ext_factor);
        l.arg(&rp.corr[0])
            .arg(&rp.corr[1])
            .arg(&rp.mscale)
            .arg(&err);
        // SAFETY: a block per call row; slots, positions and rows are checked on the card and
        // every span was checked by `addr`.
        unsafe { l.launch(cfg(rows as u32, THREADS)) }.map_err(driver_err("bl_compress_f32"))?;
        if plain {
            // The Plain form writes nothing in place.
            return Ok(());
        }
        let swi = sw as i32;
        let f = self.func("bl_compress_store_f32")?;
        let mut l = self.args(&f);
        l.arg(&at[0])
            .arg(&at[1])
            .arg(&at[4])
            .arg(&at[5])
            .arg(&at[6]);
        l.arg(&swi).arg(&lr).arg(&ns);
        // SAFETY: as above; this launch follows the pooling, so no row reads a store of its call.
        unsafe { l.launch(cfg(rows as u32, THREADS)) }
            .map_err(driver_err("bl_compress_store_f32"))?;
        Ok(())
    }

    /// Compress's `Store` form: srcs `[x [width, rows], norm, comp, slots, positions]`, dst =
    /// `comp`.
    fn comp_store<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: CompressParams,
    ) -> Result<(), PluginError> {
        let (x, norm, comp, slots, pos) = (src(0)?, src(1)?, src(2)?, src(3)?, src(4)?);
        for (t, what) in [(x, "x"), (norm, "norm"), (comp, "comp")] {
            f32_only(t, &format!("Compress (Store) {what}"))?;
        }
        let w = u64::from(p.width);
        let rows = x.rows();
        let (len_comp, n_slots) = (comp.ne[1], comp.ne[2]);
        let fits = p.ratio > 0
            && !p.overlap
            && x.ne[0] == w
            && norm.elements() == w
            && comp.ne[0] == w
            && c.dst == *comp
            && slots.elements() == rows
            && pos.elements() == rows
            && slots.dtype == DType::I32
            && pos.dtype == DType::I32;
        if !fits {
            return Err(bad("Compress (Store)", &[x, norm, comp], &c.dst));
        }
        let rp = comp_rope(&p)?;
        let (px, pn, pc) = (addr(x, "x")?, addr(norm, "norm")?, addr(comp, "comp")?);
        let (ps, pp) = (addr(slots, "slots")?, addr(pos, "positions")?);
        if rows == 0 {
            return Ok(());
        }
        let err = self.error_word;
        let (ratio, wi, lc, ns) = (p.ratio as i32, w as i32, len_comp as i32, n_slots as i32);
        let f = self.func("bl_comp_store_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&pn).arg(&pc).arg(&ps).arg(&pp);
        l.arg(&ratio).arg(&wi).arg(&lc).arg(&ns).arg(&p.eps);
        l.arg(&rp.neox).arg(&rp.n_dims).arg(&rp.offset);
        l.arg(&rp.log2_base)
            .arg(&p.rope.freq_scale)
            .arg(&p.rope.ext_factor);
        l.arg(&rp.corr[0])
            .arg(&rp.corr[1])
            .arg(&rp.mscale)
            .arg(&err);
        // SAFETY: a block per call row; slots, positions and rows are checked on the card and
        // every span was checked by `addr`.
        unsafe { l.launch(cfg(rows as u32, THREADS)) }.map_err(driver_err("bl_comp_store_f32"))?;
        Ok(())
    }

    /// CompSelect: srcs `[q, w, keys, slots, positions]` → i32 `[top_k, rows]`.
    pub(super) fn comp_select<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: CompSelectParams,
    ) -> Result<(), PluginError> {
        let (q, w, keys, slots, pos) = (src(0)?, src(1)?, src(2)?, src(3)?, src(4)?);
        for (t, what) in [(q, "q"), (w, "w"), (keys, "keys")] {
            f32_only(t, &format!("CompSelect {what}"))?;
        }
        let (nh, dh, top_k) = (
            u64::from(p.n_head),
            u64::from(p.head_dim),
            u64::from(p.top_k),
        );
        let rows = q.ne[2] * q.ne[3];
        let (len, n_slots) = (keys.ne[1], keys.ne[2] * keys.ne[3]);
        let fits = p.ratio > 0
            && q.ne[0] == dh
            && q.ne[1] == nh
            && w.ne[0] == nh
            && w.rows() == rows
            && keys.ne[0] == dh
            && slots.elements() == rows
            && pos.elements() == rows
            && slots.dtype == DType::I32
            && pos.dtype == DType::I32
            && c.dst.dtype == DType::I32
            && c.dst.ne[0] == top_k
            && c.dst.rows() == rows;
        if !fits {
            return Err(bad("CompSelect", &[q, w, keys], &c.dst));
        }
        if len > COMP_MAX_ROWS {
            return Err(PluginError::unsupported(
                format!("CompSelect over {len} compressed rows on the CUDA bundles"),
                &["up to 8192 rows a slot"],
            ));
        }
        let (pq, pw, pk) = (addr(q, "q")?, addr(w, "w")?, addr(keys, "keys")?);
        let (ps, pp, po) = (
            addr(slots, "slots")?,
            addr(pos, "positions")?,
            addr(&c.dst, "dst")?,
        );
        if rows == 0 || top_k == 0 {
            return Ok(());
        }
        let err = self.error_word;
        let (nhi, dhi, ratio, k) = (nh as i32, dh as i32, p.ratio as i32, top_k as i32);
        let (leni, nsi) = (len as i32, n_slots as i32);
        let f = self.func("bl_comp_select_f32")?;
        let mut l = self.args(&f);
        l.arg(&pq).arg(&pw).arg(&pk).arg(&ps).arg(&pp).arg(&po);
        l.arg(&nhi)
            .arg(&dhi)
            .arg(&ratio)
            .arg(&k)
            .arg(&leni)
            .arg(&nsi)
            .arg(&err);
        // SAFETY: a block per row; slots, positions and visible rows are checked on the card and
        // every span was checked by `addr`.
        unsafe { l.launch(cfg(rows as u32, THREADS)) }.map_err(driver_err("bl_comp_select_f32"))?;
        Ok(())
    }
}
