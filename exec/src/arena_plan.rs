//! Memory plan for a graph's intermediates: each gets an offset in one arena, and tensors whose
//! lifetimes do not overlap share bytes.

use bloomery_plugin_api::graph::{Graph, TensorSource};

/// Arena offsets of every intermediate (`None` for other tensors) and the arena size.
#[derive(Debug, Clone, PartialEq)]
pub struct ArenaPlan {
    /// Offset of tensor `i`, for intermediates.
    pub offsets: Vec<Option<u64>>,
    /// Bytes needed.
    pub size: u64,
}

/// Alignment of every intermediate in the arena.
pub const ARENA_ALIGN: u64 = 64;

/// The tensor whose memory `t` uses (following views to their base).
pub fn root_of(graph: &Graph, mut t: usize) -> usize {
    let mut hops = 0;
    while let Some(TensorSource::View { base, .. }) = graph.tensors.get(t).map(|d| d.source) {
        t = base.0 as usize;
        hops += 1;
        if hops > graph.tensors.len() {
            break;
        }
    }
    t
}

/// Plans the arena: an intermediate lives from the node that writes it to the last node that reads
/// it (directly or through a view); graph outputs live to the end.
pub fn plan_arena(graph: &Graph) -> Result<ArenaPlan, String> {
    let n = graph.tensors.len();
    let mut first = vec![usize::MAX; n];
    let mut last = vec![0usize; n];
    let end = graph.nodes.len();
    for (i, node) in graph.nodes.iter().enumerate() {
        for t in node.srcs.iter().chain(std::iter::once(&node.dst)) {
            let r = root_of(graph, t.0 as usize);
            if r >= n {
                return Err(format!("node {i} names tensor {} of {n}", t.0));
            }
            first[r] = first[r].min(i);
            last[r] = last[r].max(i);
        }
    }
    for o in graph.outputs.iter() {
        let r = root_of(graph, o.tensor.0 as usize);
        if r < n {
            last[r] = end;
        }
    }
    let mut items: Vec<(usize, u64)> = Vec::new();
    for (i, d) in graph.tensors.iter().enumerate() {
        if d.source != TensorSource::Intermediate || first[i] == usize::MAX {
            continue;
        }
        let bytes = d
            .dtype
            .row_bytes(d.ne[0])
            .and_then(|r| r.checked_mul(d.ne[1] * d.ne[2] * d.ne[3]))
            .ok_or_else(|| format!("tensor {} has no valid size", d.name))?;
        items.push((i, bytes.div_ceil(ARENA_ALIGN) * ARENA_ALIGN));
    }
    items.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut offsets = vec![None; n];
    let mut placed: Vec<(u64, u64, usize, usize)> = Vec::new();
    let mut size = 0;
    for (i, bytes) in items {
        let mut conflicts: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(_, _, f, l)| f <= last[i] && first[i] <= l)
            .map(|&(o, b, _, _)| (o, o + b))
            .collect();
        conflicts.sort_unstable();
        let mut offset = 0;
        for (start, stop) in conflicts {
            if offset + bytes <= start {
                break;
            }
            offset = offset.max(stop);
        }
        offsets[i] = Some(offset);
        placed.push((offset, bytes, first[i], last[i]));
        size = size.max(offset + bytes);
    }
    Ok(ArenaPlan { offsets, size })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::graph::GraphBuilder;
    use bloomery_plugin_api::op::Op;
    use bloomery_plugin_api::DType;

    #[test]
    fn dead_tensors_share_memory_and_live_ones_do_not() {
        let mut g = GraphBuilder::new();
        let s = Op::Scale { s: 1.0 };
        let a = g.op("a", s, &[], DType::F32, [16, 1, 1, 1]).unwrap();
        let b = g.op("b", s, &[a], DType::F32, [16, 1, 1, 1]).unwrap();
        let c = g.op("c", s, &[b], DType::F32, [16, 1, 1, 1]).unwrap();
        let d = g.op("d", s, &[c], DType::F32, [16, 1, 1, 1]).unwrap();
        g.output("out", d);
        let graph = g.finish();
        let p = plan_arena(&graph).unwrap();
        let off = |t: bloomery_plugin_api::graph::TensorId| p.offsets[t.0 as usize].unwrap();
        assert_ne!(off(a), off(b));
        assert_ne!(off(b), off(c));
        assert_ne!(off(c), off(d));
        assert_eq!(off(a), off(c), "a is dead once b is written");
        assert_eq!(p.size, 128);
    }

    #[test]
    fn a_view_keeps_its_base_alive() {
        let mut g = GraphBuilder::new();
        let s = Op::Scale { s: 1.0 };
        let a = g.op("a", s, &[], DType::F32, [16, 1, 1, 1]).unwrap();
        let v = g.view(a, "v", [8, 1, 1, 1], [4, 32, 32, 32], 0);
        let b = g.op("b", s, &[], DType::F32, [16, 1, 1, 1]).unwrap();
        let c = g.op("c", s, &[v, b], DType::F32, [16, 1, 1, 1]).unwrap();
        g.output("out", c);
        let graph = g.finish();
        let p = plan_arena(&graph).unwrap();
        assert_ne!(p.offsets[a.0 as usize], p.offsets[b.0 as usize]);
        assert_eq!(p.offsets[v.0 as usize], None);
    }
}
