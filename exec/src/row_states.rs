//! Per-row states of verify passes: a pass that evaluates drafted tokens
//! ([`GraphKind::Verify`]) leaves, beside each slot's per-sequence state after its last row,
//! the state after every row in buffers on the device; after a refused draft the state of the
//! last kept row is copied into the slot there, so no pass runs the kept rows again.

use std::collections::BTreeSet;

use bloomery_plugin_api::graph::{
    BatchShape, Graph, GraphKind, TensorId, TensorSource, MAX_VERIFY_ROWS,
};
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::DType;

use crate::error::{device_err, ModelError};
use crate::executor::BatchInputs;
use crate::model::{LoadedModel, PassOutputs};
use crate::readout::Readout;

impl LoadedModel {
    /// Makes the buffers that verify passes of up to `rows` rows (at most [`MAX_VERIFY_ROWS`])
    /// write, unless made already for as many, when the plugin's verify graph writes the row
    /// states of every per-sequence state buffer; returns whether it does. When it does not (or
    /// the model keeps no per-sequence state), the reason is logged and a refused draft is rolled
    /// back from the spare ([`LoadedModel::restore_sequence`]) instead.
    pub fn reserve_row_states(&mut self, rows: u32) -> Result<bool, ModelError> {
        let rows = rows.clamp(1, MAX_VERIFY_ROWS);
        if self.row_states.rows >= rows {
            return Ok(true);
        }
        if let Err(why) = self.verify_graph_covers() {
            tracing::info!("drafts roll back by running the kept rows again: {why}");
            return Ok(false);
        }
        let mut refs = vec![None; self.state.len()];
        let mut buffers = Vec::new();
        for (i, r) in self.state.iter().enumerate() {
            if !self.per_sequence(i) {
                continue;
            }
            let ne = [r.ne[0], u64::from(rows), 1, 1];
            let nb = TensorRef::contiguous_strides(DType::F32, ne)
                .ok_or_else(|| ModelError::Request(format!("row states of {ne:?}")))?;
            let b = self.device.alloc(nb[3]).map_err(device_err(&format!(
                "allocating the row states of state buffer {i} ({} bytes)",
                nb[3]
            )))?;
            refs[i] = Some(TensorRef {
                buffer: b.handle,
                offset: 0,
                dtype: DType::F32,
                ne,
                nb,
            });
            buffers.push(b);
        }
        self.row_states = crate::state::RowStates {
            buffers,
            refs,
            rows,
        };
        Ok(true)
    }

    /// The most rows a verify pass may have: what [`LoadedModel::reserve_row_states`] made room
    /// for (0 before).
    pub fn verify_rows(&self) -> u32 {
        self.row_states.rows
    }

    /// Bytes of the buffers [`LoadedModel::reserve_row_states`] made (0 before).
    pub fn row_state_bytes(&self) -> u64 {
        self.row_states.buffers.iter().map(|b| b.bytes).sum()
    }

    /// Whether the verify graph (of two rows) has every op that updates a per-sequence state
    /// write that state's row states, and every per-sequence state updated so; else why not.
    fn verify_graph_covers(&self) -> Result<(), String> {
        let shape = BatchShape {
            n_rows: 2,
            n_outputs: 2,
            kind: GraphKind::Verify,
        };
        let g = self
            .instance
            .build_graph(shape)
            .into_result()
            .map_err(|e| format!("the plugin builds no verify graph ({e})"))?;
        let wanted: BTreeSet<u32> = (0..self.state.len())
            .filter(|&i| self.per_sequence(i))
            .map(|i| i as u32)
            .collect();
        if wanted.is_empty() {
            return Err("the model keeps no per-sequence state".into());
        }
        let covered = row_state_writes(&g)?;
        match covered == wanted {
            true => Ok(()),
            false => Err(format!(
                "the verify graph writes the row states of state buffers {covered:?}, the \
                 per-sequence ones are {wanted:?}"
            )),
        }
    }

    /// Runs a verify pass ([`GraphKind::Verify`]) over a batch of at most
    /// [`LoadedModel::verify_rows`] rows, as [`LoadedModel::forward_reading`] runs the main
    /// graph; the state after each row is kept for [`LoadedModel::keep_row_state`] until the next
    /// verify pass. Refused before [`LoadedModel::reserve_row_states`] made the buffers.
    pub fn forward_verify(
        &mut self,
        batch: &BatchInputs,
        readout: Readout,
    ) -> Result<PassOutputs, ModelError> {
        if self.row_states.buffers.is_empty() {
            return Err(ModelError::Request(
                "a verify pass before the row states are made".into(),
            ));
        }
        let most = self.row_states.rows;
        if batch.tokens.len() > most as usize {
            return Err(ModelError::Request(format!(
                "a verify pass of {} rows (at most {most})",
                batch.tokens.len()
            )));
        }
        self.forward_kind(batch, readout, GraphKind::Verify)
    }

    /// Copies the state that row `row` of the last verify pass left into slot `slot`'s
    /// per-sequence state on the device, ordered after the calls submitted so far: the slot's
    /// sequence then ends at that row (the row must be one of the slot's). Positional buffers are
    /// left as they are.
    pub fn keep_row_state(&mut self, slot: u32, row: u32) -> Result<(), ModelError> {
        self.check_slot(slot, 0)?;
        if row >= self.row_states.rows {
            return Err(ModelError::Request(format!(
                "no row state {row} to keep (the row states hold {})",
                self.row_states.rows
            )));
        }
        for (i, r) in self.row_states.refs.iter().enumerate() {
            let Some(r) = r else { continue };
            let (offset, len) = self.extent(i, slot, 0);
            self.device
                .copy(
                    (r.buffer, u64::from(row) * r.nb[1]),
                    (self.state[i].buffer, offset),
                    len as u64,
                )
                .map_err(device_err("putting a kept row's state into its slot"))?;
        }
        Ok(())
    }
}

/// The state buffers whose row states graph `g` writes, each by the op that updates that state
/// (`ConvCausal` and `DeltaRule`, as their last source); a state op without row states, or row
/// states of another buffer than the op's state, is an error naming it.
fn row_state_writes(g: &Graph) -> Result<BTreeSet<u32>, String> {
    let source = |t: TensorId| g.tensors.get(t.0 as usize).map(|d| d.source);
    let mut covered = BTreeSet::new();
    for n in g.nodes.iter() {
        let (state_at, name) = match n.op {
            Op::ConvCausal { .. } => (2, "ConvCausal"),
            Op::DeltaRule(_) => (5, "DeltaRule"),
            _ => continue,
        };
        let state = n.srcs.get(state_at).and_then(|&t| source(t));
        let rows = n.srcs.get(state_at + 3).and_then(|&t| source(t));
        match (state, rows) {
            (Some(TensorSource::State { index }), Some(TensorSource::RowStates { index: r }))
                if index == r =>
            {
                covered.insert(index);
            }
            _ => return Err(format!("a {name} of the verify graph writes no row states")),
        }
    }
    Ok(covered)
}
