//! Copies of rows (`cu/copy.cuh`): Copy of a source of any byte strides into a contiguous
//! destination, f32 and f16 either way (and I32 bit for bit), a block per source row; and GetRows,
//! the gather of table rows by I32 ids (f32, f16, or any type of [`QUANT_TYPES`] dequantized as
//! the CPU reference does; an I32 table gives I32 rows, bit for bit), a block per id, ids checked
//! on the card. A run of small contiguous
//! copies goes in one launch (`fused::copy_run`).
//!
//! [`QUANT_TYPES`]: super::QUANT_TYPES

use bloomery_plugin_api::op::{OpKind, OpSupport};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::quant::{weight_code, with_quant_types};
use super::{cfg, claim, driver_err, f32_only, Addr, Buffers, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![
        claim(OpKind::Copy, &[DType::F32, DType::F16, DType::I32]),
        OpSupport {
            op: OpKind::GetRows,
            dtypes: with_quant_types(&[DType::F32, DType::F16, DType::I32]),
        },
    ]
}

impl Launcher {
    /// Copy or convert (f32 ↔ f16) a source of any byte strides into a contiguous destination of
    /// the same shape: one block per source row.
    pub(super) fn copy(
        &self,
        bufs: &dyn Buffers,
        addr: Addr<'_>,
        x: &TensorRef,
        dst: &TensorRef,
    ) -> Result<(), PluginError> {
        let name = match (x.dtype, dst.dtype) {
            (DType::F32, DType::F32) => "bl_copy_f32_f32",
            (DType::F32, DType::F16) => "bl_copy_f32_f16",
            (DType::F16, DType::F32) => "bl_copy_f16_f32",
            (DType::F16, DType::F16) => "bl_copy_f16_f16",
            // 32-bit moves: the f32 kernel's loads and stores keep every bit.
            (DType::I32, DType::I32) => "bl_copy_f32_f32",
            (a, d) => {
                return Err(PluginError::unsupported(
                    format!("Copy {a} to {d} on the CUDA bundles"),
                    &["F32<->F16"],
                ))
            }
        };
        if x.ne != dst.ne {
            return Err(PluginError::invalid(format!(
                "Copy {:?} into {:?}",
                x.ne, dst.ne
            )));
        }
        let es: u64 = if x.dtype == DType::F16 { 2 } else { 4 };
        if !x.offset.is_multiple_of(es) || x.nb.iter().any(|b| !b.is_multiple_of(es)) {
            return Err(PluginError::invalid("Copy: a misaligned source view"));
        }
        if x.elements() == 0 {
            return Ok(());
        }
        // The source spans up to its last element (any strides, also between elements of a row).
        let span = (0..4)
            .try_fold(es, |end, d| {
                x.nb[d]
                    .checked_mul(x.ne[d] - 1)
                    .and_then(|v| end.checked_add(v))
            })
            .ok_or_else(|| PluginError::invalid("Copy: the source view overflows"))?;
        let px = bufs.address(x.buffer, x.offset, span)?;
        let po = addr(dst, "Copy dst")?;
        let rows = x.rows();
        let (ne0, ne1, ne2, nrows) = (x.ne[0] as i64, x.ne[1] as i64, x.ne[2] as i64, rows as i64);
        let [nb0, nb1, nb2, nb3] = x.nb.map(|b| b as i64);
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&po)
            .arg(&ne0)
            .arg(&ne1)
            .arg(&ne2)
            .arg(&nrows);
        l.arg(&nb0).arg(&nb1).arg(&nb2).arg(&nb3);
        let threads = (x.ne[0].div_ceil(32) * 32).clamp(32, 256) as u32;
        // SAFETY: every source element lies inside the checked span (strides and extents as
        // given), every destination element inside the contiguous destination's span; blocks
        // stride over the rows.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (rows.min(1 << 20) as u32, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver_err(name))?;
        Ok(())
    }

    /// Rows of a table (source 0) by the I32 ids of source 1, as f32 (an I32 table: as I32).
    pub(super) fn get_rows<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
    ) -> Result<(), PluginError> {
        let (t, ids) = (src(0)?, src(1)?);
        if ids.dtype != DType::I32 {
            return Err(PluginError::invalid("GetRows ids must be I32"));
        }
        if t.dtype == DType::I32 {
            if c.dst.dtype != DType::I32 {
                return Err(PluginError::invalid(
                    "GetRows of an I32 table into a non-I32 dst",
                ));
            }
        } else {
            f32_only(&c.dst, "GetRows dst")?;
        }
        let (name, wtype) = match (t.dtype, weight_code(t.dtype)) {
            // 32-bit moves: the f32 kernel's loads and stores keep every bit.
            (DType::F32 | DType::I32, _) => ("bl_get_rows_f32", 0),
            (DType::F16, _) => ("bl_get_rows_f16", 0),
            (_, Some((code, _))) => ("bl_get_rows_q", code),
            (other, None) => {
                return Err(PluginError::unsupported(format!("GetRows of {other}"), &[]))
            }
        };
        let n_ids = ids.elements();
        if c.dst.ne[0] != t.ne[0] || c.dst.rows() != n_ids {
            return Err(PluginError::invalid("GetRows shapes"));
        }
        let (pt, pi, po) = (addr(t, "table")?, addr(ids, "ids")?, addr(&c.dst, "dst")?);
        let (stride, ncols, nrows) = (t.nb[1] as i64, t.ne[0] as i32, t.rows() as i32);
        let err = self.error_word;
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&pt)
            .arg(&stride)
            .arg(&pi)
            .arg(&po)
            .arg(&ncols)
            .arg(&nrows)
            .arg(&err);
        if wtype != 0 {
            l.arg(&wtype);
        }
        if n_ids > 0 {
            // SAFETY: ids are checked against the table on the card; rows are in spans.
            unsafe { l.launch(cfg(n_ids as u32, 128)) }.map_err(driver_err(name))?;
        }
        Ok(())
    }
}
