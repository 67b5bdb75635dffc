//! The executor's side of expert tiering: a MoE call whose layer has host experts runs as a card
//! part and a host part (inputs read back from the card, the host's output added on the card), or,
//! for batches, with the layer's whole stacks streamed into card staging buffers first. In the
//! split form the card also takes a share of the step's host experts (the bus share), reading
//! their weights in place from page-locked host memory while the CPU computes the rest. With a
//! second expert device (a second card's stand-in), that device computes its experts on the same
//! packed inputs and the host adds its output to its own ([`PeerCall`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bloomery_plugin_api::graph::{Graph, Node, TensorId, TensorSource};
use bloomery_plugin_api::op::{MoeParams, Op, RouterParams};
use bloomery_plugin_api::tensor::{OpCall, TensorRef, MAX_SRCS};
use bloomery_plugin_api::{DType, PluginError};

use bloomery_devices::bytes::i32_bytes;
use bloomery_devices::{Buffer, Device};
use bloomery_tiering::residency::LayerResidency;
use bloomery_tiering::{ExpertTier, HostSlice, PeerPart, TierLayer};

use super::{dev, ExecError, Executor, Replay};

/// A MoE call whose layer has host experts: the card computes its experts (call `at`, with the
/// card's expert map), the host device computes the rest from the same inputs, and its output is
/// added on the card.
pub(super) struct HostedMoe {
    /// Index of the card's MoE call in `calls`.
    at: usize,
    /// Index of its layer among the tier's layers (for routing counts).
    tier_layer: usize,
    /// Whether the card holds any of this layer's experts (else call `at` is skipped and,
    /// without a bus share, the host's output is written straight to its destination).
    card_part: bool,
    /// The pass's sequence number last written to the `seq` word of `packed`, whose inputs
    /// the segment before the MoE call packs and signals ([`TieredCalls::pack`]); the host waits
    /// for the signal instead of synchronizing with the card.
    seq: AtomicU32,
    /// The inputs' bytes in `packed` (the words follow them).
    in_bytes: usize,
    /// The same inputs as host-device views of `packed` (read in place by the host call), and
    /// the host call's output.
    host_inputs: [Buffer; 3],
    host_out: Buffer,
    host_call: OpCall,
    /// Where the host's output is uploaded (buffer, offset): the MoE call's destination, or,
    /// with a card part, `_card_out` for the adds; None with a bus share (the adds read the
    /// host's output in place).
    upload_to: Option<(u64, u64)>,
    _card_out: Option<Buffer>,
    _card_part_out: Buffer,
    /// The card's share of the step's host experts, when it can read them in place.
    pub(super) bus: Option<BusShare>,
    /// The card's guess of the next tier layer's experts, packed after the words, for the disk
    /// tier to read ahead.
    guess: Option<PackedGuess>,
    /// The second card's part: its experts on the same packed inputs, added to the host's
    /// output before that goes to the card.
    peer: Option<PeerCall>,
    /// Page-locked memory both devices use in place (after every view of it, so dropped
    /// last): the packed inputs, then the `seq` and `done` words and the words the card's queue
    /// waits on ([`ROUTED`], [`SUMMED`]); at host address `packed_at`.
    packed: Buffer,
    packed_at: usize,
}

/// A hosted layer's experts on the second expert device ([`ExpertTier::peer`]): its call reads
/// the packed inputs in place and writes host memory the host device reads in place, where the
/// host adds it to its own experts' part.
struct PeerCall {
    device: Arc<Device>,
    call: OpCall,
    /// The host experts' part plus the second device's, into the host's output.
    add: OpCall,
    /// The second device's views of the packed inputs, and the host's view of its output
    /// (before the output itself, so dropped first).
    _views: Vec<Buffer>,
    _out: Buffer,
    /// The host experts' part.
    _mine: Buffer,
}

impl PeerCall {
    /// Runs the second device's experts, then adds their output to the host's.
    fn run(&self, host: &Device) -> Result<(), ExecError> {
        self.device
            .run(std::slice::from_ref(&self.call))
            .map_err(dev("running the second card's experts"))?;
        self.device
            .sync()
            .map_err(dev("waiting for the second card's experts"))?;
        host.run(std::slice::from_ref(&self.add))
            .map_err(dev("adding the second card's experts"))?;
        host.sync()
            .map_err(dev("waiting for the sum of host experts"))
    }
}

/// The second device's part of a hosted MoE call `p` ([`PeerCall`]): the packed `inputs` at
/// `packed_at` (their card tensors, in order), the layer's stacks and map there, output shaped as
/// the host experts' part `mine`, added to it into `to`.
fn peer_call(
    (peer, host): (&Arc<Device>, &Arc<Device>),
    part: &PeerPart,
    p: MoeParams,
    (inputs, packed_at): (&[TensorRef; 3], usize),
    (mine, to): (Buffer, TensorRef),
) -> Result<PeerCall, ExecError> {
    let dst = to;
    let mut srcs = [TensorRef::default(); MAX_SRCS];
    let mut views = Vec::new();
    let mut offset = 0;
    for (i, r) in inputs.iter().enumerate() {
        let bytes = r.elements() * 4;
        // SAFETY: the bytes lie inside the hosted layer's packed memory, which its HostedMoe
        // drops after this PeerCall (field order).
        let view = unsafe { peer.map_host((packed_at + offset as usize) as *const u8, bytes) }
            .map_err(dev("viewing the second card's inputs"))?;
        srcs[i] = view.tensor(*r);
        views.push(view);
        offset += bytes;
    }
    for (k, s) in part.stacks.iter().enumerate() {
        srcs[3 + k] = *s;
    }
    let n = 3 + part.stacks.len();
    srcs[n] = part.map;
    let out_bytes = dst.elements() * 4;
    let (out, at) = peer
        .alloc_shared(out_bytes)
        .map_err(dev("allocating the second card's output"))?;
    // SAFETY: `at` addresses `out`'s bytes, which the PeerCall holding this view drops after it.
    let seen = unsafe { host.map_host(at as *const u8, out_bytes) }
        .map_err(dev("viewing the second card's output"))?;
    let call = OpCall {
        op: Op::MoeExperts(p),
        n_srcs: n as u32 + 1,
        srcs,
        dst: out.tensor(dst),
    };
    let add = OpCall::new(Op::Add, &[mine.tensor(dst), seen.tensor(dst)], to);
    views.push(seen);
    Ok(PeerCall {
        device: Arc::clone(peer),
        call,
        add,
        _views: views,
        _out: out,
        _mine: mine,
    })
}

/// Where, after a hosted layer's packed inputs, the host writes the pass's sequence number once
/// it has written the step maps of the bus share (which the card's queue waits for before the
/// share's call), and once it has written its experts' output (which the card waits for before
/// the next segment): [`Executor::tiered_pass_ahead`].
const ROUTED: usize = 8;
/// See [`ROUTED`].
const SUMMED: usize = 12;
/// Bytes of the words after the packed inputs: `seq`, `done`, [`ROUTED`] and [`SUMMED`].
const WORDS: u64 = 16;

/// How long the host waits for a card's segment to signal its packed inputs before it asks the
/// card why (a failed kernel answers the synchronization with its error).
const SIGNAL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Where a hosted layer's packed memory holds the card's guess of the next tier layer's experts:
/// i32 ids `[k, rows]` at byte `at`, from the next layer's router applied to this layer's input.
struct PackedGuess {
    /// The next tier layer.
    layer: usize,
    /// Byte offset in the packed memory.
    at: usize,
    /// Ids.
    len: usize,
    /// The card's logits and ids before the ids are packed.
    _scratch: [Buffer; 2],
}

/// The next tier layer's router as the card's guess applies it: weights `[n_embd, n_expert]`,
/// the selection bias, the router's parameters (`k`: the experts guessed per row), and which
/// tier layer it serves.
pub(super) struct NextRouter {
    /// Router weights on the card.
    pub(super) weights: TensorRef,
    /// Selection bias, if the router has one.
    pub(super) bias: Option<TensorRef>,
    /// The router's parameters.
    pub(super) params: RouterParams,
    /// The tier layer it routes.
    pub(super) layer: usize,
}

/// For each MoE node of `graph` (by node index), its router as the graph wires it: the weight of
/// the product feeding the top-k that chose its ids, the top-k's selection bias, and the
/// router's parameters. Nodes whose ids come otherwise are left out.
pub(super) fn moe_routers(
    graph: &Graph,
) -> HashMap<usize, (TensorId, Option<TensorId>, RouterParams)> {
    let writer: HashMap<u32, &Node> = graph.nodes.iter().map(|n| (n.dst.0, n)).collect();
    let is_weight = |t: &TensorId| {
        graph
            .tensors
            .get(t.0 as usize)
            .is_some_and(|d| matches!(d.source, TensorSource::Weight { .. }))
    };
    let mut out = HashMap::new();
    for (j, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.op, Op::MoeExperts(_)) {
            continue;
        }
        let found = (|| {
            let top = writer.get(&node.srcs.get(1)?.0)?;
            let Op::RouterTopK(params) = top.op else {
                return None;
            };
            let product = writer.get(&top.srcs.first()?.0)?;
            let weights = *product.srcs.first()?;
            let bias = top.srcs.get(1).copied();
            (product.op == Op::MatMul && is_weight(&weights) && bias.iter().all(is_weight))
                .then_some((weights, bias, params))
        })();
        if let Some(r) = found {
            out.insert(j, r);
        }
    }
    out
}

impl HostedMoe {
    /// The card's guess of the next tier layer's experts for the pass it signalled, as (tier
    /// layer, ids); None without a guess.
    fn guessed(&self) -> Option<(usize, Vec<i32>)> {
        let g = self.guess.as_ref()?;
        // SAFETY: `at..at + 4·len` lies inside `packed` (allocated with room for it after the
        // words), alive as long as `self`; the card wrote it before signalling and writes it
        // again only in the next pass.
        let bytes =
            unsafe { std::slice::from_raw_parts((self.packed_at + g.at) as *const u8, 4 * g.len) };
        Some((
            g.layer,
            bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ))
    }

    /// Sets the sequence number the next launch of the segment before the MoE call signals;
    /// returns it.
    fn arm(&self) -> u32 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        // SAFETY: the `seq` word lies inside `packed` (in_bytes..in_bytes + 4, 4-aligned as the
        // inputs are whole 4-byte values), which lives as long as `self`; the card reads it only
        // in calls submitted after this write.
        unsafe { std::ptr::write_volatile((self.packed_at + self.in_bytes) as *mut u32, seq) };
        seq
    }

    /// The sequence number last armed.
    fn armed(&self) -> u32 {
        self.seq.load(Ordering::Relaxed)
    }

    /// Byte offset in the packed memory of word `word` ([`ROUTED`] or [`SUMMED`]).
    fn word(&self, word: usize) -> u64 {
        (self.in_bytes + word) as u64
    }

    /// Writes `seq` to word `word` after everything the host wrote before (the card's queue
    /// waits for it).
    fn post(&self, word: usize, seq: u32) {
        std::sync::atomic::fence(Ordering::Release);
        // SAFETY: the word lies inside `packed` (allocated with WORDS after the inputs, 4-byte
        // aligned as they are whole 4-byte values), alive as long as `self`; the card only reads
        // it, whole.
        unsafe {
            std::ptr::write_volatile((self.packed_at + self.in_bytes + word) as *mut u32, seq)
        };
    }

    /// Waits until the card's segment has written the packed inputs of pass `seq` (its `done`
    /// word equal to `seq`): spins, then, past [`SIGNAL_WAIT`], runs `release` (so that no queue
    /// wait holds the card) and synchronizes with the card to surface a failed kernel.
    fn wait_signal(&self, seq: u32, card: &Device, release: &dyn Fn()) -> Result<(), ExecError> {
        let done = (self.packed_at + self.in_bytes + 4) as *const u32;
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        // SAFETY: the `done` word lies inside `packed` (as in `arm`), alive as long as `self`;
        // the card writes it whole (one 4-byte store), so a volatile read sees the old or the
        // new value.
        while unsafe { std::ptr::read_volatile(done) } != seq {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && start.elapsed() > SIGNAL_WAIT {
                release();
                card.sync().map_err(dev("waiting for the card's segment"))?;
                // SAFETY: as above.
                if unsafe { std::ptr::read_volatile(done) } != seq {
                    return Err(ExecError::BadGraph(
                        "the card finished its segment without signalling the host experts' inputs"
                            .into(),
                    ));
                }
                break;
            }
            std::hint::spin_loop();
        }
        std::sync::atomic::fence(Ordering::Acquire);
        Ok(())
    }

    /// The routed expert ids among the packed inputs the card signalled (input 1, i32 bytes;
    /// valid until the next launch of its segment).
    fn routed_ids(&self) -> &[u8] {
        // SAFETY: `packed_at..packed_at + in_bytes` are `packed`'s first bytes, alive as long as
        // `self`; the card wrote them before signalling and writes them again only in the next
        // pass, after this borrow ends (the passes read them between the signal and the
        // layer's end).
        let packed =
            unsafe { std::slice::from_raw_parts(self.packed_at as *const u8, self.in_bytes) };
        let at = self.host_inputs[0].bytes as usize;
        &packed[at..at + self.host_inputs[1].bytes as usize]
    }
}

/// The card's share of a layer's host experts in a step: `sizes[c]` in `k` of those the step
/// routes to (`c` the pass's choice, see `BusBalance`), computed by the card from the page-locked
/// file while the CPU computes the others.
pub(super) struct BusShare {
    /// Experts the card takes for every `k` host experts of a step, per candidate size.
    sizes: [usize; 2],
    /// Experts a row routes to.
    k: usize,
    /// i32 `[n_expert]` in page-locked host memory the card reads in place (written by the
    /// host before each step's call, at host address `map_at`): the expert's own index when
    /// the card takes it, else -1.
    map: Buffer,
    map_at: usize,
    /// The card's call over the page-locked stacks with `map`.
    call: OpCall,
    _out: Buffer,
    /// The host call's map for the step (host experts less the card's share), on the host.
    host_map: Buffer,
    /// The sum of the card's part and this share, when the layer has card experts.
    _sum: Option<Buffer>,
    /// The host call's output: page-locked memory the host device writes through a view
    /// (`HostedMoe::host_out`, dropped first) and the adds read in place.
    _host_out: Buffer,
}

impl BusShare {
    /// Splits a step's host experts (`ids` routed, `state` the layer's placement) between the
    /// card and the host with the pass's size `choice`: writes both step maps. Returns the
    /// routed calls the card takes.
    fn split(
        &self,
        ids: &[i32],
        state: &LayerResidency,
        host: &Device,
        choice: usize,
    ) -> Result<u64, ExecError> {
        // SAFETY: `map_at` addresses `map`'s bytes (alloc_shared, 4-byte aligned), which live as
        // long as `self`; the card reads them only in calls submitted after this (the previous
        // pass's calls ended at its sync), and nothing else references them.
        let card_map = unsafe {
            std::slice::from_raw_parts_mut(self.map_at as *mut i32, self.map.bytes as usize / 4)
        };
        card_map.fill(-1);
        let mut host_map = state.host_map();
        for e in bus_choice(ids, &state.slot_of, self.sizes[choice.min(1)], self.k) {
            host_map[e] = -1;
            card_map[e] = e as i32;
        }
        host.write(&self.host_map, 0, i32_bytes(&host_map))
            .map_err(dev("writing the host's step map"))?;
        let taken = ids
            .iter()
            .filter(|&&e| {
                usize::try_from(e).is_ok_and(|e| card_map.get(e).is_some_and(|&m| m >= 0))
            })
            .count();
        Ok(taken as u64)
    }
}

/// The experts of `ids` (a step's routing) that live on the host (`slot_of` < 0) and that the
/// card takes: `n` in `k` of them (rounded to nearest), those routed by the fewest rows first
/// (the card's kernels read an expert over the bus once per row routed to it, the CPU's once
/// for all its rows), ties to the lower id; in id order.
pub(super) fn bus_choice(ids: &[i32], slot_of: &[i32], n: usize, k: usize) -> Vec<usize> {
    let mut rows = vec![0u32; slot_of.len()];
    for &e in ids {
        if let Some(c) = usize::try_from(e)
            .ok()
            .filter(|&e| slot_of.get(e).is_some_and(|&s| s < 0))
            .and_then(|e| rows.get_mut(e))
        {
            *c += 1;
        }
    }
    let mut used: Vec<usize> = (0..rows.len()).filter(|&e| rows[e] > 0).collect();
    used.sort_by_key(|&e| (rows[e], e));
    used.truncate((used.len() * n + k / 2) / k.max(1));
    used.sort_unstable();
    used
}

/// The hosted layers of a pass submitted ahead: dropped (when the pass ends, also by an error),
/// it writes every layer's armed sequence number to both words its queue waits on, so that the
/// card never waits for a word the host will not write.
struct Posted<'a>(&'a [HostedMoe]);

impl Posted<'_> {
    /// Writes every layer's armed sequence number to both of its words.
    fn post_all(&self) {
        for h in self.0 {
            let seq = h.armed();
            h.post(ROUTED, seq);
            h.post(SUMMED, seq);
        }
    }
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        self.post_all();
    }
}

/// The error of a lock whose holder panicked.
fn poisoned() -> ExecError {
    ExecError::BadGraph("bus share state poisoned".into())
}

/// Accumulated wall time of the phases of host-expert layers, printed when the executor drops.
#[derive(Default)]
pub(super) struct TierTimes {
    /// Submitting the card's work up to the MoE call (and, submitted ahead, up to the next).
    launch: std::time::Duration,
    /// Waiting for the card's work up to the MoE call.
    card: std::time::Duration,
    /// Inputs from the card to the host.
    inputs: std::time::Duration,
    /// The host's experts.
    host: std::time::Duration,
    /// The host's output back to the card (nothing with a bus share: the adds read it in place).
    output: std::time::Duration,
    /// Layers timed.
    layers: u64,
}

/// The clock of a pass's phases: each lap adds the time since the last to a phase.
struct Laps(std::time::Instant);

impl Laps {
    /// A clock started now.
    fn start() -> Laps {
        Laps(std::time::Instant::now())
    }

    /// Adds the time since the last lap (or the start) to `phase`.
    fn to(&mut self, phase: &mut std::time::Duration) {
        let now = std::time::Instant::now();
        *phase += now - self.0;
        self.0 = now;
    }
}

impl TierTimes {
    /// Prints the totals (`BLOOMERY_TIER_PROFILE=1`), when any layer was timed.
    pub(super) fn report(&self, n_rows: u32) {
        if self.layers == 0 {
            return;
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "host-expert layers, {n_rows} rows: {} layer passes; launches {:.1} ms, card {:.1} ms, \
             inputs {:.1} ms, host experts {:.1} ms, output and add {:.1} ms",
            self.layers,
            ms(self.launch),
            ms(self.card),
            ms(self.inputs),
            ms(self.host),
            ms(self.output)
        );
    }
}

impl Executor {
    /// Runs the calls with the host's part of every tiered MoE layer in between: the card runs
    /// up to the layer's MoE call, its inputs come to the host, the card computes its experts
    /// while the host computes its own, and the host's output is added on the card.
    pub(super) fn run_tiered(&self, device: &Device, host: &Device) -> Result<(), ExecError> {
        let choice = match &self.bus_balance {
            Some(b) => b.lock().map_err(|_| poisoned())?.choice(),
            None => 0,
        };
        let started = std::time::Instant::now();
        // Each layer's output stays alive until the sync below: its upload reads it.
        let mut outputs = Vec::with_capacity(self.hosted.len());
        let pass = match self.ahead_ready(device)? {
            true => self.tiered_pass_ahead(device, host, choice),
            false => self.tiered_pass(device, host, &mut outputs, choice),
        };
        // Also after a failure, so that no copy still reads `outputs` when they are freed.
        let done = device.sync().map_err(dev("waiting for the device"));
        drop(outputs);
        pass.and(done)?;
        self.time_bus_share(choice, started.elapsed())
    }

    /// Gives a one-row pass's time to the bus share's choice of size (see `BusBalance`).
    fn time_bus_share(&self, choice: usize, elapsed: std::time::Duration) -> Result<(), ExecError> {
        let share = self.hosted.iter().find_map(|h| h.bus.as_ref());
        if let (Some(balance), Some(bus), 1) = (&self.bus_balance, share, self.shape.n_rows) {
            let mut balance = balance.lock().map_err(|_| poisoned())?;
            balance.record(choice, elapsed, (bus.sizes, bus.k));
        }
        Ok(())
    }

    /// Submits a tiered pass (see [`Executor::run_tiered`]); each host output uploaded to the
    /// card is kept in `outputs`.
    fn tiered_pass(
        &self,
        device: &Device,
        host: &Device,
        outputs: &mut Vec<Vec<u8>>,
        choice: usize,
    ) -> Result<(), ExecError> {
        let mut start = 0;
        let mut times = TierTimes::default();
        let mut lap = Laps::start();
        for (seg, h) in self.hosted.iter().enumerate() {
            // The segment ends with the inputs' packing into host memory and its signal.
            let seq = h.arm();
            self.launch_segment(device, seg, &self.calls[start..h.at])?;
            lap.to(&mut times.launch);
            h.wait_signal(seq, device, &|| {})?;
            lap.to(&mut times.card);
            // The host call reads the packed inputs in place; the ids (input 1) are routed here.
            let ids = h.routed_ids();
            self.route(h, ids, host, choice)?;
            if h.card_part {
                device
                    .run(&self.calls[h.at..=h.at])
                    .map_err(dev("running the card's experts"))?;
            }
            if let Some(bus) = &h.bus {
                // Also when it takes nothing this step (its output is then zero), so that the
                // adds after the MoE call stay the same calls in the next segment's graph.
                let seg = self.hosted.len() + 1 + seg;
                self.launch_segment(device, seg, std::slice::from_ref(&bus.call))?;
            }
            lap.to(&mut times.inputs);
            host.run(std::slice::from_ref(&h.host_call))
                .map_err(dev("running host experts"))?;
            host.sync().map_err(dev("waiting for host experts"))?;
            if let Some(p) = &h.peer {
                p.run(host)?;
            }
            lap.to(&mut times.host);
            // Without a bus share the host's output goes to the card; with one the adds read it
            // in place. The adds (HostedMoe::adds) open the next segment.
            if let Some((to, offset)) = h.upload_to {
                let mut out = vec![0u8; h.host_out.bytes as usize];
                host.read(h.host_out.handle, 0, &mut out)
                    .map_err(dev("reading host experts' output"))?;
                // Uploaded without waiting: the card's stream was idle at the read above, and
                // the next calls wait for the copy.
                // SAFETY: `out`'s heap buffer does not move when the Vec is pushed into
                // `outputs`, which run_tiered frees only after its sync.
                unsafe { device.upload(to, offset, &out, 0) }
                    .map_err(dev("writing host experts' output"))?;
                outputs.push(out);
            }
            lap.to(&mut times.output);
            times.layers += 1;
            start = h.at + 1;
        }
        self.profile(&times);
        self.launch_segment(device, self.hosted.len(), &self.calls[start..])
    }

    /// Adds a pass's phase times to the profile, when one is kept.
    fn profile(&self, times: &TierTimes) {
        if let Some(t) = self
            .tier_profile
            .as_ref()
            .and_then(|t| t.lock().ok())
            .as_mut()
        {
            t.launch += times.launch;
            t.card += times.card;
            t.inputs += times.inputs;
            t.host += times.host;
            t.output += times.output;
            t.layers += times.layers;
        }
    }

    /// Whether this pass can submit the card's work ahead of the host's
    /// ([`Executor::tiered_pass_ahead`]): every hosted layer has a bus share (the card reads the
    /// host's output in place), every segment replays a captured graph (no capture behind a
    /// queue wait), and the card's queue can wait on a host word (asked once, by a wait on a
    /// word that already holds its value).
    fn ahead_ready(&self, device: &Device) -> Result<bool, ExecError> {
        let Some(first) = self.hosted.first() else {
            return Ok(false);
        };
        if self.hosted.iter().any(|h| h.bus.is_none()) {
            return Ok(false);
        }
        let captured = self
            .replay
            .lock()
            .map_err(|_| ExecError::BadGraph("executor state poisoned".into()))?
            .iter()
            .all(|r| matches!(r, Replay::Captured(_)));
        if !captured {
            return Ok(false);
        }
        Ok(*self.queue_waits.get_or_init(|| {
            let seq = first.armed();
            first.post(SUMMED, seq);
            match device.wait_word(first.packed.handle, first.word(SUMMED), seq) {
                Ok(()) => true,
                Err(e) => {
                    if !matches!(e, PluginError::Unsupported { .. }) {
                        tracing::warn!("the card's queue cannot wait on host words ({e})");
                    }
                    false
                }
            }
        }))
    }

    /// A tiered pass with the card's work submitted ahead: for each hosted layer, before the
    /// host waits for its inputs, the card's experts, its bus share (held until the host has
    /// written the step maps) and the next segment (held until the host has written its
    /// experts' output) are already queued. The host's path per layer is then the wait, the
    /// routing and its experts, with no launch in it. The words are always written, also after
    /// a failure ([`Posted`]), so that no queue wait outlives the pass.
    fn tiered_pass_ahead(
        &self,
        device: &Device,
        host: &Device,
        choice: usize,
    ) -> Result<(), ExecError> {
        let posted = Posted(&self.hosted);
        let release = || posted.post_all();
        let mut times = TierTimes::default();
        let mut lap = Laps::start();
        let n = self.hosted.len();
        if let Some(first) = self.hosted.first() {
            first.arm();
            self.launch_segment(device, 0, &self.calls[..first.at])?;
        }
        for (seg, h) in self.hosted.iter().enumerate() {
            let seq = h.armed();
            let bus = h
                .bus
                .as_ref()
                .ok_or_else(|| ExecError::BadGraph("a layer ahead without a bus share".into()))?;
            if h.card_part {
                device
                    .run(&self.calls[h.at..=h.at])
                    .map_err(dev("running the card's experts"))?;
            }
            let wait = |word| {
                device
                    .wait_word(h.packed.handle, h.word(word), seq)
                    .map_err(dev("holding the card for the host"))
            };
            wait(ROUTED)?;
            self.launch_segment(device, n + 1 + seg, std::slice::from_ref(&bus.call))?;
            let end = match self.hosted.get(seg + 1) {
                Some(next) => {
                    next.arm();
                    next.at
                }
                None => self.calls.len(),
            };
            wait(SUMMED)?;
            self.launch_segment(device, seg + 1, &self.calls[h.at + 1..end])?;
            lap.to(&mut times.launch);
            h.wait_signal(seq, device, &release)?;
            lap.to(&mut times.card);
            let ids = h.routed_ids();
            self.route(h, ids, host, choice)?;
            h.post(ROUTED, seq);
            lap.to(&mut times.inputs);
            host.run(std::slice::from_ref(&h.host_call))
                .map_err(dev("running host experts"))?;
            host.sync().map_err(dev("waiting for host experts"))?;
            h.post(SUMMED, seq);
            lap.to(&mut times.host);
            times.layers += 1;
        }
        self.profile(&times);
        Ok(())
    }

    /// Takes a pass's routed expert ids for layer `h` (`ids`, i32 bytes): counts them, splits
    /// the host's experts with the card (the bus share) and, with the disk tier, brings the
    /// host's ones into the arena and points the host call's map at them. `choice` is the pass's
    /// bus share size.
    fn route(
        &self,
        h: &HostedMoe,
        ids: &[u8],
        host: &Device,
        choice: usize,
    ) -> Result<(), ExecError> {
        let Some(res) = &self.residency else {
            return Ok(());
        };
        let ids: Vec<i32> = ids
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut res = res
            .lock()
            .map_err(|_| ExecError::BadGraph("residency state poisoned".into()))?;
        res.record(h.tier_layer, &ids);
        if let Some(bus) = &h.bus {
            let taken = bus.split(&ids, &res.layers[h.tier_layer], host, choice)?;
            res.bus_calls += taken;
        }
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let slot_of = &res.layers[h.tier_layer].slot_of;
        let host_ids = host_experts(&ids, slot_of);
        let n_expert = slot_of.len();
        // The card's guess of the next tier layer's experts, less those on the card.
        let ahead = h.guessed().and_then(|(layer, ids)| {
            Some((layer, host_experts(&ids, &res.layers.get(layer)?.slot_of)))
        });
        drop(res);
        let map = disk
            .ensure(h.tier_layer, &host_ids, n_expert)
            .map_err(ExecError::BadGraph)?;
        // While the host computes this layer, the next one's guessed host experts are read
        // ahead.
        if let Some((layer, guessed)) = ahead {
            disk.read_ahead(layer, &guessed)
                .map_err(ExecError::BadGraph)?;
        }
        let map_ref = h.host_call.srcs[h.host_call.n_srcs as usize - 1];
        host.write_handle(map_ref.buffer, map_ref.offset, i32_bytes(&map))
            .map_err(dev("writing the disk tier's expert map"))
    }

    /// Runs the calls with each tiered layer's whole stacks copied into the card's staging
    /// buffers before its MoE call (or each part's experts before that part's call). The copies
    /// run on the card's copy queue: copy `s` is issued once the calls before its call are
    /// submitted, and starts when the call that last used its memory has run (two sets: a
    /// layer's copy overlaps the previous layer's MoE and this layer's attention; one set in
    /// two parts: one part's copy overlaps the other part's call; one set whole: copies and
    /// calls alternate).
    pub(super) fn run_streamed(&self, device: &Device) -> Result<(), ExecError> {
        let slots = self.staging_slots.max(1);
        let lending = self.lending.as_ref();
        if let Some(l) = lending {
            l.overwriting().map_err(dev("tracking the staging sets"))?;
        }
        // freed[s]: the fence after which copy s's memory may be overwritten.
        let mut freed = Vec::with_capacity(self.streamed.len());
        let mut start = 0;
        for (seg, s) in self.streamed.iter().enumerate() {
            self.launch_segment(device, seg, &self.calls[start..s.at])?;
            if seg > 0 {
                freed.push(device.fence().map_err(dev("fencing a streamed layer"))?);
            }
            let after = if seg >= slots { freed[seg - slots] } else { 0 };
            for (handle, offset, slice) in &s.uploads {
                // SAFETY: the slice is the mapped model file, which outlives every executor;
                // the sync below (or an earlier failure's) ends the copy's use of it.
                unsafe { device.upload(*handle, *offset, slice.bytes(), after) }
                    .map_err(dev("streaming host experts to the card"))?;
                // With the disk tier host RAM is short: the layer's pages leave resident memory
                // as soon as they are queued (a copy still reading them faults them in again).
                if self.disk.is_some() {
                    slice.release();
                }
            }
            start = s.at;
        }
        self.launch_segment(device, self.streamed.len(), &self.calls[start..])?;
        device.sync().map_err(dev("waiting for the device"))?;
        // Each set holds the last layer streamed into it (the one lent it, see `Lending`).
        if let Some(l) = lending {
            for s in &self.streamed {
                l.holds(s.set, s.layer)
                    .map_err(dev("tracking the staging sets"))?;
            }
        }
        Ok(())
    }
}

/// The valid ids of `ids` whose experts live on the host (`slot_of` -1).
fn host_experts(ids: &[i32], slot_of: &[i32]) -> Vec<u32> {
    ids.iter()
        .filter_map(|&e| usize::try_from(e).ok())
        .filter(|&e| slot_of.get(e).is_some_and(|&s| s < 0))
        .map(|e| e as u32)
        .collect()
}

/// A copy of file bytes to a card buffer: (buffer handle, byte offset in it, the bytes).
pub(super) type Upload = (u64, u64, HostSlice);

/// Points a tiered MoE call's stacks at staging set `set` of the card, where its layer's whole
/// stacks are copied before it runs; returns the copies.
pub(super) fn stream_moe(
    tier: &ExpertTier,
    layer: &TierLayer,
    set: usize,
    call: &mut OpCall,
) -> Result<Vec<Upload>, ExecError> {
    let mut uploads = Vec::new();
    for (k, (slice, full)) in layer.stream.iter().enumerate() {
        let staging = tier
            .staging
            .get(set)
            .and_then(|s| s.get(k))
            .filter(|b| b.bytes >= slice.bytes().len() as u64)
            .ok_or_else(|| ExecError::BadGraph("no staging buffer for a streamed stack".into()))?;
        call.srcs[3 + k] = staging.tensor(*full);
        uploads.push((staging.handle, 0, *slice));
    }
    Ok(uploads)
}

/// One part of a streamed MoE call ([`stream_parts`]).
pub(super) struct StreamPart {
    /// The part's call.
    pub(super) call: OpCall,
    /// After the second half's call, the add that sums both into the call's destination.
    pub(super) add: Option<OpCall>,
    /// The copies of the part's experts into the staging set.
    pub(super) uploads: Vec<Upload>,
}

/// A streamed MoE call (see [`stream_moe`]) split over its layer's two expert halves
/// ([`ExpertTier::staging_parts`]): each half's call reads the whole staging set through its
/// map (only its own experts) once that half's experts are copied, so the copy of one half
/// overlaps the call over the other within one set. The halves write the two halves of
/// `part_out`, and an add after the second sums them into the call's destination.
pub(super) fn stream_parts(
    tier: &ExpertTier,
    layer: &TierLayer,
    set: usize,
    call: OpCall,
    part_out: Option<&Buffer>,
) -> Result<Vec<StreamPart>, ExecError> {
    let mut whole = call;
    let uploads = stream_moe(tier, layer, set, &mut whole)?;
    match layer.part_maps.len() {
        0 | 1 => {
            return Ok(vec![StreamPart {
                call: whole,
                add: None,
                uploads,
            }])
        }
        2 => {}
        n => {
            return Err(ExecError::BadGraph(format!(
                "a streamed call in {n} parts (at most 2)"
            )))
        }
    }
    let Op::MoeExperts(mut p) = whole.op else {
        return Err(ExecError::BadGraph("not a MoE call".into()));
    };
    let n = 3 + if p.fused_gate_up { 2 } else { 3 };
    if whole.n_srcs as usize != n || p.expert_map || n + 1 > MAX_SRCS {
        return Err(ExecError::BadGraph(
            "a streamed MoE call must name x, ids, weights and its stacks, without a map".into(),
        ));
    }
    p.expert_map = true;
    let n_expert = u64::from(p.n_expert);
    let bytes = whole.dst.elements() * 4;
    let out_buffer = part_out
        .filter(|b| b.bytes >= 2 * bytes)
        .ok_or_else(|| ExecError::BadGraph("no buffer for a streamed half".into()))?;
    let half_out = |i: u64| TensorRef {
        offset: i * bytes,
        ..out_buffer.tensor(whole.dst)
    };
    let mut out = Vec::new();
    for (i, map) in layer.part_maps.iter().enumerate() {
        let (lo, hi) = (n_expert * i as u64 / 2, n_expert * (i as u64 + 1) / 2);
        let mut c = whole;
        c.op = Op::MoeExperts(p);
        c.srcs[n] = *map;
        c.n_srcs = n as u32 + 1;
        c.dst = half_out(i as u64);
        let add = (i == 1).then(|| OpCall::new(Op::Add, &[half_out(0), c.dst], whole.dst));
        let uploads = uploads
            .iter()
            .zip(&layer.stream)
            .map(|(&(handle, _, slice), (_, full))| {
                let stride = full.nb[2];
                let at = lo * stride;
                (
                    handle,
                    at,
                    slice.part(at as usize, ((hi - lo) * stride) as usize),
                )
            })
            .collect();
        out.push(StreamPart {
            call: c,
            add,
            uploads,
        });
    }
    Ok(out)
}

/// The calls a tiered MoE call brings to the executor's list around it.
pub(super) struct TieredCalls {
    /// Before it: the copies packing its inputs into host memory (and the card's guess of the
    /// next layer's experts), then the signal the host waits for.
    pub(super) pack: Vec<OpCall>,
    /// After it (so in the next segment's graph): the adds summing the parts (the card's, the
    /// bus share's, the host's) into its destination; none where the host's output is uploaded
    /// there directly.
    pub(super) adds: Vec<OpCall>,
}

/// Prepares the host half of a tiered MoE call (index `first` among the executor's calls before
/// its packing is placed ahead of it; `next`: the router whose guess the card packs too) and
/// points the card's call at the compacted stacks' map; returns it with the calls to place
/// around the call.
pub(super) fn host_moe(
    card: &Arc<Device>,
    tier: &ExpertTier,
    (tier_layer, layer): (usize, &TierLayer),
    call: &mut OpCall,
    (first, next): (usize, Option<NextRouter>),
) -> Result<(HostedMoe, TieredCalls), ExecError> {
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
    let card_inputs = [call.srcs[0], call.srcs[1], call.srcs[2]];
    let mut host_srcs = [TensorRef::default(); MAX_SRCS];
    for r in &card_inputs {
        if !r.is_contiguous()
            || r.dtype
                .layout()
                .is_none_or(|l| (l.block, l.bytes) != (1, 4))
        {
            return Err(ExecError::BadGraph(
                "a MoE input is not contiguous 4-byte values".into(),
            ));
        }
    }
    let in_bytes: u64 = card_inputs.iter().map(|r| r.elements() * 4).sum();
    let rows = card_inputs[0].elements() / card_inputs[0].ne[0].max(1);
    let guess_bytes = next
        .as_ref()
        .map_or(0, |n| 4 * u64::from(n.params.k) * rows);
    let (packed, packed_at) = card
        .alloc_shared(in_bytes + WORDS + guess_bytes)
        .map_err(dev("allocating host experts' packed inputs"))?;
    let mut offset = 0;
    let mut host_inputs = Vec::new();
    for (i, r) in card_inputs.iter().enumerate() {
        let bytes = r.elements() * 4;
        // SAFETY: the bytes lie inside `packed`, which the HostedMoe holding this view drops
        // after it (field order).
        let view = unsafe { host.map_host((packed_at + offset as usize) as *const u8, bytes) }
            .map_err(dev("viewing host experts' inputs"))?;
        host_srcs[i] = view.tensor(*r);
        host_inputs.push(view);
        offset += bytes;
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
    let sizes = {
        let balance = tier.bus.lock().map_err(|_| poisoned())?;
        [balance.count(0, p.k), balance.count(1, p.k)]
    };
    let bus_on =
        sizes.iter().any(|&n| n > 0) && tier.disk.is_none() && layer.bus_stacks.len() == n_stacks;
    // With a bus share the host's output lies in page-locked memory the card reads in place.
    // Page-locked memory may run out (its limit is the host's, not the card's): the layer then
    // runs without a share.
    let shared = match bus_on {
        true => match (
            card.alloc_shared(out_bytes),
            card.alloc_shared(4 * u64::from(p.n_expert)),
        ) {
            (Ok(out), Ok(map)) => Some((out, map)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("no bus share for a layer: page-locked memory refused ({e})");
                None
            }
        },
        false => None,
    };
    let (host_out, shared) = match shared {
        Some(((out, at), map)) => {
            // SAFETY: `at` addresses `out`'s bytes, which live in the BusShare of the HostedMoe
            // that also holds this view, declared after it (the view goes first).
            let view = unsafe { host.map_host(at as *const u8, out_bytes) }
                .map_err(dev("viewing host experts' shared output"))?;
            (view, Some((out, map)))
        }
        None => {
            let out = host
                .alloc(out_bytes)
                .map_err(dev("allocating host experts' output"))?;
            (out, None)
        }
    };
    let mut host_call = OpCall {
        op: Op::MoeExperts(p),
        n_srcs: n as u32 + 1,
        srcs: host_srcs,
        dst: host_out.tensor(dst),
    };
    let card_part_out = card
        .alloc(out_bytes)
        .map_err(dev("allocating the card experts' output"))?;
    call.dst = card_part_out.tensor(dst);
    let card_part = layer.n_card > 0;
    let (bus, adds, upload_to, card_out) = match shared {
        Some((shared_out, map)) => {
            let (bus, adds) = bus_share(
                (card, host),
                layer,
                (p, sizes),
                (&card_inputs, call.dst, dst),
                &mut host_call,
                (shared_out, map),
            )?;
            (Some(bus), adds, None, None)
        }
        None if card_part => {
            let card_out = card
                .alloc(out_bytes)
                .map_err(dev("allocating host experts' output on the card"))?;
            let add = OpCall::new(Op::Add, &[call.dst, card_out.tensor(dst)], dst);
            (None, vec![add], Some((card_out.handle, 0)), Some(card_out))
        }
        None => (None, Vec::new(), Some((dst.buffer, dst.offset)), None),
    };
    // With a second card the host's experts write a buffer of their own, which the sum with
    // the second card's reads into where they wrote before.
    let peer = match (&tier.peer, &layer.peer) {
        (Some(device), Some(part)) => {
            let mine = host
                .alloc(out_bytes)
                .map_err(dev("allocating host experts' part"))?;
            let to = host_call.dst;
            host_call.dst = mine.tensor(dst);
            Some(peer_call(
                (device, host),
                part,
                p,
                (&card_inputs, packed_at),
                (mine, to),
            )?)
        }
        _ => None,
    };
    let host_inputs: [Buffer; 3] = host_inputs
        .try_into()
        .map_err(|_| ExecError::BadGraph("three MoE inputs".into()))?;
    let mut offset = 0;
    let [x, ids, w] = card_inputs.map(|r| {
        let to = TensorRef {
            buffer: packed.handle,
            offset,
            ..r
        };
        offset += r.elements() * 4;
        OpCall::new(Op::Copy, &[r], to)
    });
    let word = |at: u64| TensorRef {
        buffer: packed.handle,
        offset: at,
        dtype: DType::I32,
        ne: [1, 1, 1, 1],
        nb: [4, 4, 4, 4],
    };
    let signal = OpCall::new(Op::Copy, &[word(in_bytes)], word(in_bytes + 4));
    let mut pack = vec![x, ids, w];
    let guess = match next {
        Some(n) => {
            let (calls, scratch) =
                guess_calls(card, &n, card_inputs[0], rows, (&packed, in_bytes + WORDS))?;
            pack.extend(calls);
            Some(PackedGuess {
                layer: n.layer,
                at: (in_bytes + WORDS) as usize,
                len: (guess_bytes / 4) as usize,
                _scratch: scratch,
            })
        }
        None => None,
    };
    pack.push(signal);
    let hosted = HostedMoe {
        // The packing lands before the call, which was to be call `first`.
        at: first + pack.len(),
        tier_layer,
        card_part,
        in_bytes: in_bytes as usize,
        seq: AtomicU32::new(0),
        host_inputs,
        host_out,
        host_call,
        upload_to,
        _card_out: card_out,
        _card_part_out: card_part_out,
        bus,
        guess,
        peer,
        packed,
        packed_at,
    };
    Ok((hosted, TieredCalls { pack, adds }))
}

/// The card's guess of the next tier layer's experts from this layer's MoE input `x` (f32
/// `[n_embd, rows]`): the next router's product and top-k into card scratch, then the ids copied
/// into the packed memory at byte `at`; returns the calls and the scratch.
fn guess_calls(
    card: &Arc<Device>,
    next: &NextRouter,
    x: TensorRef,
    rows: u64,
    (packed, at): (&Buffer, u64),
) -> Result<(Vec<OpCall>, [Buffer; 2]), ExecError> {
    let n_expert = u64::from(next.params.n_expert);
    let k = u64::from(next.params.k);
    if next.weights.ne[0] != x.ne[0] || next.weights.ne[1] != n_expert {
        return Err(ExecError::BadGraph(format!(
            "the next layer's router is {:?}, this layer's MoE input {:?}",
            next.weights.ne, x.ne
        )));
    }
    let flat = |dtype: DType, ne0: u64| {
        let ne = [ne0, rows, 1, 1];
        TensorRef {
            buffer: 0,
            offset: 0,
            dtype,
            ne,
            nb: TensorRef::contiguous_strides(dtype, ne).unwrap_or_default(),
        }
    };
    let logits = card
        .alloc(4 * n_expert * rows)
        .map_err(dev("allocating the guess's logits"))?;
    let ids = card
        .alloc(4 * k * rows)
        .map_err(dev("allocating the guess's ids"))?;
    let logits_ref = logits.tensor(flat(DType::F32, n_expert));
    let ids_ref = ids.tensor(flat(DType::I32, k));
    let mut sel = vec![logits_ref];
    sel.extend(next.bias);
    let packed_ref = TensorRef {
        buffer: packed.handle,
        offset: at,
        ..ids_ref
    };
    let calls = vec![
        OpCall::new(Op::MatMul, &[next.weights, x], logits_ref),
        OpCall::new(Op::RouterTopK(next.params), &sel, ids_ref),
        OpCall::new(Op::Copy, &[ids_ref], packed_ref),
    ];
    Ok((calls, [logits, ids]))
}

/// Prepares a layer's bus share: the card's call over the page-locked stacks with the step map
/// `map` (page-locked, at its host address) and the host call pointed at a step map of its own;
/// returns it with the adds of the card's part (`card_dst`, when the layer has card experts), the
/// share and the host's output (`shared_out`, page-locked) into `dst`.
fn bus_share(
    (card, host): (&Arc<Device>, &Arc<Device>),
    layer: &TierLayer,
    (p, sizes): (MoeParams, [usize; 2]),
    (card_inputs, card_dst, dst): (&[TensorRef; 3], TensorRef, TensorRef),
    host_call: &mut OpCall,
    (shared_out, (map, map_at)): (Buffer, (Buffer, usize)),
) -> Result<(BusShare, Vec<OpCall>), ExecError> {
    let n = host_call.n_srcs as usize - 1;
    let map_ref = |b: &Buffer| TensorRef {
        buffer: b.handle,
        ..layer.host_map
    };
    let host_map = host
        .alloc(map.bytes)
        .map_err(dev("allocating the host's step map"))?;
    host_call.srcs[n] = map_ref(&host_map);
    let out = card
        .alloc(shared_out.bytes)
        .map_err(dev("allocating the bus share's output"))?;
    let mut srcs = [TensorRef::default(); MAX_SRCS];
    srcs[..3].copy_from_slice(card_inputs);
    srcs[3..n].copy_from_slice(&layer.bus_stacks);
    srcs[n] = map_ref(&map);
    let call = OpCall {
        op: Op::MoeExperts(p),
        n_srcs: n as u32 + 1,
        srcs,
        dst: out.tensor(dst),
    };
    let (adds, sum) = if layer.n_card > 0 {
        let sum = card
            .alloc(shared_out.bytes)
            .map_err(dev("allocating the card parts' sum"))?;
        let adds = vec![
            OpCall::new(Op::Add, &[card_dst, call.dst], sum.tensor(dst)),
            OpCall::new(Op::Add, &[sum.tensor(dst), shared_out.tensor(dst)], dst),
        ];
        (adds, Some(sum))
    } else {
        let adds = vec![OpCall::new(
            Op::Add,
            &[call.dst, shared_out.tensor(dst)],
            dst,
        )];
        (adds, None)
    };
    let bus = BusShare {
        sizes,
        k: p.k as usize,
        map,
        map_at,
        call,
        _out: out,
        host_map,
        _sum: sum,
        _host_out: shared_out,
    };
    Ok((bus, adds))
}

#[cfg(test)]
mod tests {
    use super::bus_choice;

    #[test]
    fn the_bus_share_takes_the_least_routed_host_experts_first() {
        // Experts 2 and 6 live on the card; the rest on the host.
        let slot_of = [-1, -1, 0, -1, -1, -1, 1, -1];
        // One row routing to 8 experts, 3 in 8 of its host ones: the lowest ids on a tie.
        assert_eq!(bus_choice(&[7, 5, 3, 1, 0, 4], &slot_of, 3, 8), vec![0, 1]);
        assert_eq!(
            bus_choice(&[7, 5, 3, 1, 0, 4, 2, 6], &slot_of, 3, 8),
            vec![0, 1]
        );
        // Four rows of k = 2: expert 5 serves three rows, 4 two and 7 one; card experts never
        // count. The card takes the fewest-row ones first.
        let ids = [5, 4, 5, 2, 5, 4, 6, 7];
        assert_eq!(bus_choice(&ids, &slot_of, 1, 2), vec![4, 7]);
        assert_eq!(bus_choice(&ids, &slot_of, 1, 4), vec![7]);
        assert_eq!(bus_choice(&ids, &slot_of, 2, 2), vec![4, 5, 7]);
        // None asked, none on the host, or no valid id: nothing.
        assert!(bus_choice(&ids, &slot_of, 0, 2).is_empty());
        assert!(bus_choice(&[2, 6], &slot_of, 2, 2).is_empty());
        assert!(bus_choice(&[-1, 99], &slot_of, 2, 2).is_empty());
    }
}
