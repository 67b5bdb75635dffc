//! Turns a graph into resolved op calls over device memory, and runs them.
//!
//! Built once per batch shape: the arena for intermediates and the input buffers are allocated
//! here, every tensor is resolved to a `TensorRef`, and each step only writes the inputs, runs the
//! prepared calls and reads the outputs. Nothing on the step path allocates device memory.

use std::sync::{Arc, Mutex};

use bloomery_plugin_api::graph::{BatchInput, BatchShape, Graph, TensorSource};
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef, MAX_SRCS};
use bloomery_plugin_api::{DType, PluginError};

use super::check::{missing_kernels, MissingKernel};
use super::device::{Buffer, Device};
use super::plan::plan_arena;
use crate::tiering::residency::Residency;
use crate::tiering::{DiskTier, ExpertTier, HostSlice, TierLayer, STREAM_MIN_ROWS};

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
    /// For each row, its token and the ones before it, newest first (-1 before the start), as
    /// many per row as the graph's `TokenHistory` input declares.
    pub history: Vec<i32>,
}

/// Host-side facts the executor resolves graph tensors with.
pub struct Bindings<'a> {
    /// Weight `i` of the model, resolved.
    pub weights: &'a [TensorRef],
    /// State buffer `i` of the model, resolved.
    pub state: &'a [TensorRef],
    /// Routed experts split between the card and the host, when some live on the host.
    pub tier: Option<&'a ExpertTier>,
}

/// A MoE call whose layer has host experts: the card computes its experts (call `at`, with the
/// card's expert map), the host device computes the rest from the same inputs, and its output is
/// added on the card.
struct HostedMoe {
    /// Index of the card's MoE call in `calls`.
    at: usize,
    /// Index of its layer among the tier's layers (for routing counts).
    tier_layer: usize,
    /// Whether the card holds any of this layer's experts (else call `at` is skipped and the
    /// host's output is written straight to its destination).
    card_part: bool,
    /// The call's inputs on the card: x, ids, weights.
    card_inputs: [TensorRef; 3],
    /// The same inputs on the host device, and the host call's output.
    host_inputs: [(Buffer, u64); 3],
    host_out: Buffer,
    host_call: OpCall,
    /// The host's output on the card, the card's own part, and the call adding the two into
    /// the MoE call's destination.
    card_out: Buffer,
    _card_part_out: Buffer,
    add: OpCall,
    /// The card MoE call's destination.
    dst: TensorRef,
}

/// Accumulated wall time of the phases of host-expert layers, printed when the executor drops.
#[derive(Default)]
struct TierTimes {
    /// Card work up to the MoE call, and waiting for it.
    card: std::time::Duration,
    /// Inputs from the card to the host.
    inputs: std::time::Duration,
    /// The host's experts.
    host: std::time::Duration,
    /// The host's output back to the card and the add.
    output: std::time::Duration,
    /// Layers timed.
    layers: u64,
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

/// A prepared graph.
pub struct Executor {
    /// The shape it was built for.
    pub shape: BatchShape,
    calls: Vec<OpCall>,
    hosted: Vec<HostedMoe>,
    /// MoE calls whose layers' whole stacks are copied to the card first: the call's index and
    /// (staging buffer, file bytes) per stack.
    streamed: Vec<(usize, Vec<(u64, HostSlice)>)>,
    host: Option<Arc<Device>>,
    /// Where host-expert layers count their routing.
    residency: Option<Arc<Mutex<Residency>>>,
    /// The disk tier host experts are read into, when host RAM cannot hold them.
    disk: Option<Arc<DiskTier>>,
    /// Time spent per phase of the host-expert layers (`BLOOMERY_TIER_PROFILE=1`).
    tier_profile: Option<Mutex<TierTimes>>,
    inputs: Vec<(BatchInput, Buffer, TensorRef)>,
    outputs: Vec<(String, TensorRef)>,
    /// Per segment of calls between host work (one segment without host experts).
    replay: Mutex<Vec<Replay>>,
    device: Arc<Device>,
    _arena: Option<Buffer>,
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Some(t) = self.tier_profile.as_ref().and_then(|t| t.lock().ok()) {
            if t.layers > 0 {
                let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                eprintln!(
                    "host-expert layers, {} rows: {} layer passes; card {:.1} ms, inputs {:.1} ms, \
                     host experts {:.1} ms, output and add {:.1} ms",
                    self.shape.n_rows,
                    t.layers,
                    ms(t.card),
                    ms(t.inputs),
                    ms(t.host),
                    ms(t.output)
                );
            }
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
    /// Checks the graph against the device's kernels, plans and allocates its memory, and resolves
    /// every op call. With `graphs`, the second pass captures the calls into a device graph and
    /// later passes replay it (where the device can capture; eager otherwise).
    pub fn prepare(
        device: &Arc<Device>,
        shape: BatchShape,
        graph: &Graph,
        bind: &Bindings<'_>,
        graphs: bool,
    ) -> Result<Executor, ExecError> {
        let missing = missing_kernels(graph, &device.capabilities);
        if !missing.is_empty() {
            return Err(ExecError::MissingKernels {
                plugin: device.plugin.clone(),
                missing,
            });
        }
        let plan = plan_arena(graph).map_err(ExecError::BadGraph)?;
        let arena = if plan.size > 0 {
            Some(
                device
                    .alloc(plan.size)
                    .map_err(dev("allocating the activation arena"))?,
            )
        } else {
            None
        };
        let n = graph.tensors.len();
        let mut refs: Vec<Option<TensorRef>> = vec![None; n];
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
                TensorSource::Input { input } => {
                    let bytes = d
                        .dtype
                        .row_bytes(d.ne[0])
                        .map(|r| r * d.ne[1] * d.ne[2] * d.ne[3])
                        .ok_or_else(|| {
                            ExecError::BadGraph(format!("input `{}` has no size", d.name))
                        })?;
                    let buf = device
                        .alloc(bytes.max(4))
                        .map_err(dev("allocating an input"))?;
                    let r = TensorRef {
                        buffer: buf.handle,
                        offset: 0,
                        dtype: d.dtype,
                        ne: d.ne,
                        nb: d.nb,
                    };
                    inputs.push((input, buf, r));
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
        let mut calls = Vec::with_capacity(graph.nodes.len());
        let mut hosted = Vec::new();
        let mut streamed = Vec::new();
        let stream = shape.n_rows >= STREAM_MIN_ROWS;
        for node in graph.nodes.iter() {
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
            if let (Op::MoeExperts(_), Some(tier), Some(w)) = (node.op, bind.tier, first_stack) {
                match tier.layer(w) {
                    Some((_, layer)) if stream => {
                        streamed.push((calls.len(), stream_moe(tier, layer, &mut call)?));
                    }
                    Some((i, layer)) => {
                        let mut h = host_moe(device, tier, layer, &mut call, calls.len())?;
                        h.tier_layer = i;
                        hosted.push(h);
                    }
                    None => {}
                }
            }
            calls.push(call);
        }
        let outputs = graph
            .outputs
            .iter()
            .map(|o| Ok((o.name.to_string(), get(o.tensor.0)?)))
            .collect::<Result<Vec<_>, ExecError>>()?;
        // With host experts each stretch of card calls between host work is its own graph.
        let segments = hosted.len().max(streamed.len()) + 1;
        Ok(Executor {
            shape,
            calls,
            host: (!hosted.is_empty())
                .then(|| bind.tier.map(|t| Arc::clone(&t.host)))
                .flatten(),
            residency: bind.tier.map(|t| Arc::clone(&t.residency)),
            disk: bind.tier.and_then(|t| t.disk.clone()),
            tier_profile: (!hosted.is_empty()
                && std::env::var_os("BLOOMERY_TIER_PROFILE").is_some_and(|v| v == "1"))
            .then(|| Mutex::new(TierTimes::default())),
            hosted,
            streamed,
            inputs,
            outputs,
            replay: Mutex::new(vec![
                if graphs { Replay::Fresh } else { Replay::Eager };
                segments
            ]),
            device: Arc::clone(device),
            _arena: arena,
        })
    }

    /// Writes the inputs and runs every call; waits for the device.
    pub fn run(&self, device: &Device, batch: &BatchInputs) -> Result<(), ExecError> {
        for (kind, buf, r) in &self.inputs {
            let data: &[i32] = match kind {
                BatchInput::Tokens => &batch.tokens,
                BatchInput::Positions => &batch.positions,
                BatchInput::Slots => &batch.slots,
                BatchInput::OutputRows => &batch.output_rows,
                BatchInput::TokenHistory => &batch.history,
            };
            if data.len() as u64 != r.elements() {
                return Err(ExecError::BadGraph(format!(
                    "input {kind:?}: {} values for a tensor of {}",
                    data.len(),
                    r.elements()
                )));
            }
            device
                .write(buf, 0, i32_bytes(data))
                .map_err(dev("writing inputs"))?;
        }
        if !self.streamed.is_empty() {
            return self.run_streamed(device);
        }
        if let Some(host) = &self.host {
            return self.run_tiered(device, host);
        }
        self.launch(device)?;
        device.sync().map_err(dev("waiting for the device"))
    }

    /// Runs the calls with the host's part of every tiered MoE layer in between: the card runs
    /// up to the layer's MoE call, its inputs come to the host, the card computes its experts
    /// while the host computes its own, and the host's output is added on the card.
    fn run_tiered(&self, device: &Device, host: &Device) -> Result<(), ExecError> {
        let mut start = 0;
        let mut times = TierTimes::default();
        let mut clock = std::time::Instant::now();
        let mut lap = |d: &mut std::time::Duration| {
            let now = std::time::Instant::now();
            *d += now - clock;
            clock = now;
        };
        for (seg, h) in self.hosted.iter().enumerate() {
            self.launch_segment(device, seg, &self.calls[start..h.at])?;
            device
                .sync()
                .map_err(dev("waiting for the card before host experts"))?;
            lap(&mut times.card);
            for (i, (r, (buf, bytes))) in h.card_inputs.iter().zip(&h.host_inputs).enumerate() {
                let mut v = vec![0u8; *bytes as usize];
                device
                    .read(r.buffer, r.offset, &mut v)
                    .map_err(dev("reading host experts' inputs"))?;
                // Input 1 holds the routed expert ids: count them, and with the disk tier bring
                // the host's ones into the arena.
                if let (1, Some(res)) = (i, &self.residency) {
                    let ids: Vec<i32> = v
                        .chunks_exact(4)
                        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    let (host_ids, n_expert) = {
                        let mut res = res
                            .lock()
                            .map_err(|_| ExecError::BadGraph("residency state poisoned".into()))?;
                        res.record(h.tier_layer, &ids);
                        let slot_of = &res.layers[h.tier_layer].slot_of;
                        let host_ids: Vec<u32> = ids
                            .iter()
                            .filter_map(|&e| usize::try_from(e).ok())
                            .filter(|&e| slot_of.get(e).is_some_and(|&s| s < 0))
                            .map(|e| e as u32)
                            .collect();
                        (host_ids, slot_of.len())
                    };
                    if let Some(disk) = &self.disk {
                        let map = disk
                            .arena
                            .lock()
                            .map_err(|_| ExecError::BadGraph("disk tier poisoned".into()))?
                            .ensure(
                                h.tier_layer,
                                &host_ids,
                                n_expert,
                                &disk.sources[h.tier_layer],
                            )
                            .map_err(ExecError::BadGraph)?;
                        let map_ref = h.host_call.srcs[h.host_call.n_srcs as usize - 1];
                        let bytes: Vec<u8> = map.iter().flat_map(|x| x.to_le_bytes()).collect();
                        host.write_handle(map_ref.buffer, map_ref.offset, &bytes)
                            .map_err(dev("writing the disk tier's expert map"))?;
                    }
                }
                host.write(buf, 0, &v)
                    .map_err(dev("writing host experts' inputs"))?;
            }
            if h.card_part {
                device
                    .run(&self.calls[h.at..=h.at])
                    .map_err(dev("running the card's experts"))?;
            }
            lap(&mut times.inputs);
            host.run(std::slice::from_ref(&h.host_call))
                .map_err(dev("running host experts"))?;
            host.sync().map_err(dev("waiting for host experts"))?;
            lap(&mut times.host);
            let mut out = vec![0u8; h.host_out.bytes as usize];
            host.read(h.host_out.handle, 0, &mut out)
                .map_err(dev("reading host experts' output"))?;
            if h.card_part {
                device
                    .write(&h.card_out, 0, &out)
                    .map_err(dev("writing host experts' output"))?;
                device
                    .run(std::slice::from_ref(&h.add))
                    .map_err(dev("adding host experts' output"))?;
            } else {
                device
                    .write_handle(h.dst.buffer, h.dst.offset, &out)
                    .map_err(dev("writing host experts' output"))?;
            }
            lap(&mut times.output);
            times.layers += 1;
            start = h.at + 1;
        }
        if let Some(t) = self
            .tier_profile
            .as_ref()
            .and_then(|t| t.lock().ok())
            .as_mut()
        {
            t.card += times.card;
            t.inputs += times.inputs;
            t.host += times.host;
            t.output += times.output;
            t.layers += times.layers;
        }
        self.launch_segment(device, self.hosted.len(), &self.calls[start..])?;
        device.sync().map_err(dev("waiting for the device"))
    }

    /// Runs the calls with each tiered layer's whole stacks copied into the card's staging
    /// buffers just before its MoE call (copies and calls are ordered on the card's stream).
    fn run_streamed(&self, device: &Device) -> Result<(), ExecError> {
        let mut start = 0;
        for (seg, (at, uploads)) in self.streamed.iter().enumerate() {
            self.launch_segment(device, seg, &self.calls[start..*at])?;
            for (handle, slice) in uploads {
                device
                    .write_handle(*handle, 0, slice.bytes())
                    .map_err(dev("streaming host experts to the card"))?;
            }
            start = *at;
        }
        self.launch_segment(device, self.streamed.len(), &self.calls[start..])?;
        device.sync().map_err(dev("waiting for the device"))
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
            Replay::Warm => match device.capture(calls) {
                Ok(g) => {
                    *replay = Replay::Captured(g);
                    device.replay(g).map_err(dev("replaying the device graph"))
                }
                Err(PluginError::Unsupported { .. }) => {
                    *replay = Replay::Eager;
                    device.run(calls).map_err(dev("running the graph"))
                }
                Err(e) => Err(dev("capturing the device graph")(e)),
            },
        }
    }

    /// Reads an f32 output by name.
    pub fn read_f32(&self, device: &Device, name: &str) -> Result<Vec<f32>, ExecError> {
        let (_, r) = self
            .outputs
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| ExecError::BadGraph(format!("the graph has no output `{name}`")))?;
        if r.dtype != DType::F32 || !r.is_contiguous() {
            return Err(ExecError::BadGraph(format!(
                "output `{name}` is not contiguous f32"
            )));
        }
        let mut bytes = vec![0u8; (r.elements() * 4) as usize];
        device
            .read(r.buffer, r.offset, &mut bytes)
            .map_err(dev("reading outputs"))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Points a tiered MoE call's stacks at the card's staging buffers, where its layer's whole
/// stacks are copied before it runs; returns the copies.
fn stream_moe(
    tier: &ExpertTier,
    layer: &TierLayer,
    call: &mut OpCall,
) -> Result<Vec<(u64, HostSlice)>, ExecError> {
    let mut uploads = Vec::new();
    for (k, (slice, full)) in layer.stream.iter().enumerate() {
        let staging = tier
            .staging
            .get(k)
            .filter(|b| b.bytes >= slice.bytes().len() as u64)
            .ok_or_else(|| ExecError::BadGraph("no staging buffer for a streamed stack".into()))?;
        call.srcs[3 + k] = TensorRef {
            buffer: staging.handle,
            offset: 0,
            ..*full
        };
        uploads.push((staging.handle, *slice));
    }
    Ok(uploads)
}

/// Prepares the host half of a tiered MoE call and points the card's call at the compacted
/// stacks' map.
fn host_moe(
    card: &Arc<Device>,
    tier: &ExpertTier,
    layer: &TierLayer,
    call: &mut OpCall,
    at: usize,
) -> Result<HostedMoe, ExecError> {
    let Op::MoeExperts(mut p) = call.op else {
        return Err(ExecError::BadGraph("not a MoE call".into()));
    };
    let n_stacks = if p.fused_gate_up { 2 } else { 3 };
    let n = 3 + n_stacks;
    if call.n_srcs as usize != n || p.expert_map || n + 1 > MAX_SRCS {
        return Err(ExecError::BadGraph(
            "a tiered MoE call must name x, ids, weights and its stacks, without a map".into(),
        ));
    }
    p.expert_map = true;
    call.op = Op::MoeExperts(p);
    call.srcs[n] = layer.card_map;
    call.n_srcs = n as u32 + 1;
    let host = &tier.host;
    let mut card_inputs = [TensorRef::default(); 3];
    let mut host_srcs = [TensorRef::default(); MAX_SRCS];
    let mut host_inputs = Vec::new();
    for i in 0..3 {
        let r = call.srcs[i];
        if !r.is_contiguous() {
            return Err(ExecError::BadGraph("a MoE input is not contiguous".into()));
        }
        let bytes = r.elements() * 4;
        let buf = host
            .alloc(bytes)
            .map_err(dev("allocating host experts' inputs"))?;
        card_inputs[i] = r;
        host_srcs[i] = TensorRef {
            buffer: buf.handle,
            offset: 0,
            ..r
        };
        host_inputs.push((buf, bytes));
    }
    for (k, s) in layer.host_stacks.iter().enumerate() {
        host_srcs[3 + k] = *s;
    }
    host_srcs[n] = layer.host_map;
    let dst = call.dst;
    let out_bytes = dst.elements() * 4;
    if !dst.is_contiguous() {
        return Err(ExecError::BadGraph("a MoE output is not contiguous".into()));
    }
    let host_out = host
        .alloc(out_bytes)
        .map_err(dev("allocating host experts' output"))?;
    let card_out = card
        .alloc(out_bytes)
        .map_err(dev("allocating host experts' output on the card"))?;
    let out_ref = |b: &Buffer| TensorRef {
        buffer: b.handle,
        offset: 0,
        ..dst
    };
    let host_call = OpCall {
        op: Op::MoeExperts(p),
        n_srcs: n as u32 + 1,
        srcs: host_srcs,
        dst: out_ref(&host_out),
    };
    let card_part_out = card
        .alloc(out_bytes)
        .map_err(dev("allocating the card experts' output"))?;
    call.dst = out_ref(&card_part_out);
    let mut add_srcs = [TensorRef::default(); MAX_SRCS];
    add_srcs[0] = call.dst;
    add_srcs[1] = out_ref(&card_out);
    let add = OpCall {
        op: Op::Add,
        n_srcs: 2,
        srcs: add_srcs,
        dst,
    };
    let [x, ids, w]: [(Buffer, u64); 3] = host_inputs
        .try_into()
        .map_err(|_| ExecError::BadGraph("three MoE inputs".into()))?;
    Ok(HostedMoe {
        at,
        tier_layer: 0,
        card_part: layer.n_card > 0,
        card_inputs,
        host_inputs: [x, ids, w],
        host_out,
        host_call,
        card_out,
        _card_part_out: card_part_out,
        add,
        dst,
    })
}

/// The bytes of an i32 slice in the host's byte order (device buffers hold host-order integers;
/// both supported hosts, x86-64 and aarch64, are little-endian like GGUF). No copy: inputs are
/// written every step.
fn i32_bytes(v: &[i32]) -> &[u8] {
    // SAFETY: i32 has no padding and every bit pattern is a valid u8 sequence; the returned slice
    // covers exactly the same memory and borrows `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}
