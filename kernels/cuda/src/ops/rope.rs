//! RoPE (`cu/rope.cuh`): NORM (adjacent pairs) and NEOX (pairs half a rotated span apart) over
//! the first `n_dims` of each head, IMROPE with one text position per row (NEOX on every section),
//! and YaRN, its correction dims shared with the CPU reference; the rotated span may start at a
//! dimension offset and the rotation may be inverted (DeepSeek-V4's tail rope and the inverse rope
//! of its attention output). A thread per (row, head, pair).
//! A per-head RMSNorm and the Rope of its result, with the K and V cache stores after them, go in
//! one launch (`fused::norm_rope`).

use bloomery_plugin_api::op::{OpKind, OpSupport, RopeMode, RopeParams};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::{cfg, claim, driver_err, grid, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![claim(OpKind::Rope, &[DType::F32])]
}

impl Launcher {
    /// RoPE of the rows of x (source 0) at the I32 positions of source 1.
    pub(super) fn rope<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: RopeParams,
    ) -> Result<(), PluginError> {
        let (x, pos) = (src(0)?, src(1)?);
        let r = rope_args(&p, x, pos, &c.dst)?;
        let (px, pp, po) = (addr(x, "x")?, addr(pos, "positions")?, addr(&c.dst, "dst")?);
        let f = self.func("bl_rope_f32")?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&po)
            .arg(&pp)
            .arg(&r.head_dim)
            .arg(&r.n_head)
            .arg(&r.rows)
            .arg(&r.neox)
            .arg(&r.n_dims);
        l.arg(&r.log2_base).arg(&p.freq_scale).arg(&p.ext_factor);
        l.arg(&r.corr[0]).arg(&r.corr[1]).arg(&r.mscale);
        l.arg(&r.offset).arg(&r.inverse);
        let total = (r.rows * r.n_head * (r.head_dim / 2)) as u64;
        // SAFETY: one thread per (row, head, pair) inside the checked spans.
        unsafe { l.launch(cfg(grid(total.max(1), 256).min(4096), 256)) }
            .map_err(driver_err("bl_rope_f32"))?;
        Ok(())
    }
}

/// A checked Rope call's kernel arguments.
pub(super) struct RopeArgs {
    pub(super) head_dim: i32,
    pub(super) n_head: i32,
    pub(super) rows: i32,
    /// 1 for NEOX pairs (and IMROPE with one position per row), 0 for adjacent pairs.
    pub(super) neox: i32,
    pub(super) n_dims: i32,
    /// YaRN correction dims.
    pub(super) corr: [f32; 2],
    pub(super) mscale: f64,
    /// log2 of the frequency base, in double (the kernels raise 2 to multiples of it).
    pub(super) log2_base: f64,
    /// The first rotated dim (even).
    pub(super) offset: i32,
    /// 1: rotate by the negative angle.
    pub(super) inverse: i32,
}

/// Checks a Rope call of `x` at `pos` into `dst` for the CUDA kernels.
pub(super) fn rope_args(
    p: &RopeParams,
    x: &TensorRef,
    pos: &TensorRef,
    dst: &TensorRef,
) -> Result<RopeArgs, PluginError> {
    for t in [x, dst] {
        if t.dtype != DType::F32 {
            return Err(PluginError::unsupported(
                format!("Rope of type {}", t.dtype),
                &[],
            ));
        }
    }
    let rows = dst.ne[2] * dst.ne[3];
    let neox: i32 = match p.mode {
        RopeMode::Norm => 0,
        RopeMode::Neox => 1,
        // Text positions (one per row) give every section the same position: NEOX.
        RopeMode::Imrope if pos.elements() == rows => {
            if p.sections.iter().all(|&s| s == 0) {
                return Err(PluginError::invalid("IMROPE sections are all zero"));
            }
            1
        }
        RopeMode::Imrope => {
            return Err(PluginError::unsupported(
                "IMROPE with per-axis positions on the CUDA bundles",
                &["one position per row"],
            ))
        }
    };
    // An odd offset would split the copied dims' pairs: no model uses one.
    if !p.offset.is_multiple_of(2) {
        return Err(PluginError::unsupported(
            format!(
                "RoPE from the odd dim offset {} on the CUDA bundles",
                p.offset
            ),
            &["an even offset"],
        ));
    }
    let (hd, nh) = (dst.ne[0], dst.ne[1]);
    if x.ne != dst.ne
        || pos.dtype != DType::I32
        || pos.elements() != rows
        || hd % 2 != 0
        || !p.n_dims.is_multiple_of(2)
        || u64::from(p.n_dims) + u64::from(p.offset) > hd
        || !(p.freq_base > 0.0 && p.freq_scale > 0.0)
    {
        return Err(PluginError::invalid(format!(
            "Rope shapes {:?} with {} positions, n_dims {}",
            x.ne,
            pos.elements(),
            p.n_dims
        )));
    }
    let (corr, mscale) = bloomery_kernels_cpu::ops::rope::RopeParams::from_abi(p).yarn_terms();
    Ok(RopeArgs {
        head_dim: hd as i32,
        n_head: nh as i32,
        rows: rows as i32,
        neox,
        n_dims: p.n_dims as i32,
        corr,
        mscale,
        log2_base: f64::from(p.freq_base).log2(),
        offset: p.offset as i32,
        inverse: i32::from(p.inverse),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(dtype: DType, ne: [u64; 4]) -> TensorRef {
        TensorRef {
            buffer: 1,
            offset: 0,
            dtype,
            ne,
            nb: TensorRef::contiguous_strides(dtype, ne).unwrap(),
        }
    }

    /// DeepSeek-V4's rope forms (a dimension offset, the inverse) are accepted and passed to the
    /// kernel; an odd offset is refused by name and a span past the head is invalid.
    #[test]
    fn the_offset_and_inverse_forms_reach_the_kernel() {
        let x = tensor(DType::F32, [128, 2, 3, 1]);
        let pos = tensor(DType::I32, [3, 1, 1, 1]);
        let plain = RopeParams {
            mode: RopeMode::Norm,
            n_dims: 16,
            offset: 0,
            sections: [0; 4],
            freq_base: 1e4,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
            inverse: false,
        };
        let r = rope_args(&plain, &x, &pos, &x).unwrap();
        assert_eq!((r.offset, r.inverse), (0, 0));
        let tail = RopeParams {
            offset: 112,
            inverse: true,
            ..plain
        };
        let r = rope_args(&tail, &x, &pos, &x).unwrap();
        assert_eq!((r.offset, r.inverse), (112, 1));
        let odd = RopeParams {
            offset: 111,
            ..plain
        };
        let e = rope_args(&odd, &x, &pos, &x).err().unwrap().to_string();
        assert!(e.contains("odd dim offset 111"), "{e}");
        let past = RopeParams {
            offset: 114,
            ..plain
        };
        assert!(rope_args(&past, &x, &pos, &x).is_err());
    }
}
