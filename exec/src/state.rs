//! The state buffers every sequence slot holds (K/V rows, latent rows, pooled keys, conv and
//! recurrent state), as the model plugin declares them.

use std::sync::Arc;

use bloomery_devices::{Buffer, Device};
use bloomery_plugin_api::graph::MAX_VERIFY_ROWS;
use bloomery_plugin_api::model::{ModelSpec, StateDecl, StateKind};
use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::DType;

use crate::error::{device_err, ModelError};
use crate::options::LoadOptions;

/// Bytes of every state buffer for all slots, as [`allocate_state`] lays them out.
pub(crate) fn state_bytes(spec: &ModelSpec, o: LoadOptions) -> u64 {
    spec.state
        .iter()
        .map(|s| {
            let (dtype, rows) = state_rows(s, o);
            dtype.row_bytes(s.row_elems).unwrap_or(0) * rows * u64::from(o.n_slots)
        })
        .sum()
}

/// Card bytes draft decoding adds for a model with MTP layers (any model when
/// `o.draft_history`: n-gram drafts) when `o.draft_n_max` > 0: the
/// spare copy of every slot's per-sequence state, as `LoadedModel::reserve_sequence_spare`
/// makes it, and one row of it per row of a verify pass of up to `n_slots` × (`draft_n_max` + 1)
/// rows, at most [`MAX_VERIFY_ROWS`], as `LoadedModel::reserve_row_states` makes them (planned
/// whether or not the model's verify graph writes row states, and for `draft_n_max` even where
/// the MTP layers draft fewer tokens a step: an upper bound).
pub(crate) fn drafting_bytes(spec: &ModelSpec, o: LoadOptions) -> u64 {
    if o.draft_n_max == 0 || (spec.caps.n_mtp_layers == 0 && !o.draft_history) {
        return 0;
    }
    let slots = u64::from(o.n_slots);
    let rows = (slots * (u64::from(o.draft_n_max) + 1)).min(u64::from(MAX_VERIFY_ROWS));
    spec.state
        .iter()
        .filter(|s| matches!(s.kind, StateKind::Conv | StateKind::Recurrent))
        .map(|s| DType::F32.row_bytes(s.row_elems).unwrap_or(0) * (slots + rows))
        .sum()
}

/// The type of state buffer `s` and its rows per slot: one per position for positional kinds
/// (pooled keys: per block), one per sequence otherwise.
fn state_rows(s: &StateDecl, o: LoadOptions) -> (DType, u64) {
    let ctx = u64::from(o.ctx_per_slot);
    match s.kind {
        StateKind::Keys | StateKind::Latent => (o.kv_type_k, ctx),
        StateKind::Values => (o.kv_type_v, ctx),
        StateKind::PooledKeys => (DType::F32, ctx.div_ceil(u64::from(s.block.max(1)))),
        StateKind::Conv | StateKind::Recurrent => (DType::F32, 1),
    }
}

/// Allocates every declared state buffer for all slots.
pub(crate) fn allocate_state(
    device: &Arc<Device>,
    spec: &ModelSpec,
    o: LoadOptions,
) -> Result<(Vec<Buffer>, Vec<TensorRef>), ModelError> {
    let mut buffers = Vec::new();
    let mut refs = Vec::new();
    for s in spec.state.iter() {
        let (dtype, len) = state_rows(s, o);
        let ne = [s.row_elems, len, u64::from(o.n_slots), 1];
        let nb = TensorRef::contiguous_strides(dtype, ne).ok_or_else(|| {
            ModelError::Request(format!("state `{}` has no layout for {dtype}", s.name))
        })?;
        let bytes = nb[3];
        let buf = device.alloc(bytes).map_err(device_err(&format!(
            "allocating state `{}` ({bytes} bytes)",
            s.name
        )))?;
        refs.push(TensorRef {
            buffer: buf.handle,
            offset: 0,
            dtype,
            ne,
            nb,
        });
        buffers.push(buf);
    }
    Ok((buffers, refs))
}

/// Spare buffers laid out as the model's per-sequence state buffers, for the device-side copy
/// of a slot's state before a draft is verified (`spare.rs` makes and uses them).
#[derive(Default)]
pub(crate) struct SpareState {
    /// Per per-sequence state buffer (declaration order): its index and its spare.
    pub(crate) buffers: Vec<(usize, Buffer)>,
    /// Per slot: a save not yet restored.
    pub(crate) saved: Vec<bool>,
}

/// The per-row copies of the per-sequence state buffers that a verify pass
/// ([`bloomery_plugin_api::graph::GraphKind::Verify`]) writes (`row_states.rs` makes and uses
/// them).
#[derive(Default)]
pub(crate) struct RowStates {
    /// The buffers, each `[row_elems, rows]` f32, of the per-sequence state buffers.
    pub(crate) buffers: Vec<Buffer>,
    /// Rows each holds: the most a verify pass may have.
    pub(crate) rows: u32,
    /// Per state buffer (declaration order): its row states, when made.
    pub(crate) refs: Vec<Option<TensorRef>>,
}
