//! Moving a slot's cached positions to earlier positions, as llama.cpp's `seq_rm` + `seq_add`
//! do for context shift and cache reuse: the rows are copied down and each key row is rotated
//! back by the distance it moved (keys are stored after their rotary embedding). Done through
//! the device's reads and writes, so it serves every device alike; the rotation itself is the
//! CPU kernels' rope on the host.

use bloomery_kernels_cpu::ops::rope::{rope, RopeParams};
use bloomery_plugin_api::graph::{BatchShape, GraphKind};
use bloomery_plugin_api::model::StateKind;
use bloomery_plugin_api::DType;

use crate::error::{device_err, ModelError};
use crate::model::LoadedModel;

use crate::shift_plan::{plan, RowMove, ShiftPlan};

impl LoadedModel {
    /// What moving positions does to each state buffer, or why this model cannot: worked out
    /// once from the one-row graph.
    fn shift_plan(&self) -> &ShiftPlan {
        self.shift.get_or_init(|| {
            let shape = BatchShape {
                n_rows: 1,
                n_outputs: 1,
                kind: GraphKind::Main,
            };
            let g = self
                .instance
                .build_graph(shape)
                .into_result()
                .map_err(|e| format!("building the graph: {e}"))?;
            let kinds: Vec<StateKind> = self.spec.state.iter().map(|s| s.kind).collect();
            plan(&g, &kinds, self.options.kv_type_k)
        })
    }

    /// Why this model's cached positions cannot be moved (context shift, cache reuse), if they
    /// cannot.
    pub fn shift_refusal(&self) -> Option<String> {
        self.shift_plan().as_ref().err().cloned()
    }

    /// Moves `len` cached positions of slot `slot` from `from` down to `to` (`to < from`), as
    /// llama.cpp's `seq_add` by `to - from`: the rows are copied and every key row is rotated
    /// back by `from - to` positions. Positions past the moved ones keep their (now stale)
    /// rows: the caller drops them from what the slot holds. Not on the step path: it copies
    /// the rows through host memory.
    pub fn move_positions(
        &mut self,
        slot: u32,
        from: u32,
        to: u32,
        len: u32,
    ) -> Result<(), ModelError> {
        let end = from
            .checked_add(len)
            .filter(|&e| e <= self.options.ctx_per_slot);
        if to >= from || end.is_none() || slot >= self.options.n_slots {
            return Err(ModelError::Request(format!(
                "moving {len} positions of slot {slot} from {from} to {to} (slots of {} positions, {} slots)",
                self.options.ctx_per_slot, self.options.n_slots
            )));
        }
        let moves = self.shift_plan().clone().map_err(ModelError::Request)?;
        let delta = from as i32 - to as i32;
        for (i, m) in moves.iter().enumerate() {
            let r = self.state[i];
            let base = u64::from(slot) * r.nb[2];
            let row = r.nb[1];
            let mut bytes = vec![0u8; (u64::from(len) * row) as usize];
            self.device
                .read(r.buffer, base + u64::from(from) * row, &mut bytes)
                .map_err(device_err("reading cache rows to move"))?;
            if let RowMove::Rotated { params, head_dim } = m {
                rotate_back(&mut bytes, r.dtype, *head_dim, params, delta)?;
            }
            self.device
                .write(&self.state_buffers[i], base + u64::from(to) * row, &bytes)
                .map_err(device_err("writing moved cache rows"))?;
        }
        Ok(())
    }
}

/// Rotates key rows (f32 or f16 bytes) back by `delta` positions: the rope at position
/// `-delta`, as a pure rotation (YaRN's magnitude factor is taken out, since the stored keys
/// carry it already).
fn rotate_back(
    bytes: &mut [u8],
    dtype: DType,
    head_dim: usize,
    params: &RopeParams,
    delta: i32,
) -> Result<(), ModelError> {
    let mut p = *params;
    let (_, mscale) = p.yarn_terms();
    p.attn_factor = (f64::from(p.attn_factor) / mscale) as f32;
    let mut x: Vec<f32> = match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(ModelError::Request(format!(
                "a {other} key cache cannot be rotated"
            )))
        }
    };
    if head_dim == 0 || !x.len().is_multiple_of(head_dim) {
        return Err(ModelError::Request(format!(
            "key rows of {} values do not split into heads of {head_dim}",
            x.len()
        )));
    }
    // One "row" per head: every head of every position turns by the same angle.
    let positions = vec![-delta; x.len() / head_dim];
    rope(&mut x, head_dim, 1, &positions, &p)
        .map_err(|e| ModelError::Request(format!("rotating moved keys: {e}")))?;
    match dtype {
        DType::F32 => {
            for (b, v) in bytes.chunks_exact_mut(4).zip(&x) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            for (b, v) in bytes.chunks_exact_mut(2).zip(&x) {
                b.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_kernels_cpu::ops::rope::RopeMode;

    #[test]
    fn rotating_back_by_the_move_equals_the_rope_at_the_new_position() {
        let head_dim = 8;
        let p = RopeParams::plain(RopeMode::Neox, 6, 10000.0);
        let x0: Vec<f32> = (0..2 * head_dim).map(|i| (i as f32 * 0.37).sin()).collect();
        // Two heads at position 11, moved to position 4.
        let mut at11 = x0.clone();
        rope(&mut at11, head_dim, 2, &[11], &p).unwrap();
        let mut want = x0.clone();
        rope(&mut want, head_dim, 2, &[4], &p).unwrap();
        let mut bytes: Vec<u8> = at11.iter().flat_map(|v| v.to_le_bytes()).collect();
        rotate_back(&mut bytes, DType::F32, head_dim, &p, 7).unwrap();
        let got: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }
}
