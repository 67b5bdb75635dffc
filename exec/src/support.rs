//! Load-time check that a kernel plugin implements every `(op, dtype)` pair a graph uses, so a
//! missing kernel is a named error before the first token rather than a failure mid-request.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use bloomery_plugin_api::graph::Graph;
use bloomery_plugin_api::op::{OpKind, OpSupport};
use bloomery_plugin_api::DType;

/// One `(op, dtype)` pair a graph needs and the plugin lacks, with an example node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MissingKernel {
    /// The op.
    pub op: OpKind,
    /// The dtype of its typed source (F32 when it has none).
    pub dtype: DType,
    /// The name of the first node that needs it.
    pub node: String,
}

impl fmt::Display for MissingKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {} (first needed by `{}`)",
            self.op, self.dtype, self.node
        )
    }
}

/// The `(op, dtype)` pairs of `graph` that `supported` lacks, each once, sorted.
pub fn missing_kernels(graph: &Graph, supported: &[OpSupport]) -> Vec<MissingKernel> {
    let have: BTreeMap<OpKind, BTreeSet<DType>> = supported
        .iter()
        .map(|s| (s.op, s.dtypes.iter().copied().collect()))
        .collect();
    let mut missing: BTreeMap<(OpKind, DType), String> = BTreeMap::new();
    for node in graph.nodes.iter() {
        let op = node.op.kind();
        let dtype = node
            .op
            .typed_src()
            .and_then(|i| node.srcs.get(i))
            .and_then(|t| graph.tensors.get(t.0 as usize))
            .map(|d| d.dtype)
            .unwrap_or(DType::F32);
        if have.get(&op).is_some_and(|set| set.contains(&dtype)) {
            continue;
        }
        missing.entry((op, dtype)).or_insert_with(|| {
            graph
                .tensors
                .get(node.dst.0 as usize)
                .map(|d| d.name.to_string())
                .unwrap_or_default()
        });
    }
    missing
        .into_iter()
        .map(|((op, dtype), node)| MissingKernel { op, dtype, node })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::graph::GraphBuilder;
    use bloomery_plugin_api::op::Op;

    #[test]
    fn reports_each_missing_pair_once_with_the_first_node() {
        let mut g = GraphBuilder::new();
        let w = g.weight(0, "w", DType::Q4_K, [256, 4, 1, 1]).unwrap();
        let x = g
            .op("x", Op::Scale { s: 1.0 }, &[], DType::F32, [256, 1, 1, 1])
            .unwrap();
        g.op("y0", Op::MatMul, &[w, x], DType::F32, [4, 1, 1, 1])
            .unwrap();
        g.op("y1", Op::MatMul, &[w, x], DType::F32, [4, 1, 1, 1])
            .unwrap();
        let graph = g.finish();
        let supported = vec![
            OpSupport {
                op: OpKind::MatMul,
                dtypes: vec![DType::F32].into(),
            },
            OpSupport {
                op: OpKind::Scale,
                dtypes: vec![DType::F32].into(),
            },
        ];
        let m = missing_kernels(&graph, &supported);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].to_string(), "MatMul on Q4_K (first needed by `y0`)");
        let all = vec![
            OpSupport {
                op: OpKind::MatMul,
                dtypes: vec![DType::Q4_K].into(),
            },
            OpSupport {
                op: OpKind::Scale,
                dtypes: vec![DType::F32].into(),
            },
        ];
        assert!(missing_kernels(&graph, &all).is_empty());
    }
}
