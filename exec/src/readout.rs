//! What a pass reads back for its output rows: their logits, their final-norm rows (the
//! embeddings, [`FINAL_NORM`]), or both. The model plugin builds one graph per batch shape; the
//! host derives the other readouts from it: embeddings alone run the graph up to the node that
//! writes the final norm (no output head), both keep the whole graph and read the norm too. A
//! tap keeps the whole graph and also reads every tensor of one name (an intermediate, such as
//! a sparse attention's selection, for checking it against a reference). A top-k readout keeps
//! the logits on the device and reads each row's `k` likeliest ids and their probabilities
//! among those `k`, with the final-norm rows (an MTP draft step's choice and its next row).
//! A split readout reads every output row's final-norm row and runs the output head on a few of
//! them (a prompt whose rows an MTP block takes in needs only its last row's logits).

use bloomery_plugin_api::graph::{
    BatchInput, Graph, GraphBuilder, GraphOutput, TensorId, TensorSource, FINAL_NORM,
};
use bloomery_plugin_api::op::{Gating, Op, RouterParams};
use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::DType;

/// The name the host gives the final-norm rows among a graph's outputs.
pub const EMBEDDINGS_OUTPUT: &str = "embeddings";

/// The output of a [`Readout::Top`] pass's ids, i32 `[k, n_outputs]`, likeliest first.
pub const TOP_IDS_OUTPUT: &str = "top_ids";

/// The output of a [`Readout::Top`] pass's probabilities, f32 `[k, n_outputs]`.
pub const TOP_PROBS_OUTPUT: &str = "top_probs";

/// Which results a pass reads back for its output rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Readout {
    /// The logits, `n_vocab` values a row (the plugin's graph as built).
    Logits,
    /// The final-norm rows, `n_embd` values a row; the output head does not run.
    Embeddings,
    /// Both, for a pass whose output rows mix generations and embeddings.
    Both,
    /// The final-norm rows of every output row and the logits of this many of them, those
    /// `BatchInputs::logit_rows` names (in its order): the output head runs on those alone.
    Split(u32),
    /// The logits and every tensor named this, one output per tensor ([`tap_layer`]).
    Tap(&'static str),
    /// The final-norm rows, and of each row's logits (which stay on the device) the this many
    /// likeliest token ids (ties: the lower id) with their probabilities among those (a softmax
    /// over their logits): llama.cpp's draft-mtp choice, top-k then softmax.
    Top(u32),
}

/// The output name the host gives a tapped tensor named `name` of layer `layer` (-1: none).
fn tap_output(name: &str, layer: i32) -> String {
    format!("tap:{name}:{layer}")
}

/// The layer of a tapped tensor named `name` from its output name (`None`: another output).
pub fn tap_layer(output: &str, name: &str) -> Option<i32> {
    let rest = output.strip_prefix("tap:")?.strip_prefix(name)?;
    rest.strip_prefix(':')?.parse().ok()
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
        matches!(
            self,
            Readout::Logits | Readout::Both | Readout::Split(_) | Readout::Tap(_)
        )
    }

    /// Whether the pass reads the final-norm rows.
    pub fn embeddings(self) -> bool {
        matches!(
            self,
            Readout::Embeddings | Readout::Both | Readout::Split(_) | Readout::Top(_)
        )
    }
}

/// `graph` as it runs for `readout`, its rows (embeddings) the last tensor named `rows` outside
/// any layer ([`FINAL_NORM`], or the MTP block's [`bloomery_plugin_api::graph::NEXTN_HIDDEN`]);
/// an error says why it cannot (no such rows).
pub fn graph_for(mut graph: Graph, readout: Readout, rows: &str) -> Result<Graph, String> {
    match readout {
        Readout::Logits => return Ok(graph),
        Readout::Tap(name) => return tapped(graph, name),
        Readout::Top(k) => return top(graph, k, rows),
        Readout::Embeddings | Readout::Both | Readout::Split(_) => {}
    }
    let norm = rows_of(&graph, rows)?;
    let output = GraphOutput {
        name: EMBEDDINGS_OUTPUT.into(),
        tensor: norm,
    };
    if readout == Readout::Embeddings {
        // The nodes after the final norm's writer are the output head (and its soft cap):
        // nothing there writes state.
        let writer = writer_of(&graph, norm, rows)?;
        graph.nodes.truncate(writer + 1);
        graph.outputs.clear();
    }
    graph.outputs.push(output);
    match readout {
        Readout::Split(n) => head_on_rows(graph, n),
        _ => Ok(graph),
    }
}

/// `graph` with its output head (the nodes after the final norm's writer) run on `n` of the
/// final-norm rows, those [`BatchInput::LogitRows`] names: a gather of those rows goes in
/// before the head, which reads it in place of the norm, and the head's results shrink to `n`
/// rows. An error says why a head cannot be cut so (a view into it, a result of other rows).
fn head_on_rows(graph: Graph, n: u32) -> Result<Graph, String> {
    let norm = rows_of(&graph, FINAL_NORM)?;
    let writer = writer_of(&graph, norm, FINAL_NORM)?;
    let [width, n_out, ..] = graph.tensors[norm.0 as usize].ne;
    let n = u64::from(n);
    if n == 0 || n > n_out {
        return Err(format!("the logits of {n} of {n_out} output rows"));
    }
    let mut g = GraphBuilder::extend(graph);
    let ids = g
        .input(BatchInput::LogitRows, [n, 1, 1, 1])
        .map_err(|e| e.to_string())?;
    let picked = g
        .op(
            "logit_rows",
            Op::GetRows,
            &[norm, ids],
            DType::F32,
            [width, n, 1, 1],
        )
        .map_err(|e| e.to_string())?;
    let mut graph = g.finish();
    let gather = graph.nodes.pop().expect("the gather just added");
    graph.nodes.insert(writer + 1, gather);
    let mut resized = vec![false; graph.tensors.len()];
    for node in graph.nodes[writer + 2..].iter_mut() {
        for src in node.srcs.iter_mut() {
            if *src == norm {
                *src = picked;
            }
            // The head reads the picked rows, its own results and weights: anything else (a
            // view, an earlier intermediate of every output row) would keep the old row count.
            let decl = &graph.tensors[src.0 as usize];
            let weight = |s: TensorSource| matches!(s, TensorSource::Weight { .. });
            let known = *src == picked
                || resized[src.0 as usize]
                || weight(decl.source)
                || matches!(decl.source, TensorSource::View { base, .. }
                    if weight(graph.tensors[base.0 as usize].source));
            if !known {
                return Err(format!(
                    "the output head reads `{}`, neither its rows, its own result nor a weight",
                    decl.name
                ));
            }
        }
        let at = node.dst.0 as usize;
        let decl = &mut graph.tensors[at];
        if resized[at] {
            continue;
        }
        if decl.source != TensorSource::Intermediate || decl.ne[1] != n_out || decl.ne[2] != 1 {
            return Err(format!(
                "the output head writes `{}` {:?}, not a result of its {n_out} rows",
                decl.name, decl.ne
            ));
        }
        decl.ne[1] = n;
        decl.nb = TensorRef::contiguous_strides(decl.dtype, decl.ne)
            .ok_or_else(|| format!("no layout for `{}` {:?}", decl.name, decl.ne))?;
        resized[at] = true;
    }
    Ok(graph)
}

/// The index of the last node of `graph` that writes `t` (named `name`, for the error).
fn writer_of(graph: &Graph, t: TensorId, name: &str) -> Result<usize, String> {
    graph
        .nodes
        .iter()
        .rposition(|n| n.dst == t)
        .ok_or_else(|| format!("no node writes `{name}`"))
}

/// `graph` reading its rows named `rows` and, of its logits, each row's `k` likeliest ids
/// (`TopK`) and their probabilities among them (`RouterWeights` with the softmax over the
/// chosen: the same ops as a router's, over the vocabulary); its logits not read.
fn top(graph: Graph, k: u32, rows: &str) -> Result<Graph, String> {
    let norm = rows_of(&graph, rows)?;
    let logits = graph
        .outputs
        .iter()
        .find(|o| o.name.as_str() == "logits")
        .map(|o| o.tensor)
        .ok_or("the graph has no `logits` to choose from")?;
    let decl = &graph.tensors[logits.0 as usize];
    let (n_vocab, n_out) = (decl.ne[0], decl.ne[1]);
    if decl.dtype != DType::F32 || k == 0 || u64::from(k) > n_vocab {
        return Err(format!(
            "the {k} likeliest of {n_vocab} {} logits",
            decl.dtype
        ));
    }
    let mut g = GraphBuilder::extend(graph);
    let err = |e: bloomery_plugin_api::PluginError| e.to_string();
    let ids = g
        .op(
            "top_ids",
            Op::TopK { k },
            &[logits],
            DType::I32,
            [u64::from(k), n_out, 1, 1],
        )
        .map_err(err)?;
    let probs = RouterParams {
        gating: Gating::SoftmaxSelected,
        n_expert: n_vocab as u32,
        k,
        n_group: 1,
        topk_group: 1,
        bias: false,
        norm: false,
        norm_min: 0.0,
        scale: 1.0,
    };
    let p = g
        .op(
            "top_probs",
            Op::RouterWeights(probs),
            &[logits, ids],
            DType::F32,
            [u64::from(k), n_out, 1, 1],
        )
        .map_err(err)?;
    let mut graph = g.finish();
    graph.outputs.clear();
    for (name, tensor) in [
        (EMBEDDINGS_OUTPUT, norm),
        (TOP_IDS_OUTPUT, ids),
        (TOP_PROBS_OUTPUT, p),
    ] {
        graph.outputs.push(GraphOutput {
            name: name.into(),
            tensor,
        });
    }
    Ok(graph)
}

/// `graph` with every tensor named `name` added to its outputs, in the graph's order; an error
/// when it has none.
fn tapped(mut graph: Graph, name: &str) -> Result<Graph, String> {
    let found: Vec<TensorId> = (0..graph.tensors.len())
        .filter(|&i| graph.tensors[i].name.as_str() == name)
        .map(|i| TensorId(i as u32))
        .collect();
    if found.is_empty() {
        return Err(format!("the graph has no tensor named `{name}` to tap"));
    }
    for tensor in found {
        let layer = graph.tensors[tensor.0 as usize].layer;
        graph.outputs.push(GraphOutput {
            name: tap_output(name, layer).into(),
            tensor,
        });
    }
    Ok(graph)
}

/// The rows of `graph` named `name`: the last tensor of that name outside any layer that a node
/// writes (views of it, which share its name, left aside).
fn rows_of(graph: &Graph, name: &str) -> Result<TensorId, String> {
    let written = |i: usize| graph.nodes.iter().any(|n| n.dst.0 as usize == i);
    let at = (0..graph.tensors.len())
        .rev()
        .find(|&i| {
            let t = &graph.tensors[i];
            t.name.as_str() == name && t.layer == -1 && written(i)
        })
        .ok_or_else(|| match name == FINAL_NORM {
            true => format!("the graph has no `{FINAL_NORM}` rows (the final norm)"),
            false => format!("the graph has no `{name}` rows"),
        })?;
    Ok(TensorId(at as u32))
}

#[cfg(test)]
mod tests {
    use super::{
        graph_for, tap_layer, Readout, EMBEDDINGS_OUTPUT, TOP_IDS_OUTPUT, TOP_PROBS_OUTPUT,
    };
    use bloomery_plugin_api::graph::{
        BatchInput, Graph, GraphBuilder, TensorId, TensorSource, FINAL_NORM,
    };
    use bloomery_plugin_api::op::{Gating, Op, UnaryFn};
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
        let g = graph_for(head(), Readout::Embeddings, FINAL_NORM).unwrap();
        assert_eq!(g.nodes.len(), 2);
        assert_eq!(outputs(&g), [EMBEDDINGS_OUTPUT]);
        let t = g.outputs[0].tensor.0 as usize;
        assert_eq!(g.tensors[t].name.as_str(), FINAL_NORM);
    }

    #[test]
    fn both_keep_the_head_and_read_the_norm() {
        let g = graph_for(head(), Readout::Both, FINAL_NORM).unwrap();
        assert_eq!(g.nodes.len(), 4);
        assert_eq!(outputs(&g), ["logits", EMBEDDINGS_OUTPUT]);
        assert_eq!(
            graph_for(head(), Readout::Logits, FINAL_NORM).unwrap(),
            head()
        );
    }

    #[test]
    fn split_runs_the_head_on_the_rows_named_and_reads_every_norm_row() {
        let g = graph_for(head(), Readout::Split(1), FINAL_NORM).unwrap();
        assert_eq!(outputs(&g), ["logits", EMBEDDINGS_OUTPUT]);
        let norm = g.outputs[1].tensor;
        assert_eq!(g.tensors[norm.0 as usize].ne, [4, 2, 1, 1]);
        assert_eq!(g.nodes.len(), 5);
        let gather = &g.nodes[2];
        assert_eq!(gather.op, Op::GetRows);
        assert_eq!(gather.srcs[0], norm);
        let ids = &g.tensors[gather.srcs[1].0 as usize];
        assert_eq!(
            (ids.source, ids.ne),
            (
                TensorSource::Input {
                    input: BatchInput::LogitRows
                },
                [1, 1, 1, 1]
            )
        );
        assert_eq!(g.nodes[3].srcs.as_slice(), &[gather.dst][..]);
        for node in &g.nodes[2..] {
            let t = &g.tensors[node.dst.0 as usize];
            assert_eq!((t.ne, t.nb), ([4, 1, 1, 1], [4, 16, 16, 16]), "{}", t.name);
        }
        assert!(Readout::Split(1).logits() && Readout::Split(1).embeddings());
        // None, or more than the output rows.
        for n in [0, 3] {
            let e = graph_for(head(), Readout::Split(n), FINAL_NORM).unwrap_err();
            assert!(e.contains("output rows"), "{e}");
        }
    }

    #[test]
    fn split_refuses_a_head_that_reads_a_view_of_the_norm() {
        let graph = head();
        let at = graph
            .tensors
            .iter()
            .position(|t| t.name.as_str() == FINAL_NORM)
            .unwrap();
        let mut g = GraphBuilder::extend(graph);
        let v = g.reshape(TensorId(at as u32), [8, 1, 1, 1]).unwrap();
        g.op(
            "flat",
            Op::Unary { f: UnaryFn::Silu },
            &[v],
            DType::F32,
            [8, 1, 1, 1],
        )
        .unwrap();
        let e = graph_for(g.finish(), Readout::Split(1), FINAL_NORM).unwrap_err();
        assert!(e.contains("reads `result_norm`"), "{e}");
    }

    #[test]
    fn top_keeps_the_logits_on_the_device_and_reads_their_choice() {
        let g = graph_for(head(), Readout::Top(3), FINAL_NORM).unwrap();
        assert_eq!(
            outputs(&g),
            [EMBEDDINGS_OUTPUT, TOP_IDS_OUTPUT, TOP_PROBS_OUTPUT]
        );
        let logits = head().outputs[0].tensor;
        let (top, probs) = (&g.nodes[4], &g.nodes[5]);
        assert_eq!(
            (top.op, top.srcs.as_slice()),
            (Op::TopK { k: 3 }, &[logits][..])
        );
        assert_eq!(probs.srcs.as_slice(), &[logits, top.dst][..]);
        let Op::RouterWeights(p) = probs.op else {
            panic!("{:?}", probs.op)
        };
        assert_eq!(
            (p.gating, p.n_expert, p.k, p.norm),
            (Gating::SoftmaxSelected, 4, 3, false)
        );
        assert_eq!(g.tensors[top.dst.0 as usize].ne, [3, 2, 1, 1]);
        assert!(!Readout::Top(3).logits() && Readout::Top(3).embeddings());
        // More than the vocabulary, or none.
        for k in [0, 5] {
            let e = graph_for(head(), Readout::Top(k), FINAL_NORM).unwrap_err();
            assert!(e.contains("likeliest"), "{e}");
        }
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
        let e = graph_for(g.finish(), Readout::Embeddings, FINAL_NORM).unwrap_err();
        assert!(e.contains(FINAL_NORM), "{e}");
    }

    #[test]
    fn a_tap_reads_every_tensor_of_its_name_with_its_layer_and_keeps_the_logits() {
        let mut g = GraphBuilder::new();
        let mut last = None;
        for layer in [3, 7] {
            g.set_layer(layer);
            let src: Vec<_> = last.into_iter().collect();
            let t = g
                .op(
                    "sel",
                    Op::Unary { f: UnaryFn::Silu },
                    &src,
                    DType::F32,
                    [4, 1, 1, 1],
                )
                .unwrap();
            last = Some(t);
        }
        g.set_layer(-1);
        g.output("logits", last.unwrap());
        let base = g.finish();
        let t = graph_for(base.clone(), Readout::Tap("sel"), FINAL_NORM).unwrap();
        assert_eq!(t.nodes, base.nodes);
        let layers: Vec<Option<i32>> = t
            .outputs
            .iter()
            .map(|o| tap_layer(&o.name, "sel"))
            .collect();
        assert_eq!(layers, [None, Some(3), Some(7)]);
        assert_eq!(tap_layer("tap:sel:3", "se"), None);
        let e = graph_for(base, Readout::Tap("nothing"), FINAL_NORM).unwrap_err();
        assert!(e.contains("`nothing`"), "{e}");
        assert!(Readout::Tap("sel").logits() && !Readout::Tap("sel").embeddings());
    }
}
