//! What the tier reads off a model's graph: its MoE layers and the tables it only gathers rows
//! from.

use bloomery_gguf::GgufModel;
use bloomery_plugin_api::graph::{Graph, TensorId, TensorSource};
use bloomery_plugin_api::model::ModelSpec;
use bloomery_plugin_api::op::Op;

use crate::plan::MoeLayer;

/// The MoE layers of `graph`, with their stacks' names and sizes from the file.
pub fn moe_layers(graph: &Graph, spec: &ModelSpec, file: &GgufModel) -> Vec<MoeLayer> {
    let mut out = Vec::new();
    for node in graph.nodes.iter() {
        let Op::MoeExperts(p) = node.op else {
            continue;
        };
        let n_stacks = if p.fused_gate_up { 2 } else { 3 };
        let mut stacks = Vec::new();
        let mut names = Vec::new();
        let mut bytes = 0u64;
        for s in node.srcs.iter().skip(3).take(n_stacks) {
            if let Some(TensorSource::Weight { index }) =
                graph.tensors.get(s.0 as usize).map(|t| t.source)
            {
                let name = spec.weights[index as usize].name.to_string();
                if let Some(t) = file.tensor(&name) {
                    bytes += t.info.size;
                }
                stacks.push(index as usize);
                names.push(name);
            }
        }
        if stacks.len() != n_stacks {
            continue;
        }
        let block = names[0]
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(out.len() as u32);
        out.push(MoeLayer {
            block,
            stacks,
            names,
            n_expert: p.n_expert,
            expert_bytes: bytes / u64::from(p.n_expert.max(1)),
        });
    }
    out
}

/// Weights that every node of `graphs` reads only as the table of a row gather (token
/// embeddings), in index order: a pass needs a few of their rows, which the card can read in
/// place from page-locked host RAM. A weight also read otherwise (a tied output head) or viewed
/// is left out.
pub fn gathered_tables(graphs: &[&Graph]) -> Vec<usize> {
    let mut gathered = std::collections::BTreeSet::new();
    let mut other = std::collections::HashSet::new();
    for g in graphs {
        let weight = |t: TensorId| match g.tensors.get(t.0 as usize).map(|d| d.source) {
            Some(TensorSource::Weight { index }) => Some(index as usize),
            _ => None,
        };
        for d in &g.tensors {
            if let TensorSource::View { base, .. } = d.source {
                other.extend(weight(base));
            }
        }
        for n in &g.nodes {
            for (i, &s) in n.srcs.iter().enumerate() {
                match (weight(s), n.op == Op::GetRows && i == 0) {
                    (Some(w), true) => gathered.insert(w),
                    (Some(w), false) => other.insert(w),
                    (None, _) => false,
                };
            }
        }
    }
    gathered
        .into_iter()
        .filter(|w| !other.contains(w))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::gathered_tables;
    use bloomery_plugin_api::graph::{BatchInput, GraphBuilder};
    use bloomery_plugin_api::op::Op;
    use bloomery_plugin_api::DType;

    #[test]
    fn only_tables_that_nothing_but_row_gathers_read_stay_on_the_host() {
        let ne = [8, 16, 1, 1];
        let mut g = GraphBuilder::new();
        let tokens = g.input(BatchInput::Tokens, [2, 1, 1, 1]).unwrap();
        let [embd, head, tied, viewed] =
            [0, 1, 2, 3].map(|i| g.weight(i, &format!("w{i}"), DType::F32, ne).unwrap());
        let row = [8, 2, 1, 1];
        let x = g
            .op("x", Op::GetRows, &[embd, tokens], DType::F32, row)
            .unwrap();
        // A tied head: gathered in one place, multiplied in another.
        let y = g
            .op("y", Op::GetRows, &[tied, tokens], DType::F32, row)
            .unwrap();
        let z = g
            .op("z", Op::MatMul, &[tied, x], DType::F32, [16, 2, 1, 1])
            .unwrap();
        let h = g
            .op("h", Op::MatMul, &[head, y], DType::F32, [16, 2, 1, 1])
            .unwrap();
        // A view of a table is read otherwise too.
        let v = g.view(viewed, "v", ne, [4, 32, 512, 512], 0);
        let w = g
            .op("w", Op::GetRows, &[v, tokens], DType::F32, row)
            .unwrap();
        let u = g
            .op("u", Op::GetRows, &[viewed, tokens], DType::F32, row)
            .unwrap();
        for (name, t) in [("z", z), ("h", h), ("w", w), ("u", u)] {
            g.output(name, t);
        }
        let graph = g.finish();
        assert_eq!(gathered_tables(&[&graph]), vec![0]);
        // A second graph that multiplies the first table takes it out.
        let mut g = GraphBuilder::new();
        let x = g.input(BatchInput::Tokens, [8, 1, 1, 1]).unwrap();
        let embd = g.weight(0, "w0", DType::F32, ne).unwrap();
        let y = g
            .op("y", Op::MatMul, &[embd, x], DType::F32, [16, 1, 1, 1])
            .unwrap();
        g.output("y", y);
        let other = g.finish();
        assert!(gathered_tables(&[&graph, &other]).is_empty());
    }
}
