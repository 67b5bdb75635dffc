//! Activations quantized to Q8_1 for the quantized products (`cu/activations.cuh`), and the
//! launcher's record of which activations the scratch holds a copy of: a product that leaves its
//! input intact keeps the copy for the next product of the same activations (Q, K and V quantize
//! their common input once), a norm, GLU or attention whose result a quantized product reads next
//! writes the copy itself, and routing calls in between keep it, since they touch neither the
//! scratch nor (unless they write there) the activations.

use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::quant::weight_code;
use super::{driver_err, Launcher, BLOCK};

/// A routing call (router logits from F32 weights, top-k, expert weights): it touches neither
/// the scratch nor, unless it writes there, the activations a Q8_1 copy holds.
pub(super) fn is_routing(c: &OpCall) -> bool {
    match c.op {
        Op::MatMul => c.srcs().first().is_some_and(|w| w.dtype == DType::F32),
        Op::RouterTopK(_) | Op::RouterWeights(_) => true,
        _ => false,
    }
}

/// Whether `out` is next read, with only routing calls between, as the activations of a
/// quantized product or of routed experts: whoever writes `out` may then write its Q8_1 copy.
/// A reshape of `out` counts (the same memory and size).
pub(super) fn quantized_reader(out: &TensorRef, rest: &[OpCall]) -> bool {
    let quantized = |w: Option<&TensorRef>| {
        w.and_then(|w| weight_code(w.dtype))
            .is_some_and(|(code, _)| code >= 1)
    };
    let is_out = |x: Option<&TensorRef>| {
        x.is_some_and(|x| {
            x.buffer == out.buffer
                && x.offset == out.offset
                && x.elements() == out.elements()
                && x.dtype == DType::F32
                && x.is_contiguous()
        })
    };
    for c in rest.iter().take(6) {
        match c.op {
            _ if is_routing(c) => {}
            Op::MatMul if is_out(c.srcs().get(1)) => return quantized(c.srcs().first()),
            Op::MoeExperts(_) if is_out(c.srcs().first()) => return quantized(c.srcs().get(3)),
            _ => return false,
        }
    }
    false
}

/// A Q8_1 copy of f32 activations in the scratch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Quantized {
    /// Address of the f32 activations.
    pub(super) x: u64,
    /// Their 32-value blocks.
    pub(super) nblocks: u64,
    /// Address of the copy (the scratch base when it was written).
    pub(super) q: u64,
}

impl Quantized {
    /// Whether `len` bytes at `addr` leave the activations intact.
    pub(super) fn clear_of(&self, addr: u64, len: u64) -> bool {
        addr + len <= self.x || self.x + self.nblocks * 128 <= addr
    }
}

impl Launcher {
    /// Forgets which activations the scratch holds quantized (at a pass boundary: the host may
    /// write device memory between passes).
    pub fn forget_quantized(&self) {
        if let Ok(mut q) = self.quantized.lock() {
            *q = None;
        }
    }

    /// The Q8_1 copy of the `nblocks` 32-value blocks at `x` in the scratch: quantized there
    /// unless `held` says the scratch has it already.
    pub(super) fn quantize_in_scratch(
        &self,
        x: u64,
        nblocks: u64,
        held: Option<Quantized>,
    ) -> Result<Quantized, PluginError> {
        let q = self.scratch(nblocks * 36)?;
        let copy = Quantized { x, nblocks, q };
        if held != Some(copy) {
            self.quantize_q8_1(x, q, nblocks)?;
        }
        Ok(copy)
    }

    /// Quantizes the `nblocks` 32-value blocks at `x` to Q8_1 blocks at `q`: 8 lanes per block
    /// with 16-byte loads where x is 16-byte aligned, else a warp per block (the same bytes).
    pub(super) fn quantize_q8_1(&self, x: u64, q: u64, nblocks: u64) -> Result<(), PluginError> {
        let nb = nblocks as i64;
        let (name, per_block) = if x.is_multiple_of(16) {
            ("bl_quantize_q8_1_quads", 8)
        } else {
            ("bl_quantize_q8_1", 32)
        };
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&x).arg(&q).arg(&nb);
        let threads = nblocks * per_block;
        let launch = LaunchConfig {
            grid_dim: (threads.div_ceil(u64::from(BLOCK)).max(1) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: per_block threads per 32-value block of x (those past nblocks write nothing);
        // q holds nblocks blocks.
        unsafe { l.launch(launch) }.map_err(driver_err(name))
    }

    /// Room in the scratch for the Q8_1 copy of the `elements` f32 at `x`, when `wanted` and
    /// they are whole 32-value blocks (the kernels that write a copy hold whole blocks per warp).
    pub(super) fn copy_slot(
        &self,
        wanted: bool,
        x: u64,
        elements: u64,
    ) -> Result<Option<Quantized>, PluginError> {
        if !wanted || !elements.is_multiple_of(32) {
            return Ok(None);
        }
        let nblocks = elements / 32;
        let q = self.scratch(nblocks * 36)?;
        Ok(Some(Quantized { x, nblocks, q }))
    }

    /// Records that the scratch holds `h` (see [`Launcher::quantized`]).
    pub(super) fn keep_quantized(&self, h: Quantized) -> Result<(), PluginError> {
        *self
            .quantized
            .lock()
            .map_err(|_| PluginError::device("quantized-input record poisoned"))? = Some(h);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::tensor_at;

    fn tensor(buffer: u64, dtype: DType, ne: [u64; 4]) -> TensorRef {
        tensor_at(buffer, 0, dtype, ne)
    }

    #[test]
    fn a_norm_writes_q8_1_only_for_a_quantized_reader_past_routing() {
        let act = |b| tensor(b, DType::F32, [256, 1, 1, 1]);
        let (a, out) = (act(1), act(4));
        let q8 = tensor(6, DType::Q8_0, [256, 64, 1, 1]);
        let router = tensor(7, DType::F32, [256, 8, 1, 1]);
        let product = OpCall::new(Op::MatMul, &[q8, out], act(8));
        let logits = OpCall::new(
            Op::MatMul,
            &[router, out],
            tensor(9, DType::F32, [8, 1, 1, 1]),
        );
        assert!(quantized_reader(&out, &[product]));
        assert!(quantized_reader(&out, &[logits, product]));
        assert!(!quantized_reader(&out, &[logits]));
        // A quantized product of other activations, or an op that is not routing, comes first.
        let other = OpCall::new(Op::MatMul, &[q8, a], act(8));
        assert!(!quantized_reader(&out, &[other, product]));
        let add = OpCall::new(Op::Add, &[out, a], act(10));
        assert!(!quantized_reader(&out, &[add, product]));
        // A product of a reshape of `out` (attention's [dv, heads] output read as one row).
        let heads = tensor(4, DType::F32, [64, 4, 1, 1]);
        assert!(quantized_reader(&heads, &[product]));
    }

    #[test]
    fn a_q8_1_copy_is_clear_only_of_writes_outside_its_activations() {
        let h = Quantized {
            x: 1024,
            nblocks: 2,
            q: 4096,
        };
        assert!(h.clear_of(0, 1024));
        assert!(h.clear_of(1024 + 256, 64));
        assert!(!h.clear_of(1024 + 252, 8));
        assert!(!h.clear_of(1000, 25));
    }
}
