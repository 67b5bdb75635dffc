//! Calls launched as one kernel when consecutive calls of a pass form a pattern (as llama.cpp's
//! CUDA backend fuses add + rms_norm): a residual `Add` and the `RmsNorm` of its result; a
//! `Unary` and the `Mul` of its result with a same-shape tensor (output gates); a strided `Copy`
//! and the `L2Norm` of its result (q and k split out of the DeltaNet convolution). Every fused
//! kernel still writes the first call's result, so any later reader sees what it would have, and
//! each thread reads back only what it wrote, so tensors sharing reused memory stay safe.

use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{driver_err, unary_code, Buffers, Launcher};

/// A contiguous f32 tensor of extents `ne`.
fn plain(t: &TensorRef, ne: [u64; 4]) -> bool {
    t.dtype == DType::F32 && t.is_contiguous() && t.ne == ne
}

/// Threads of a row kernel with `ncols` columns: a thread per 2 columns, 32 to 1024.
fn row_threads(ncols: u64) -> u32 {
    (ncols as u32).div_ceil(64).clamp(1, 32) * 32
}

fn launch_cfg(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Launcher {
    /// Launches the leading calls of `calls` as one kernel when they form a pattern of this
    /// module, returning how many it took.
    pub fn fused(
        &self,
        bufs: &dyn Buffers,
        calls: &[OpCall],
    ) -> Result<Option<usize>, PluginError> {
        let [first, second, ..] = calls else {
            return Ok(None);
        };
        if second.srcs().is_empty() {
            return Ok(None);
        }
        let addr = |t: &TensorRef| -> Result<u64, PluginError> {
            let span = t
                .span_bytes()
                .ok_or_else(|| PluginError::invalid("a fused call's tensor has no layout"))?;
            bufs.address(t.buffer, t.offset, span)
        };
        let launched = match (first.op, second.op) {
            (Op::Add, Op::RmsNorm { eps }) => self.add_rms_norm(&addr, first, second, eps)?,
            (Op::Unary { f }, Op::Mul) => self.unary_mul(&addr, first, second, unary_code(f))?,
            (Op::Copy, Op::L2Norm { eps }) => self.copy_l2_norm(bufs, &addr, first, second, eps)?,
            _ => false,
        };
        if !launched {
            return Ok(None);
        }
        // A quantized product after this one quantizes its input afresh.
        self.quantized
            .lock()
            .map_err(|_| PluginError::device("quantized-input record poisoned"))?
            .take();
        Ok(Some(2))
    }

    /// `d = a + b; out = rms_norm(d) · w` for same-shape `a`, `b`.
    fn add_rms_norm(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        add: &OpCall,
        norm: &OpCall,
        eps: f32,
    ) -> Result<bool, PluginError> {
        let ne = add.dst.ne;
        if add.n_srcs != 2 || norm.srcs()[0] != add.dst {
            return Ok(false);
        }
        let (a, b) = (&add.srcs()[0], &add.srcs()[1]);
        if ![a, b, &add.dst, &norm.dst]
            .into_iter()
            .all(|t| plain(t, ne))
        {
            return Ok(false);
        }
        let ncols = ne[0];
        let pw = match norm.srcs().get(1) {
            Some(w) if w.dtype == DType::F32 && w.is_contiguous() && w.elements() == ncols => {
                addr(w)?
            }
            Some(_) => return Ok(false),
            None => 0u64,
        };
        let (pa, pb, pd, po) = (addr(a)?, addr(b)?, addr(&add.dst)?, addr(&norm.dst)?);
        let n = ncols as i32;
        let f = self.func("bl_add_rms_norm_f32")?;
        let mut l = self.stream.launch_builder(&f);
        l.arg(&pa)
            .arg(&pb)
            .arg(&pd)
            .arg(&pw)
            .arg(&po)
            .arg(&n)
            .arg(&eps);
        // SAFETY: one block per row of ncols contiguous f32 in each tensor, whose spans the
        // buffer table checked.
        unsafe { l.launch(launch_cfg(norm.dst.rows() as u32, row_threads(ncols))) }
            .map_err(driver_err("bl_add_rms_norm_f32"))?;
        Ok(true)
    }

    /// `u = f(x); out = other · u` for a `Mul` whose one operand is `u` and whose other has
    /// `u`'s shape.
    fn unary_mul(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        unary: &OpCall,
        mul: &OpCall,
        code: i32,
    ) -> Result<bool, PluginError> {
        let u = unary.dst;
        let ne = u.ne;
        if mul.n_srcs != 2 || unary.n_srcs != 1 {
            return Ok(false);
        }
        let other = match (mul.srcs()[0] == u, mul.srcs()[1] == u) {
            (true, false) => mul.srcs()[1],
            (false, true) => mul.srcs()[0],
            _ => return Ok(false),
        };
        let x = unary.srcs()[0];
        if ![&x, &u, &other, &mul.dst].into_iter().all(|t| plain(t, ne)) {
            return Ok(false);
        }
        let n = u.elements() as i64;
        let (px, pu, po, pout) = (addr(&x)?, addr(&u)?, addr(&other)?, addr(&mul.dst)?);
        let f = self.func("bl_unary_mul_f32")?;
        let mut l = self.stream.launch_builder(&f);
        l.arg(&px).arg(&pu).arg(&po).arg(&pout).arg(&n).arg(&code);
        let blocks = (n as u64).div_ceil(256).clamp(1, 4096) as u32;
        // SAFETY: the four tensors hold n contiguous f32 each (checked spans).
        unsafe { l.launch(launch_cfg(blocks, 256)) }.map_err(driver_err("bl_unary_mul_f32"))?;
        Ok(true)
    }

    /// `c = copy(x); out = l2_norm(c)` for an f32 source whose rows (ne0) are contiguous.
    fn copy_l2_norm(
        &self,
        bufs: &dyn Buffers,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        copy: &OpCall,
        norm: &OpCall,
        eps: f32,
    ) -> Result<bool, PluginError> {
        let (x, c) = (copy.srcs()[0], copy.dst);
        let ne = c.ne;
        if norm.srcs()[0] != c || !plain(&c, ne) || !plain(&norm.dst, ne) {
            return Ok(false);
        }
        if x.dtype != DType::F32 || x.ne != ne || x.nb[0] != 4 || x.offset % 4 != 0 {
            return Ok(false);
        }
        let rows = c.rows();
        let fits = |v: u64| v <= i32::MAX as u64;
        if x.nb[1..].iter().any(|b| b % 4 != 0) || rows == 0 || !fits(ne[1]) || !fits(ne[2]) {
            return Ok(false);
        }
        // The source spans up to its last element.
        let span = (0..4).fold(4u64, |end, d| end + x.nb[d] * (x.ne[d] - 1));
        let px = bufs.address(x.buffer, x.offset, span)?;
        let (pc, po) = (addr(&c)?, addr(&norm.dst)?);
        let (nb1, nb2, nb3) = (
            (x.nb[1] / 4) as i64,
            (x.nb[2] / 4) as i64,
            (x.nb[3] / 4) as i64,
        );
        let (ne1, ne2, ncols) = (ne[1] as i32, ne[2] as i32, ne[0] as i32);
        let f = self.func("bl_copy_l2_norm_f32")?;
        let mut l = self.stream.launch_builder(&f);
        l.arg(&px)
            .arg(&nb1)
            .arg(&nb2)
            .arg(&nb3)
            .arg(&ne1)
            .arg(&ne2)
            .arg(&pc)
            .arg(&po)
            .arg(&ncols)
            .arg(&eps);
        // SAFETY: every source row lies inside the span the buffer table checked; c and out
        // hold rows × ncols contiguous f32.
        unsafe { l.launch(launch_cfg(rows as u32, row_threads(ne[0]))) }
            .map_err(driver_err("bl_copy_l2_norm_f32"))?;
        Ok(true)
    }
}
