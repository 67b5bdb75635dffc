//! Forward graphs: what a model plugin builds for a batch shape and the host executes.
//!
//! A graph is a list of tensor declarations and a list of nodes in execution order. Tensors are
//! weights (by index into the model's weight list), host-owned state (by index into its state list),
//! batch inputs the host fills every step, intermediates the host allocates, or strided views of
//! another tensor. A graph depends only on the [`BatchShape`]: token ids, positions and slots are
//! inputs, so the host can build a graph once and replay it (and a GPU plugin can capture it).

use abi_stable::std_types::{RString, RVec};
use abi_stable::StableAbi;

use crate::op::Op;
use crate::tensor::{TensorRef, MAX_SRCS};
use crate::{DType, PluginError};

/// Index of a tensor in [`Graph::tensors`].
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

/// Per-step inputs the host writes before each pass.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BatchInput {
    /// i32 `[rows]`: token ids.
    Tokens = 0,
    /// i32 `[rows]`: positions in their sequences.
    Positions = 1,
    /// i32 `[rows]`: sequence slots (index of the state each row reads and writes).
    Slots = 2,
    /// i32 `[n_outputs]`: rows whose outputs are wanted (logits are computed for these only).
    OutputRows = 3,
    /// i32 `[n_ids, rows]`: each row's hashed n-gram table row ids, which the host computes with
    /// the model's [`crate::ngram::NgramSpec`] from its record of the row's sequence
    /// ([`crate::ngram::NgramSpec::row_ids`]); `n_ids` = [`crate::ngram::NgramSpec::n_ids`].
    NgramRows = 4,
    /// f32 `[n_embd, rows]`: each row's hidden state from an earlier pass, the main graph's
    /// final-norm row ([`FINAL_NORM`]) of some position; the draft graph ([`GraphKind::Mtp`])
    /// pairs it with the row's token.
    Hidden = 5,
    /// f32 `[width, n_ids, rows]`: the rows of the hashed n-gram tables that each row's
    /// [`BatchInput::NgramRows`] ids name, gathered and dequantized by the host (llama.cpp's
    /// dequantization, as `GetRows` gives it). Table `t` (ids `t·per_table ..`, see
    /// [`crate::ngram::NgramSpec`]) is the `t`-th weight of class
    /// [`crate::model::WeightClass::NgramTable`] in declaration order; every table has `width`
    /// values a row.
    NgramEmbd = 6,
    /// i32 `[n_logits]`: which of the output rows the output head runs on, indices into
    /// [`BatchInput::OutputRows`]'s rows. The host adds it to a graph whose pass wants every
    /// output row's final-norm row but the logits of a few (a prompt whose rows an MTP block
    /// takes in needs its last row's logits alone); plugins never declare it.
    LogitRows = 7,
}

impl BatchInput {
    /// The element type of the input.
    pub fn dtype(self) -> DType {
        match self {
            BatchInput::Hidden | BatchInput::NgramEmbd => DType::F32,
            _ => DType::I32,
        }
    }
}

/// Where a tensor's memory comes from.
#[repr(C, u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub enum TensorSource {
    /// A model weight: index into the model's `weights`. Shape and type are the file's.
    Weight {
        /// Index into `ModelSpec::weights`.
        index: u32,
    },
    /// Host-owned state: index into the model's `state`. Its shape is the host's allocation
    /// (`[row_elems, len, n_slots]`): the declaration's `ne`/`nb` are ignored.
    State {
        /// Index into `ModelSpec::state`.
        index: u32,
    },
    /// A batch input written by the host every step.
    Input {
        /// Which.
        input: BatchInput,
    },
    /// An intermediate result, allocated (and reused across liveness gaps) by the host.
    Intermediate,
    /// Per-row copies of the per-sequence state `index` (a `Conv` or `Recurrent` buffer), f32
    /// `[row_elems, rows]`, host-owned, which a [`GraphKind::Verify`] pass's state ops write as
    /// their optional last source: column `r` holds row `r`'s sequence's state after row `r`.
    /// The host keeps them past the pass, to put a kept row's state into its slot.
    RowStates {
        /// Index into `ModelSpec::state`.
        index: u32,
    },
    /// A view of another tensor's memory: `offset` bytes in, with this declaration's `ne`/`nb`.
    View {
        /// The viewed tensor (not itself a view of a weight that the host may move).
        base: TensorId,
        /// Byte offset into the base.
        offset: u64,
    },
}

/// A tensor declaration.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct TensorDecl {
    /// Name for dumps, llama.cpp's node names where the meaning is the same (`attn_norm`, `l_out`).
    pub name: RString,
    /// Layer, or -1 outside layers.
    pub layer: i32,
    /// Element type.
    pub dtype: DType,
    /// Extents, ne0 contiguous.
    pub ne: [u64; 4],
    /// Byte strides.
    pub nb: [u64; 4],
    /// Where the memory comes from.
    pub source: TensorSource,
}

/// One node: an op with sources and a destination, in execution order.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Node {
    /// The op.
    pub op: Op,
    /// Sources.
    pub srcs: RVec<TensorId>,
    /// Destination.
    pub dst: TensorId,
}

/// A named result of the graph (e.g. `logits` f32 `[n_vocab, n_outputs]`).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct GraphOutput {
    /// Name.
    pub name: RString,
    /// Tensor.
    pub tensor: TensorId,
}

/// The name of a causal LM's final-norm rows, f32 `[n_embd, n_outputs]` outside any layer
/// (llama.cpp's `result_norm`, which it reads as the embeddings): the host reads this tensor as
/// the embeddings of the output rows, and runs the graph only up to the node that writes it when
/// no logits are wanted. [`crate::builders::GraphBuilder::lm_head`] declares it; a graph without
/// it serves no embeddings.
pub const FINAL_NORM: &str = "result_norm";

/// The name of the rows a model's draft graph ([`GraphKind::Mtp`]) pairs with the next token,
/// f32 `[width, n_outputs]` outside any layer, where they are not the [`FINAL_NORM`] rows
/// (llama.cpp's `h_nextn`): qwen4exp's MTP block reads the trunk's hyper-connection residual
/// (`n_stream·n_embd` wide) before its final mixer, and its own residual feeds the next draft
/// step. A graph without it pairs the [`FINAL_NORM`] rows.
pub const NEXTN_HIDDEN: &str = "h_nextn";

/// Which graph to build.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphKind {
    /// The model's forward pass.
    Main = 0,
    /// The multi-token-prediction draft layers: each row's token with its
    /// [`BatchInput::Hidden`] row.
    Mtp = 1,
    /// The main graph of a pass that verifies drafted tokens (at most [`MAX_VERIFY_ROWS`] rows):
    /// each op that updates a per-sequence state (`ConvCausal`, `DeltaRule`) also writes every
    /// row's state into that state's [`TensorSource::RowStates`], so that after a refused draft
    /// the host puts the last kept row's state into the slot instead of running the kept rows
    /// again. A plugin whose graphs keep no per-sequence state may build the main graph.
    Verify = 2,
}

/// Most rows of a [`GraphKind::Verify`] pass (the host's row-state buffers hold this many).
pub const MAX_VERIFY_ROWS: u32 = 16;

/// The shape a graph is built for.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchShape {
    /// Rows (tokens) in the pass.
    pub n_rows: u32,
    /// Rows whose outputs are wanted.
    pub n_outputs: u32,
    /// Which graph.
    pub kind: GraphKind,
}

/// A forward graph.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Default)]
pub struct Graph {
    /// Tensor declarations.
    pub tensors: RVec<TensorDecl>,
    /// Nodes in execution order.
    pub nodes: RVec<Node>,
    /// Results.
    pub outputs: RVec<GraphOutput>,
}

/// Builds a [`Graph`] node by node. Shared by every model plugin; methods that add a node return
/// the destination tensor.
#[derive(Default)]
pub struct GraphBuilder {
    graph: Graph,
    layer: i32,
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        GraphBuilder {
            graph: Graph::default(),
            layer: -1,
        }
    }

    /// Goes on building `graph` (a host adding nodes after a plugin's graph), outside any
    /// layer.
    pub fn extend(graph: Graph) -> Self {
        GraphBuilder { graph, layer: -1 }
    }

    /// Sets the layer that later tensors are tagged with (-1 outside layers).
    pub fn set_layer(&mut self, layer: i32) {
        self.layer = layer;
    }

    /// The declaration of `t`.
    pub fn decl(&self, t: TensorId) -> &TensorDecl {
        &self.graph.tensors[t.0 as usize]
    }

    /// The extents of `t`.
    pub fn ne(&self, t: TensorId) -> [u64; 4] {
        self.decl(t).ne
    }

    fn push(
        &mut self,
        name: &str,
        dtype: DType,
        ne: [u64; 4],
        nb: [u64; 4],
        source: TensorSource,
    ) -> TensorId {
        let id = TensorId(self.graph.tensors.len() as u32);
        self.graph.tensors.push(TensorDecl {
            name: name.into(),
            layer: self.layer,
            dtype,
            ne,
            nb,
            source,
        });
        id
    }

    fn contiguous(dtype: DType, ne: [u64; 4]) -> Result<[u64; 4], PluginError> {
        TensorRef::contiguous_strides(dtype, ne)
            .ok_or_else(|| PluginError::invalid(format!("no contiguous layout for {dtype} {ne:?}")))
    }

    /// Declares a weight (index into the model's weight list) with the file's type and shape.
    pub fn weight(
        &mut self,
        index: u32,
        name: &str,
        dtype: DType,
        ne: [u64; 4],
    ) -> Result<TensorId, PluginError> {
        let nb = Self::contiguous(dtype, ne)?;
        Ok(self.push(name, dtype, ne, nb, TensorSource::Weight { index }))
    }

    /// Declares host-owned state (index into the model's state list).
    pub fn state(&mut self, index: u32, name: &str) -> TensorId {
        self.push(
            name,
            DType::F32,
            [0; 4],
            [0; 4],
            TensorSource::State { index },
        )
    }

    /// Declares the per-row copies of state `index` for a pass of `rows` rows (at most
    /// [`MAX_VERIFY_ROWS`]), `row_elems` f32 a row: the optional last source of the op that
    /// updates that state in a [`GraphKind::Verify`] graph.
    pub fn row_states(
        &mut self,
        index: u32,
        name: &str,
        row_elems: u64,
        rows: u64,
    ) -> Result<TensorId, PluginError> {
        if rows > u64::from(MAX_VERIFY_ROWS) {
            return Err(PluginError::invalid(format!(
                "a verify pass of {rows} rows (at most {MAX_VERIFY_ROWS} keep row states)"
            )));
        }
        let ne = [row_elems, rows, 1, 1];
        let nb = Self::contiguous(DType::F32, ne)?;
        Ok(self.push(name, DType::F32, ne, nb, TensorSource::RowStates { index }))
    }

    /// Declares a batch input; `ne` as documented on [`BatchInput`].
    pub fn input(&mut self, input: BatchInput, ne: [u64; 4]) -> Result<TensorId, PluginError> {
        let nb = Self::contiguous(input.dtype(), ne)?;
        let name = match input {
            BatchInput::Tokens => "inp_tokens",
            BatchInput::Positions => "inp_pos",
            BatchInput::Slots => "inp_slots",
            BatchInput::OutputRows => "inp_out_ids",
            BatchInput::NgramRows => "inp_ngram_rows",
            BatchInput::NgramEmbd => "inp_ngram_embd",
            BatchInput::Hidden => "inp_hidden",
            BatchInput::LogitRows => "inp_logit_ids",
        };
        Ok(self.push(name, input.dtype(), ne, nb, TensorSource::Input { input }))
    }

    /// Adds a node whose result is a new contiguous intermediate of `dtype` and `ne`.
    pub fn op(
        &mut self,
        name: &str,
        op: Op,
        srcs: &[TensorId],
        dtype: DType,
        ne: [u64; 4],
    ) -> Result<TensorId, PluginError> {
        if srcs.len() > MAX_SRCS {
            return Err(PluginError::invalid(format!(
                "{name}: {} sources, at most {MAX_SRCS}",
                srcs.len()
            )));
        }
        let nb = Self::contiguous(dtype, ne)?;
        let dst = self.push(name, dtype, ne, nb, TensorSource::Intermediate);
        self.graph.nodes.push(Node {
            op,
            srcs: srcs.iter().copied().collect(),
            dst,
        });
        Ok(dst)
    }

    /// Adds a node that writes into an existing tensor (a cache store, a state update).
    pub fn op_into(&mut self, op: Op, srcs: &[TensorId], dst: TensorId) -> Result<(), PluginError> {
        if srcs.len() > MAX_SRCS {
            return Err(PluginError::invalid(format!(
                "{} sources, at most {MAX_SRCS}",
                srcs.len()
            )));
        }
        self.graph.nodes.push(Node {
            op,
            srcs: srcs.iter().copied().collect(),
            dst,
        });
        Ok(())
    }

    /// A strided view of `base`: `offset` bytes in, with extents `ne` and strides `nb`.
    pub fn view(
        &mut self,
        base: TensorId,
        name: &str,
        ne: [u64; 4],
        nb: [u64; 4],
        offset: u64,
    ) -> TensorId {
        let dtype = self.decl(base).dtype;
        self.push(name, dtype, ne, nb, TensorSource::View { base, offset })
    }

    /// A contiguous reshape of a contiguous tensor (same element count).
    pub fn reshape(&mut self, base: TensorId, ne: [u64; 4]) -> Result<TensorId, PluginError> {
        let d = self.decl(base).clone();
        let count: u64 = d.ne.iter().product();
        if count != ne.iter().product::<u64>() {
            return Err(PluginError::invalid(format!(
                "reshape of {} {:?} to {ne:?}",
                d.name, d.ne
            )));
        }
        let nb = Self::contiguous(d.dtype, ne)?;
        Ok(self.view(base, &d.name, ne, nb, 0))
    }

    /// Marks `t` as a named result.
    pub fn output(&mut self, name: &str, t: TensorId) {
        self.graph.outputs.push(GraphOutput {
            name: name.into(),
            tensor: t,
        });
    }

    /// The finished graph.
    pub fn finish(self) -> Graph {
        self.graph
    }
}
