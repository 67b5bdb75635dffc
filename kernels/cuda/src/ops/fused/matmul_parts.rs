//! Two or three quantized products of the same activations with weights of one type (Q, K and V)
//! as one launch: the activations quantized once (unless the scratch holds them) and every row of
//! every product in one kernel, of the single-row (`bl_matmul_q_parts_<type>`) or few-column form
//! (`bl_matmul_q_few_parts_...`, both in `cu/matmul.cuh`) or the tiled form of batches
//! (`bl_mmq_parts_*` in `cu/mmq.cuh`).

use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::plain;
use crate::ops::activations::Quantized;
use crate::ops::matmul::{few_cols, stage_bytes, FEW_BLOCK, MATMUL_Q_PARTS};
use crate::ops::quant::{pairs_ok, typed, weight_code};
use crate::ops::{cfg, driver_err, Launcher};

/// One product of `bl_matmul_q_parts`: weights, row stride, output, rows (cu/quant.cuh's
/// `MatmulPart`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MatmulPart {
    w: u64,
    stride: i64,
    y: u64,
    n: i32,
    pad: i32,
}

// SAFETY: plain old data laid out as the kernel's struct (two 8-byte words, a pointer, an int
// and padding to 8-byte alignment).
unsafe impl DeviceRepr for MatmulPart {}

impl Launcher {
    /// Two or three quantized products of the same activations with weights of one type (Q, K
    /// and V), for a single row, a few rows (Q8_0, Q4_K) or a batch of tiled products: the
    /// activations quantized once (unless `held` has them) and every row of every product in one
    /// launch. Returns the calls taken and the Q8_1 copy left, or `None`.
    pub(super) fn matmul_parts(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
        held: Option<Quantized>,
    ) -> Result<Option<(usize, Option<Quantized>)>, PluginError> {
        let x = calls[0].srcs().get(1).copied();
        let Some(x) = x.filter(|x| x.dtype == DType::F32 && x.is_contiguous()) else {
            return Ok(None);
        };
        let (k, m) = (x.ne[0], x.rows());
        // A single row, a few (the few-column form, when every part's rows suit it) or a batch
        // the tiled products take (one launch over every part's tiles).
        let tiled = self.mmq.tiles(m);
        if x.ne != [k, m, 1, 1] || m > i32::MAX as u64 {
            return Ok(None);
        }
        let w0 = calls[0].srcs()[0];
        let Some((wtype, block)) = weight_code(w0.dtype).filter(|(c, _)| *c >= 1) else {
            return Ok(None);
        };
        if k % block.max(32) != 0 || k > i32::MAX as u64 {
            return Ok(None);
        }
        let px = addr(&x)?;
        let x_len = k * 4 * m;
        let mut parts = Vec::with_capacity(3);
        for c in calls.iter().take(3) {
            let ok = matches!(c.op, Op::MatMul)
                && c.n_srcs == 2
                && c.srcs()[1] == x
                && c.srcs()[0].dtype == w0.dtype
                && c.srcs()[0].ne[0] == k
                && c.srcs()[0].ne[2] == 1
                && c.srcs()[0].ne[3] == 1
                && plain(&c.dst, [c.srcs()[0].ne[1], m, 1, 1])
                && c.srcs()[0].ne[1] <= i32::MAX as u64;
            if !ok {
                break;
            }
            let (w, y) = (addr(&c.srcs()[0])?, addr(&c.dst)?);
            let y_len = c.dst.elements() * 4;
            // A product writing over the activations ends the group.
            if !(y + y_len <= px || px + x_len <= y) {
                break;
            }
            parts.push(MatmulPart {
                w,
                stride: c.srcs()[0].nb[1] as i64,
                y,
                n: c.srcs()[0].ne[1] as i32,
                pad: 0,
            });
        }
        if parts.len() < 2 {
            return Ok(None);
        }
        let few = if m > 1 && tiled.is_none() {
            let widest = parts.iter().map(|p| p.n as u64).max().unwrap_or(0);
            let suits = parts.iter().all(|p| pairs_ok(wtype, p.w, p.stride, 0, k));
            let Some(form) = few_cols(wtype, widest, m).filter(|_| suits) else {
                return Ok(None);
            };
            Some(form)
        } else {
            None
        };
        let taken = parts.len();
        let rows: u64 = parts.iter().map(|p| p.n as u64).sum();
        while parts.len() < 3 {
            parts.push(MatmulPart {
                w: 0,
                stride: 0,
                y: 0,
                n: 0,
                pad: 0,
            });
        }
        let copy = self.quantize_in_scratch(px, k / 32 * m, held)?;
        let q = copy.q;
        let ki = k as i32;
        if let Some(form) = tiled {
            let name = form.parts;
            let tiles: u64 = parts.iter().map(|p| (p.n as u64).div_ceil(form.rows)).sum();
            let (x_row, mi) = ((k / 32 * 36) as i64, m as i32);
            let f = self.func_smem(name, form.smem)?;
            let mut l = self.args(&f);
            l.arg(&parts[0])
                .arg(&parts[1])
                .arg(&parts[2])
                .arg(&wtype)
                .arg(&q)
                .arg(&x_row)
                .arg(&ki)
                .arg(&mi);
            let launch = LaunchConfig {
                grid_dim: (tiles as u32, m.div_ceil(form.cols) as u32, 1),
                block_dim: (form.threads, 1, 1),
                shared_mem_bytes: form.smem,
            };
            // SAFETY: one block per tile of one part, with the dynamic shared memory the kernel
            // takes; rows and columns past a part's rows and the batch are neither read nor
            // written; all inside the checked spans.
            unsafe { l.launch(launch) }.map_err(driver_err(name))?;
            return Ok(Some((taken, Some(copy))));
        }
        if let Some(form) = few {
            let warps: u64 = parts.iter().map(|p| (p.n as u64).div_ceil(form.rows)).sum();
            let (x_row, mi) = ((k / 32 * 36) as i64, m as i32);
            let f = self.func(form.parts)?;
            let mut l = self.args(&f);
            l.arg(&parts[0])
                .arg(&parts[1])
                .arg(&parts[2])
                .arg(&q)
                .arg(&x_row)
                .arg(&ki)
                .arg(&mi);
            let block = FEW_BLOCK;
            let launch = LaunchConfig {
                grid_dim: (
                    warps.div_ceil(u64::from(block / 32)) as u32,
                    m.div_ceil(form.cols) as u32,
                    1,
                ),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one warp per `form.rows` rows of one part (none past its rows), each pass of
            // `form.cols` columns below m; weights and outputs inside the checked spans.
            unsafe { l.launch(launch) }.map_err(driver_err(form.parts))?;
            return Ok(Some((taken, Some(copy))));
        }
        let name = typed(&MATMUL_Q_PARTS, wtype)?;
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&parts[0])
            .arg(&parts[1])
            .arg(&parts[2])
            .arg(&q)
            .arg(&ki);
        let launch = LaunchConfig {
            shared_mem_bytes: stage_bytes(wtype, k, 1),
            ..cfg(rows.div_ceil(8) as u32, 256)
        };
        // SAFETY: one warp per row of the products, whose weights and outputs lie inside the
        // checked spans; q holds the activations' blocks.
        unsafe { l.launch(launch) }.map_err(driver_err(name))?;
        Ok(Some((taken, Some(copy))))
    }
}
