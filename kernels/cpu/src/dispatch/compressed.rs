//! The dispatch of DeepSeek-V4's compressed-row ops (`Op::Compress`, `Op::CompSelect`): their
//! tensors' shapes checked against the parameters, then [`crate::ops::compress`].

use bloomery_plugin_api::op::{CompSelectParams, CompressForm, CompressParams};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::PluginError;

use super::{alone, op_err, slots_u32, src, usz, Backend};
use crate::ops::{self, compress::CompSelectShape, compress::CompressShape};
use crate::tensors::{f32s, f32s_mut, i32s, i32s_mut};

/// Refuses a call whose extents do not fit its parameters, naming them.
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

/// The compressed cache (source `at`, also the destination) overlaps no other source.
fn comp_alone(buf: &crate::memory::Buffers, c: &OpCall, at: usize) -> Result<(), PluginError> {
    let span = |t: &bloomery_plugin_api::tensor::TensorRef| -> Result<(usize, usize), PluginError> {
        let start = buf.check_tensor(t)? as usize;
        Ok((start, start + usz(t.span_bytes().unwrap_or(0))))
    };
    let (lo, hi) = span(&c.dst)?;
    for (j, t) in c.srcs().iter().enumerate().filter(|&(j, _)| j != at) {
        let (a, b) = span(t)?;
        if a < hi && lo < b {
            return Err(PluginError::invalid(format!(
                "Compress: the compressed cache overlaps source {j}"
            )));
        }
    }
    Ok(())
}

/// The compressor, by its form: `Pool` srcs `[kv, score, ape, norm, raw, comp, slots,
/// positions]` → `comp`; `Plain` the same but `comp` → f32 `[width, rows]`; `Store` srcs `[x,
/// norm, comp, slots, positions]` → `comp`.
pub(super) fn compress(b: &Backend<'_>, c: &OpCall, p: CompressParams) -> Result<(), PluginError> {
    match p.form {
        CompressForm::Pool | CompressForm::Plain => pool(b, c, p),
        CompressForm::Store => store(b, c, p),
    }
}

/// The `Pool` and `Plain` forms.
fn pool(b: &Backend<'_>, c: &OpCall, p: CompressParams) -> Result<(), PluginError> {
    const OP: &str = "Compress";
    let buf = b.buffers;
    let plain = p.form == CompressForm::Plain;
    let n = if plain { 7 } else { 8 };
    let mut t: Vec<_> = (0..n).map(|i| src(c, i, OP)).collect::<Result<_, _>>()?;
    if plain {
        // No cache: the slots and positions sit one source earlier.
        t.insert(5, &c.dst);
    }
    let (raw, comp) = (t[4], t[5]);
    if !plain && *comp != c.dst {
        return Err(PluginError::invalid(
            "Compress must write the compressed cache it names (source 5)",
        ));
    }
    let s = CompressShape {
        ratio: p.ratio as usize,
        overlap: p.overlap,
        width: p.width as usize,
        len_raw: usz(raw.ne[1]),
        len_comp: usz(comp.ne[1]),
        n_slots: usz(raw.ne[2]),
    };
    let (sw, rows) = (s.series_width() as u64, t[0].ne[1]);
    let w = u64::from(p.width);
    let fits = t[0].ne == [sw, rows, 1, 1]
        && t[1].ne == t[0].ne
        && t[2].ne == [sw, u64::from(p.ratio), 1, 1]
        && t[3].ne == [w, 1, 1, 1]
        && raw.ne == [2 * sw, raw.ne[1], raw.ne[2], 1]
        && if plain {
            c.dst.ne == [w, rows, 1, 1]
        } else {
            comp.ne[0] == w && comp.ne[2] == raw.ne[2] && comp.ne[3] == 1
        }
        && t[6].elements() == rows
        && t[7].elements() == rows;
    shapes(OP, fits, c)?;
    let x = ops::compress::CompressInputs {
        kv: f32s(buf, t[0], "kv")?,
        score: f32s(buf, t[1], "score")?,
        ape: f32s(buf, t[2], "ape")?,
        norm: f32s(buf, t[3], "norm")?,
        slots: slots_u32(i32s(buf, t[6], "slots")?)?,
        positions: i32s(buf, t[7], "positions")?,
        eps: p.eps,
        rope: ops::rope::RopeParams::from_abi(&p.rope),
    };
    if plain {
        // Only the destination is written; it may overlap no source.
        comp_alone(buf, c, usize::MAX)?;
        let raw = f32s(buf, raw, "raw")?;
        let out = f32s_mut(buf, &c.dst, "out")?;
        return ops::compress::compress_plain(&x, &s, raw, out).map_err(op_err);
    }
    // Both caches are written in place: the raw state may overlap nothing else, the compressed
    // cache nothing but itself as the destination.
    alone(buf, c, 4, "Compress raw state")?;
    comp_alone(buf, c, 5)?;
    let raw = f32s_mut(buf, raw, "raw")?;
    let comp = f32s_mut(buf, &c.dst, "comp")?;
    ops::compress::compress(&x, &s, raw, comp).map_err(op_err)
}

/// The `Store` form: srcs `[x, norm, comp, slots, positions]` → `comp`.
fn store(b: &Backend<'_>, c: &OpCall, p: CompressParams) -> Result<(), PluginError> {
    const OP: &str = "Compress";
    let buf = b.buffers;
    let t: Vec<_> = (0..5).map(|i| src(c, i, OP)).collect::<Result<_, _>>()?;
    let comp = t[2];
    if *comp != c.dst {
        return Err(PluginError::invalid(
            "Compress (Store) must write the compressed cache it names (source 2)",
        ));
    }
    comp_alone(buf, c, 2)?;
    let (w, rows) = (u64::from(p.width), t[0].ne[1]);
    let fits = t[0].ne == [w, rows, 1, 1]
        && t[1].ne == [w, 1, 1, 1]
        && comp.ne[0] == w
        && comp.ne[3] == 1
        && t[3].elements() == rows
        && t[4].elements() == rows;
    shapes(OP, fits, c)?;
    let s = CompressShape {
        ratio: p.ratio as usize,
        overlap: p.overlap,
        width: p.width as usize,
        len_raw: 0,
        len_comp: usz(comp.ne[1]),
        n_slots: usz(comp.ne[2]),
    };
    let x = ops::compress::CompStoreInputs {
        x: f32s(buf, t[0], "x")?,
        norm: f32s(buf, t[1], "norm")?,
        slots: slots_u32(i32s(buf, t[3], "slots")?)?,
        positions: i32s(buf, t[4], "positions")?,
        eps: p.eps,
        rope: ops::rope::RopeParams::from_abi(&p.rope),
    };
    let comp = f32s_mut(buf, &c.dst, "comp")?;
    ops::compress::comp_store(&x, &s, comp).map_err(op_err)
}

/// The indexer over compressed rows: srcs `[q, w, keys, slots, positions]` → i32 `[top_k, rows]`.
pub(super) fn comp_select(
    b: &Backend<'_>,
    c: &OpCall,
    p: CompSelectParams,
) -> Result<(), PluginError> {
    const OP: &str = "CompSelect";
    let buf = b.buffers;
    let t: Vec<_> = (0..5).map(|i| src(c, i, OP)).collect::<Result<_, _>>()?;
    let (dh, nh, rows) = (u64::from(p.head_dim), u64::from(p.n_head), t[0].ne[2]);
    let keys = t[2];
    let fits = t[0].ne == [dh, nh, rows, 1]
        && t[1].ne == [nh, rows, 1, 1]
        && keys.ne[0] == dh
        && keys.ne[3] == 1
        && t[3].elements() == rows
        && t[4].elements() == rows
        && c.dst.ne == [u64::from(p.top_k), rows, 1, 1];
    shapes(OP, fits, c)?;
    let s = CompSelectShape {
        n_head: p.n_head as usize,
        head_dim: p.head_dim as usize,
        ratio: p.ratio as usize,
        top_k: p.top_k as usize,
        len: usz(keys.ne[1]),
        n_slots: usz(keys.ne[2]),
    };
    ops::compress::comp_select(
        b.par,
        f32s(buf, t[0], "q")?,
        f32s(buf, t[1], "w")?,
        f32s(buf, keys, "keys")?,
        slots_u32(i32s(buf, t[3], "slots")?)?,
        i32s(buf, t[4], "positions")?,
        &s,
        i32s_mut(buf, &c.dst, "CompSelect dst")?,
    )
    .map_err(op_err)
}
