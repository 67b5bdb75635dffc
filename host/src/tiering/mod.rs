//! Routed experts across the card and host RAM. [`plan`] decides where each expert lives; this
//! module loads the weights that way: dense weights and the card's experts (each MoE stack
//! compacted to its on-card experts) in card memory, the host's experts read in place from the
//! mapped file by the best CPU kernel plugin. Each MoE call of a layer with host experts then runs
//! twice with complementary expert maps (`MoeParams::expert_map`): the card's part on the card,
//! the host's part on the CPU at the same time, and the host's output is added on the card.
//! Batches of [`STREAM_MIN_ROWS`] rows or more instead copy the layer's whole stacks from the
//! mapped file into card staging buffers and run the unsplit call there: a prompt uses nearly
//! every expert, and PCIe moves a layer's experts faster than the CPU multiplies them by hundreds
//! of rows.

pub mod arena;
pub mod bus_balance;
pub mod disk;
pub mod lending;
pub mod plan;
pub mod residency;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bloomery_gguf::GgufModel;
use bloomery_plugin_api::graph::{Graph, TensorId, TensorSource};
use bloomery_plugin_api::kernel::DeviceConfig;
use bloomery_plugin_api::model::ModelSpec;
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::DType;

use self::arena::StackSource;
use self::bus_balance::BusBalance;
use self::disk::disk_tier;
pub use self::disk::DiskTier;
use self::lending::Lending;
use self::plan::{MoeLayer, Plan, TierRequest};
use self::residency::{LayerResidency, Residency};
use crate::engine::device::{Buffer, Device};
use crate::engine::executor::i32_bytes;
use crate::model::{weight_tensor, ModelError};
use crate::plugins::KernelPluginFile;

/// Rows from which a batch streams a tiered layer's experts to the card instead of computing
/// the host's share on the CPU. At 16 rows and k = 8 a layer's 128 experts are nearly all
/// used, so the CPU reads them all anyway, and its multiply cost grows with the rows while the
/// copy does not.
pub const STREAM_MIN_ROWS: u32 = 32;

/// Bytes of the mapped file: an address kept as an integer so the tier can move between
/// threads. Valid while the model's mapping lives (the tier is dropped before it).
#[derive(Clone, Copy, Debug)]
pub struct HostSlice {
    addr: usize,
    len: usize,
}

impl HostSlice {
    /// The slice of the mapped file holding `bytes`.
    fn of(bytes: &[u8]) -> HostSlice {
        HostSlice {
            addr: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    }

    /// `len` bytes of the slice from byte `from` (clamped to its end).
    pub fn part(&self, from: usize, len: usize) -> HostSlice {
        let from = from.min(self.len);
        HostSlice {
            addr: self.addr + from,
            len: len.min(self.len - from),
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `addr..addr+len` lies in the model's read-only file mapping, which outlives
        // every tier and executor that holds a HostSlice (LoadedModel's field order).
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Drops the slice's whole pages from the process's resident memory (the disk tier streams
    /// prompts' layers from the mapping and must not keep them resident). The bytes do not
    /// change: a later read faults the pages in again from the file.
    pub fn release(&self) {
        let page = page_size();
        let lo = self.addr.div_ceil(page) * page;
        let hi = (self.addr + self.len) / page * page;
        if hi > lo {
            // SAFETY: [lo, hi) is whole pages inside the model's read-only shared file mapping,
            // alive while the tier is (see `bytes`). MADV_DONTNEED on such a mapping only unmaps
            // the pages; later reads fault them in from the file with the same bytes, so a copy
            // still reading them is unaffected.
            let _ = unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) };
        }
    }
}

/// The system's page size in bytes.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(1)
}

/// Address ranges `(start, end)` rounded out to whole pages of `page` bytes and merged where
/// they touch or overlap: sorted and disjoint, empty ranges dropped (what page-locking and
/// `mlock` take).
pub fn whole_pages(ranges: &[(usize, usize)], page: usize) -> Vec<(usize, usize)> {
    let mut r: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|&&(a, b)| a < b)
        .map(|&(a, b)| (a / page * page, b.div_ceil(page) * page))
        .collect();
    r.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(r.len());
    for (a, b) in r {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// One MoE layer with host experts, as the executor needs it.
pub struct TierLayer {
    /// Weight index of the layer's first stack (how the executor finds its MoE call).
    pub first_stack: usize,
    /// Experts on the card (0: the card's call is skipped).
    pub n_card: u32,
    /// i32 `[n_expert]` on the card: index in the compacted stacks, or -1.
    pub card_map: TensorRef,
    /// The full stacks in the mapped file, on the host device, in the call's source order.
    pub host_stacks: Vec<TensorRef>,
    /// i32 `[n_expert]` on the host device: the expert's own index when it lives on the host, or
    /// -1.
    pub host_map: TensorRef,
    /// The full stacks in the mapped file, for streaming to the card, with their layouts.
    pub stream: Vec<(HostSlice, TensorRef)>,
    /// The compacted card stacks (residency rewrites their slots, `nb[2]` bytes apart).
    pub card_stacks: Vec<TensorRef>,
    /// The full stacks in the page-locked file as card buffers the card reads in place (the
    /// bus share of a decode step's host experts); empty when the card cannot read them.
    pub bus_stacks: Vec<TensorRef>,
    /// With [`ExpertTier::staging_parts`] over 1: per part, i32 `[n_expert]` on the card, the
    /// expert's own index when it lies in the part (an equal run of experts), else -1.
    pub part_maps: Vec<TensorRef>,
}

/// The staging set of `sets` a prompt streams tier layer `layer` (its rank among the layers with
/// host experts) into: prompts stream every tier layer in order, taking turns over the sets, so
/// the last layer streamed into a set is the last of its rank mod `sets`.
pub fn stream_set(layer: usize, sets: usize) -> usize {
    layer % sets.max(1)
}

/// Alignment of each weight in the card's one weight allocation (the kernels' widest loads
/// want 16 bytes; 256 as the driver aligns allocations).
const WEIGHT_ALIGN: u64 = 256;

/// Most experts moved onto the card per step (each move copies one expert's stacks).
const MAX_FLIPS_PER_STEP: usize = 4;

/// The host side of a tiered model. Field order is drop order: buffers before the device.
pub struct ExpertTier {
    /// Layers with host experts.
    pub layers: Vec<TierLayer>,
    /// Card buffers a streamed layer's stacks are copied into: one or two sets (streamed layers
    /// take turns), each one buffer per stack position.
    pub staging: Vec<Vec<Buffer>>,
    /// Parts a streamed layer's experts are copied and computed in (1, or 2 with one set).
    pub staging_parts: usize,
    /// The staging sets' layers between prompts (shared with the executors).
    pub lending: Arc<Lending>,
    /// Routing counts and the placement they move (shared with the executors, which count).
    pub residency: Arc<Mutex<Residency>>,
    /// The disk tier, when host RAM cannot hold the host experts.
    pub disk: Option<Arc<DiskTier>>,
    /// The bus share's size, asked for or chosen by the first decode passes (shared with the
    /// executors, which time their passes).
    pub bus: Arc<Mutex<BusBalance>>,
    /// The card's views of the page-locked stacks behind [`TierLayer::bus_stacks`] and of the
    /// token tables it reads in place.
    _bus_views: Vec<Buffer>,
    /// The address ranges `(start, end)` of the file mapping the host reads during a run: the
    /// layers' stacks (not when the disk tier reads them into its arena) and the token tables
    /// the card reads in place. Page-locked at load; `--mlock` locks them too.
    pub host_read: Vec<(usize, usize)>,
    _host_buffers: Vec<Buffer>,
    /// The CPU device that computes host experts.
    pub host: Arc<Device>,
}

impl ExpertTier {
    /// The staging set a prompt streams tier layer `layer` into (see [`stream_set`]).
    pub fn stream_set(&self, layer: usize) -> usize {
        stream_set(layer, self.staging.len())
    }

    /// The layer whose first stack is weight `index`, with its position in [`ExpertTier::layers`].
    pub fn layer(&self, index: usize) -> Option<(usize, &TierLayer)> {
        self.layers
            .iter()
            .enumerate()
            .find(|(_, l)| l.first_stack == index)
    }

    /// Between steps: moves the experts the counts call for onto `card` (their stacks from the
    /// file into the slots they take) and rewrites both expert maps of each layer touched.
    /// Returns the moves made.
    pub fn rebalance(&self, card: &Device) -> Result<usize, bloomery_plugin_api::PluginError> {
        let mut r = self
            .residency
            .lock()
            .map_err(|_| bloomery_plugin_api::PluginError::device("residency state poisoned"))?;
        let flips = r.step(MAX_FLIPS_PER_STEP);
        for f in &flips {
            let layer = &self.layers[f.layer];
            for ((slice, _), stack) in layer.stream.iter().zip(&layer.card_stacks) {
                let stride = stack.nb[2];
                let from = f.incoming as usize * stride as usize;
                card.write_handle(
                    stack.buffer,
                    stack.offset + u64::from(f.slot) * stride,
                    &slice.bytes()[from..from + stride as usize],
                )?;
            }
            let state = &r.layers[f.layer];
            card.write_handle(layer.card_map.buffer, 0, i32_bytes(&state.slot_of))?;
            self.host
                .write_handle(layer.host_map.buffer, 0, i32_bytes(&state.host_map()))?;
        }
        Ok(flips.len())
    }
}

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

fn dev_err(context: &str) -> impl FnOnce(bloomery_plugin_api::PluginError) -> ModelError + '_ {
    move |source| ModelError::Device {
        context: context.to_owned(),
        source,
    }
}

/// Page-locks `ranges` of the file mapping (the host's reads: the stacks a prompt streams to
/// the card and the tables the card reads in place, [`ExpertTier::host_read`]), rounded to whole
/// pages, so the copies run at bus speed rather than through the driver's bounce buffer. Failure
/// is logged and false returned: the copies then stay pageable, and the card cannot read the
/// tables in place.
fn pin_streamed(card: &Device, ranges: &[(usize, usize)]) -> bool {
    for (lo, hi) in whole_pages(ranges, page_size()) {
        // SAFETY: every range lies in the model's read-only file mapping (rounded to the pages
        // it occupies), which outlives the card device (LoadedModel's field order).
        if let Err(e) = unsafe { card.pin_host(lo as *const u8, (hi - lo) as u64) } {
            tracing::warn!("page-locking host experts failed ({e}); prompts copy them pageable");
            return false;
        }
    }
    true
}

/// Gives each layer the card's in-place views of its page-locked stacks (the bus share of
/// decode's host experts); returns the views. Where the card cannot read host memory it logs
/// once and leaves every layer without them (the CPU then computes all host experts).
fn bus_views(card: &Arc<Device>, layers: &mut [TierLayer]) -> Vec<Buffer> {
    let mut views = Vec::new();
    for l in layers.iter_mut() {
        for (slice, full) in &l.stream {
            // SAFETY: the slice lies in the model's read-only file mapping, page-locked by
            // pin_streamed, which outlives the card device (LoadedModel's field order).
            match unsafe { card.map_pinned(slice.addr as *const u8, slice.len as u64) } {
                Ok(v) => {
                    l.bus_stacks.push(v.tensor(*full));
                    views.push(v);
                }
                Err(e) => {
                    tracing::warn!(
                        "the card cannot read host experts in place ({e}); the CPU computes them all"
                    );
                    layers.iter_mut().for_each(|l| l.bus_stacks.clear());
                    return Vec::new();
                }
            }
        }
    }
    views
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

/// Loads the weights as `plan` places them: every weight on `card`, routed-expert stacks
/// compacted to their on-card experts; the file mapped on a device of `host_kernel` for the host
/// experts. Returns the card buffers, the card's weight table (in `spec` order) and the tier.
pub fn load_weights(
    card: &Arc<Device>,
    host_kernel: &KernelPluginFile,
    threads: u32,
    file: &GgufModel,
    spec: &ModelSpec,
    plan: &Plan,
    request: &TierRequest,
) -> Result<(Vec<Buffer>, Vec<TensorRef>, ExpertTier), ModelError> {
    let host = Device::open(
        host_kernel,
        DeviceConfig {
            index: 0,
            threads,
            pin_threads: true,
        },
    )
    .map_err(dev_err("opening the host experts' CPU device"))?;
    let mut host_buffers = Vec::new();
    for part in file.parts() {
        let bytes = part.bytes();
        // SAFETY: the mapping lives in `LoadedModel::file`, which is dropped after the tier
        // (field order), and the file is mapped read-only and never written.
        let buf = unsafe { host.map_host(bytes.as_ptr(), bytes.len() as u64) }
            .map_err(dev_err("mapping the model file for host experts"))?;
        host_buffers.push(buf);
    }
    // weight index → (layer, position among its stacks)
    let mut stack_of: HashMap<usize, (usize, usize)> = HashMap::new();
    for (li, l) in plan.layers.iter().enumerate() {
        for (k, &w) in l.stacks.iter().enumerate() {
            stack_of.insert(w, (li, k));
        }
    }
    let mut card_buffers = Vec::new();
    let mut weights = Vec::with_capacity(spec.weights.len());
    let mut host_stacks: Vec<Vec<TensorRef>> = vec![Vec::new(); plan.layers.len()];
    let mut stream: Vec<Vec<(HostSlice, TensorRef)>> = vec![Vec::new(); plan.layers.len()];
    let mut card_stacks: Vec<Vec<TensorRef>> = vec![Vec::new(); plan.layers.len()];
    let mut sources: Vec<Vec<StackSource>> = vec![Vec::new(); plan.layers.len()];
    // Every weight the card holds lies in one allocation, at these offsets: the driver rounds
    // each allocation up to whole 2 MiB pages, and one allocation a tensor cost the 30B-A3B file
    // about 230 MiB of card memory with every expert on the host (docs/performance.md).
    let mut packed_at = vec![None; spec.weights.len()];
    let mut packed = 0u64;
    for (i, w) in spec.weights.iter().enumerate() {
        let (t, _, nb) = weight_tensor(file, spec, w.name.as_str())?;
        let bytes = match stack_of.get(&i) {
            None if plan.table_weights.contains(&i) => 0,
            None => t.info.size,
            Some(&(li, _)) => plan.on_card[li].iter().filter(|&&c| c).count() as u64 * nb[2],
        };
        if bytes > 0 {
            packed_at[i] = Some(packed);
            packed += bytes.div_ceil(WEIGHT_ALIGN) * WEIGHT_ALIGN;
        }
    }
    let arena = card
        .alloc(packed)
        .map_err(dev_err("allocating the card's weights"))?;
    // The tables left in host RAM: weight index and bytes, given views once page-locked.
    let mut tables: Vec<(usize, HostSlice)> = Vec::new();
    for (i, w) in spec.weights.iter().enumerate() {
        let (t, ne, nb) = weight_tensor(file, spec, w.name.as_str())?;
        let data = file.tensor_data(t)?;
        let at = packed_at[i].unwrap_or(0);
        if plan.table_weights.contains(&i) && !stack_of.contains_key(&i) {
            tables.push((i, HostSlice::of(data)));
            weights.push(TensorRef {
                buffer: 0,
                offset: 0,
                dtype: t.info.dtype,
                ne,
                nb,
            });
            continue;
        }
        let Some(&(li, _)) = stack_of.get(&i) else {
            card.write(&arena, at, data)
                .map_err(dev_err("copying weights to the card"))?;
            // The host never reads a weight the card holds: its pages leave resident memory,
            // which then holds what the host budget plans for (docs/performance.md).
            HostSlice::of(data).release();
            weights.push(TensorRef {
                buffer: arena.handle,
                offset: at,
                dtype: t.info.dtype,
                ne,
                nb,
            });
            continue;
        };
        let full = TensorRef {
            buffer: host_buffers[t.part].handle,
            offset: t.info.start,
            dtype: t.info.dtype,
            ne,
            nb,
        };
        host_stacks[li].push(full);
        sources[li].push(StackSource {
            part: t.part,
            offset: t.info.start,
            stride: nb[2],
        });
        stream[li].push((HostSlice::of(data), full));
        let on_card: Vec<usize> = (0..ne[2] as usize)
            .filter(|&e| plan.on_card[li][e])
            .collect();
        let compact = [ne[0], ne[1], on_card.len() as u64, 1];
        let cnb = TensorRef::contiguous_strides(t.info.dtype, compact).ok_or_else(|| {
            ModelError::Request(format!("tensor `{}` has no valid layout", t.info.name))
        })?;
        let mut r = TensorRef {
            buffer: 0,
            offset: 0,
            dtype: t.info.dtype,
            ne: compact,
            nb: cnb,
        };
        if !on_card.is_empty() {
            let stride = nb[2] as usize;
            for (j, &e) in on_card.iter().enumerate() {
                card.write(
                    &arena,
                    at + (j * stride) as u64,
                    &data[e * stride..][..stride],
                )
                .map_err(dev_err("copying experts to the card"))?;
            }
            r.buffer = arena.handle;
            r.offset = at;
            if on_card.len() as u64 == ne[2] {
                // A layer whole on the card is not a tier layer: nothing streams its stacks.
                HostSlice::of(data).release();
            }
        }
        card_stacks[li].push(r);
        weights.push(r);
    }
    card_buffers.push(arena);
    let mut layers = Vec::new();
    let mut layer_sources = Vec::new();
    let mut routing = Vec::new();
    // The tier layers lent a staging set.
    let mut lent = Vec::new();
    for (li, l) in plan.layers.iter().enumerate() {
        let here = &plan.on_card[li];
        if here.iter().all(|&c| c) {
            continue;
        }
        if plan.lent.contains(&li) {
            lent.push(layers.len());
        }
        let mut next = 0;
        let card_map: Vec<i32> = here
            .iter()
            .map(|&c| {
                if c {
                    next += 1;
                    next - 1
                } else {
                    -1
                }
            })
            .collect();
        let host_map: Vec<i32> = here
            .iter()
            .enumerate()
            .map(|(e, &c)| if c { -1 } else { e as i32 })
            .collect();
        let map_ref = |buf: &Buffer| TensorRef {
            buffer: buf.handle,
            offset: 0,
            dtype: DType::I32,
            ne: [u64::from(l.n_expert), 1, 1, 1],
            nb: [
                4,
                4 * u64::from(l.n_expert),
                4 * u64::from(l.n_expert),
                4 * u64::from(l.n_expert),
            ],
        };
        let cbuf = card
            .alloc(4 * u64::from(l.n_expert))
            .map_err(dev_err("allocating an expert map"))?;
        card.write(&cbuf, 0, i32_bytes(&card_map))
            .map_err(dev_err("writing an expert map"))?;
        let hbuf = host
            .alloc(4 * u64::from(l.n_expert))
            .map_err(dev_err("allocating an expert map"))?;
        host.write(&hbuf, 0, i32_bytes(&host_map))
            .map_err(dev_err("writing an expert map"))?;
        layers.push(TierLayer {
            first_stack: l.stacks[0],
            n_card: next as u32,
            card_map: map_ref(&cbuf),
            host_stacks: std::mem::take(&mut host_stacks[li]),
            host_map: map_ref(&hbuf),
            stream: std::mem::take(&mut stream[li]),
            card_stacks: std::mem::take(&mut card_stacks[li]),
            bus_stacks: Vec::new(),
            part_maps: Vec::new(),
        });
        layer_sources.push(std::mem::take(&mut sources[li]));
        let on_card: Vec<u32> = (0..l.n_expert).filter(|&e| here[e as usize]).collect();
        routing.push(LayerResidency::new(l.n_expert as usize, &on_card));
        card_buffers.push(cbuf);
        host_buffers.push(hbuf);
    }
    let mut bus = Vec::new();
    let on_disk = plan.host_expert_bytes() > plan.host_budget && !layers.is_empty();
    // With the disk tier only the tables (prompts stream its experts from the mapping; the plan
    // puts the tables here only when the card cannot hold them).
    let host_read: Vec<(usize, usize)> = layers
        .iter()
        .filter(|_| !on_disk)
        .flat_map(|l| l.stream.iter().map(|(h, _)| h))
        .chain(tables.iter().map(|(_, h)| h))
        .map(|h| (h.addr, h.addr + h.len))
        .collect();
    let pinned = pin_streamed(card, &host_read);
    let disk = if on_disk {
        Some(Arc::new(disk_tier(
            &host,
            file,
            plan,
            &mut layers,
            layer_sources,
            request.disk_prefetch,
        )?))
    } else {
        if pinned && request.bus_experts != Some(0) {
            bus = bus_views(card, &mut layers);
        }
        None
    };
    for (i, slice) in tables {
        let r = &mut weights[i];
        // SAFETY: the slice lies in the model's read-only file mapping, page-locked above, which
        // outlives the card device (LoadedModel's field order).
        match unsafe { card.map_pinned(slice.addr as *const u8, slice.len as u64) } {
            Ok(v) => {
                r.buffer = v.handle;
                bus.push(v);
            }
            Err(e) => {
                // The plan left no room for it, so the card may run short later.
                tracing::warn!(
                    "the card cannot read `{}` in place ({e}); it is copied to the card, {:.1} \
                     MiB past the plan",
                    spec.weights[i].name,
                    slice.len as f64 / (1u64 << 20) as f64
                );
                let buf = card
                    .alloc(slice.len as u64)
                    .map_err(dev_err("allocating a token table on the card"))?;
                card.write(&buf, 0, slice.bytes())
                    .map_err(dev_err("copying a token table to the card"))?;
                r.buffer = buf.handle;
                card_buffers.push(buf);
            }
        }
    }
    let mut staging = Vec::new();
    for _ in 0..plan.staging_sets {
        let mut set = Vec::new();
        for k in 0..layers.iter().map(|l| l.stream.len()).max().unwrap_or(0) {
            let bytes = layers
                .iter()
                .filter_map(|l| l.stream.get(k).map(|(h, _)| h.len as u64))
                .max()
                .unwrap_or(0);
            set.push(
                card.alloc(bytes)
                    .map_err(dev_err("allocating the experts' staging buffers"))?,
            );
        }
        staging.push(set);
    }
    let parts = plan.staging_parts();
    if parts > 1 && !layers.is_empty() {
        card_buffers.push(part_maps(card, &mut layers, parts)?);
    }
    let mut sets = vec![None; staging.len()];
    for t in lent {
        let set = stream_set(t, staging.len());
        let copies = layers[t]
            .stream
            .iter()
            .zip(staging.get(set).into_iter().flatten())
            .map(|((slice, _), b)| (b.handle, *slice))
            .collect();
        if let Some(s) = sets.get_mut(set) {
            *s = Some((t, copies));
        }
    }
    let lending = Arc::new(Lending::new(sets, disk.is_some()));
    Ok((
        card_buffers,
        weights,
        ExpertTier {
            layers,
            staging,
            staging_parts: parts,
            lending,
            residency: Arc::new(Mutex::new(Residency::new(routing, !request.no_residency))),
            disk,
            bus: Arc::new(Mutex::new(BusBalance::new(request.bus_experts))),
            _bus_views: bus,
            host_read,
            _host_buffers: host_buffers,
            host,
        },
    ))
}

/// Writes every layer's part maps ([`TierLayer::part_maps`], `parts` each) into one card
/// buffer, which it returns.
fn part_maps(
    card: &Arc<Device>,
    layers: &mut [TierLayer],
    parts: usize,
) -> Result<Buffer, ModelError> {
    let mut maps: Vec<i32> = Vec::new();
    for l in layers.iter() {
        let n = l.card_map.ne[0] as usize;
        for p in 0..parts {
            let (lo, hi) = (n * p / parts, n * (p + 1) / parts);
            maps.extend((0..n).map(|e| if (lo..hi).contains(&e) { e as i32 } else { -1 }));
        }
    }
    let buf = card
        .alloc(4 * maps.len() as u64)
        .map_err(dev_err("allocating the experts' part maps"))?;
    card.write(&buf, 0, i32_bytes(&maps))
        .map_err(dev_err("writing the experts' part maps"))?;
    let mut offset = 0;
    for l in layers.iter_mut() {
        let like = l.card_map;
        for _ in 0..parts {
            l.part_maps.push(TensorRef {
                buffer: buf.handle,
                offset,
                ..like
            });
            offset += like.ne[0] * 4;
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::{gathered_tables, whole_pages, HostSlice};
    use bloomery_plugin_api::graph::{BatchInput, GraphBuilder};
    use bloomery_plugin_api::op::Op;
    use bloomery_plugin_api::DType;
    use std::io::Write;

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

    #[test]
    fn ranges_are_rounded_out_to_pages_and_merged() {
        let p = 4096;
        assert_eq!(whole_pages(&[(100, 3 * p + 5)], p), vec![(0, 4 * p)]);
        // Unsorted; two sharing a page merge; one touching the next merges; an empty one goes.
        assert_eq!(
            whole_pages(
                &[
                    (9 * p, 9 * p + 1),
                    (p + 5, 2 * p + 1),
                    (3 * p - 1, 4 * p),
                    (4 * p, 5 * p),
                    (7 * p, 7 * p),
                ],
                p
            ),
            vec![(p, 5 * p), (9 * p, 10 * p)]
        );
        assert!(whole_pages(&[], p).is_empty());
    }

    /// Resident pages of this process (`/proc/self/statm`, second field).
    fn resident_pages() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        statm.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_released_slice_leaves_resident_memory_with_its_bytes_unchanged() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let bytes: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
        f.write_all(&bytes).unwrap();
        f.flush().unwrap();
        // SAFETY: the temporary file is not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(f.as_file()) }.unwrap();
        let slice = HostSlice {
            addr: map.as_ptr() as usize,
            len: map.len(),
        };
        let sum = |s: &HostSlice| s.bytes().iter().map(|&b| u64::from(b)).sum::<u64>();
        let want = sum(&slice);
        let touched = resident_pages();
        slice.release();
        let released = resident_pages();
        // 64 MiB are 16,384 pages of 4 KiB: at least half of them must have left.
        assert!(
            touched >= released + 8192,
            "resident pages {touched} before the release, {released} after"
        );
        assert_eq!(sum(&slice), want, "the bytes changed");
    }
}
