//! Turns a graph into resolved op calls over device memory, and runs them.
//!
//! Built once per batch shape: the arena for intermediates and the input buffers are allocated
//! here, every tensor is resolved to a `TensorRef`, and each step only writes the inputs, runs the
//! prepared calls and reads the outputs. Nothing on the step path allocates device memory.
//! MoE calls of layers with host experts run through the `tiered` submodule; each stretch of
//! calls between them is its own captured device graph.
//!
//! Where the device has page-locked host memory it uses in place, a pass's inputs are written
//! there and moved to the device by the pass's first call, and its outputs are moved there by its
//! last calls: a step then makes no synchronous copy of its own besides the pass. (The CPU's
//! shared memory is ordinary memory: the same path, its copies plain moves.)

use std::sync::{Arc, Mutex};

use bloomery_plugin_api::graph::{BatchInput, BatchShape, Graph, TensorSource};
use bloomery_plugin_api::op::{Op, OpKind, RouterParams};
use bloomery_plugin_api::tensor::{OpCall, TensorRef, MAX_SRCS};
use bloomery_plugin_api::{DType, PluginError};

use bloomery_devices::bytes::{f32_bytes, i32_bytes};
use bloomery_devices::{Buffer, Device};
use bloomery_tiering::bus_balance::BusBalance;
use bloomery_tiering::lending::Lending;
use bloomery_tiering::residency::Residency;
use bloomery_tiering::{DiskTier, ExpertTier, STREAM_MIN_ROWS};

use crate::arena_plan::plan_arena;
use crate::ngram_table::NgramTables;
use crate::support::{missing_kernels, MissingKernel};

mod tiered;

use self::tiered::{
    host_moe, moe_routers, stream_moe, stream_parts, HostedMoe, NextRouter, TierTimes, Upload,
};

/// Why a graph could not be prepared or run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The kernel plugin lacks kernels the graph needs.
    #[error("kernel plugin `{plugin}` lacks {}", list(.missing))]
    MissingKernels {
        /// The plugin.
        plugin: String,
        /// What is missing.
        missing: Vec<MissingKernel>,
    },
    /// The graph is inconsistent.
    #[error("malformed graph: {0}")]
    BadGraph(String),
    /// The device failed.
    #[error("{context}: {source}")]
    Device {
        /// What was being done.
        context: String,
        /// The plugin's error.
        source: PluginError,
    },
}

fn list(m: &[MissingKernel]) -> String {
    m.iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn dev(context: &str) -> impl FnOnce(PluginError) -> ExecError + '_ {
    move |source| ExecError::Device {
        context: context.to_owned(),
        source,
    }
}

/// The per-step inputs of a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchInputs {
    /// Token id of each row.
    pub tokens: Vec<i32>,
    /// Position of each row in its sequence.
    pub positions: Vec<i32>,
    /// Sequence slot of each row.
    pub slots: Vec<i32>,
    /// Rows whose outputs are wanted.
    pub output_rows: Vec<i32>,
    /// Each row's hashed n-gram table row ids, [`NgramSpec::n_ids`] per row in row order, for a
    /// graph that reads [`BatchInput::NgramRows`] or the table rows they name,
    /// [`BatchInput::NgramEmbd`] (filled with [`NgramSpec::row_ids`]; empty otherwise).
    ///
    /// [`NgramSpec::n_ids`]: bloomery_plugin_api::ngram::NgramSpec::n_ids
    /// [`NgramSpec::row_ids`]: bloomery_plugin_api::ngram::NgramSpec::row_ids
    pub ngram_rows: Vec<i32>,
    /// Which output rows a [`crate::readout::Readout::Split`] pass runs the output head on,
    /// indices into `output_rows` (empty for every other readout).
    pub logit_rows: Vec<i32>,
}

/// The largest output moved to host memory by the pass itself; larger ones (every row's logits
/// of a long prompt) are read from the device after it, so that no executor pins much memory.
const STAGED_OUTPUT_MAX: u64 = 16 << 20;

/// Page-locked host memory the device's calls use in place ([`Device::alloc_shared`]).
struct Staged {
    buffer: Buffer,
    /// The host address of its bytes.
    host: usize,
}

impl Staged {
    /// Allocates `bytes` where `device` can copy `dtype` values with a call (None where it cannot,
    /// or has no such memory: the executor then copies with the device's own reads and writes).
    fn try_alloc(device: &Arc<Device>, bytes: u64, dtype: DType) -> Option<Staged> {
        let copies = device
            .capabilities
            .iter()
            .any(|s| s.op == OpKind::Copy && s.dtypes.contains(&dtype));
        if !copies {
            return None;
        }
        match device.alloc_shared(bytes) {
            Ok((buffer, host)) => Some(Staged { buffer, host }),
            Err(e) => {
                tracing::debug!("no page-locked staging of {bytes} bytes: {e}");
                None
            }
        }
    }
}

/// Host-side facts the executor resolves graph tensors with.
pub struct Bindings<'a> {
    /// Weight `i` of the model, resolved.
    pub weights: &'a [TensorRef],
    /// State buffer `i` of the model, resolved.
    pub state: &'a [TensorRef],
    /// Routed experts split between the card and the host, when some live on the host.
    pub tier: Option<&'a ExpertTier>,
    /// Per state buffer `i`, the per-row copies a verify pass writes (`[row_elems, rows]`, rows
    /// as many as the longest verify pass), when made.
    pub row_states: &'a [Option<TensorRef>],
    /// The hashed n-gram tables the host gathers [`BatchInput::NgramEmbd`] from, when the model
    /// has any.
    pub ngram: Option<&'a Arc<NgramTables>>,
}

/// Whether an executor's calls run one by one or as a captured device graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// Not captured yet (graphs wanted, no pass has run).
    Fresh,
    /// One eager pass has run (the device's scratch has its size): the next pass captures.
    Warm,
    /// Captured: every pass replays this device graph.
    Captured(u64),
    /// Eager for good (graphs off, or the device cannot capture these calls).
    Eager,
}

/// A MoE call whose layer's whole stacks (or one part of its experts) are copied to the card
/// before it runs.
struct Streamed {
    /// The call's index.
    at: usize,
    /// Its tier layer.
    layer: usize,
    /// The staging set it is copied into.
    set: usize,
    /// The copies into the staging set, per stack.
    uploads: Vec<Upload>,
}

/// A prepared graph.
pub struct Executor {
    /// The shape it was built for.
    pub shape: BatchShape,
    calls: Vec<OpCall>,
    hosted: Vec<HostedMoe>,
    /// MoE calls whose layers' whole stacks (or expert parts) are copied to the card first.
    /// Consecutive layers take turns over the staging sets, and a layer's parts over the
    /// parts of its set.
    streamed: Vec<Streamed>,
    /// Staging sets times parts: the copies in flight, each into its own memory.
    staging_slots: usize,
    /// Where a streamed call's two halves write before the add that sums them.
    _part_out: Option<Buffer>,
    /// What the staging sets hold between prompts, when this executor streams layers or reads
    /// lent ones.
    lending: Option<Arc<Lending>>,
    /// Whether MoE calls read layers lent a staging set (restored before each pass).
    reads_lent: bool,
    host: Option<Arc<Device>>,
    /// Where host-expert layers count their routing.
    residency: Option<Arc<Mutex<Residency>>>,
    /// The bus share's size, when a layer has a share (one-row passes time themselves for it).
    bus_balance: Option<Arc<Mutex<BusBalance>>>,
    /// The disk tier host experts are read into, when host RAM cannot hold them.
    disk: Option<Arc<DiskTier>>,
    /// The n-gram tables [`BatchInput::NgramEmbd`] is gathered from.
    ngram: Option<Arc<NgramTables>>,
    /// Time spent per phase of the host-expert layers (`BLOOMERY_TIER_PROFILE=1`).
    tier_profile: Option<Mutex<TierTimes>>,
    /// The inputs, each at its offset in `input_buffer`.
    inputs: Vec<(BatchInput, TensorRef)>,
    input_buffer: Buffer,
    /// Host memory laid out as `input_buffer`, copied to it by the first call.
    input_stage: Option<Staged>,
    /// The outputs, with the host memory the last calls copy each to (where staged).
    outputs: Vec<(String, TensorRef, Option<Staged>)>,
    /// Per segment of calls between host work (one segment without host experts).
    replay: Mutex<Vec<Replay>>,
    /// Whether the device's queue can wait on a word the host writes (asked by the first tiered
    /// pass that could submit ahead).
    queue_waits: std::sync::OnceLock<bool>,
    device: Arc<Device>,
    arena: Option<Arc<Buffer>>,
    /// Bytes of the arena this pass's plan needs (at most the arena's).
    planned: u64,
}

/// Where a pass's activation arena comes from.
pub enum ArenaSource<'a> {
    /// An allocation of its own.
    Own,
    /// A buffer shared with other executors, replaced by one at least twice as large when this
    /// pass needs more (the executors holding the smaller one keep it). Sound because a model's
    /// passes run one at a time, each waited for and its outputs read before the next is
    /// submitted.
    Shared(&'a mut Option<Arc<Buffer>>),
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Some(t) = self.tier_profile.as_ref().and_then(|t| t.lock().ok()) {
            t.report(self.shape.n_rows);
        }
        if let Ok(states) = self.replay.lock() {
            for state in states.iter() {
                if let Replay::Captured(g) = *state {
                    if let Err(e) = self.device.release_graph(g) {
                        tracing::warn!("releasing a device graph: {e}");
                    }
                }
            }
        }
    }
}

impl Executor {
    /// The resolved op calls, in the order they run.
    pub fn calls(&self) -> &[OpCall] {
        &self.calls
    }

    /// The activation arena this pass's intermediates use (shared or its own): its handle and
    /// bytes.
    pub fn arena(&self) -> Option<(u64, u64)> {
        self.arena.as_ref().map(|a| (a.handle, a.bytes))
    }

    /// Bytes of the arena this pass's plan needs (an arena of its own would hold this many).
    pub fn arena_planned(&self) -> u64 {
        self.planned
    }

    /// Checks the graph against the device's kernels, plans and allocates its memory (its arena
    /// from `arena`), and resolves every op call. With `graphs`, the second pass captures the
    /// calls into a device graph and later passes replay it (where the device can capture;
    /// eager otherwise).
    pub fn prepare(
        device: &Arc<Device>,
        shape: BatchShape,
        graph: &Graph,
        bind: &Bindings<'_>,
        graphs: bool,
        arena: ArenaSource<'_>,
    ) -> Result<Executor, ExecError> {
        let missing = missing_kernels(graph, &device.capabilities);
        if !missing.is_empty() {
            return Err(ExecError::MissingKernels {
                plugin: device.plugin.clone(),
                missing,
            });
        }
        let plan = plan_arena(graph).map_err(ExecError::BadGraph)?;
        let alloc = |bytes: u64| {
            device
                .alloc(bytes)
                .map(Arc::new)
                .map_err(dev("allocating the activation arena"))
        };
        let arena = match arena {
            _ if plan.size == 0 => None,
            ArenaSource::Own => Some(alloc(plan.size)?),
            ArenaSource::Shared(shared) => match shared {
                Some(a) if a.bytes >= plan.size => Some(Arc::clone(a)),
                _ => {
                    // At least twice the last: the arenas older executors keep add up to less
                    // than the newest.
                    let last = shared.as_ref().map_or(0, |a| a.bytes);
                    let a = alloc(plan.size.max(2 * last))?;
                    *shared = Some(Arc::clone(&a));
                    Some(a)
                }
            },
        };
        let n = graph.tensors.len();
        let mut refs: Vec<Option<TensorRef>> = vec![None; n];
        let (input_offsets, input_bytes) = input_layout(graph)?;
        let input_buffer = device
            .alloc(input_bytes)
            .map_err(dev("allocating the inputs"))?;
        let input_stage = Staged::try_alloc(device, input_bytes, DType::I32);
        let mut inputs = Vec::new();
        // Resolve non-views first, then views (whose bases precede them or not).
        for (i, d) in graph.tensors.iter().enumerate() {
            let r = match d.source {
                TensorSource::Weight { index } => {
                    let w = *bind.weights.get(index as usize).ok_or_else(|| {
                        ExecError::BadGraph(format!(
                            "`{}` names weight {index} of {}",
                            d.name,
                            bind.weights.len()
                        ))
                    })?;
                    // Stacks of a tiered layer hold only the card's experts.
                    let tiered = bind.tier.is_some() && w.ne[2] != d.ne[2];
                    if w.ne[..2] != d.ne[..2]
                        || w.ne[3] != d.ne[3]
                        || w.dtype != d.dtype
                        || (w.ne[2] != d.ne[2] && !tiered)
                    {
                        return Err(ExecError::BadGraph(format!(
                            "`{}` declared {} {:?}, the file has {} {:?}",
                            d.name, d.dtype, d.ne, w.dtype, w.ne
                        )));
                    }
                    w
                }
                TensorSource::State { index } => {
                    *bind.state.get(index as usize).ok_or_else(|| {
                        ExecError::BadGraph(format!(
                            "`{}` names state {index} of {}",
                            d.name,
                            bind.state.len()
                        ))
                    })?
                }
                TensorSource::RowStates { index } => {
                    let r = bind.row_states.get(index as usize).copied().flatten();
                    let r = r.ok_or_else(|| {
                        ExecError::BadGraph(format!(
                            "`{}` names the row states of state {index}, which are not made",
                            d.name
                        ))
                    })?;
                    if d.ne[0] != r.ne[0] || d.ne[1] > r.ne[1] || d.ne[2..] != [1, 1] {
                        return Err(ExecError::BadGraph(format!(
                            "`{}` declared {:?}, the row states hold {:?}",
                            d.name, d.ne, r.ne
                        )));
                    }
                    TensorRef {
                        ne: d.ne,
                        nb: d.nb,
                        ..r
                    }
                }
                TensorSource::Input { input } => {
                    let r = TensorRef {
                        buffer: input_buffer.handle,
                        offset: input_offsets[i],
                        dtype: d.dtype,
                        ne: d.ne,
                        nb: d.nb,
                    };
                    inputs.push((input, r));
                    r
                }
                TensorSource::Intermediate => match (plan.offsets[i], &arena) {
                    (Some(offset), Some(a)) => TensorRef {
                        buffer: a.handle,
                        offset,
                        dtype: d.dtype,
                        ne: d.ne,
                        nb: d.nb,
                    },
                    _ => continue,
                },
                TensorSource::View { .. } => continue,
            };
            refs[i] = Some(r);
        }
        for (i, d) in graph.tensors.iter().enumerate() {
            if !matches!(d.source, TensorSource::View { .. }) {
                continue;
            }
            let (mut b, mut offset, mut hops) = (i, 0u64, 0);
            while let TensorSource::View { base, offset: o } = graph.tensors[b].source {
                offset += o;
                b = base.0 as usize;
                hops += 1;
                if b >= n || hops > n {
                    return Err(ExecError::BadGraph(format!(
                        "view `{}` has no base",
                        d.name
                    )));
                }
            }
            if let Some(base) = refs[b] {
                refs[i] = Some(TensorRef {
                    buffer: base.buffer,
                    offset: base.offset + offset,
                    dtype: d.dtype,
                    ne: d.ne,
                    nb: d.nb,
                });
            }
        }
        let get = |t: u32| -> Result<TensorRef, ExecError> {
            refs.get(t as usize).copied().flatten().ok_or_else(|| {
                ExecError::BadGraph(format!("tensor {t} is used but never produced"))
            })
        };
        let mut calls: Vec<OpCall> = Vec::with_capacity(graph.nodes.len() + 2);
        if let Some(stage) = &input_stage {
            let from = stage.buffer.tensor(flat(DType::I32, 0, input_bytes / 4));
            calls.extend(flat_copies(from, input_buffer.tensor(from)));
        }
        let mut hosted = Vec::new();
        // Where the calls after the last hosted MoE call (and its adds) begin.
        let mut after_hosted = 0;
        let mut streamed = Vec::new();
        let mut reads_lent = false;
        // Batches stream tier layers into the staging sets; a tier without them (every expert
        // on the cards, some on a second one) runs every pass split.
        let stream =
            shape.n_rows >= STREAM_MIN_ROWS && bind.tier.is_some_and(|t| !t.staging.is_empty());
        // One buffer for every streamed layer's halves: the calls run in order on the card,
        // each layer's add reading it before the next layer's halves write it.
        let part_out = match bind.tier {
            Some(t) if stream && t.staging_parts > 1 => {
                let bytes = graph
                    .nodes
                    .iter()
                    .filter(|n| matches!(n.op, Op::MoeExperts(_)))
                    .map(|n| 2 * graph.tensors[n.dst.0 as usize].ne.iter().product::<u64>() * 4)
                    .max()
                    .unwrap_or(0);
                Some(
                    device
                        .alloc(bytes)
                        .map_err(dev("allocating the streamed parts' output"))?,
                )
            }
            _ => None,
        };
        // With the disk tier reading ahead, each hosted layer's segment also guesses the next
        // tier layer's experts with that layer's router.
        let guesses = bind
            .tier
            .and_then(|t| t.disk.as_ref())
            .map_or(0, |d| d.guesses_per_row());
        let guessing = guesses > 0;
        let routers = if guessing {
            moe_routers(graph)
        } else {
            Default::default()
        };
        // The tier layer of each MoE node with host experts, by node index.
        let tier_of = |node: &bloomery_plugin_api::graph::Node| {
            let w = match graph.tensors.get(node.srcs.get(3)?.0 as usize)?.source {
                TensorSource::Weight { index } => index as usize,
                _ => return None,
            };
            Some(bind.tier?.layer(w)?.0)
        };
        let next_router = |j: usize, i: usize| -> Result<Option<NextRouter>, ExecError> {
            // A lent layer's experts are on the card in passes that stream nothing.
            if bind.tier.is_some_and(|t| t.lending.set_of(i + 1).is_some()) {
                return Ok(None);
            }
            let Some(n) = graph
                .nodes
                .iter()
                .enumerate()
                .skip(j + 1)
                .find_map(|(n, node)| {
                    (matches!(node.op, Op::MoeExperts(_)) && tier_of(node) == Some(i + 1))
                        .then_some(n)
                })
            else {
                return Ok(None);
            };
            let Some(&(w, b, params)) = routers.get(&n) else {
                return Ok(None);
            };
            Ok(Some(NextRouter {
                weights: get(w.0)?,
                bias: b.map(|b| get(b.0)).transpose()?,
                params: RouterParams {
                    k: params.k.min(guesses),
                    ..params
                },
                layer: i + 1,
            }))
        };
        for (j, node) in graph.nodes.iter().enumerate() {
            if node.srcs.len() > MAX_SRCS {
                return Err(ExecError::BadGraph(format!(
                    "a node has {} sources",
                    node.srcs.len()
                )));
            }
            let mut srcs = [TensorRef::default(); MAX_SRCS];
            for (k, s) in node.srcs.iter().enumerate() {
                srcs[k] = get(s.0)?;
            }
            let mut call = OpCall {
                op: node.op,
                n_srcs: node.srcs.len() as u32,
                srcs,
                dst: get(node.dst.0)?,
            };
            let first_stack =
                node.srcs
                    .get(3)
                    .and_then(|s| match graph.tensors[s.0 as usize].source {
                        TensorSource::Weight { index } => Some(index as usize),
                        _ => None,
                    });
            let mut adds = Vec::new();
            let hosted_before = hosted.len();
            if let (Op::MoeExperts(_), Some(tier), Some(w)) = (node.op, bind.tier, first_stack) {
                // The tier layer, and the staging set lent to it if any.
                match tier.layer(w).map(|(i, l)| (i, l, tier.lending.set_of(i))) {
                    Some((i, layer, _)) if stream => {
                        let set = tier.stream_set(i);
                        let parts = stream_parts(tier, layer, set, call, part_out.as_ref())?;
                        // The first part's call stands for the call; the others follow it.
                        let at = calls.len();
                        for (p, part) in parts.into_iter().enumerate() {
                            let at = match p {
                                0 => at,
                                _ => at + 1 + adds.len(),
                            };
                            streamed.push(Streamed {
                                at,
                                layer: i,
                                set,
                                uploads: part.uploads,
                            });
                            match p {
                                0 => call = part.call,
                                _ => adds.push(part.call),
                            }
                            adds.extend(part.add);
                        }
                    }
                    Some((_, layer, Some(set))) => {
                        // Its stacks wait in the staging set lent to it: no copies to make.
                        stream_moe(tier, layer, set, &mut call)?;
                        reads_lent = true;
                    }
                    Some((i, layer, None)) => {
                        // The packing and its signal go right after the last call writing the
                        // MoE call's inputs: calls after that (a shared expert) run on the card
                        // while the host computes its experts.
                        let floor = after_hosted;
                        let inputs = [call.srcs[0], call.srcs[1], call.srcs[2]];
                        let pack_at = calls[floor..]
                            .iter()
                            .rposition(|c| inputs.iter().any(|t| c.dst.shares_bytes(t)))
                            .map_or(floor, |p| floor + p + 1);
                        let next = if guessing { next_router(j, i)? } else { None };
                        let (h, around) =
                            host_moe(device, tier, (i, layer), &mut call, (calls.len(), next))?;
                        calls.splice(pack_at..pack_at, around.pack);
                        adds = around.adds;
                        hosted.push(h);
                    }
                    None => {}
                }
            }
            calls.push(call);
            calls.extend(adds);
            if hosted.len() > hosted_before {
                after_hosted = calls.len();
            }
        }
        let mut outputs = Vec::with_capacity(graph.outputs.len());
        for o in graph.outputs.iter() {
            let r = get(o.tensor.0)?;
            let staged = stage_output(device, &mut calls, r);
            outputs.push((o.name.to_string(), r, staged));
        }
        // With host experts each stretch of card calls between host work is its own graph, and
        // so is each layer's bus share (after the stretches).
        let segments = (2 * hosted.len()).max(streamed.len()) + 1;
        Ok(Executor {
            shape,
            calls,
            host: (!hosted.is_empty())
                .then(|| bind.tier.map(|t| Arc::clone(&t.host)))
                .flatten(),
            residency: bind.tier.map(|t| Arc::clone(&t.residency)),
            bus_balance: bind
                .tier
                .filter(|_| hosted.iter().any(|h| h.bus.is_some()))
                .map(|t| Arc::clone(&t.bus)),
            disk: bind.tier.and_then(|t| t.disk.clone()),
            ngram: bind.ngram.cloned(),
            tier_profile: (!hosted.is_empty()
                && std::env::var_os("BLOOMERY_TIER_PROFILE").is_some_and(|v| v == "1"))
            .then(|| Mutex::new(TierTimes::default())),
            lending: bind
                .tier
                .filter(|_| reads_lent || !streamed.is_empty())
                .map(|t| Arc::clone(&t.lending)),
            reads_lent,
            hosted,
            streamed,
            staging_slots: bind
                .tier
                .map_or(1, |t| t.staging.len() * t.staging_parts.max(1)),
            _part_out: part_out,
            inputs,
            input_buffer,
            input_stage,
            outputs,
            replay: Mutex::new(vec![
                if graphs { Replay::Fresh } else { Replay::Eager };
                segments
            ]),
            queue_waits: std::sync::OnceLock::new(),
            device: Arc::clone(device),
            arena,
            planned: plan.size,
        })
    }

    /// Writes the inputs and runs every call; waits for the device.
    pub fn run(&self, device: &Device, batch: &BatchInputs) -> Result<(), ExecError> {
        self.run_with_hidden(device, batch, &[])
    }

    /// [`Executor::run`] for a graph that also reads hidden rows (`hidden`, `n_embd` f32 a row:
    /// [`BatchInput::Hidden`]).
    pub fn run_with_hidden(
        &self,
        device: &Device,
        batch: &BatchInputs,
        hidden: &[f32],
    ) -> Result<(), ExecError> {
        let mut gathered: Vec<f32>;
        for (kind, r) in &self.inputs {
            let (n, bytes) = match kind {
                BatchInput::Tokens => (batch.tokens.len(), i32_bytes(&batch.tokens)),
                BatchInput::Positions => (batch.positions.len(), i32_bytes(&batch.positions)),
                BatchInput::Slots => (batch.slots.len(), i32_bytes(&batch.slots)),
                BatchInput::OutputRows => (batch.output_rows.len(), i32_bytes(&batch.output_rows)),
                BatchInput::NgramRows => (batch.ngram_rows.len(), i32_bytes(&batch.ngram_rows)),
                BatchInput::LogitRows => (batch.logit_rows.len(), i32_bytes(&batch.logit_rows)),
                BatchInput::Hidden => (hidden.len(), f32_bytes(hidden)),
                BatchInput::NgramEmbd => {
                    gathered = self.gather_ngram(batch, r)?;
                    (gathered.len(), f32_bytes(&gathered))
                }
            };
            if n as u64 != r.elements() {
                return Err(ExecError::BadGraph(format!(
                    "input {kind:?}: {n} values for a tensor of {}",
                    r.elements()
                )));
            }
            match &self.input_stage {
                Some(stage) => {
                    // SAFETY: the stage holds `input_layout`'s bytes, of which this input's
                    // `bytes` (its element count checked above) start at `r.offset`; no call
                    // reads the stage now: the previous pass ended with the device waited for.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            (stage.host + r.offset as usize) as *mut u8,
                            bytes.len(),
                        )
                    }
                }
                None => device
                    .write(&self.input_buffer, r.offset, bytes)
                    .map_err(dev("writing inputs"))?,
            }
        }
        if !self.streamed.is_empty() {
            return self.run_streamed(device);
        }
        if let (Some(lending), true) = (&self.lending, self.reads_lent) {
            lending
                .restore(device)
                .map_err(dev("copying lent layers to the staging sets"))?;
        }
        if let Some(host) = &self.host {
            return self.run_tiered(device, host);
        }
        self.launch(device)?;
        device.sync().map_err(dev("waiting for the device"))
    }

    /// The n-gram table rows `batch`'s ids name, for the input `r` `[width, n_ids, rows]`.
    fn gather_ngram(&self, batch: &BatchInputs, r: &TensorRef) -> Result<Vec<f32>, ExecError> {
        let tables = self.ngram.as_ref().ok_or_else(|| {
            ExecError::BadGraph(
                "the graph reads n-gram table rows; the model declares no table".into(),
            )
        })?;
        if [r.ne[0], r.ne[1]] != [tables.width() as u64, tables.n_ids() as u64] {
            return Err(ExecError::BadGraph(format!(
                "input NgramEmbd {:?}: the tables give {} row ids of {} values a row",
                r.ne,
                tables.n_ids(),
                tables.width()
            )));
        }
        let mut out = vec![0f32; batch.ngram_rows.len() * tables.width()];
        tables
            .gather(&batch.ngram_rows, &mut out)
            .map_err(ExecError::BadGraph)?;
        Ok(out)
    }

    /// Submits the calls: eagerly, or by capturing once and replaying after.
    fn launch(&self, device: &Device) -> Result<(), ExecError> {
        self.launch_segment(device, 0, &self.calls)
    }

    /// Submits segment `seg` (`calls`): eagerly on its first pass, captured on its second and
    /// replayed after (eagerly for good where the device cannot capture).
    fn launch_segment(
        &self,
        device: &Device,
        seg: usize,
        calls: &[OpCall],
    ) -> Result<(), ExecError> {
        if calls.is_empty() {
            return Ok(());
        }
        let mut states = self
            .replay
            .lock()
            .map_err(|_| ExecError::BadGraph("executor state poisoned".into()))?;
        let replay = states
            .get_mut(seg)
            .ok_or_else(|| ExecError::BadGraph(format!("no call segment {seg}")))?;
        match *replay {
            Replay::Captured(g) => device.replay(g).map_err(dev("replaying the device graph")),
            Replay::Fresh | Replay::Eager => {
                if *replay == Replay::Fresh {
                    *replay = Replay::Warm;
                }
                device.run(calls).map_err(dev("running the graph"))
            }
            Replay::Warm => {
                let started = std::time::Instant::now();
                match device.capture(calls) {
                    Ok(g) => {
                        tracing::debug!(
                            "captured {} calls of a pass of {} rows in {:.2} ms",
                            calls.len(),
                            self.shape.n_rows,
                            started.elapsed().as_secs_f64() * 1e3
                        );
                        *replay = Replay::Captured(g);
                        device.replay(g).map_err(dev("replaying the device graph"))
                    }
                    Err(PluginError::Unsupported { .. }) => {
                        *replay = Replay::Eager;
                        device.run(calls).map_err(dev("running the graph"))
                    }
                    Err(e) => Err(dev("capturing the device graph")(e)),
                }
            }
        }
    }

    /// The elements the graph's batch input `input` holds (`None`: the graph reads no such
    /// input): the width of a draft graph's hidden rows times its rows.
    pub fn input_elements(&self, input: BatchInput) -> Option<u64> {
        self.inputs
            .iter()
            .find(|(kind, _)| *kind == input)
            .map(|(_, r)| r.elements())
    }

    /// The names of the graph's outputs, in its order.
    pub fn output_names(&self) -> impl Iterator<Item = &str> {
        self.outputs.iter().map(|(n, ..)| n.as_str())
    }

    /// Reads an i32 output by name.
    pub fn read_i32(&self, device: &Device, name: &str) -> Result<Vec<i32>, ExecError> {
        let (_, r, staged) = self
            .outputs
            .iter()
            .find(|(n, ..)| n == name)
            .ok_or_else(|| ExecError::BadGraph(format!("the graph has no output `{name}`")))?;
        if r.dtype != DType::I32 || !r.is_contiguous() {
            return Err(ExecError::BadGraph(format!(
                "output `{name}` is not contiguous i32"
            )));
        }
        let n = r.elements() as usize * 4;
        let mut bytes = vec![0u8; n];
        match staged {
            Some(s) => {
                // SAFETY: the stage holds the output's n bytes (allocated for its span), written
                // by the pass, which `run` waited for.
                let stage = unsafe { std::slice::from_raw_parts(s.host as *const u8, n) };
                bytes.copy_from_slice(stage);
            }
            None => device
                .read(r.buffer, r.offset, &mut bytes)
                .map_err(dev("reading outputs"))?,
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Reads an f32 output by name.
    pub fn read_f32(&self, device: &Device, name: &str) -> Result<Vec<f32>, ExecError> {
        let (_, r, staged) = self
            .outputs
            .iter()
            .find(|(n, ..)| n == name)
            .ok_or_else(|| ExecError::BadGraph(format!("the graph has no output `{name}`")))?;
        if r.dtype != DType::F32 || !r.is_contiguous() {
            return Err(ExecError::BadGraph(format!(
                "output `{name}` is not contiguous f32"
            )));
        }
        let n = r.elements() as usize;
        if let Some(s) = staged {
            let mut out = Vec::<f32>::with_capacity(n);
            // SAFETY: the stage holds the output's n f32 (allocated for its span), written by the
            // pass, which `run` waited for; `out` has room for n f32 and they are all set here
            // (a byte copy: the host's order, as the device wrote them).
            unsafe {
                std::ptr::copy_nonoverlapping(s.host as *const u8, out.as_mut_ptr().cast(), n * 4);
                out.set_len(n);
            }
            return Ok(out);
        }
        let mut bytes = vec![0u8; n * 4];
        device
            .read(r.buffer, r.offset, &mut bytes)
            .map_err(dev("reading outputs"))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Gives output `r` page-locked host memory that copies appended to `calls` move it to, when it
/// is small, contiguous f32 or i32 and the device can copy it there, so the pass's one wait
/// covers it. (Its last writer writing there itself was slower on the H200: a product's
/// scattered 4-byte stores crossing the bus.) None: the host reads it from the device after the
/// pass.
fn stage_output(device: &Arc<Device>, calls: &mut Vec<OpCall>, r: TensorRef) -> Option<Staged> {
    let bytes = r.span_bytes()?;
    let words = matches!(r.dtype, DType::F32 | DType::I32);
    if !words || !r.is_contiguous() || bytes > STAGED_OUTPUT_MAX {
        return None;
    }
    let staged = Staged::try_alloc(device, bytes, r.dtype)?;
    let from = TensorRef {
        buffer: r.buffer,
        ..flat(r.dtype, r.offset, r.elements())
    };
    calls.extend(flat_copies(from, staged.buffer.tensor(from)));
    Some(staged)
}

/// Each input tensor's offset in one buffer of all inputs (16-byte aligned; 0 for other tensors)
/// and that buffer's size (at least 16 bytes, so that every graph has one).
fn input_layout(graph: &Graph) -> Result<(Vec<u64>, u64), ExecError> {
    let mut offsets = vec![0; graph.tensors.len()];
    let mut total = 0u64;
    for (i, d) in graph.tensors.iter().enumerate() {
        if !matches!(d.source, TensorSource::Input { .. }) {
            continue;
        }
        let TensorSource::Input { input } = d.source else {
            continue;
        };
        if d.dtype != input.dtype() {
            return Err(ExecError::BadGraph(format!(
                "input `{}` is {}, not {}",
                d.name,
                d.dtype,
                input.dtype()
            )));
        }
        let bytes = d
            .dtype
            .row_bytes(d.ne[0])
            .map(|r| r * d.ne[1] * d.ne[2] * d.ne[3])
            .ok_or_else(|| ExecError::BadGraph(format!("input `{}` has no size", d.name)))?;
        offsets[i] = total;
        total += bytes.max(4).next_multiple_of(16);
    }
    Ok((offsets, total.max(16)))
}

/// `n` contiguous 4-byte values (`dtype` I32 or F32) at `offset` (of a buffer set after).
fn flat(dtype: DType, offset: u64, n: u64) -> TensorRef {
    TensorRef {
        buffer: 0,
        offset,
        dtype,
        ne: [n, 1, 1, 1],
        nb: [4, 4 * n, 4 * n, 4 * n],
    }
}

/// Values a row of a staging copy holds: the Copy kernels give each row one block.
const COPY_ROW: u64 = 1024;

/// Copies of the flat run `from` (4-byte values) to `to` (the same run in another buffer) as
/// rows of [`COPY_ROW`] values and one shorter row, so that a long run is copied by many blocks.
fn flat_copies(from: TensorRef, to: TensorRef) -> Vec<OpCall> {
    let n = from.elements();
    let (rows, rest) = (n / COPY_ROW, n % COPY_ROW);
    let mut calls = Vec::with_capacity(2);
    if rows > 0 {
        let ne = [COPY_ROW, rows, 1, 1];
        let nb = [4, 4 * COPY_ROW, 4 * COPY_ROW * rows, 4 * COPY_ROW * rows];
        let bulk = |t: TensorRef| TensorRef { ne, nb, ..t };
        calls.push(OpCall::new(Op::Copy, &[bulk(from)], bulk(to)));
    }
    if rest > 0 {
        let tail = |t: TensorRef| TensorRef {
            buffer: t.buffer,
            ..flat(t.dtype, t.offset + 4 * COPY_ROW * rows, rest)
        };
        calls.push(OpCall::new(Op::Copy, &[tail(from)], tail(to)));
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copies of a staged run cover it exactly once: whole rows, then the rest.
    #[test]
    fn flat_copies_cover_the_run_once() {
        let at = |buffer: u64, offset: u64, n: u64| TensorRef {
            buffer,
            ..flat(DType::F32, offset, n)
        };
        for n in [1, 1023, 1024, 2500, 248_320] {
            let calls = flat_copies(at(1, 64, n), at(2, 0, n));
            let mut covered = Vec::new();
            for c in &calls {
                let (s, d) = (c.srcs()[0], c.dst);
                assert!(s.is_contiguous() && d.is_contiguous(), "{n}: {c:?}");
                assert_eq!((s.ne, s.buffer, d.buffer), (d.ne, 1, 2), "{n}");
                assert_eq!(s.offset, d.offset + 64, "{n}");
                covered.push((d.offset, d.elements()));
            }
            let mut end = 0;
            for (offset, elements) in covered {
                assert_eq!(offset, end, "{n}: a gap or an overlap");
                end += 4 * elements;
            }
            assert_eq!(end, 4 * n, "{n}");
            assert!(calls.len() <= 2 && calls.iter().all(|c| c.srcs()[0].ne[0] <= COPY_ROW));
        }
    }
}
