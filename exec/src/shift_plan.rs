//! What moving a slot's cached positions does to each state buffer, read from the model's
//! one-row graph: values are copied, keys stored after a rope are rotated back by the distance,
//! keys without one (NoPE) are copied; a recurrent state, pooled keys, latent rows or a
//! quantized key cache cannot move (`shift.rs` does the moving).

use bloomery_kernels_cpu::ops::rope::RopeParams;
use bloomery_plugin_api::graph::{Graph, TensorId, TensorSource};
use bloomery_plugin_api::model::StateKind;
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::DType;

/// What moving a position does to one state buffer's rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RowMove {
    /// Copied as they are (values).
    Copy,
    /// Keys without rotary embedding (NoPE layers): copied as they are.
    Unrotated,
    /// Keys rotated by this rope over heads of `head_dim` values: rotated back by the distance.
    Rotated {
        /// The rope the graph applies before storing the keys.
        params: RopeParams,
        /// Values per head.
        head_dim: usize,
    },
}

/// Why a model's cache cannot move positions, or what moving does to each state buffer.
pub(crate) type ShiftPlan = Result<Vec<RowMove>, String>;

/// The node that wrote tensor `t` (through views), if any.
fn producer(g: &Graph, mut t: TensorId) -> Option<&bloomery_plugin_api::graph::Node> {
    loop {
        if let Some(n) = g.nodes.iter().find(|n| n.dst == t) {
            return Some(n);
        }
        match g.tensors.get(t.0 as usize)?.source {
            TensorSource::View { base, .. } => t = base,
            _ => return None,
        }
    }
}

/// Whether any rope runs upstream of tensor `t`.
fn roped_upstream(g: &Graph, t: TensorId) -> bool {
    let mut todo = vec![t];
    let mut seen = std::collections::HashSet::new();
    while let Some(t) = todo.pop() {
        if !seen.insert(t.0) {
            continue;
        }
        if let Some(TensorSource::View { base, .. }) = g.tensors.get(t.0 as usize).map(|d| d.source)
        {
            todo.push(base);
        }
        if let Some(n) = g.nodes.iter().find(|n| n.dst == t) {
            if matches!(n.op, Op::Rope(_)) {
                return true;
            }
            todo.extend(n.srcs.iter().copied());
        }
    }
    false
}

/// What moving positions does to each of the model's state buffers, read from its one-row
/// graph: the rope whose output each key cache stores. Refused for state that is not one row
/// per position (recurrent, convolution, pooled keys, latent rows), for a quantized key cache,
/// and for keys that pass through anything but views between their rope and their store.
pub(crate) fn plan(g: &Graph, kinds: &[StateKind], kv_type_k: DType) -> ShiftPlan {
    let mut moves = Vec::with_capacity(kinds.len());
    for (i, kind) in kinds.iter().enumerate() {
        let m = match kind {
            StateKind::Values => RowMove::Copy,
            StateKind::Keys => {
                if kv_type_k != DType::F32 && kv_type_k != DType::F16 {
                    return Err(format!(
                        "a {kv_type_k} key cache cannot be shifted (its rows would be dequantized, rotated and requantized; use -ctk f16)"
                    ));
                }
                key_move(g, i as u32)?
            }
            other => {
                return Err(format!(
                    "the model keeps {other:?} state, which cannot move to other positions (recurrent and hybrid models cannot shift)"
                ))
            }
        };
        moves.push(m);
    }
    Ok(moves)
}

/// The rope applied to the keys that state buffer `index` stores.
fn key_move(g: &Graph, index: u32) -> Result<RowMove, String> {
    let is_cache = |t: TensorId| matches!(g.tensors.get(t.0 as usize).map(|d| d.source), Some(TensorSource::State { index: i }) if i == index);
    let store = g.nodes.iter().find(|n| {
        matches!(n.op, Op::CacheStore { .. }) && n.srcs.get(1).is_some_and(|&c| is_cache(c))
    });
    let Some(store) = store else {
        return Err(format!("no cache store writes key buffer {index}"));
    };
    let Some(&k) = store.srcs.first() else {
        return Err(format!("the store of key buffer {index} has no source"));
    };
    match producer(g, k) {
        Some(n) => match n.op {
            Op::Rope(p) if !p.inverse => {
                let head_dim = n
                    .srcs
                    .first()
                    .and_then(|&x| g.tensors.get(x.0 as usize))
                    .map_or(0, |d| d.ne[0] as usize);
                Ok(RowMove::Rotated {
                    params: RopeParams::from_abi(&p),
                    head_dim,
                })
            }
            _ if roped_upstream(g, k) => Err(format!(
                "the keys of buffer {index} pass through `{:?}` after their rope",
                n.op
            )),
            _ => Ok(RowMove::Unrotated),
        },
        None => Ok(RowMove::Unrotated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_that_is_not_one_row_per_position_cannot_shift() {
        let g = Graph::default();
        let e = plan(&g, &[StateKind::Recurrent], DType::F16).unwrap_err();
        assert!(e.contains("cannot shift"), "{e}");
        let e = plan(&g, &[StateKind::Keys], DType::Q8_0).unwrap_err();
        assert!(e.contains("q8_0") || e.contains("Q8_0"), "{e}");
    }
}
