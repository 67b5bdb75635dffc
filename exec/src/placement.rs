//! The placement plan of a model file: its MoE layers, what the card must hold besides them
//! (dense weights, state, activations, kernel scratch, page tables) and the budgets.

use std::path::Path;
use std::sync::Arc;

use bloomery_devices::{Device, KernelPluginFile, Registry};
use bloomery_gguf::GgufModel;
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphKind};
use bloomery_plugin_api::kernel::{DeviceClass, DeviceConfig};
use bloomery_plugin_api::model::{ModelInstanceBox, ModelSpec, WeightClass};
use bloomery_plugin_api::op::Op;
use bloomery_tiering::cards::{CardBudget, UsedCard};
use bloomery_tiering::plan::{FixedCosts, Plan, TierRequest, DEFAULT_BATCH_ROWS, NGRAM_CACHE_MIN};
use bloomery_tiering::{gathered_tables, moe_layers};

use crate::arena_plan::plan_arena;
use crate::error::{device_err, ModelError};
use crate::open::open_model;
use crate::options::LoadOptions;
use crate::state::{drafting_bytes, state_bytes};

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

/// Bytes per row of a pass that a card computing experts for another (a card after the main
/// one) holds besides its kernel scratch: the MoE call's input and output rows (f32) and each
/// row's expert ids and weights, for the largest MoE call of `graph`.
fn moe_io_per_row(graph: &Graph) -> u64 {
    graph
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::MoeExperts(p) => {
                let n_embd = graph.tensors.get(n.srcs.first()?.0 as usize)?.ne[0];
                Some((2 * n_embd + 2 * u64::from(p.k)) * 4)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
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

/// The placement plan `request` gives for the file at `path` on the cards of `kernel` it asks
/// for (every card found by default), without loading weights (`bloomery plan`).
pub fn plan_only(
    reg: &Registry,
    path: &Path,
    options: LoadOptions,
    kernel: &KernelPluginFile,
    request: &TierRequest,
) -> Result<Plan, ModelError> {
    let o = open_model(reg, path, options.overrides)?;
    let used = used_cards(kernel, request)?;
    let mut cards = Vec::with_capacity(used.len());
    for card in &used {
        let device = open_card(kernel, card.device, options.threads)?;
        cards.push(card_budget(kernel, card, &device, request));
    }
    plan_for(
        &o.instance,
        &o.spec,
        &o.file,
        &cards,
        options,
        request,
        &o.shown,
        &o.plugin.name,
    )
}

/// The cards `request` asks for among those `kernel` found, main card first (a CPU plugin has
/// the one device 0); a card not there is a named error.
pub(crate) fn used_cards(
    kernel: &KernelPluginFile,
    request: &TierRequest,
) -> Result<Vec<UsedCard>, ModelError> {
    let found = match kernel.probe.class {
        DeviceClass::Gpu => kernel.probe.devices.len() as u32,
        _ => 1,
    };
    request.cards.cards(found).map_err(ModelError::Request)
}

/// The one card a model loads on, of those `request` asks for (main card first). Routed experts
/// are not computed on a card after the main one yet, so a request naming several cards itself
/// (`-dev A,B`, `-ts` with two shares) is refused by name; with several cards merely found, the
/// main card is used and that is logged.
pub(crate) fn one_card(
    kernel: &KernelPluginFile,
    request: &TierRequest,
) -> Result<UsedCard, ModelError> {
    let used = used_cards(kernel, request)?;
    if used.len() > 1 {
        if request.cards.asks_for_several() {
            return Err(ModelError::Request(format!(
                "routed experts across {} cards (-dev/-ts): computing experts on a card after \
                 the main one is not implemented yet; `bloomery plan` shows that placement, and \
                 -sm none or -dev with one card runs on one card",
                used.len()
            )));
        }
        tracing::info!(
            "{} cards found: the model runs on card {} only (experts on the others are not run \
             yet; -dev or -mg picks the card)",
            used.len(),
            used[0].device
        );
    }
    Ok(used[0])
}

/// Opens device `index` of `kernel`.
pub(crate) fn open_card(
    kernel: &KernelPluginFile,
    index: u32,
    threads: u32,
) -> Result<Arc<Device>, ModelError> {
    Device::open(
        kernel,
        DeviceConfig {
            index,
            threads,
            pin_threads: false,
        },
    )
    .map_err(device_err("opening the kernel plugin's device"))
}

/// The budget of `card` (open as `device`): asked by `--gpu-budget`, else its free memory
/// (unlimited when the device does not say), named as llama.cpp names it (`CUDA1`).
pub(crate) fn card_budget(
    kernel: &KernelPluginFile,
    card: &UsedCard,
    device: &Device,
    request: &TierRequest,
) -> CardBudget {
    let budget = request
        .gpu_budget(card.position)
        .unwrap_or(match device.info().free_memory {
            0 => u64::MAX,
            free => free,
        });
    let prefix = match kernel.probe.class {
        DeviceClass::Gpu => "CUDA",
        _ => "CPU",
    };
    CardBudget {
        name: format!("{prefix}{}", card.device),
        budget,
        share: card.share,
    }
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

/// Where a model loaded without a placement plan (the CPU, no placement flags) reads its n-gram
/// tables of `tables` bytes, in a file of `file` bytes: from the mapping while the whole file
/// fits in host RAM, else from disk through a row cache of what RAM holds beside the rest of
/// the file ([`ngram_cache_unplanned`]).
pub(crate) fn unplanned_ngram_cache(file: u64, tables: u64) -> Option<u64> {
    ngram_cache_unplanned(file, tables, host_available())
}

/// [`unplanned_ngram_cache`] for `available` bytes of host RAM: None (the mapping) when the
/// file fits, else the cache's bytes, at least [`NGRAM_CACHE_MIN`].
fn ngram_cache_unplanned(file: u64, tables: u64, available: u64) -> Option<u64> {
    (tables > 0 && file > available).then(|| {
        available
            .saturating_sub(file - tables.min(file))
            .max(NGRAM_CACHE_MIN)
    })
}

/// The kind of graph the file's passes run: [`GraphKind::Main`], or [`GraphKind::Mtp`] for a
/// file that holds draft layers alone (qwen4exp's MTP-only file, loaded with `-md`), whose main
/// graph the plugin refuses while its draft graph builds. A main graph refused for another
/// reason still is, on the file's first main pass.
pub(crate) fn pass_kind(instance: &ModelInstanceBox) -> GraphKind {
    let builds = |kind| {
        let shape = BatchShape {
            n_rows: 1,
            n_outputs: 1,
            kind,
        };
        instance.build_graph(shape).into_result().is_ok()
    };
    match !builds(GraphKind::Main) && builds(GraphKind::Mtp) {
        true => GraphKind::Mtp,
        false => GraphKind::Main,
    }
}

/// The placement plan on `cards` (main card first): the graph's MoE layers, what the main card
/// must hold besides them, what each other card holds for its expert calls, and the budgets.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_for(
    instance: &ModelInstanceBox,
    spec: &ModelSpec,
    file: &GgufModel,
    cards: &[CardBudget],
    options: LoadOptions,
    request: &TierRequest,
    path: &str,
    plugin: &str,
) -> Result<Plan, ModelError> {
    let kind = pass_kind(instance);
    let graph_of = |n_rows: u32| {
        instance
            .build_graph(BatchShape {
                n_rows,
                n_outputs: 1,
                kind,
            })
            .into_result()
            .map_err(|error| ModelError::Plugin {
                path: path.to_owned(),
                plugin: plugin.to_owned(),
                error,
            })
    };
    let decode = graph_of(1)?;
    let layers = moe_layers(&decode, spec, file);
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
    // The hashed n-gram tables never go to a card: the host gathers their rows.
    let ngram = |i: usize| spec.weights[i].class == WeightClass::NgramTable;
    let dense = (0..spec.weights.len())
        .filter(|&i| !stacks.contains(spec.weights[i].name.as_str()) && !ngram(i))
        .map(|i| size(&i))
        .sum();
    let ngram_bytes = (0..spec.weights.len())
        .filter(|&i| ngram(i))
        .map(|i| size(&i))
        .sum();
    let state = state_bytes(spec, options);
    let rows = match request.batch_rows {
        0 => DEFAULT_BATCH_ROWS,
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
    let tables: Vec<usize> = gathered_tables(&graphs)
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
        drafting: drafting_bytes(spec, options),
        scratch: scratch_bytes(
            arena,
            rows,
            scratch_per_row(&batch),
            expert_bytes + table_bytes,
        ),
        tables: table_bytes,
    };
    let peer_fixed =
        CARD_RESERVE + u64::from(rows) * (scratch_per_row(&batch) + moe_io_per_row(&batch));
    let host = request.host_budget.unwrap_or_else(host_available);
    let mut plan = Plan::across(layers, fixed, cards, peer_fixed, host, request)?;
    if plan.tables_on_host {
        plan.table_weights = tables;
    }
    plan.place_ngram_tables(ngram_bytes);
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::{ngram_cache_unplanned, scratch_per_row, MIN_SCRATCH_PER_ROW, NGRAM_CACHE_MIN};

    #[test]
    fn without_a_plan_the_tables_go_to_disk_only_when_the_file_does_not_fit() {
        const G: u64 = 1 << 30;
        // Qwen3.8 at a reduced depth on a 23 GB host: 33 GB of file, 28.8 GB of it the table.
        assert_eq!(ngram_cache_unplanned(33 * G, 29 * G, 22 * G), Some(18 * G));
        // The rest of the file alone over RAM: the smallest cache.
        assert_eq!(
            ngram_cache_unplanned(60 * G, 29 * G, 22 * G),
            Some(NGRAM_CACHE_MIN)
        );
        // The whole file fits, or there is no table: the mapping.
        assert_eq!(ngram_cache_unplanned(20 * G, 10 * G, 22 * G), None);
        assert_eq!(ngram_cache_unplanned(33 * G, 0, 22 * G), None);
    }
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
}
