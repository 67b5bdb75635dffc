//! What a pass reads back for its output rows: their logits, their final-norm rows (the
//! embeddings, [`FINAL_NORM`]), or both. The model plugin builds one graph per batch shape; the
//! host derives the other readouts from it: embeddings alone run the graph up to the node that
//! writes the final norm (no output head), both keep the whole graph and read the norm too.

use bloomery_plugin_api::graph::{Graph, GraphOutput, TensorId, FINAL_NORM};

/// The name the host gives the final-norm rows among a graph's outputs.
pub const EMBEDDINGS_OUTPUT: &str = "embeddings";

/// Which results a pass reads back for its output rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Readout {
    /// The logits, `n_vocab` values a row (the plugin's graph as built).
    Logits,
    /// The final-norm rows, `n_embd` values a row; the output head does not run.
    Embeddings,
    /// Both, for a pass whose output rows mix generations and embeddings.
    Both,
}

impl Readout {
    /// The readout that gives logits and/or embeddings as asked (logits when neither is).
    pub fn of(logits: bool, embeddings: bool) -> Readout {
        match (logits, embeddings) {
            (true, true) => Readout::Both,
            (false, true) => Readout::Embeddings,
            _ => Readout::Logits,
        }
    }

    /// Whether the pass reads logits.
    pub fn logits(self) -> bool {
        self != Readout::Embeddings
    }

    /// Whether the pass reads the final-norm rows.
    pub fn embeddings(self) -> bool {
        self != Readout::Logits
    }
}

/// `graph` as it runs for `readout`; an error says why it cannot (no final-norm rows).
pub fn graph_for(mut graph: Graph, readout: Readout) -> Result<Graph, String> {
    if readout == Readout::Logits {
        return Ok(graph);
    }
    let norm = final_norm(&graph)?;
    let output = GraphOutput {
        name: EMBEDDINGS_OUTPUT.into(),
        tensor: norm,
    };
    if readout == Readout::Embeddings {
        // The nodes after the final norm's writer are the output head (and its soft cap):
        // nothing there writes state.
        let writer = graph
            .nodes
            .iter()
            .rposition(|n| n.dst == norm)
            .ok_or_else(|| format!("no node writes `{FINAL_NORM}`"))?;
        graph.nodes.truncate(writer + 1);
        graph.outputs.clear();
    }
    graph.outputs.push(output);
    Ok(graph)
}

/// The final-norm rows of `graph`: the last tensor named [`FINAL_NORM`] outside any layer.
fn final_norm(graph: &Graph) -> Result<TensorId, String> {
    let at = graph
        .tensors
        .iter()
        .rposition(|t| t.name.as_str() == FINAL_NORM && t.layer == -1)
        .ok_or_else(|| format!("the graph has no `{FINAL_NORM}` rows (the final norm)"))?;
    Ok(TensorId(at as u32))
}

#[cfg(test)]
mod tests {
    use super::{graph_for, Readout, EMBEDDINGS_OUTPUT};
    use bloomery_plugin_api::graph::{Graph, GraphBuilder, FINAL_NORM};
    use bloomery_plugin_api::op::{Op, UnaryFn};
    use bloomery_plugin_api::DType;

    /// x → `result_norm` → `result_output` (logits) → a soft cap.
    fn head() -> Graph {
        let mut g = GraphBuilder::new();
        let x = g
            .op(
                "x",
                Op::Unary { f: UnaryFn::Silu },
                &[],
                DType::F32,
                [4, 2, 1, 1],
            )
            .unwrap();
        let n = g
            .op(
                FINAL_NORM,
                Op::Unary { f: UnaryFn::Silu },
                &[x],
                DType::F32,
                [4, 2, 1, 1],
            )
            .unwrap();
        let l = g
            .op(
                "result_output",
                Op::Unary { f: UnaryFn::Silu },
                &[n],
                DType::F32,
                [4, 2, 1, 1],
            )
            .unwrap();
        let c = g
            .op(
                "softcap",
                Op::Unary { f: UnaryFn::Tanh },
                &[l],
                DType::F32,
                [4, 2, 1, 1],
            )
            .unwrap();
        g.output("logits", c);
        g.finish()
    }

    fn outputs(g: &Graph) -> Vec<&str> {
        g.outputs.iter().map(|o| o.name.as_str()).collect()
    }

    #[test]
    fn embeddings_alone_stop_at_the_final_norm() {
        let g = graph_for(head(), Readout::Embeddings).unwrap();
        assert_eq!(g.nodes.len(), 2);
        assert_eq!(outputs(&g), [EMBEDDINGS_OUTPUT]);
        let t = g.outputs[0].tensor.0 as usize;
        assert_eq!(g.tensors[t].name.as_str(), FINAL_NORM);
    }

    #[test]
    fn both_keep_the_head_and_read_the_norm() {
        let g = graph_for(head(), Readout::Both).unwrap();
        assert_eq!(g.nodes.len(), 4);
        assert_eq!(outputs(&g), ["logits", EMBEDDINGS_OUTPUT]);
        assert_eq!(graph_for(head(), Readout::Logits).unwrap(), head());
    }

    #[test]
    fn a_graph_without_the_final_norm_is_refused_by_name() {
        let mut g = GraphBuilder::new();
        let x = g
            .op(
                "x",
                Op::Unary { f: UnaryFn::Silu },
                &[],
                DType::F32,
                [4, 1, 1, 1],
            )
            .unwrap();
        g.output("logits", x);
        let e = graph_for(g.finish(), Readout::Embeddings).unwrap_err();
        assert!(e.contains(FINAL_NORM), "{e}");
    }
}
