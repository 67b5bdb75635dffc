//! Calls launched as one kernel when consecutive calls of a pass form a pattern (as llama.cpp's
//! CUDA backend fuses add + rms_norm), one module per pattern, each kernel in the source of the
//! family it extends: a residual `Add` and the `RmsNorm` of its result, or two Adds and the norm
//! (`add_norm`); a `Unary` and the `Mul` of its result with a same-shape tensor (`unary_mul`:
//! output gates); a strided `Copy` and the `L2Norm` of its result (`copy_l2_norm`: q and k split
//! out of the DeltaNet convolution); the router's logits and the choice of experts from them
//! (`routing`); a run of small contiguous copies (`copy_run`: the tiered executor's packing of a
//! layer's inputs and its signal to the host); a per-head `RmsNorm`, the `Rope` of its result and
//! the cache stores after them (`norm_rope`); two or three quantized products of the same
//! activations (`matmul_parts`). Those kernels still write the first call's result, so any later
//! reader sees what it would have, and each thread reads back only what it wrote, so tensors
//! sharing reused memory stay safe. Three patterns skip results instead, taken only when no later
//! call reads them ([`skipped_read_later`]): a sigmoid-gated shared expert's sum (`gated_add`: its
//! gate's product, the sigmoid, the Mul and the Add), the same shared expert run inside the routed
//! experts' decode kernels (`moe_shared`), and a Gated DeltaNet mixer's decode step (`gdn`).

use bloomery_plugin_api::op::{Op, UnaryFn};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::activations::Quantized;
use super::elementwise::unary_code;
use super::{quantized_reader, Buffers, Launcher};

mod add_norm;
mod copy_l2_norm;
mod copy_run;
mod gated_add;
mod gdn;
mod matmul_parts;
mod moe_shared;
mod norm_rope;
mod reads;
mod routing;
mod unary_mul;

pub use add_norm::add2_norms;
pub use copy_run::copy_runs;
pub use gated_add::gated_adds;
pub use gdn::gdn_steps;
pub use moe_shared::shared_moes;

use reads::{read_later, skipped_read_later};

/// A contiguous f32 tensor of extents `ne`.
fn plain(t: &TensorRef, ne: [u64; 4]) -> bool {
    t.dtype == DType::F32 && t.is_contiguous() && t.ne == ne
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
        let held = *self
            .quantized
            .lock()
            .map_err(|_| PluginError::device("quantized-input record poisoned"))?;
        // The Q8_1 copy the scratch holds after the fused kernel, if any.
        let mut copy = None;
        let pair = |launched: bool| if launched { 2 } else { 0 };
        // The copy `held` after a kernel that wrote the first n calls' results and not the
        // scratch: kept unless one of those results overlaps the quantized activations.
        let kept = |n: usize| -> Result<Option<Quantized>, PluginError> {
            let Some(h) = held else {
                return Ok(None);
            };
            for c in &calls[..n] {
                if !h.clear_of(addr(&c.dst)?, c.dst.span_bytes().unwrap_or(u64::MAX)) {
                    return Ok(None);
                }
            }
            Ok(Some(h))
        };
        let taken = match (first.op, second.op) {
            (Op::Add, Op::Add) => match self.add2_rms_norm(&addr, calls)? {
                Some(launched) => {
                    copy = launched;
                    3
                }
                None => 0,
            },
            (Op::Add, Op::RmsNorm { eps }) => {
                let quantize = quantized_reader(&second.dst, &calls[2..]);
                let launched = self.add_rms_norm(&addr, first, second, eps, quantize)?;
                copy = launched.flatten();
                pair(launched.is_some())
            }
            (Op::Unary { f }, Op::Mul) => {
                pair(self.unary_mul(&addr, first, second, unary_code(f))?)
            }
            (Op::Copy, Op::L2Norm { eps }) => {
                pair(self.copy_l2_norm(bufs, &addr, first, second, eps)?)
            }
            (Op::Copy, Op::Copy) => {
                let taken = self.copy_words(&addr, calls)?;
                // Copies leave the scratch alone, and the activations unless they wrote there.
                if taken > 0 {
                    copy = kept(taken)?;
                }
                taken
            }
            (Op::RouterTopK(p), Op::RouterWeights(q)) if p == q => {
                let launched = self.router(&addr, first, second, p)?;
                // Routing leaves the scratch alone, and the activations unless it wrote there.
                if launched {
                    copy = kept(2)?;
                }
                pair(launched)
            }
            (Op::MatMul, Op::RouterTopK(p)) => {
                let launched = self.router_logits(&addr, calls, p)?;
                // As for the routing pair alone; the logits are not in the scratch either.
                if launched {
                    copy = kept(3)?;
                }
                if launched {
                    3
                } else {
                    0
                }
            }
            (
                Op::MatMul,
                Op::Unary {
                    f: UnaryFn::Sigmoid,
                },
            ) => match self.gated_add(&addr, calls)? {
                // The kernel writes only the sum, one of the four results.
                true => {
                    copy = kept(4)?;
                    4
                }
                false => 0,
            },
            (Op::RmsNorm { eps }, Op::Rope(p)) => self.norm_rope(&addr, calls, eps, p)?,
            (
                Op::Unary {
                    f: UnaryFn::Sigmoid,
                },
                Op::Add,
            ) => match self.gdn_step(&addr, calls)? {
                Some((n, c)) => {
                    copy = c;
                    n
                }
                None => 0,
            },
            (Op::MatMul, Op::MatMul) => match self.gdn_step(&addr, calls)? {
                Some((n, c)) => {
                    copy = c;
                    n
                }
                // The shared expert's products start its group with the routed experts; the
                // group leaves no copy (its output may be over the activations).
                None => match self.moe_shared(bufs, calls, held)? {
                    0 => match self.matmul_parts(&addr, calls, held)? {
                        Some((n, c)) => {
                            copy = c;
                            n
                        }
                        None => 0,
                    },
                    n => n,
                },
            },
            _ => 0,
        };
        if taken == 0 {
            return Ok(None);
        }
        // Unless a copy was kept or written, a quantized product after this quantizes afresh.
        *self
            .quantized
            .lock()
            .map_err(|_| PluginError::device("quantized-input record poisoned"))? = copy;
        Ok(Some(taken))
    }
}
