//! A model loaded for inference: the mapped file, its plugin instance, weights mapped on a
//! device, the state buffers of every sequence slot, and prepared graphs per batch shape.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bloomery_devices::{Buffer, Device, KernelPluginFile, Registry, Staging};
use bloomery_gguf::GgufModel;
use bloomery_plugin_api::graph::{BatchInput, BatchShape, GraphKind, TensorSource, FINAL_NORM};
use bloomery_plugin_api::kernel::{DeviceClass, DeviceConfig};
use bloomery_plugin_api::model::{ModelInstanceBox, ModelSpec, WeightClass};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_tiering::arena::ArenaStats;
use bloomery_tiering::cards::UsedCard;
use bloomery_tiering::plan::{Plan, TierRequest};
use bloomery_tiering::ExpertTier;

use crate::error::{device_err, ModelError};
use crate::executor::{ArenaSource, BatchInputs, Bindings, ExecError, Executor};
use crate::mlock;
use crate::ngram_table::{NgramStats, NgramTables};
use crate::open::{open_model, Opened};
use crate::options::LoadOptions;
use crate::placement::{
    card_budget, one_card, open_card, pass_kind, plan_for, unplanned_ngram_cache,
};
use crate::readout::{
    graph_for, tap_layer, Readout, EMBEDDINGS_OUTPUT, TOP_IDS_OUTPUT, TOP_PROBS_OUTPUT,
};
use crate::state::allocate_state;
use crate::weights::{copy_weights, load_tiered, map_weights};

/// Prepared executors of passes of more than [`SMALL_ROWS`] rows kept per model; the least
/// recently used beyond this is dropped.
const MAX_EXECUTORS: usize = 8;

/// Passes of at most this many rows count as small: decode steps, and a drafting loop's verify
/// passes (each slot's sampled token and its drafts: 16 rows for 4 slots at
/// `--spec-draft-n-max` 3), re-runs after a refusal and the MTP block's passes.
const SMALL_ROWS: u32 = 16;

/// Prepared executors of small passes kept per model, beside [`MAX_EXECUTORS`]. A drafting loop
/// at `--spec-draft-n-max` 3 cycles through about a dozen shapes with one slot (verify passes
/// of 1–4 rows, re-runs of 1–3, the MTP block's passes of 1–4) and about 40 with four (the
/// tiny qwen35moe file, `bench -np 4`), which a shared limit of 8 kept preparing afresh (on a
/// GPU each time an eager pass and a graph capture). Small passes share one activation arena
/// (the largest one's), so each kept costs only its inputs, staging and captured graph.
const MAX_SMALL_EXECUTORS: usize = 64;

/// A loaded model. Field order is drop order: device buffers go before the mapping they view.
pub struct LoadedModel {
    /// Prepared executors by (batch shape, readout), with the tick each was last used.
    pub(crate) executors: HashMap<(BatchShape, Readout), (Executor, u64)>,
    /// The activation arena small passes share (the largest one's, made as they come).
    small_arena: Option<Arc<Buffer>>,
    pub(crate) clock: u64,
    /// Executors prepared since load.
    pub(crate) prepared: u64,
    pub(crate) state_buffers: Vec<Buffer>,
    pub(crate) state: Vec<TensorRef>,
    /// Page-locked memory that slot states are copied out through, made at the first copy or at
    /// a server's start (`snapshot.rs`).
    pub(crate) snapshot_staging: std::sync::Mutex<Option<Staging>>,
    /// Device-side copies of slots' per-sequence state, for refused drafts (`spare.rs`).
    pub(crate) spare: crate::state::SpareState,
    /// Per-row copies of the per-sequence state that verify passes write (`row_states.rs`).
    pub(crate) row_states: crate::state::RowStates,
    /// What moving cached positions does to each state buffer (`shift.rs`), worked out at the
    /// first shift.
    pub(crate) shift: std::sync::OnceLock<crate::shift_plan::ShiftPlan>,
    _weight_buffers: Vec<Buffer>,
    pub(crate) weights: Vec<TensorRef>,
    pub(crate) tier: Option<ExpertTier>,
    /// The hashed n-gram tables the host gathers rows from (before `file`, whose mapping they
    /// read).
    pub(crate) ngram: Option<Arc<NgramTables>>,
    /// Where the routed experts live (made when the model runs on a GPU or placement was asked
    /// for).
    pub plan: Option<Plan>,
    pub(crate) instance: ModelInstanceBox,
    pub(crate) device: Arc<Device>,
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
    /// The graph gives logits (false for a decision model's backbone, whose graph ends at its
    /// final norm): text generation needs them.
    pub output_head: bool,
    /// The rows the embeddings readout reads ([`LoadedModel::read_rows_from`]).
    rows: &'static str,
}

/// What a pass read back for its output rows (each empty when its readout did not ask for it).
#[derive(Clone, Debug, Default)]
pub struct PassOutputs {
    /// `n_vocab` logits a row.
    pub logits: Vec<f32>,
    /// `n_embd` final-norm values a row (the embeddings).
    pub embeddings: Vec<f32>,
    /// [`Readout::Top`]'s `k` likeliest token ids a row, likeliest first.
    pub top_ids: Vec<i32>,
    /// Their probabilities among those `k`.
    pub top_probs: Vec<f32>,
}

impl PassOutputs {
    /// Bytes read back to the host.
    pub fn bytes(&self) -> u64 {
        4 * (self.logits.len() + self.embeddings.len() + self.top_ids.len() + self.top_probs.len())
            as u64
    }
}

/// What `readout` asks of a pass `exec` ran.
fn read_outputs(
    exec: &Executor,
    device: &Device,
    readout: Readout,
) -> Result<PassOutputs, ModelError> {
    let mut out = PassOutputs::default();
    if readout.logits() {
        out.logits = exec.read_f32(device, "logits")?;
    }
    if readout.embeddings() {
        out.embeddings = exec.read_f32(device, EMBEDDINGS_OUTPUT)?;
    }
    if let Readout::Top(_) = readout {
        out.top_ids = exec.read_i32(device, TOP_IDS_OUTPUT)?;
        out.top_probs = exec.read_f32(device, TOP_PROBS_OUTPUT)?;
    }
    Ok(out)
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

/// Bytes of the file's parts.
fn file_bytes(file: &GgufModel) -> u64 {
    file.parts().iter().map(|p| p.bytes().len() as u64).sum()
}

/// Bytes of the hashed n-gram tables `spec` declares.
fn ngram_bytes(file: &GgufModel, spec: &ModelSpec) -> u64 {
    spec.weights
        .iter()
        .filter(|w| w.class == WeightClass::NgramTable)
        .filter_map(|w| file.tensor(w.name.as_str()))
        .map(|t| t.info.size)
        .sum()
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
    /// `gpu`, on the CPU ([`LoadedModel::load_cpu`]: card flags that name a card besides device 0
    /// refused, `--host-budget` holding the routed experts to it).
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
        // The CPU is the one device: card flags naming another are refused, not ignored.
        request.cards.cards(1).map_err(ModelError::Request)?;
        Self::load_cpu(reg, path, options, request)
    }

    /// The CPU-only load of [`LoadedModel::load_offloaded`]. Every routed expert is the CPU's
    /// already, so the card's placement flags change nothing, and each one given says so once;
    /// `--host-budget` holds the routed experts to that much host RAM: the model loads through
    /// the placement plan with the CPU's device as its main one and every routed expert in the
    /// host tier, which reads from the file on demand into an arena of the budget's size the
    /// experts that do not fit (the disk tier, as below a card).
    fn load_cpu(
        reg: &Registry,
        path: &Path,
        options: LoadOptions,
        request: &TierRequest,
    ) -> Result<LoadedModel, ModelError> {
        for (given, flag) in [
            (request.cpu_moe, "-cmoe"),
            (request.n_cpu_moe.is_some(), "-ncmoe"),
            (!request.overrides.is_empty(), "-ot"),
            (!request.gpu_budgets.is_empty(), "--gpu-budget"),
            (request.bus_experts.is_some(), "--bus-experts"),
            (request.no_decode_staging, "--no-decode-staging"),
        ] {
            if given {
                tracing::warn!(
                    "{flag}: no card: every routed expert is computed by the CPU already, so it \
                     changes nothing"
                );
            }
        }
        let Some(budget) = request.host_budget else {
            return Self::load(reg, path, options);
        };
        tracing::info!(
            "--host-budget {budget}: routed experts held to it in host RAM, those beyond read \
             from the file as called"
        );
        let kernel = reg.best_kernel(DeviceClass::Cpu)?;
        let hosted = TierRequest {
            cpu_moe: true,
            host_budget: Some(budget),
            // Moving called experts "onto the card" would copy them into host RAM beyond the
            // budget: the CPU's device keeps none.
            no_residency: true,
            disk_prefetch: request.disk_prefetch,
            batch_rows: request.batch_rows,
            ..TierRequest::default()
        };
        Self::load_placed(reg, path, options, kernel, &hosted)
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
    /// kernel plugin, straight from the mapped file. One card: the one `-dev`/`-mg` picks.
    pub fn load_placed(
        reg: &Registry,
        path: &Path,
        options: LoadOptions,
        kernel: &KernelPluginFile,
        request: &TierRequest,
    ) -> Result<LoadedModel, ModelError> {
        let main = one_card(kernel, request)?;
        Self::load_across(reg, path, options, (kernel, main), None, request)
    }

    /// As [`LoadedModel::load_placed`] on card `main` of `kernel`, with device 0 of `peer` planned
    /// as a second card (its budget `--gpu-budget`'s second value, else its free memory): the
    /// routed experts the plan puts there are computed on it, on the packed rows of the main
    /// card's routing, and added to the host's experts' output before that reaches the main
    /// card. A CPU plugin's device stands in for the second card where there is none (the
    /// cards' own path, over NCCL or peer copies, is not built yet).
    pub fn load_across(
        reg: &Registry,
        path: &Path,
        options: LoadOptions,
        (kernel, main): (&KernelPluginFile, UsedCard),
        peer: Option<&KernelPluginFile>,
        request: &TierRequest,
    ) -> Result<LoadedModel, ModelError> {
        let Opened {
            file,
            shown,
            plugin,
            instance,
            spec,
        } = open_model(reg, path, options.overrides)?;
        if options.check_tensors {
            crate::file_check::check_tensor_data(&file, &shown, options.threads)?;
        }
        tracing::info!(model = %plugin.name, kernel = %kernel.name, "loading {shown}");
        let device = Device::open(
            kernel,
            DeviceConfig {
                index: main.device,
                threads: options.threads,
                pin_threads: true,
            },
        )
        .map_err(device_err("opening the kernel plugin's device"))?;
        let mut cards = vec![card_budget(kernel, &main, &device, request)];
        let peer = match peer {
            Some(k) => {
                let second = UsedCard {
                    device: 0,
                    position: 1,
                    share: request.cards.split.get(1).copied().unwrap_or(0.0),
                };
                let d = open_card(k, 0, options.threads)?;
                cards.push(card_budget(k, &second, &d, request));
                Some(d)
            }
            None => None,
        };
        let plan = if kernel.probe.class == DeviceClass::Gpu || !request.is_default() {
            Some(plan_for(
                &instance,
                &spec,
                &file,
                &cards,
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
            Some(p) if p.has_host_experts() || p.has_peer_experts() => {
                let host = reg.best_kernel(DeviceClass::Cpu)?;
                tracing::info!(
                    "routed experts: {:.2} GiB on the card, {:.2} GiB in host RAM on {}",
                    p.card_expert_bytes() as f64 / (1u64 << 30) as f64,
                    p.host_expert_bytes() as f64 / (1u64 << 30) as f64,
                    host.name
                );
                let (b, w, t) = load_tiered(
                    &device,
                    host,
                    peer,
                    options.threads,
                    &file,
                    &spec,
                    p,
                    request,
                )?;
                (b, w, Some(t))
            }
            _ => {
                let (b, w) = match kernel.probe.class {
                    DeviceClass::Gpu => copy_weights(&device, &file, &spec)?,
                    _ => map_weights(&device, &file, &spec)?,
                };
                (b, w, None)
            }
        };
        let disk_cache = match &plan {
            Some(p) => p.ngram_disk_cache(),
            None => unplanned_ngram_cache(file_bytes(&file), ngram_bytes(&file, &spec)),
        };
        let ngram = crate::ngram_open::open_tables(&file, &spec, disk_cache)?.map(Arc::new);
        let locked = if options.mlock {
            let ranges = match &tier {
                Some(t) => t.host_read.clone(),
                // Every weight copied to the card: the host reads none of the file but the
                // n-gram tables (below).
                None if kernel.probe.class == DeviceClass::Gpu => Vec::new(),
                None => file
                    .parts()
                    .iter()
                    .map(|p| p.bytes().as_ptr_range())
                    .map(|r| (r.start as usize, r.end as usize))
                    .collect(),
            };
            // The n-gram tables' rows are read from the mapping, or from disk: then none of
            // their pages is held.
            let ranges = match &ngram {
                Some(n) if n.on_disk() => mlock::without(&ranges, &n.mapped_ranges()),
                Some(n) => [ranges, n.mapped_ranges()].concat(),
                None => ranges,
            };
            mlock::lock_ranges(&ranges)
        } else {
            0
        };
        let mut model = LoadedModel {
            executors: HashMap::new(),
            small_arena: None,
            clock: 0,
            prepared: 0,
            state_buffers,
            state,
            snapshot_staging: std::sync::Mutex::new(None),
            spare: crate::state::SpareState::default(),
            row_states: crate::state::RowStates::default(),
            shift: std::sync::OnceLock::new(),
            _weight_buffers: weight_buffers,
            weights,
            tier,
            ngram,
            plan,
            instance,
            device,
            spec,
            plugin: plugin.name.clone(),
            options,
            file,
            locked,
            output_head: false,
            rows: FINAL_NORM,
        };
        let kind = pass_kind(&model.instance);
        model.executor_kind(1, 1, Readout::Logits, kind)?;
        model.output_head = model.graph_has_logits();
        Ok(model)
    }

    /// The main graph's executor for `n_rows` rows and `n_outputs` outputs.
    fn executor(
        &mut self,
        n_rows: u32,
        n_outputs: u32,
        readout: Readout,
    ) -> Result<&Executor, ModelError> {
        self.executor_kind(n_rows, n_outputs, readout, GraphKind::Main)
    }

    /// The executor of the graph of `kind` for `n_rows` rows and `n_outputs` outputs.
    fn executor_kind(
        &mut self,
        n_rows: u32,
        n_outputs: u32,
        readout: Readout,
        kind: GraphKind,
    ) -> Result<&Executor, ModelError> {
        let shape = BatchShape {
            n_rows,
            n_outputs,
            kind,
        };
        self.executor_of(shape, readout)
    }

    /// The executor of the graph of `shape`, read as `readout` asks, prepared on first use.
    fn executor_of(
        &mut self,
        shape: BatchShape,
        readout: Readout,
    ) -> Result<&Executor, ModelError> {
        let key = (shape, readout);
        let BatchShape {
            n_rows, n_outputs, ..
        } = shape;
        self.clock += 1;
        let now = self.clock;
        if !self.executors.contains_key(&key) {
            // A server sees many batch shapes: keep the most recently used few, small passes
            // and larger ones each in their own count.
            let small = n_rows <= SMALL_ROWS;
            let max = match small {
                true => MAX_SMALL_EXECUTORS,
                false => MAX_EXECUTORS,
            };
            let alike = |k: &(BatchShape, Readout)| (k.0.n_rows <= SMALL_ROWS) == small;
            while self.executors.keys().filter(|k| alike(k)).count() >= max {
                let oldest = self
                    .executors
                    .iter()
                    .filter(|(k, _)| alike(k))
                    .min_by_key(|(_, e)| e.1)
                    .map(|(k, _)| *k);
                match oldest {
                    Some(k) => self.executors.remove(&k),
                    None => break,
                };
            }
            let graph = self
                .instance
                .build_graph(shape)
                .into_result()
                .map_err(|error| ModelError::Plugin {
                    path: self.file.parts()[0].path().display().to_string(),
                    plugin: self.plugin.clone(),
                    error,
                })?;
            let graph = graph_for(graph, readout, self.rows).map_err(|why| match readout {
                Readout::Tap(_) => ModelError::Request(why),
                _ => ModelError::NoEmbeddings {
                    plugin: self.plugin.clone(),
                    why,
                },
            })?;
            let bind = Bindings {
                weights: &self.weights,
                state: &self.state,
                tier: self.tier.as_ref(),
                row_states: &self.row_states.refs,
                ngram: self.ngram.as_ref(),
            };
            let started = std::time::Instant::now();
            let arena = match small {
                true => ArenaSource::Shared(&mut self.small_arena),
                false => ArenaSource::Own,
            };
            let exec = Executor::prepare(
                &self.device,
                shape,
                &graph,
                &bind,
                self.options.graphs,
                arena,
            )?;
            tracing::debug!(
                "prepared the {:?} pass of {n_rows} rows and {n_outputs} outputs ({readout:?}) in {:.2} ms, arena {:.2} MiB",
                shape.kind,
                started.elapsed().as_secs_f64() * 1e3,
                exec.arena_planned() as f64 / f64::from(1 << 20)
            );
            self.prepared += 1;
            self.executors.insert(key, (exec, now));
        }
        let entry = self
            .executors
            .get_mut(&key)
            .ok_or_else(|| ModelError::Request("executor cache lost an entry".into()))?;
        entry.1 = now;
        Ok(&entry.0)
    }

    /// How many pass executors (a graph of one batch shape and readout, its memory planned and
    /// allocated) were prepared since load: a shape whose executor was dropped for newer ones
    /// counts again when it returns.
    pub fn executors_prepared(&self) -> u64 {
        self.prepared
    }

    /// Bytes of the activation arenas the prepared executors hold (small passes share one) and
    /// the bytes their plans need summed (what arenas of their own would hold).
    pub fn arena_bytes(&self) -> (u64, u64) {
        let mut held: HashMap<u64, u64> = HashMap::new();
        let mut planned = 0;
        for (exec, _) in self.executors.values() {
            if let Some((handle, bytes)) = exec.arena() {
                held.insert(handle, bytes);
            }
            planned += exec.arena_planned();
        }
        (held.values().sum(), planned)
    }

    /// Whether the plugin's one-row graph has a `logits` output.
    fn graph_has_logits(&self) -> bool {
        let shape = BatchShape {
            n_rows: 1,
            n_outputs: 1,
            kind: GraphKind::Main,
        };
        self.instance
            .build_graph(shape)
            .into_result()
            .is_ok_and(|g| g.outputs.iter().any(|o| o.name.as_str() == "logits"))
    }

    /// The op calls of a pass of `n_rows` rows and `n_outputs` outputs, as the kernel plugin
    /// receives them (memory planned; for checking what a kernel plugin will see).
    pub fn pass_calls(&mut self, n_rows: u32, n_outputs: u32) -> Result<Vec<OpCall>, ModelError> {
        Ok(self
            .executor(n_rows, n_outputs, Readout::Logits)?
            .calls()
            .to_vec())
    }

    /// Checks that the model's graph gives its final-norm rows, which embeddings read (a
    /// named error otherwise), and prepares the one-row pass that reads them.
    pub fn check_embeddings(&mut self) -> Result<(), ModelError> {
        self.executor(1, 1, Readout::Embeddings).map(|_| ())
    }

    /// Starts gathering, on the n-gram tables' prefetch thread, the table rows of the token
    /// rows whose ids are `ids` (`NgramSpec::n_ids` a row, as the next pass will read them):
    /// called once a step's tokens are sampled. Nothing when the model has no n-gram tables.
    pub fn prefetch_ngram(&self, ids: &[i32]) {
        if let Some(t) = &self.ngram {
            t.prefetch(ids);
        }
    }

    /// The n-gram tables' gather counts since load (None without tables), and whether the rows
    /// are read from disk.
    pub fn ngram_stats(&self) -> Option<(NgramStats, bool)> {
        self.ngram.as_ref().map(|t| (t.stats(), t.on_disk()))
    }

    /// Refuses a batch whose rows, positions, slots, tokens or output rows are out of range.
    fn check_batch(&self, batch: &BatchInputs) -> Result<(), ModelError> {
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
        Ok(())
    }

    /// Runs one pass over a batch and returns the logits of its output rows, `n_vocab` values per
    /// output row in the order of `batch.output_rows`.
    pub fn forward(&mut self, batch: &BatchInputs) -> Result<Vec<f32>, ModelError> {
        Ok(self.forward_reading(batch, Readout::Logits)?.logits)
    }

    /// Runs one pass over a batch and reads back what `readout` asks for its output rows, in the
    /// order of `batch.output_rows`: `n_vocab` logits and/or `n_embd` final-norm values a row.
    /// A batch without output rows reads nothing and runs the graph `readout` gives (with
    /// [`Readout::Embeddings`] cut after the final norm: no output head).
    pub fn forward_reading(
        &mut self,
        batch: &BatchInputs,
        readout: Readout,
    ) -> Result<PassOutputs, ModelError> {
        self.forward_kind(batch, readout, GraphKind::Main)
    }

    /// As [`LoadedModel::forward_reading`], running the graph of `kind`.
    pub(crate) fn forward_kind(
        &mut self,
        batch: &BatchInputs,
        readout: Readout,
        kind: GraphKind,
    ) -> Result<PassOutputs, ModelError> {
        self.check_batch(batch)?;
        let rows = batch.tokens.len();
        let device = Arc::clone(&self.device);
        if batch.output_rows.is_empty() {
            // A prompt chunk before the last: no logits wanted. Graphs always keep one output
            // row (kernels need not handle empty tensors); its logits are dropped.
            let mut one = batch.clone();
            one.output_rows.push(rows as i32 - 1);
            self.executor_kind(rows as u32, 1, readout, kind)?
                .run(&device, &one)?;
            self.rebalance()?;
            return Ok(PassOutputs::default());
        }
        let n_outputs = batch.output_rows.len() as u32;
        if let Readout::Split(n) = readout {
            let named = batch.logit_rows.len() == n as usize
                && batch
                    .logit_rows
                    .iter()
                    .all(|&r| r >= 0 && (r as u32) < n_outputs);
            if !named {
                return Err(ModelError::Request(format!(
                    "the logits of {n} of {n_outputs} output rows, named by {:?}",
                    batch.logit_rows
                )));
            }
        }
        let exec = self.executor_kind(rows as u32, n_outputs, readout, kind)?;
        exec.run(&device, batch)?;
        let out = read_outputs(exec, &device, readout)?;
        self.rebalance()?;
        Ok(out)
    }

    /// Runs one pass over a batch and reads back every i32 tensor of the graph named `name`,
    /// in the graph's order, each with its layer: an intermediate to check against a reference,
    /// such as a sparse attention's selection (`indexer_sel_idx`). The main graph, or with
    /// `hidden` the draft graph ([`LoadedModel::forward_draft`]). A name the graph lacks or a
    /// tensor not i32 is an error.
    pub fn forward_tap_i32(
        &mut self,
        batch: &BatchInputs,
        hidden: Option<&[f32]>,
        name: &'static str,
    ) -> Result<Vec<(i32, Vec<i32>)>, ModelError> {
        self.forward_tap(batch, hidden, name, |exec, device, out| {
            exec.read_i32(device, out)
        })
    }

    /// As [`LoadedModel::forward_tap_i32`] for f32 tensors: the rows the MTP block pairs with
    /// the next token (`h_nextn`, [`bloomery_plugin_api::graph::NEXTN_HIDDEN`]), say.
    pub fn forward_tap_f32(
        &mut self,
        batch: &BatchInputs,
        hidden: Option<&[f32]>,
        name: &'static str,
    ) -> Result<Vec<(i32, Vec<f32>)>, ModelError> {
        self.forward_tap(batch, hidden, name, |exec, device, out| {
            exec.read_f32(device, out)
        })
    }

    /// One tapped pass ([`LoadedModel::forward_tap_i32`]), each tap read by `read`.
    fn forward_tap<T>(
        &mut self,
        batch: &BatchInputs,
        hidden: Option<&[f32]>,
        name: &'static str,
        read: impl Fn(&Executor, &Device, &str) -> Result<Vec<T>, ExecError>,
    ) -> Result<Vec<(i32, Vec<T>)>, ModelError> {
        self.check_batch(batch)?;
        if batch.output_rows.is_empty() {
            return Err(ModelError::Request(
                "a tapped pass needs output rows".into(),
            ));
        }
        let shape = BatchShape {
            n_rows: batch.tokens.len() as u32,
            n_outputs: batch.output_rows.len() as u32,
            kind: if hidden.is_some() {
                GraphKind::Mtp
            } else {
                GraphKind::Main
            },
        };
        let device = Arc::clone(&self.device);
        let exec = self.executor_of(shape, Readout::Tap(name))?;
        exec.run_with_hidden(&device, batch, hidden.unwrap_or_default())?;
        let mut taps = Vec::new();
        for out in exec.output_names() {
            if let Some(layer) = tap_layer(out, name) {
                taps.push((layer, read(exec, &device, out)?));
            }
        }
        self.rebalance()?;
        Ok(taps)
    }

    /// Runs the model's draft layers (its multi-token-prediction graph, [`GraphKind::Mtp`]) over
    /// a batch whose row `r` pairs `batch.tokens[r]` with the hidden row `hidden[r·w..]` (`w`
    /// the width the draft graph declares: `n_embd` for the main graph's final-norm row of the
    /// position before, as [`LoadedModel::forward_hidden`] reads it; qwen4exp's hc-wide
    /// residual, its `h_nextn`) at `batch.positions[r]` of the draft layers' own caches; returns
    /// the logits of the output rows. A model without draft layers is a named error.
    pub fn forward_draft(
        &mut self,
        batch: &BatchInputs,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .forward_draft_reading(batch, hidden, Readout::Logits)?
            .logits)
    }

    /// As [`LoadedModel::forward_draft`], reading back what `readout` asks for the output rows:
    /// the logits and/or the draft layers' own final-norm rows (`FINAL_NORM` of the draft graph:
    /// the hidden row a chained draft step pairs with the token it drafted).
    pub fn forward_draft_reading(
        &mut self,
        batch: &BatchInputs,
        hidden: &[f32],
        readout: Readout,
    ) -> Result<PassOutputs, ModelError> {
        self.check_batch(batch)?;
        if batch.output_rows.is_empty() {
            return Err(ModelError::Request("a draft pass needs output rows".into()));
        }
        let shape = BatchShape {
            n_rows: batch.tokens.len() as u32,
            n_outputs: batch.output_rows.len() as u32,
            kind: GraphKind::Mtp,
        };
        let device = Arc::clone(&self.device);
        let exec = self.executor_of(shape, readout)?;
        let want = exec.input_elements(BatchInput::Hidden).unwrap_or(0) as usize;
        if hidden.len() != want {
            let rows = batch.tokens.len();
            return Err(ModelError::Request(format!(
                "a draft pass of {rows} rows needs {want} hidden values ({} a row), not {}",
                want / rows.max(1),
                hidden.len()
            )));
        }
        exec.run_with_hidden(&device, batch, hidden)?;
        let out = read_outputs(exec, &device, readout)?;
        self.rebalance()?;
        Ok(out)
    }

    /// Runs one pass over a batch and returns the final-norm rows of its output rows, `n_embd`
    /// values per output row in the order of `batch.output_rows` (a decision model's backbone,
    /// whose head reads them), read as embeddings are: the graph cut after its final norm.
    pub fn forward_hidden(&mut self, batch: &BatchInputs) -> Result<Vec<f32>, ModelError> {
        if batch.output_rows.is_empty() {
            return Err(ModelError::Request(
                "a pass for final-norm rows needs output rows".into(),
            ));
        }
        Ok(self.forward_reading(batch, Readout::Embeddings)?.embeddings)
    }

    /// Makes the embeddings readout ([`Readout::Embeddings`], [`Readout::Both`]) read the rows
    /// named `name` instead of the final-norm rows ([`FINAL_NORM`]): qwen4exp's `h_nextn`
    /// ([`bloomery_plugin_api::graph::NEXTN_HIDDEN`]), the rows its separate MTP file pairs with
    /// the next token. Executors prepared so far are dropped.
    pub fn read_rows_from(&mut self, name: &'static str) {
        if self.rows != name {
            self.rows = name;
            self.executors.clear();
        }
    }

    /// The rows the embeddings readout reads ([`LoadedModel::read_rows_from`]).
    pub fn rows_name(&self) -> &'static str {
        self.rows
    }

    /// Values a row of the draft graph's hidden input (`None` for a model without draft layers):
    /// `n_embd`, or qwen4exp's hyper-connection residual width.
    pub fn hidden_width(&self) -> Option<usize> {
        let shape = BatchShape {
            n_rows: 1,
            n_outputs: 1,
            kind: GraphKind::Mtp,
        };
        let g = self.instance.build_graph(shape).into_result().ok()?;
        let hidden = TensorSource::Input {
            input: BatchInput::Hidden,
        };
        g.tensors
            .iter()
            .find(|t| t.source == hidden)
            .map(|t| t.ne[0] as usize)
    }

    /// The resolved tensor of the weight named `name` (its GGUF name), if the model has one.
    pub fn weight_ref(&self, name: &str) -> Option<TensorRef> {
        let i = self
            .spec
            .weights
            .iter()
            .position(|w| w.name.as_str() == name)?;
        self.weights.get(i).copied()
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
    /// see [`bloomery_tiering::lending`].
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

#[cfg(test)]
mod tests {
    use super::{may_fall_back, ModelError};
    use bloomery_tiering::plan::PlanError;

    #[test]
    fn a_placement_that_does_not_fit_is_refused_rather_than_run_on_the_cpu() {
        assert!(!may_fall_back(&ModelError::Plan(PlanError(
            "dense weights … over its budget".into()
        ))));
        assert!(may_fall_back(&ModelError::Request("no GPU plugin".into())));
    }
}
