//! A model loaded for inference: the mapped file, its plugin instance, weights mapped on a
//! device, the state buffers of every sequence slot, and prepared graphs per batch shape.

mod mlock;
mod snapshot;
pub mod view;

pub use snapshot::Rewind;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bloomery_gguf::{GgufError, GgufModel, ModelTensor};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphKind};
use bloomery_plugin_api::kernel::{DeviceClass, DeviceConfig};
use bloomery_plugin_api::model::{ModelInstanceBox, ModelSpec, StateKind};
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use crate::engine::device::{Buffer, Device, Staging};
use crate::engine::executor::{BatchInputs, Bindings, ExecError, Executor};
use crate::engine::plan::plan_arena;
use crate::plugins::{KernelPluginFile, Registry, SelectError};
use crate::tiering::arena::ArenaStats;
use crate::tiering::plan::{FixedCosts, Plan, PlanError, TierRequest};
use crate::tiering::{self, ExpertTier};

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file is not a valid GGUF.
    #[error(transparent)]
    File(#[from] GgufError),
    /// No plugin serves it.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// The file lacks `general.architecture`.
    #[error("{path}: no `general.architecture` key")]
    NoArchitecture {
        /// The file.
        path: String,
    },
    /// The model plugin refused the file.
    #[error("{path}: the `{plugin}` plugin cannot load it: {source}")]
    Plugin {
        /// The file.
        path: String,
        /// The model plugin.
        plugin: String,
        /// Its error.
        source: PluginError,
    },
    /// A device operation failed.
    #[error("{context}: {source}")]
    Device {
        /// What was being done.
        context: String,
        /// The plugin's error.
        source: PluginError,
    },
    /// Preparing or running a graph failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A request the model cannot serve (a position past the context, a bad slot).
    #[error("{0}")]
    Request(String),
    /// No placement of the weights fits the budgets.
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// Card memory kept free besides the planned arenas, the kernels' per-row scratch
/// ([`scratch_per_row`]) and the page tables ([`PAGE_TABLE_SHARE`]): captured graphs, the
/// executors' inputs, a streamed layer's halves' output and small buffers. Measured on the H200
/// (docs/performance.md, "every expert on the host within llama.cpp's card memory"): the
/// 30B-A3B file with every expert on the host used about 25 MiB of these (graphs 15, the
/// halves' output 8).
const CARD_RESERVE: u64 = 96 << 20;

/// The least kernel scratch planned per row of the largest pass.
const MIN_SCRATCH_PER_ROW: u64 = 32 << 10;

/// Kernel scratch per row of a pass of `graph`, at least [`MIN_SCRATCH_PER_ROW`]: what a batched
/// MoE call holds per row (its `k` experts' gate|up and down products in f32, with Q8_1 copies of
/// its input and of the GLU, as the CUDA bundles lay them out), and a quarter more.
fn scratch_per_row(graph: &Graph) -> u64 {
    let moe = graph
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::MoeExperts(p) => {
                let n_embd = graph.tensors.get(n.srcs.first()?.0 as usize)?.ne[0];
                let (k, n_ff) = (u64::from(p.k), u64::from(p.n_ff));
                let q8 = |n: u64| n.div_ceil(32) * 36;
                Some(k * (2 * n_ff + n_embd) * 4 + k * q8(n_ff) + q8(n_embd))
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    (moe + moe / 4).max(MIN_SCRATCH_PER_ROW)
}

/// Card memory the driver takes per byte of host memory the card reads in place (page-locked
/// and mapped: host experts, token tables): its page tables, 8 bytes a 4 KiB page. Measured on
/// the H200: 30 MiB for the 30B-A3B file's 15.5 GiB.
const PAGE_TABLE_SHARE: u64 = 512;

/// The card memory planned for activations and kernel scratch: two arenas of the largest pass
/// (`arena` bytes, planned for `rows` rows), its kernel scratch (`per_row` a row), the reserve,
/// and the page tables of `mapped` bytes of host memory the card may read in place.
fn scratch_bytes(arena: u64, rows: u32, per_row: u64, mapped: u64) -> u64 {
    2 * arena + CARD_RESERVE + u64::from(rows) * per_row + mapped / PAGE_TABLE_SHARE
}

/// Prepared executors kept per model; the least recently used beyond this is dropped.
const MAX_EXECUTORS: usize = 8;

/// How to load a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Sequence slots (parallel sequences).
    pub n_slots: u32,
    /// Context positions per slot.
    pub ctx_per_slot: u32,
    /// Key/value cache type (F32 or F16).
    pub kv_type: DType,
    /// CPU worker threads (0 = one per core).
    pub threads: u32,
    /// Capture each batch shape's calls into a device graph on its second pass and replay it
    /// after (devices that cannot capture run eagerly either way).
    pub graphs: bool,
    /// Lock the model's mapped bytes in RAM at load (`--mlock`; see [`mlock`]).
    pub mlock: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            n_slots: 1,
            ctx_per_slot: 4096,
            kv_type: DType::F16,
            threads: 0,
            graphs: true,
            mlock: false,
        }
    }
}

/// A loaded model. Field order is drop order: device buffers go before the mapping they view.
pub struct LoadedModel {
    /// Prepared executors by (rows, outputs), with the tick each was last used.
    executors: HashMap<(u32, u32), (Executor, u64)>,
    clock: u64,
    state_buffers: Vec<Buffer>,
    state: Vec<TensorRef>,
    /// Page-locked memory that slot states are copied out through, made at the first copy or at
    /// a server's start (`snapshot.rs`).
    snapshot_staging: std::sync::Mutex<Option<Staging>>,
    _weight_buffers: Vec<Buffer>,
    weights: Vec<TensorRef>,
    tier: Option<ExpertTier>,
    /// Where the routed experts live (made when the model runs on a GPU or placement was asked
    /// for).
    pub plan: Option<Plan>,
    instance: ModelInstanceBox,
    device: Arc<Device>,
    /// What the plugin declared.
    pub spec: ModelSpec,
    /// The plugin's name.
    pub plugin: String,
    /// Load options in force.
    pub options: LoadOptions,
    /// The mapped file (kept alive for the weight buffers).
    pub file: GgufModel,
    /// Bytes of the mapped file locked in RAM (`--mlock`; 0 without it).
    pub locked: u64,
}

fn device_err(context: &str) -> impl FnOnce(PluginError) -> ModelError + '_ {
    move |source| ModelError::Device {
        context: context.to_owned(),
        source,
    }
}

/// Routed expert calls of the layers with host experts, since load or the last reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoutingStats {
    /// Served by experts on the card.
    pub card: u64,
    /// Served by experts in host RAM.
    pub host: u64,
    /// Of `host`, computed by the card reading the expert over the bus.
    pub bus: u64,
    /// Experts moved onto the card.
    pub flips: u64,
    /// The bus share's size per k host experts, once the first decode passes chose it.
    pub bus_kept: Option<usize>,
}

/// Whether a model that failed to load on the GPU may run on the CPU instead: not when its
/// placement does not fit the card's budget (see [`LoadedModel::load_offloaded`]).
fn may_fall_back(e: &ModelError) -> bool {
    !matches!(e, ModelError::Plan(_))
}

impl LoadedModel {
    /// Opens `path`, finds its model plugin and the best CPU kernel plugin, maps the weights and
    /// allocates the state. Every failure is a named error.
    pub fn load(
        reg: &Registry,
        path: &Path,
        options: LoadOptions,
    ) -> Result<LoadedModel, ModelError> {
        Self::load_on(reg, path, options, reg.best_kernel(DeviceClass::Cpu)?)
    }

    /// With `gpu`, the whole model on the best GPU kernel plugin; when none can run here, or the
    /// chosen one lacks an op of this model, on the CPU with one warning naming why. A placement
    /// that does not fit the card's budget is refused with its terms instead (falling back would
    /// run the model many times slower than asked, with only a warning to say so). Without
    /// `gpu`, as [`LoadedModel::load`].
    pub fn load_offloaded(
        reg: &Registry,
        path: &Path,
        options: LoadOptions,
        gpu: bool,
        request: &TierRequest,
    ) -> Result<LoadedModel, ModelError> {
        if gpu {
            let tried = reg
                .best_kernel(DeviceClass::Gpu)
                .map_err(ModelError::from)
                .and_then(|k| Self::load_placed(reg, path, options, k, request));
            match tried {
                Ok(m) => return Ok(m),
                Err(e) if !may_fall_back(&e) => return Err(e),
                Err(e) => tracing::warn!(
                    "GPU offload requested but not possible ({e}); running on the CPU"
                ),
            }
        }
        Self::load(reg, path, options)
    }

    /// The kernel plugin the model runs on.
    pub fn kernel_plugin(&self) -> &str {
        &self.device.plugin
    }

    /// As [`LoadedModel::load`], on the device of a given kernel plugin (weights copied there when
    /// the device is not the host). A graph op the plugin lacks is a named error at load.
    pub fn load_on(
        reg: &Registry,
        path: &Path,
        options: LoadOptions,
        kernel: &KernelPluginFile,
    ) -> Result<LoadedModel, ModelError> {
        Self::load_placed(reg, path, options, kernel, &TierRequest::default())
    }

    /// As [`LoadedModel::load_on`], with routed experts placed as `request` asks (or as the card's
    /// free memory allows): experts planned for the host are computed there by the best CPU
    /// kernel plugin, straight from the mapped file.
    pub fn load_placed(
        reg: &Registry,
        path: &Path,
        options: LoadOptions,
        kernel: &KernelPluginFile,
        request: &TierRequest,
    ) -> Result<LoadedModel, ModelError> {
        let Opened {
            file,
            shown,
            plugin,
            instance,
            spec,
        } = open_model(reg, path)?;
        tracing::info!(model = %plugin.name, kernel = %kernel.name, "loading {shown}");
        let device = Device::open(
            kernel,
            DeviceConfig {
                index: 0,
                threads: options.threads,
                pin_threads: true,
            },
        )
        .map_err(device_err("opening the kernel plugin's device"))?;
        let plan = if kernel.probe.class == DeviceClass::Gpu || !request.is_default() {
            Some(plan_for(
                &instance,
                &spec,
                &file,
                &device,
                options,
                request,
                &shown,
                &plugin.name,
            )?)
        } else {
            None
        };
        let (state_buffers, state) = allocate_state(&device, &spec, options)?;
        let (weight_buffers, weights, tier) = match &plan {
            Some(p) if p.has_host_experts() => {
                let host = reg.best_kernel(DeviceClass::Cpu)?;
                tracing::info!(
                    "routed experts: {:.2} GiB on the card, {:.2} GiB in host RAM on {}",
                    p.card_expert_bytes() as f64 / (1u64 << 30) as f64,
                    p.host_expert_bytes() as f64 / (1u64 << 30) as f64,
                    host.name
                );
                let (b, w, t) = tiering::load_weights(
                    &device,
                    host,
                    options.threads,
                    &file,
                    &spec,
                    p,
                    request,
                )?;
                (b, w, Some(t))
            }
            _ => {
                let (b, w) = map_weights(&device, &file, &spec)?;
                (b, w, None)
            }
        };
        let locked = if options.mlock {
            let ranges = match &tier {
                Some(t) => t.host_read.clone(),
                // Every weight copied to the card: the host reads none of the file.
                None if kernel.probe.class == DeviceClass::Gpu => Vec::new(),
                None => file
                    .parts()
                    .iter()
                    .map(|p| p.bytes().as_ptr_range())
                    .map(|r| (r.start as usize, r.end as usize))
                    .collect(),
            };
            mlock::lock_ranges(&ranges)
        } else {
            0
        };
        let mut model = LoadedModel {
            executors: HashMap::new(),
            clock: 0,
            state_buffers,
            state,
            snapshot_staging: std::sync::Mutex::new(None),
            _weight_buffers: weight_buffers,
            weights,
            tier,
            plan,
            instance,
            device,
            spec,
            plugin: plugin.name.clone(),
            options,
            file,
            locked,
        };
        model.executor(1, 1)?;
        Ok(model)
    }

    fn executor(&mut self, n_rows: u32, n_outputs: u32) -> Result<&Executor, ModelError> {
        let key = (n_rows, n_outputs);
        self.clock += 1;
        let now = self.clock;
        if !self.executors.contains_key(&key) {
            // A server sees many batch shapes: keep the most recently used few.
            while self.executors.len() >= MAX_EXECUTORS {
                let oldest = self
                    .executors
                    .iter()
                    .min_by_key(|(_, e)| e.1)
                    .map(|(k, _)| *k);
                match oldest {
                    Some(k) => self.executors.remove(&k),
                    None => break,
                };
            }
            let shape = BatchShape {
                n_rows,
                n_outputs,
                kind: GraphKind::Main,
            };
            let graph = self
                .instance
                .build_graph(shape)
                .into_result()
                .map_err(|source| ModelError::Plugin {
                    path: self.file.parts()[0].path().display().to_string(),
                    plugin: self.plugin.clone(),
                    source,
                })?;
            let bind = Bindings {
                weights: &self.weights,
                state: &self.state,
                tier: self.tier.as_ref(),
            };
            let started = std::time::Instant::now();
            let exec = Executor::prepare(&self.device, shape, &graph, &bind, self.options.graphs)?;
            tracing::debug!(
                "prepared the pass of {n_rows} rows and {n_outputs} outputs in {:.2} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            self.executors.insert(key, (exec, now));
        }
        let entry = self
            .executors
            .get_mut(&key)
            .ok_or_else(|| ModelError::Request("executor cache lost an entry".into()))?;
        entry.1 = now;
        Ok(&entry.0)
    }

    /// The op calls of a pass of `n_rows` rows and `n_outputs` outputs, as the kernel plugin
    /// receives them (memory planned; for checking what a kernel plugin will see).
    pub fn pass_calls(&mut self, n_rows: u32, n_outputs: u32) -> Result<Vec<OpCall>, ModelError> {
        Ok(self.executor(n_rows, n_outputs)?.calls().to_vec())
    }

    /// Runs one pass over a batch and returns the logits of its output rows, `n_vocab` values per
    /// output row in the order of `batch.output_rows`.
    pub fn forward(&mut self, batch: &BatchInputs) -> Result<Vec<f32>, ModelError> {
        let rows = batch.tokens.len();
        if rows == 0 || batch.positions.len() != rows || batch.slots.len() != rows {
            return Err(ModelError::Request(format!(
                "a batch needs one position and slot per token: {} tokens, {} positions, {} slots",
                rows,
                batch.positions.len(),
                batch.slots.len()
            )));
        }
        let ctx = self.options.ctx_per_slot as i32;
        let n_vocab = self.spec.hparams.n_vocab as i32;
        for r in 0..rows {
            let (t, p, s) = (batch.tokens[r], batch.positions[r], batch.slots[r]);
            if p < 0 || p >= ctx {
                return Err(ModelError::Request(format!(
                    "position {p} is outside the context of {ctx}"
                )));
            }
            if s < 0 || s >= self.options.n_slots as i32 {
                return Err(ModelError::Request(format!(
                    "slot {s} of {}",
                    self.options.n_slots
                )));
            }
            if t < 0 || t >= n_vocab {
                return Err(ModelError::Request(format!(
                    "token {t} outside the vocabulary of {n_vocab}"
                )));
            }
        }
        if batch
            .output_rows
            .iter()
            .any(|&o| o < 0 || o as usize >= rows)
        {
            return Err(ModelError::Request(
                "an output row is outside the batch".into(),
            ));
        }
        let device = Arc::clone(&self.device);
        if batch.output_rows.is_empty() {
            // A prompt chunk before the last: no logits wanted. Graphs always keep one output
            // row (kernels need not handle empty tensors); its logits are dropped.
            let mut one = batch.clone();
            one.output_rows.push(rows as i32 - 1);
            self.executor(rows as u32, 1)?.run(&device, &one)?;
            self.rebalance()?;
            return Ok(Vec::new());
        }
        let exec = self.executor(rows as u32, batch.output_rows.len() as u32)?;
        exec.run(&device, batch)?;
        let logits = exec.read_f32(&device, "logits")?;
        self.rebalance()?;
        Ok(logits)
    }

    /// Moves routed experts between the card and the host as the routing counts call for
    /// (nothing without host experts, or with residency off).
    fn rebalance(&self) -> Result<(), ModelError> {
        if let Some(t) = &self.tier {
            t.rebalance(&self.device)
                .map_err(device_err("moving experts onto the card"))?;
        }
        Ok(())
    }

    /// Routed calls in layers with host experts and the experts moved so far (`None` without
    /// host experts).
    pub fn residency_stats(&self) -> Option<RoutingStats> {
        let r = self.tier.as_ref()?.residency.lock().ok()?;
        Some(RoutingStats {
            card: r.card_calls,
            host: r.host_calls,
            bus: r.bus_calls,
            flips: r.flips,
            bus_kept: self.tier.as_ref()?.bus.lock().ok()?.kept(),
        })
    }

    /// Routed calls per expert of each layer with host experts, in layer order, as the residency
    /// counts them (faded between steps while residency is on; `None` without tiering).
    pub fn routing_counts(&self) -> Option<Vec<Vec<f32>>> {
        let r = self.tier.as_ref()?.residency.lock().ok()?;
        Some(r.layers.iter().map(|l| l.counts.clone()).collect())
    }

    /// Experts read from the model file by the disk tier so far, and how many of them were
    /// read ahead (`None` without a disk tier).
    pub fn disk_stats(&self) -> Option<ArenaStats> {
        self.tier.as_ref()?.disk.as_ref()?.stats().ok()
    }

    /// Layers copied back into the staging sets lent to them so far (`None` without tiering);
    /// see [`crate::tiering::lending`].
    pub fn lent_restores(&self) -> Option<u64> {
        Some(self.tier.as_ref()?.lending.restored())
    }

    /// Forgets the routing counts and statistics (`POST /residency/reset`).
    pub fn reset_residency(&self) {
        if let Some(mut r) = self.tier.as_ref().and_then(|t| t.residency.lock().ok()) {
            r.reset();
        }
    }
}

/// A file opened by its model plugin.
struct Opened<'r> {
    file: GgufModel,
    shown: String,
    plugin: &'r crate::plugins::ModelPluginFile,
    instance: ModelInstanceBox,
    spec: ModelSpec,
}

fn open_model<'r>(reg: &'r Registry, path: &Path) -> Result<Opened<'r>, ModelError> {
    let file = GgufModel::open(path)?;
    let shown = path.display().to_string();
    let arch = file
        .metadata()
        .get_str("general.architecture")
        .map_err(|_| ModelError::NoArchitecture {
            path: shown.clone(),
        })?
        .to_owned();
    let plugin = reg.model_for(&arch)?;
    let view = view::file_view(&file);
    let instance = plugin.module.load()(&view)
        .into_result()
        .map_err(|source| ModelError::Plugin {
            path: shown.clone(),
            plugin: plugin.name.clone(),
            source,
        })?;
    let spec = instance.spec();
    Ok(Opened {
        file,
        shown,
        plugin,
        instance,
        spec,
    })
}

/// The placement plan `request` gives for the file at `path` on the device of `kernel`, without
/// loading weights (`bloomery plan`).
pub fn plan_only(
    reg: &Registry,
    path: &Path,
    options: LoadOptions,
    kernel: &KernelPluginFile,
    request: &TierRequest,
) -> Result<Plan, ModelError> {
    let o = open_model(reg, path)?;
    let device = Device::open(
        kernel,
        DeviceConfig {
            index: 0,
            threads: options.threads,
            pin_threads: false,
        },
    )
    .map_err(device_err("opening the kernel plugin's device"))?;
    plan_for(
        &o.instance,
        &o.spec,
        &o.file,
        &device,
        options,
        request,
        &o.shown,
        &o.plugin.name,
    )
}

/// Host RAM available: the cgroup's limit less its use when lower, else MemAvailable.
fn host_available() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let avail = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(u64::MAX, |kib| kib * 1024);
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    match (read("memory.max"), read("memory.current")) {
        (Some(max), Some(cur)) => avail.min(max.saturating_sub(cur)),
        _ => avail,
    }
}

/// The placement plan: the graph's MoE layers, what the card must hold besides them, and the
/// budgets (asked for, or the card's free memory and the host's available RAM).
#[allow(clippy::too_many_arguments)]
fn plan_for(
    instance: &ModelInstanceBox,
    spec: &ModelSpec,
    file: &GgufModel,
    device: &Arc<Device>,
    options: LoadOptions,
    request: &TierRequest,
    path: &str,
    plugin: &str,
) -> Result<Plan, ModelError> {
    let graph_of = |n_rows: u32| {
        instance
            .build_graph(BatchShape {
                n_rows,
                n_outputs: 1,
                kind: GraphKind::Main,
            })
            .into_result()
            .map_err(|source| ModelError::Plugin {
                path: path.to_owned(),
                plugin: plugin.to_owned(),
                source,
            })
    };
    let decode = graph_of(1)?;
    let layers = tiering::moe_layers(&decode, spec, file);
    let stacks: std::collections::HashSet<&str> = layers
        .iter()
        .flat_map(|l| l.names.iter().map(String::as_str))
        .collect();
    let size = |i: &usize| {
        spec.weights
            .get(*i)
            .and_then(|w| file.tensor(w.name.as_str()))
            .map_or(0, |t| t.info.size)
    };
    let dense = (0..spec.weights.len())
        .filter(|&i| !stacks.contains(spec.weights[i].name.as_str()))
        .map(|i| size(&i))
        .sum();
    let state = state_bytes(spec, options);
    let rows = match request.batch_rows {
        0 => crate::tiering::plan::DEFAULT_BATCH_ROWS,
        n => n,
    };
    let batch = graph_of(rows)?;
    let arena = plan_arena(&batch)
        .map_err(|e| ModelError::Request(format!("planning the activation arena: {e}")))?
        .size;
    // The draft layers' graph, when the model has one, may read the same tables otherwise.
    let draft = instance
        .build_graph(BatchShape {
            n_rows: 1,
            n_outputs: 1,
            kind: GraphKind::Mtp,
        })
        .into_result()
        .ok();
    let mut graphs = vec![&decode, &batch];
    graphs.extend(draft.as_ref());
    let tables: Vec<usize> = tiering::gathered_tables(&graphs)
        .into_iter()
        .filter(|i| !stacks.contains(spec.weights[*i].name.as_str()))
        .collect();
    let table_bytes = tables.iter().map(size).sum();
    let expert_bytes: u64 = layers
        .iter()
        .map(|l| l.expert_bytes * u64::from(l.n_expert))
        .sum();
    let fixed = FixedCosts {
        dense,
        state,
        scratch: scratch_bytes(
            arena,
            rows,
            scratch_per_row(&batch),
            expert_bytes + table_bytes,
        ),
        tables: table_bytes,
    };
    let card = request
        .gpu_budget
        .unwrap_or_else(|| match device.info().free_memory {
            0 => u64::MAX,
            free => free,
        });
    let host = request.host_budget.unwrap_or_else(host_available);
    let mut plan = Plan::make(layers, fixed, card, host, request)?;
    if plan.tables_on_host {
        plan.table_weights = tables;
    }
    Ok(plan)
}

/// Bytes of every state buffer for all slots, as [`allocate_state`] lays them out.
fn state_bytes(spec: &ModelSpec, o: LoadOptions) -> u64 {
    spec.state
        .iter()
        .map(|s| {
            let (dtype, rows) = state_rows(s, o);
            dtype.row_bytes(s.row_elems).unwrap_or(0) * rows * u64::from(o.n_slots)
        })
        .sum()
}

/// The type of state buffer `s` and its rows per slot: one per position for positional kinds
/// (pooled keys: per block), one per sequence otherwise.
fn state_rows(s: &bloomery_plugin_api::model::StateDecl, o: LoadOptions) -> (DType, u64) {
    let ctx = u64::from(o.ctx_per_slot);
    match s.kind {
        StateKind::Keys | StateKind::Values | StateKind::Latent => (o.kv_type, ctx),
        StateKind::PooledKeys => (DType::F32, ctx.div_ceil(u64::from(s.block.max(1)))),
        StateKind::Conv | StateKind::Recurrent => (DType::F32, 1),
    }
}

/// The file tensor behind declared weight `name`, with its shape and contiguous strides; a
/// missing tensor is the plugin's named error.
pub(crate) fn weight_tensor<'f>(
    file: &'f GgufModel,
    spec: &ModelSpec,
    name: &str,
) -> Result<(&'f ModelTensor, [u64; 4], [u64; 4]), ModelError> {
    let t = file.tensor(name).ok_or_else(|| ModelError::Plugin {
        path: file.parts()[0].path().display().to_string(),
        plugin: spec.architecture.to_string(),
        source: PluginError::MissingTensor { name: name.into() },
    })?;
    let mut ne = [1u64; 4];
    for (d, &x) in t.info.shape.iter().take(4).enumerate() {
        ne[d] = x;
    }
    let nb = TensorRef::contiguous_strides(t.info.dtype, ne).ok_or_else(|| {
        ModelError::Request(format!("tensor `{}` has no valid layout", t.info.name))
    })?;
    Ok((t, ne, nb))
}

/// Maps each file part once and resolves every declared weight into it.
fn map_weights(
    device: &Arc<Device>,
    file: &GgufModel,
    spec: &ModelSpec,
) -> Result<(Vec<Buffer>, Vec<TensorRef>), ModelError> {
    let mut buffers = Vec::new();
    for part in file.parts() {
        let bytes = part.bytes();
        // SAFETY: the mapping lives in `LoadedModel::file`, which is dropped after the buffers
        // (field order), and the file is mapped read-only and never written.
        let buf = unsafe { device.map_host(bytes.as_ptr(), bytes.len() as u64) }
            .map_err(device_err("mapping the model file"))?;
        buffers.push(buf);
    }
    let mut refs = Vec::with_capacity(spec.weights.len());
    for w in spec.weights.iter() {
        let (t, ne, nb) = weight_tensor(file, spec, w.name.as_str())?;
        refs.push(TensorRef {
            buffer: buffers[t.part].handle,
            offset: t.info.start,
            dtype: t.info.dtype,
            ne,
            nb,
        });
    }
    Ok((buffers, refs))
}

/// Allocates every declared state buffer for all slots.
fn allocate_state(
    device: &Arc<Device>,
    spec: &ModelSpec,
    o: LoadOptions,
) -> Result<(Vec<Buffer>, Vec<TensorRef>), ModelError> {
    let mut buffers = Vec::new();
    let mut refs = Vec::new();
    for s in spec.state.iter() {
        let (dtype, len) = state_rows(s, o);
        let ne = [s.row_elems, len, u64::from(o.n_slots), 1];
        let nb = TensorRef::contiguous_strides(dtype, ne).ok_or_else(|| {
            ModelError::Request(format!("state `{}` has no layout for {dtype}", s.name))
        })?;
        let bytes = nb[3];
        let buf = device.alloc(bytes).map_err(device_err(&format!(
            "allocating state `{}` ({bytes} bytes)",
            s.name
        )))?;
        refs.push(TensorRef {
            buffer: buf.handle,
            offset: 0,
            dtype,
            ne,
            nb,
        });
        buffers.push(buf);
    }
    Ok((buffers, refs))
}

#[cfg(test)]
mod tests {
    use super::{may_fall_back, scratch_per_row, ModelError, MIN_SCRATCH_PER_ROW};
    use crate::tiering::plan::PlanError;
    use bloomery_plugin_api::graph::{BatchInput, GraphBuilder};
    use bloomery_plugin_api::op::{GluKind, MoeParams, Op};
    use bloomery_plugin_api::DType;

    /// A graph of one MoE call over `rows` rows of width `n_embd` (`k` of 128 experts, FFN
    /// `n_ff`), or of one product when `k` is 0.
    fn one_call(rows: u64, n_embd: u64, k: u32, n_ff: u32) -> bloomery_plugin_api::graph::Graph {
        let mut g = GraphBuilder::new();
        let x = g.input(BatchInput::Tokens, [n_embd, rows, 1, 1]).unwrap();
        let y = if k == 0 {
            let w = g
                .weight(0, "w", DType::F32, [n_embd, n_embd, 1, 1])
                .unwrap();
            g.op("y", Op::MatMul, &[w, x], DType::F32, [n_embd, rows, 1, 1])
                .unwrap()
        } else {
            let ids = g
                .input(BatchInput::Positions, [u64::from(k), rows, 1, 1])
                .unwrap();
            let (ff, e) = (u64::from(n_ff), 128);
            let gate = g
                .weight(0, "gate", DType::Q4_K, [n_embd, ff, e, 1])
                .unwrap();
            let up = g.weight(1, "up", DType::Q4_K, [n_embd, ff, e, 1]).unwrap();
            let down = g
                .weight(2, "down", DType::Q4_K, [ff, n_embd, e, 1])
                .unwrap();
            let p = MoeParams {
                n_expert: 128,
                k,
                n_ff,
                glu: GluKind::SwiGlu,
                limit: 0.0,
                fused_gate_up: false,
                expert_map: false,
            };
            g.op(
                "moe",
                Op::MoeExperts(p),
                &[x, ids, ids, gate, up, down],
                DType::F32,
                [n_embd, rows, 1, 1],
            )
            .unwrap()
        };
        g.output("y", y);
        g.finish()
    }

    #[test]
    fn the_kernel_scratch_planned_per_row_covers_what_the_card_used() {
        // The 30B-A3B shape (k 8 of 128, FFN 768, width 2048): the CUDA bundle's scratch grew
        // to 62 MiB for a 512-row prompt (docs/performance.md, "every expert on the host within
        // llama.cpp's card memory"); planned with a quarter more, not past it.
        let per_row = scratch_per_row(&one_call(512, 2048, 8, 768));
        assert!(512 * per_row >= 62 << 20, "{per_row}");
        assert!(512 * per_row <= 80 << 20, "{per_row}");
        // Wider experts need more; a graph without MoE calls gets the floor.
        assert!(scratch_per_row(&one_call(512, 4096, 8, 1536)) > per_row * 19 / 10);
        assert_eq!(
            scratch_per_row(&one_call(512, 2048, 0, 0)),
            MIN_SCRATCH_PER_ROW
        );
    }

    #[test]
    fn a_placement_that_does_not_fit_is_refused_rather_than_run_on_the_cpu() {
        assert!(!may_fall_back(&ModelError::Plan(PlanError(
            "dense weights … over its budget".into()
        ))));
        assert!(may_fall_back(&ModelError::Request("no GPU plugin".into())));
    }
}
