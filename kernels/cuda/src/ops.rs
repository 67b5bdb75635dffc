//! The ops the CUDA bundles run, and their launches: elementwise add/mul/scale, strided copies
//! (f32 and f16 either way), RMSNorm and L2 norm, row gathers (f32, f16 and every type of
//! [`QUANT_TYPES`]), matrix products (f32; quantized weights of [`QUANT_TYPES`] with activations
//! quantized to Q8_1 on the card: dp4a for single rows and small batches, int8 tensor-core tiles
//! for batches of 16 rows or more), GLU and unary activations, RoPE (NORM, NEOX, IMROPE with text
//! positions, YaRN), the K/V cache store, attention over an f32 or f16 cache, MoE routing and
//! routed experts (F32 or [`QUANT_TYPES`] stacks), and the causal conv and gated delta rule of
//! linear-attention layers (`recurrent`). The quantized types are Q8_0, Q4_K, Q6_K, Q5_K, Q5_0,
//! Q4_0, Q5_1, IQ4_XS, IQ4_NL, MXFP4, Q3_K and IQ3_XXS; `cu/quant.cuh` unpacks each GGUF block layout once
//! for all of these kernels. [`capabilities`] lists exactly what [`Launcher::run`] implements.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use abi_stable::std_types::RVec;
use bloomery_plugin_api::op::{Gating, GluKind, Op, OpKind, OpSupport, RopeMode, UnaryFn};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::{result, CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig};

use crate::probe::Bundle;

mod attention;
mod fused;
mod gdn;
mod launch;
mod moe_shared;
mod recurrent;

pub use fused::{add2_norms, copy_runs, gated_adds};
pub use gdn::gdn_steps;
pub use launch::Args;
pub use moe_shared::shared_moes;

/// The quantized weight types the kernels read, with their `wtype` codes in `cu/quant.cuh`.
pub const QUANT_TYPES: [(DType, i32); 12] = [
    (DType::Q8_0, 1),
    (DType::Q4_K, 2),
    (DType::Q6_K, 3),
    (DType::Q5_K, 4),
    (DType::Q5_0, 5),
    (DType::Q4_0, 6),
    (DType::Q5_1, 7),
    (DType::IQ4_XS, 8),
    (DType::IQ4_NL, 9),
    (DType::MXFP4, 10),
    (DType::Q3_K, 11),
    (DType::IQ3_XXS, 12),
];

/// The names of a kernel's entry points per weight type, indexed by `wtype` code
/// (`PER_WTYPE` in cu/kernels.cu: `name_0` .. `name_12`).
macro_rules! per_wtype {
    ($base:literal) => {
        [
            concat!($base, "_0"),
            concat!($base, "_1"),
            concat!($base, "_2"),
            concat!($base, "_3"),
            concat!($base, "_4"),
            concat!($base, "_5"),
            concat!($base, "_6"),
            concat!($base, "_7"),
            concat!($base, "_8"),
            concat!($base, "_9"),
            concat!($base, "_10"),
            concat!($base, "_11"),
            concat!($base, "_12"),
        ]
    };
}

/// Single-row quantized products, per weight type.
const MATMUL_Q: [&str; 13] = per_wtype!("bl_matmul_q");
/// Q, K and V of one activation row in one launch (ops/fused.rs), per weight type.
const MATMUL_Q_PARTS: [&str; 13] = per_wtype!("bl_matmul_q_parts");
/// Routed gate/up products with both stacks of one type, per type (`bl_moe_gate_up`: two types).
const MOE_GATE_UP: [&str; 13] = per_wtype!("bl_moe_gate_up");
/// Routed down products, per weight type.
const MOE_DOWN: [&str; 13] = per_wtype!("bl_moe_down");

/// One few-column product of a pair-form type (`bl_matmul_q_few_<type>_<M>_<R>`, and its
/// three-part form `bl_matmul_q_few_parts_...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FewForm {
    /// Weight type code.
    wtype: i32,
    /// Columns per pass (M).
    pub(crate) cols: u64,
    /// Weight rows per warp (R).
    pub(crate) rows: u64,
    /// The single product's entry point.
    pub(crate) name: &'static str,
    /// The entry point of up to three products of the same activations.
    pub(crate) parts: &'static str,
}

macro_rules! few_forms {
    ($(($t:literal, $m:literal, $r:literal)),* $(,)?) => {
        [$(FewForm {
            wtype: $t,
            cols: $m,
            rows: $r,
            name: concat!("bl_matmul_q_few_", $t, "_", $m, "_", $r),
            parts: concat!("bl_matmul_q_few_parts_", $t, "_", $m, "_", $r),
        }),*]
    };
}

/// The few-column forms the kernels define. R trades warps in flight against activation reads
/// per weight row; `few_cols` picks it by the row count as kernels/cuda/bench/cols_bench.cu
/// measured on the H200.
const MATMUL_Q_FEW: [FewForm; 15] = few_forms![
    (1, 2, 1),
    (1, 4, 1),
    (1, 8, 1),
    (1, 2, 2),
    (1, 4, 2),
    (1, 8, 2),
    (1, 2, 4),
    (1, 4, 4),
    (1, 8, 4),
    (2, 2, 1),
    (2, 4, 1),
    (2, 8, 1),
    (2, 2, 2),
    (2, 4, 2),
    (2, 8, 2),
];

/// Threads per block of the few-column products (4 warps).
pub(crate) const FEW_BLOCK: u32 = 128;

/// The few-column form for `m` (2 or more) columns of `n` weight rows (the largest part's) of
/// type `wtype`; None for types without a pair form.
pub(crate) fn few_cols(wtype: i32, n: u64, m: u64) -> Option<FewForm> {
    let cols = match m {
        0..=2 => 2,
        3 | 4 => 4,
        _ => 8,
    };
    let rows = match (wtype, n) {
        (1, 2048..) => 4,
        (_, 1024..) => 2,
        _ => 1,
    };
    MATMUL_Q_FEW
        .iter()
        .find(|f| (f.wtype, f.cols, f.rows) == (wtype, cols, rows))
        .copied()
}

/// Whether rows of type `wtype` at `base` (row stride `stride`, expert stride `estride`) of
/// `k` values suit the kernels' pair form (`pairs_ok` in cu/quant.cuh: Q8_0 or Q4_K, whole
/// 64-value chunks, 4- or 16-byte aligned).
pub(crate) fn pairs_ok(wtype: i32, base: u64, stride: i64, estride: i64, k: u64) -> bool {
    let a = base | stride as u64 | estride as u64;
    k.is_multiple_of(64)
        && match wtype {
            1 => a.is_multiple_of(4),
            2 => a.is_multiple_of(16),
            _ => false,
        }
}

/// The device address of contiguous tensor `t` (`what` names it in errors).
fn contiguous_address(bufs: &dyn Buffers, t: &TensorRef, what: &str) -> Result<u64, PluginError> {
    if !t.is_contiguous() {
        return Err(PluginError::unsupported(
            format!("{what}: a strided tensor on the CUDA bundle"),
            &[],
        ));
    }
    let span = t
        .span_bytes()
        .ok_or_else(|| PluginError::invalid(format!("{what}: no valid layout")))?;
    bufs.address(t.buffer, t.offset, span)
}

/// The entry point of `names` for weight type `wtype`.
fn typed(names: &[&'static str; 13], wtype: i32) -> Result<&'static str, PluginError> {
    usize::try_from(wtype)
        .ok()
        .and_then(|i| names.get(i).copied())
        .ok_or_else(|| PluginError::invalid(format!("weight type code {wtype}")))
}

/// Bytes per 64 values of a Q8_1 row staged in shared memory (`STAGE_PAIR` in cu/quant.cuh).
const STAGE_PAIR: u64 = 80;

/// The dynamic shared memory a single-row product launch gives its blocks so that its pair
/// form (Q8_0, Q4_K) can stage `rows` Q8_1 activation rows of `nvals` values (cu/kernels.cu
/// `stage_rows`); 0 where the form cannot apply, and the kernel then reads them from global
/// memory. At most 48 KiB, the default limit per block.
fn stage_bytes(wtype: i32, nvals: u64, rows: u64) -> u32 {
    let bytes = nvals / 64 * STAGE_PAIR * rows;
    if matches!(wtype, 1 | 2) && nvals.is_multiple_of(64) && bytes <= 48 * 1024 {
        bytes as u32
    } else {
        0
    }
}

/// The `wtype` code of a weight type (0 for F32), with its block length in values.
fn weight_code(t: DType) -> Option<(i32, u64)> {
    if t == DType::F32 {
        return Some((0, 1));
    }
    let (_, code) = QUANT_TYPES.iter().find(|(q, _)| *q == t)?;
    Some((*code, u64::from(t.layout()?.block)))
}

/// Every `(op, dtype)` pair the kernels implement (none for a bundle built without them).
pub fn capabilities(bundle: &Bundle) -> RVec<OpSupport> {
    if bundle.ptx.is_empty() {
        return RVec::new();
    }
    let quant = QUANT_TYPES.iter().map(|(t, _)| *t);
    let with =
        |first: &[DType]| -> RVec<DType> { first.iter().copied().chain(quant.clone()).collect() };
    let mut list = vec![
        OpSupport {
            op: OpKind::Add,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::Mul,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::Scale,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::Copy,
            dtypes: vec![DType::F32, DType::F16, DType::I32].into(),
        },
        OpSupport {
            op: OpKind::RmsNorm,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::L2Norm,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::GetRows,
            dtypes: with(&[DType::F32, DType::F16]),
        },
        OpSupport {
            op: OpKind::MatMul,
            dtypes: with(&[DType::F32]),
        },
        OpSupport {
            op: OpKind::Glu,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::Unary,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::Rope,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::CacheStore,
            dtypes: vec![DType::F32, DType::F16].into(),
        },
        OpSupport {
            op: OpKind::Attention,
            dtypes: vec![DType::F32, DType::F16].into(),
        },
        OpSupport {
            op: OpKind::RouterTopK,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::RouterWeights,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::MoeExperts,
            dtypes: with(&[DType::F32]),
        },
        OpSupport {
            op: OpKind::ConvCausal,
            dtypes: vec![DType::F32].into(),
        },
        OpSupport {
            op: OpKind::DeltaRule,
            dtypes: vec![DType::F32].into(),
        },
    ];
    list.sort_by_key(|s| s.op);
    list.into()
}

fn driver_err(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> PluginError + '_ {
    move |e| PluginError::device(format!("{what}: {e:?}"))
}

/// Weight rows, columns and threads of a block of `bl_matmul_f32_tiled` (`F32T_BN`, `F32T_BM`,
/// `F32T_THREADS`).
const F32_TILE_ROWS: u64 = 16;
const F32_TILE_COLS: u64 = 32;
const F32_TILE_THREADS: u32 = 256;

/// Whether an F32 product of `m` columns of `k` values takes `bl_matmul_f32_tiled`: a batch
/// (as the quantized products take tiles), whole quads, and 16-byte aligned addresses and weight
/// rows (`aligned`: w, x, the row stride).
fn f32_tiles(m: u64, k: u64, aligned: [u64; 3]) -> bool {
    m >= MMQ_MIN_ROWS && k.is_multiple_of(4) && aligned.iter().all(|a| a.is_multiple_of(16))
}

/// Threads per block of the row-per-warp kernels.
const BLOCK: u32 = 256;
/// F32 products with at most this many (row, column) pairs take a block per pair
/// (`bl_matmul_f32_split`, whose block size this is), not a warp.
const F32_SPLIT_MAX_TASKS: u64 = 4096;
/// Threads of `bl_matmul_f32_split` (its `SPLIT_THREADS`).
const F32_SPLIT_THREADS: u32 = 128;
const WARPS: u64 = (BLOCK / 32) as u64;
/// Threads per block of `bl_matmul_q_cols` (a warp per weight row): 4 warps, so that the few
/// hundred rows of a K or V projection still spread over the SMs.
const MQ_COLS_BLOCK: u32 = 128;

/// The loaded kernels of one device, with the scratch they need.
pub struct Launcher {
    ctx: Arc<CudaContext>,
    /// The stream every kernel runs on (not the legacy default stream, which cannot be captured).
    pub stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    funcs: Mutex<HashMap<&'static str, CudaFunction>>,
    /// A device word kernels set when an input is bad (an id outside a table).
    pub error_word: u64,
    /// Zeroed device ints after the error word, which split attention launches count their
    /// finished blocks in (each launch leaves them zero).
    split_counters: u64,
    /// Device scratch for quantized activations: (pointer, bytes).
    scratch: Mutex<(u64, u64)>,
    /// Scratch areas outgrown while queued launches or captured graphs may still use them:
    /// (pointer, bytes), freed by [`Launcher::free_retired`] or on drop.
    retired: Mutex<Vec<(u64, u64)>>,
    /// Set while a graph is being captured: the scratch must not grow then.
    pub capturing: AtomicBool,
    /// How batches of quantized products run.
    mmq: Mmq,
    /// The activations whose Q8_1 copy the scratch holds, while nothing since has written the
    /// activations or the scratch: set by a quantized product that left its input intact (Q, K
    /// and V of a layer then quantize their common input once) or by a norm that wrote the copy
    /// for its reader (ops/fused.rs); kept across routing calls, which touch neither.
    quantized: Mutex<Option<Quantized>>,
    /// Set by [`Launcher::run_all`] while the attention or RmsNorm being launched has a quantized
    /// reader ([`quantized_reader`]): it then writes the Q8_1 copy of its result as well.
    product_next: AtomicBool,
    /// Set by [`Launcher::run_all`] while the call before the one being launched is the routing
    /// (RouterWeights, the last of its calls): the kernel launched before is then the routing's.
    after_routing: AtomicBool,
    /// Kernels may start before their predecessor ends ([`launch`]): the bundle's kernels wait
    /// for it on the device (sm_90 and up), unless `BLOOMERY_CUDA_PDL=0`.
    overlap: bool,
    /// Set by [`Launcher::run_all`] for passes of few rows (decode), where launches overlap: in
    /// batched passes of large grids the overlap measured slower (docs/performance.md).
    overlap_pass: AtomicBool,
    /// Dynamic shared memory a block of this card may opt into.
    smem_optin: u32,
    /// Kernels allowed more dynamic shared memory than the default, and how much.
    smem_allowed: Mutex<HashMap<&'static str, u32>>,
}

/// A routing call (router logits from F32 weights, top-k, expert weights): it touches neither
/// the scratch nor, unless it writes there, the activations a Q8_1 copy holds.
fn is_routing(c: &OpCall) -> bool {
    match c.op {
        Op::MatMul => c.srcs().first().is_some_and(|w| w.dtype == DType::F32),
        Op::RouterTopK(_) | Op::RouterWeights(_) => true,
        _ => false,
    }
}

/// Whether `out` is next read, with only routing calls between, as the activations of a
/// quantized product or of routed experts: whoever writes `out` may then write its Q8_1 copy.
/// A reshape of `out` counts (the same memory and size).
fn quantized_reader(out: &TensorRef, rest: &[OpCall]) -> bool {
    let quantized = |w: Option<&TensorRef>| {
        w.and_then(|w| weight_code(w.dtype))
            .is_some_and(|(code, _)| code >= 1)
    };
    let is_out = |x: Option<&TensorRef>| {
        x.is_some_and(|x| {
            x.buffer == out.buffer
                && x.offset == out.offset
                && x.elements() == out.elements()
                && x.dtype == DType::F32
                && x.is_contiguous()
        })
    };
    for c in rest.iter().take(6) {
        match c.op {
            _ if is_routing(c) => {}
            Op::MatMul if is_out(c.srcs().get(1)) => return quantized(c.srcs().first()),
            Op::MoeExperts(_) if is_out(c.srcs().first()) => return quantized(c.srcs().get(3)),
            _ => return false,
        }
    }
    false
}

/// A Q8_1 copy of f32 activations in the scratch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quantized {
    /// Address of the f32 activations.
    x: u64,
    /// Their 32-value blocks.
    nblocks: u64,
    /// Address of the copy (the scratch base when it was written).
    q: u64,
}

impl Quantized {
    /// Whether `len` bytes at `addr` leave the activations intact.
    fn clear_of(&self, addr: u64, len: u64) -> bool {
        addr + len <= self.x || self.x + self.nblocks * 128 <= addr
    }
}

/// The batched quantized product in use (`BLOOMERY_CUDA_MMQ=mma|dp4a|off`; mma by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mmq {
    /// Tiles on the int8 tensor cores.
    Mma,
    /// The same tiles with dp4a.
    Dp4a,
    /// One warp per (row, column), as for single rows.
    Off,
}

impl Mmq {
    fn from_env() -> Mmq {
        match std::env::var("BLOOMERY_CUDA_MMQ").as_deref() {
            Ok("dp4a") => Mmq::Dp4a,
            Ok("off") => Mmq::Off,
            _ => Mmq::Mma,
        }
    }

    /// The dense, the routed and the parts kernel (up to three products of one batch,
    /// [`Launcher::fused`]), when batches of `rows` use tiles.
    fn kernels(self, rows: u64) -> Option<(&'static str, &'static str, &'static str)> {
        match self {
            _ if rows < MMQ_MIN_ROWS => None,
            Mmq::Mma => Some(("bl_mmq_mma", "bl_mmq_experts_mma", "bl_mmq_parts_mma")),
            Mmq::Dp4a => Some(("bl_mmq_dp4a", "bl_mmq_experts_dp4a", "bl_mmq_parts_dp4a")),
            Mmq::Off => None,
        }
    }
}

/// The scratch grows in whole multiples of this.
const SCRATCH_GRAIN: u64 = 2 << 20;

/// Threads of `bl_moe_tiles`, a thread per stack expert (`TILES_THREADS`).
const TILES_THREADS: u32 = 1024;
/// Threads of `bl_moe_route` (`ROUTE_THREADS`): a chunk of 32 entries a thread per round.
const ROUTE_THREADS: u32 = 1024;
/// Batches of at least this many rows use the tiled products.
const MMQ_MIN_ROWS: u64 = 16;
/// Rows and columns of one tile of the tiled products.
const MMQ_TILE: u64 = 64;
/// Threads per block of the tiled products (`MMQ_THREADS`).
const MMQ_THREADS: u32 = 128;

/// Dense tiled products with fewer tiles than this split k in two halves (grid z): about the
/// blocks an H200's 132 SMs hold at once (4 each).
const MMQ_SPLIT_BELOW_TILES: u64 = 512;

/// Along z of a dense tiled product of `tiles` tiles over `k` values: 2 (each half of the k
/// steps adds into the zeroed output) when the tiles are few and there is more than one k step
/// of 256 values, else 1.
fn mmq_k_halves(tiles: u64, k: u64) -> u32 {
    if tiles < MMQ_SPLIT_BELOW_TILES && k > 256 {
        2
    } else {
        1
    }
}

/// Refuses, by name, a tensor `what` of another type than F32.
fn f32_only(t: &TensorRef, what: &str) -> Result<(), PluginError> {
    if t.dtype == DType::F32 {
        Ok(())
    } else {
        Err(PluginError::unsupported(
            format!("{what} of type {}", t.dtype),
            &[],
        ))
    }
}

/// How [`Launcher::run`] reaches the device's buffer table.
pub trait Buffers {
    /// The device address of `len` bytes at `offset` in `buffer`, when they lie inside it.
    fn address(&self, buffer: u64, offset: u64, len: u64) -> Result<u64, PluginError>;
}

impl Launcher {
    /// Loads `ptx` on `ctx` and allocates the error word. `waits` says the kernels open with
    /// `griddepcontrol.wait` (PTX for compute capability 9.0 and up), so launches may overlap.
    pub fn new(ctx: Arc<CudaContext>, ptx: &str, waits: bool) -> Result<Launcher, PluginError> {
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(driver_err("loading the bundle's PTX"))?;
        // The error word, then the split counters 256 bytes on.
        let words = 256 + attention::SPLIT_COUNTERS as usize * 4;
        // SAFETY: the context was bound by `load_module`; the words are freed in `Drop`.
        let error_word = unsafe { result::malloc_sync(words) }.map_err(driver_err("cuMemAlloc"))?;
        // SAFETY: `error_word` is a live allocation of `words` bytes.
        unsafe { result::memset_d8_sync(error_word, 0, words) }.map_err(driver_err("cuMemset"))?;
        let stream = ctx
            .new_stream()
            .map_err(driver_err("creating the kernel stream"))?;
        let smem_optin = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(driver_err("reading the card's shared memory per block"))?
            as u32;
        Ok(Launcher {
            ctx,
            stream,
            module,
            funcs: Mutex::new(HashMap::new()),
            error_word,
            split_counters: error_word + 256,
            scratch: Mutex::new((0, 0)),
            retired: Mutex::new(Vec::new()),
            capturing: AtomicBool::new(false),
            mmq: Mmq::from_env(),
            quantized: Mutex::new(None),
            product_next: AtomicBool::new(false),
            after_routing: AtomicBool::new(false),
            overlap: waits && std::env::var("BLOOMERY_CUDA_PDL").as_deref() != Ok("0"),
            overlap_pass: AtomicBool::new(false),
            smem_optin,
            smem_allowed: Mutex::new(HashMap::new()),
        })
    }

    /// Starts the arguments of a launch of `f` on the kernel stream.
    fn args<'a>(&'a self, f: &'a CudaFunction) -> Args<'a> {
        Args::new(f, &self.stream, self.overlap_pass.load(Ordering::Relaxed))
    }

    fn func(&self, name: &'static str) -> Result<CudaFunction, PluginError> {
        let mut funcs = self
            .funcs
            .lock()
            .map_err(|_| PluginError::device("kernel table poisoned"))?;
        if let Some(f) = funcs.get(name) {
            return Ok(f.clone());
        }
        let f = self.module.load_function(name).map_err(|e| {
            PluginError::device(format!("kernel {name} missing from the PTX: {e:?}"))
        })?;
        funcs.insert(name, f.clone());
        Ok(f)
    }

    /// A scratch area of at least `bytes`. When too small it grows (never while capturing), to
    /// whole 2 MiB; the old area stays allocated until [`Launcher::free_retired`] finds no
    /// captured graph naming it, since launches still queued or graphs may use it.
    fn scratch(&self, bytes: u64) -> Result<u64, PluginError> {
        let mut s = self
            .scratch
            .lock()
            .map_err(|_| PluginError::device("scratch poisoned"))?;
        if s.1 < bytes {
            if self.capturing.load(Ordering::Acquire) {
                return Err(PluginError::unsupported(
                    "graph capture of a pass that needs more scratch than an eager pass made",
                    &[],
                ));
            }
            if s.0 != 0 {
                self.retired
                    .lock()
                    .map_err(|_| PluginError::device("scratch poisoned"))?
                    .push(*s);
                *s = (0, 0);
            }
            let bytes = bytes.div_ceil(SCRATCH_GRAIN) * SCRATCH_GRAIN;
            let n =
                usize::try_from(bytes).map_err(|_| PluginError::invalid("scratch too large"))?;
            // SAFETY: the context is current (bound by the caller); freed in Drop.
            let p = unsafe { result::malloc_sync(n) }.map_err(driver_err("cuMemAlloc scratch"))?;
            crate::memlog::note("scratch", bytes as i64);
            *s = (p, bytes);
        }
        Ok(s.0)
    }

    /// The scratch area in use (0 before the first), which a graph captured now names.
    pub fn scratch_base(&self) -> u64 {
        self.scratch.lock().map_or(0, |s| s.0)
    }

    /// Frees the outgrown scratch areas that no graph in `named` (the scratch bases of the live
    /// captured graphs) names. Call only with the kernel stream idle.
    pub fn free_retired(&self, named: &[u64]) -> Result<(), PluginError> {
        self.forget_quantized();
        let mut retired = self
            .retired
            .lock()
            .map_err(|_| PluginError::device("scratch poisoned"))?;
        let mut err = Ok(());
        retired.retain(|&(p, bytes)| {
            if named.contains(&p) {
                return true;
            }
            crate::memlog::note("scratch freed", -(bytes as i64));
            // SAFETY: `p` is an outgrown scratch area: no launch is queued (the caller's
            // contract) and no live graph names it; it leaves the list here, so it is freed once.
            if let Err(e) = unsafe { result::free_sync(p) } {
                err = Err(PluginError::device(format!("cuMemFree scratch: {e:?}")));
            }
            false
        });
        err
    }

    /// Holds the stream for `ns` nanoseconds (the profiler queues a pass behind it).
    pub fn hold(&self, ns: i64) -> Result<(), PluginError> {
        let f = self.func("bl_hold")?;
        let mut l = self.args(&f);
        l.arg(&ns);
        // SAFETY: one thread reads the clock; no memory is touched.
        unsafe { l.launch(LaunchConfig::for_num_elems(1)) }
            .map(|_| ())
            .map_err(driver_err("bl_hold"))
    }

    /// Reads and clears the error word.
    pub fn take_error(&self) -> Result<i32, PluginError> {
        let mut w = [0u8; 4];
        // SAFETY: the error word is a live 4-byte allocation; the caller synchronised.
        unsafe { result::memcpy_dtoh_sync(&mut w, self.error_word) }
            .map_err(driver_err("reading the error word"))?;
        let code = i32::from_le_bytes(w);
        if code != 0 {
            // SAFETY: as above.
            unsafe { result::memset_d8_sync(self.error_word, 0, 4) }
                .map_err(driver_err("cuMemset"))?;
        }
        Ok(code)
    }

    /// Forgets which activations the scratch holds quantized (at a pass boundary: the host may
    /// write device memory between passes).
    pub fn forget_quantized(&self) {
        if let Ok(mut q) = self.quantized.lock() {
            *q = None;
        }
    }

    /// Launches the calls of a pass in order, fusing what it can (see [`Launcher::fused`]).
    pub fn run_all(&self, bufs: &dyn Buffers, calls: &[OpCall]) -> Result<(), PluginError> {
        // Few rows: no product of the pass runs as tiles.
        let few_rows = calls.iter().all(|c| match c.op {
            Op::MatMul => c.srcs().get(1).is_none_or(|x| x.rows() < MMQ_MIN_ROWS),
            Op::MoeExperts(_) => c.srcs().first().is_none_or(|x| x.rows() < MMQ_MIN_ROWS),
            _ => true,
        });
        self.overlap_pass
            .store(self.overlap && few_rows, Ordering::Relaxed);
        let done = self.run_calls(bufs, calls);
        self.overlap_pass.store(false, Ordering::Relaxed);
        done
    }

    /// [`Launcher::run_all`] once its overlap is set.
    fn run_calls(&self, bufs: &dyn Buffers, calls: &[OpCall]) -> Result<(), PluginError> {
        let mut i = 0;
        while i < calls.len() {
            let routed = i > 0 && matches!(calls[i - 1].op, Op::RouterWeights(_));
            self.after_routing.store(routed, Ordering::Relaxed);
            i += match self.fused(bufs, &calls[i..])? {
                Some(n) => n,
                None => {
                    let next = matches!(
                        calls[i].op,
                        Op::Attention(_) | Op::RmsNorm { .. } | Op::Glu { .. }
                    ) && quantized_reader(&calls[i].dst, &calls[i + 1..]);
                    self.product_next.store(next, Ordering::Relaxed);
                    let done = self.run(bufs, &calls[i]);
                    self.product_next.store(false, Ordering::Relaxed);
                    done?;
                    1
                }
            };
        }
        Ok(())
    }

    /// Launches one call.
    pub fn run(&self, bufs: &dyn Buffers, c: &OpCall) -> Result<(), PluginError> {
        let held = self
            .quantized
            .lock()
            .map_err(|_| PluginError::device("quantized-input record poisoned"))?
            .take();
        self.launch_call(bufs, c, held)?;
        if let (Some(h), true) = (held, is_routing(c)) {
            let len = c.dst.span_bytes().unwrap_or(u64::MAX);
            let at = bufs.address(c.dst.buffer, c.dst.offset, len)?;
            if h.clear_of(at, len) {
                self.keep_quantized(h)?;
            }
        }
        Ok(())
    }

    /// The Q8_1 copy of the `nblocks` 32-value blocks at `x` in the scratch: quantized there
    /// unless `held` says the scratch has it already.
    fn quantize_in_scratch(
        &self,
        x: u64,
        nblocks: u64,
        held: Option<Quantized>,
    ) -> Result<Quantized, PluginError> {
        let q = self.scratch(nblocks * 36)?;
        let copy = Quantized { x, nblocks, q };
        if held != Some(copy) {
            self.quantize_q8_1(x, q, nblocks)?;
        }
        Ok(copy)
    }

    /// Quantizes the `nblocks` 32-value blocks at `x` to Q8_1 blocks at `q`: 8 lanes per block
    /// with 16-byte loads where x is 16-byte aligned, else a warp per block (the same bytes).
    fn quantize_q8_1(&self, x: u64, q: u64, nblocks: u64) -> Result<(), PluginError> {
        let nb = nblocks as i64;
        let (name, per_block) = if x.is_multiple_of(16) {
            ("bl_quantize_q8_1_quads", 8)
        } else {
            ("bl_quantize_q8_1", 32)
        };
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&x).arg(&q).arg(&nb);
        let threads = nblocks * per_block;
        let launch = LaunchConfig {
            grid_dim: (threads.div_ceil(u64::from(BLOCK)).max(1) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: per_block threads per 32-value block of x (those past nblocks write nothing);
        // q holds nblocks blocks.
        unsafe { l.launch(launch) }.map_err(driver_err(name))
    }

    /// Room in the scratch for the Q8_1 copy of the `elements` f32 at `x`, when `wanted` and
    /// they are whole 32-value blocks (the kernels that write a copy hold whole blocks per warp).
    fn copy_slot(
        &self,
        wanted: bool,
        x: u64,
        elements: u64,
    ) -> Result<Option<Quantized>, PluginError> {
        if !wanted || !elements.is_multiple_of(32) {
            return Ok(None);
        }
        let nblocks = elements / 32;
        let q = self.scratch(nblocks * 36)?;
        Ok(Some(Quantized { x, nblocks, q }))
    }

    /// Records that the scratch holds `h` (see [`Launcher::quantized`]).
    fn keep_quantized(&self, h: Quantized) -> Result<(), PluginError> {
        *self
            .quantized
            .lock()
            .map_err(|_| PluginError::device("quantized-input record poisoned"))? = Some(h);
        Ok(())
    }

    /// Launches one call; `held` is the Q8_1 copy the scratch holds.
    fn launch_call(
        &self,
        bufs: &dyn Buffers,
        c: &OpCall,
        held: Option<Quantized>,
    ) -> Result<(), PluginError> {
        let src = |i: usize| {
            c.srcs()
                .get(i)
                .ok_or_else(|| PluginError::invalid(format!("{}: missing source {i}", c.op.kind())))
        };
        let addr = |t: &TensorRef, what: &str| contiguous_address(bufs, t, what);
        let grid = |n: u64, per: u64| -> u32 { n.div_ceil(per).clamp(1, 65_535 * 64) as u32 };
        let cfg = |g: u32, b: u32| LaunchConfig {
            grid_dim: (g, 1, 1),
            block_dim: (b, 1, 1),
            shared_mem_bytes: 0,
        };
        match c.op {
            Op::Add | Op::Mul => {
                let (a, b) = (src(0)?, src(1)?);
                for t in [a, b, &c.dst] {
                    f32_only(t, "Add/Mul")?;
                }
                let (n, nb) = (c.dst.elements() as i64, b.elements() as i64);
                if a.elements() as i64 != n || nb == 0 || n % nb != 0 {
                    return Err(PluginError::invalid(format!(
                        "Add/Mul shapes {:?} and {:?} into {:?}",
                        a.ne, b.ne, c.dst.ne
                    )));
                }
                // b is read at (i / bdiv) % nb: one value per row when it is [1, rows].
                let per_row = b.ne[0] == 1 && a.ne[0] != 1 && b.elements() == a.rows();
                let bdiv = if per_row { a.ne[0] as i64 } else { 1 };
                let (pa, pb, po) = (addr(a, "a")?, addr(b, "b")?, addr(&c.dst, "dst")?);
                let name = if matches!(c.op, Op::Add) {
                    "bl_add_f32"
                } else {
                    "bl_mul_f32"
                };
                let f = self.func(name)?;
                let mut l = self.args(&f);
                l.arg(&pa).arg(&pb).arg(&po).arg(&n).arg(&nb).arg(&bdiv);
                // SAFETY: every pointer covers the elements the kernel touches (checked above).
                unsafe { l.launch(cfg(grid(n as u64, 256).min(4096), 256)) }
                    .map_err(driver_err(name))?;
            }
            Op::Scale { s } => {
                let x = src(0)?;
                f32_only(x, "Scale")?;
                f32_only(&c.dst, "Scale")?;
                let n = c.dst.elements() as i64;
                if x.elements() as i64 != n {
                    return Err(PluginError::invalid("Scale shapes"));
                }
                let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
                let f = self.func("bl_scale_f32")?;
                let mut l = self.args(&f);
                l.arg(&px).arg(&po).arg(&s).arg(&n);
                // SAFETY: both pointers cover n elements.
                unsafe { l.launch(cfg(grid(n as u64, 256).min(4096), 256)) }
                    .map_err(driver_err("bl_scale_f32"))?;
            }
            Op::RmsNorm { eps } => {
                let x = src(0)?;
                f32_only(x, "RmsNorm")?;
                let ncols = c.dst.ne[0] as i32;
                let rows = c.dst.rows();
                if x.elements() != c.dst.elements() {
                    return Err(PluginError::invalid("RmsNorm shapes"));
                }
                let pw = match c.srcs().get(1) {
                    Some(w) => {
                        f32_only(w, "RmsNorm weight")?;
                        if w.elements() != c.dst.ne[0] {
                            return Err(PluginError::invalid("RmsNorm weight length"));
                        }
                        addr(w, "weight")?
                    }
                    None => 0u64,
                };
                let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
                // The output's Q8_1 copy too, when a quantized product reads it next.
                let wanted = self.product_next.load(Ordering::Relaxed) && ncols % 32 == 0;
                let copy = self.copy_slot(wanted, po, c.dst.elements())?;
                let q = copy.map_or(0u64, |c| c.q);
                let f = self.func("bl_rms_norm_f32")?;
                let mut l = self.args(&f);
                let (threads, quads) = fused::norm_shape(ncols as u64, &[px, pw, po]);
                l.arg(&px)
                    .arg(&pw)
                    .arg(&po)
                    .arg(&q)
                    .arg(&ncols)
                    .arg(&eps)
                    .arg(&quads);
                // SAFETY: one block per row of ncols elements, all inside the checked spans.
                unsafe { l.launch(cfg(rows as u32, threads)) }
                    .map_err(driver_err("bl_rms_norm_f32"))?;
                if let Some(copy) = copy {
                    self.keep_quantized(copy)?;
                }
            }
            Op::L2Norm { eps } => {
                let x = src(0)?;
                f32_only(x, "L2Norm")?;
                f32_only(&c.dst, "L2Norm")?;
                if x.ne != c.dst.ne {
                    return Err(PluginError::invalid("L2Norm shapes"));
                }
                let (ncols, rows) = (c.dst.ne[0] as i32, c.dst.rows());
                let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
                let f = self.func("bl_l2_norm_f32")?;
                let mut l = self.args(&f);
                l.arg(&px).arg(&po).arg(&ncols).arg(&eps);
                let threads = (ncols as u32).div_ceil(64).clamp(1, 32) * 32;
                if rows > 0 {
                    // SAFETY: one block per row of ncols elements, all inside the checked spans.
                    unsafe { l.launch(cfg(rows as u32, threads)) }
                        .map_err(driver_err("bl_l2_norm_f32"))?;
                }
            }
            Op::Copy => self.copy(bufs, &addr, src(0)?, &c.dst)?,
            Op::ConvCausal { taps } => self.conv_causal(&addr, &src, c, taps)?,
            Op::DeltaRule(p) => self.delta_rule(&addr, &src, c, p)?,
            Op::GetRows => {
                let (t, ids) = (src(0)?, src(1)?);
                if ids.dtype != DType::I32 {
                    return Err(PluginError::invalid("GetRows ids must be I32"));
                }
                f32_only(&c.dst, "GetRows dst")?;
                let (name, wtype) = match (t.dtype, weight_code(t.dtype)) {
                    (DType::F32, _) => ("bl_get_rows_f32", 0),
                    (DType::F16, _) => ("bl_get_rows_f16", 0),
                    (_, Some((code, _))) => ("bl_get_rows_q", code),
                    (other, None) => {
                        return Err(PluginError::unsupported(format!("GetRows of {other}"), &[]))
                    }
                };
                let n_ids = ids.elements();
                if c.dst.ne[0] != t.ne[0] || c.dst.rows() != n_ids {
                    return Err(PluginError::invalid("GetRows shapes"));
                }
                let (pt, pi, po) = (addr(t, "table")?, addr(ids, "ids")?, addr(&c.dst, "dst")?);
                let (stride, ncols, nrows) = (t.nb[1] as i64, t.ne[0] as i32, t.rows() as i32);
                let err = self.error_word;
                let f = self.func(name)?;
                let mut l = self.args(&f);
                l.arg(&pt)
                    .arg(&stride)
                    .arg(&pi)
                    .arg(&po)
                    .arg(&ncols)
                    .arg(&nrows)
                    .arg(&err);
                if wtype != 0 {
                    l.arg(&wtype);
                }
                if n_ids > 0 {
                    // SAFETY: ids are checked against the table on the card; rows are in spans.
                    unsafe { l.launch(cfg(n_ids as u32, 128)) }.map_err(driver_err(name))?;
                }
            }
            Op::MatMul => {
                let (w, x) = (src(0)?, src(1)?);
                f32_only(x, "MatMul x")?;
                f32_only(&c.dst, "MatMul dst")?;
                let (k, n, m) = (w.ne[0], w.ne[1], x.rows());
                if x.ne[0] != k || c.dst.ne[0] != n || c.dst.rows() != m || w.rows() != n {
                    return Err(PluginError::invalid(format!(
                        "MatMul shapes {:?} x {:?} -> {:?}",
                        w.ne, x.ne, c.dst.ne
                    )));
                }
                let (pw, px, py) = (addr(w, "w")?, addr(x, "x")?, addr(&c.dst, "dst")?);
                let (stride, ki, ni, mi) = (w.nb[1] as i64, k as i32, n as i32, m as i32);
                let tasks = n * m;
                match (w.dtype, weight_code(w.dtype)) {
                    (DType::F32, _) => {
                        // A batch: tiles. Few outputs (a router, a gate at decode): a block per
                        // output splits k. Else a warp per output.
                        let (name, launch) = if f32_tiles(m, k, [pw, px, stride as u64]) {
                            let launch = LaunchConfig {
                                grid_dim: (
                                    n.div_ceil(F32_TILE_ROWS) as u32,
                                    m.div_ceil(F32_TILE_COLS) as u32,
                                    1,
                                ),
                                block_dim: (F32_TILE_THREADS, 1, 1),
                                shared_mem_bytes: 0,
                            };
                            ("bl_matmul_f32_tiled", launch)
                        } else if tasks <= F32_SPLIT_MAX_TASKS {
                            ("bl_matmul_f32_split", cfg(tasks as u32, F32_SPLIT_THREADS))
                        } else {
                            ("bl_matmul_f32", cfg(grid(tasks, WARPS), BLOCK))
                        };
                        let f = self.func(name)?;
                        let mut l = self.args(&f);
                        l.arg(&pw)
                            .arg(&stride)
                            .arg(&px)
                            .arg(&py)
                            .arg(&ki)
                            .arg(&ni)
                            .arg(&mi);
                        // SAFETY: a block per tile (rows and columns past n and m neither read
                        // nor written, k whole quads), a block or a warp per output, all
                        // inside the checked spans.
                        unsafe { l.launch(launch) }.map_err(driver_err(name))?;
                    }
                    (_, Some((wtype, block))) => {
                        if k % block.max(32) != 0 {
                            return Err(PluginError::invalid(format!(
                                "{} rows must be whole blocks",
                                w.dtype
                            )));
                        }
                        let nblocks = (k / 32) * m;
                        let copy = self.quantize_in_scratch(px, nblocks, held)?;
                        let q = copy.q;
                        // The next product may reuse q unless this one overwrites x.
                        let (x_end, y_end) = (px + x.elements() * 4, py + c.dst.elements() * 4);
                        if y_end <= px || x_end <= py {
                            self.keep_quantized(copy)?;
                        }
                        let x_row = ((k / 32) * 36) as i64;
                        if let Some((tiled, _, _)) = self.mmq.kernels(m) {
                            let f = self.func(tiled)?;
                            let mut l = self.args(&f);
                            l.arg(&pw).arg(&stride).arg(&wtype).arg(&q).arg(&x_row);
                            l.arg(&py).arg(&ki).arg(&ni).arg(&mi);
                            let tiles = n.div_ceil(MMQ_TILE) * m.div_ceil(MMQ_TILE);
                            let halves = mmq_k_halves(tiles, k);
                            if halves > 1 {
                                // The halves add into y.
                                // SAFETY: y is the checked m x n output span, on this stream.
                                unsafe {
                                    result::memset_d8_async(
                                        py,
                                        0,
                                        (m * n * 4) as usize,
                                        self.stream.cu_stream(),
                                    )
                                }
                                .map_err(driver_err("cuMemsetD8Async"))?;
                            }
                            let grid = (
                                n.div_ceil(MMQ_TILE) as u32,
                                m.div_ceil(MMQ_TILE) as u32,
                                halves,
                            );
                            // SAFETY: one block per 64 x 64 tile (and half of k); rows and columns
                            // beyond n and m are neither read nor written; all inside the checked
                            // spans.
                            unsafe {
                                l.launch(LaunchConfig {
                                    grid_dim: grid,
                                    block_dim: (MMQ_THREADS, 1, 1),
                                    shared_mem_bytes: 0,
                                })
                            }
                            .map_err(driver_err(tiled))?;
                            return Ok(());
                        }
                        // A single column: one warp per row. A few columns (several decode
                        // streams): each weight row read once per pass of up to 8 columns, by a
                        // warp taking 1, 2 or 4 rows (Q8_0, Q4_K) or one row (other types).
                        let few = if m > 1 && pairs_ok(wtype, pw, stride, 0, k) {
                            few_cols(wtype, n, m)
                        } else {
                            None
                        };
                        let (name, launch) = if m == 1 {
                            let launch = LaunchConfig {
                                shared_mem_bytes: stage_bytes(wtype, k, 2),
                                ..cfg(grid(tasks, WARPS), BLOCK)
                            };
                            (typed(&MATMUL_Q, wtype)?, launch)
                        } else if let Some(form) = few {
                            let warps = u64::from(FEW_BLOCK / 32) * form.rows;
                            let launch = LaunchConfig {
                                grid_dim: (grid(n, warps), m.div_ceil(form.cols) as u32, 1),
                                block_dim: (FEW_BLOCK, 1, 1),
                                shared_mem_bytes: 0,
                            };
                            (form.name, launch)
                        } else {
                            let warps = u64::from(MQ_COLS_BLOCK / 32);
                            ("bl_matmul_q_cols", cfg(grid(n, warps), MQ_COLS_BLOCK))
                        };
                        let f = self.func(name)?;
                        let mut l = self.args(&f);
                        l.arg(&pw).arg(&stride).arg(&q).arg(&x_row).arg(&py);
                        l.arg(&ki).arg(&ni).arg(&mi);
                        if m > 1 && few.is_none() {
                            l.arg(&wtype);
                        }
                        // SAFETY: one warp per (row, column), per row or per R rows, all inside
                        // the checked spans.
                        unsafe { l.launch(launch) }.map_err(driver_err(name))?;
                    }
                    (other, None) => {
                        return Err(PluginError::unsupported(
                            format!("MatMul with {other} weights"),
                            &[],
                        ))
                    }
                }
            }
            Op::Glu { kind, limit } => {
                let (g, u) = (src(0)?, src(1)?);
                for t in [g, u, &c.dst] {
                    f32_only(t, "Glu")?;
                }
                let n = c.dst.elements() as i64;
                if g.elements() as i64 != n || u.elements() as i64 != n {
                    return Err(PluginError::invalid("Glu shapes"));
                }
                let k: i32 = match kind {
                    GluKind::SwiGlu => 0,
                    GluKind::GeGlu => 1,
                };
                let (pg, pu, po) = (addr(g, "gate")?, addr(u, "up")?, addr(&c.dst, "dst")?);
                // The output's Q8_1 copy too, when a quantized product reads it next.
                let wanted = self.product_next.load(Ordering::Relaxed);
                let copy = self.copy_slot(wanted, po, c.dst.elements())?;
                let q = copy.map_or(0u64, |c| c.q);
                let f = self.func("bl_glu_f32")?;
                let mut l = self.args(&f);
                l.arg(&pg)
                    .arg(&pu)
                    .arg(&po)
                    .arg(&q)
                    .arg(&n)
                    .arg(&k)
                    .arg(&limit);
                // SAFETY: all three pointers cover n elements, q (when given) n / 32 blocks.
                unsafe { l.launch(cfg(grid(n as u64, 256).min(4096), 256)) }
                    .map_err(driver_err("bl_glu_f32"))?;
                if let Some(copy) = copy {
                    self.keep_quantized(copy)?;
                }
            }
            Op::Unary { f: which } => {
                let x = src(0)?;
                f32_only(x, "Unary")?;
                f32_only(&c.dst, "Unary")?;
                let n = c.dst.elements() as i64;
                if x.elements() as i64 != n {
                    return Err(PluginError::invalid("Unary shapes"));
                }
                let code = unary_code(which);
                let (px, po) = (addr(x, "x")?, addr(&c.dst, "dst")?);
                let f = self.func("bl_unary_f32")?;
                let mut l = self.args(&f);
                l.arg(&px).arg(&po).arg(&n).arg(&code);
                // SAFETY: both pointers cover n elements.
                unsafe { l.launch(cfg(grid(n as u64, 256).min(4096), 256)) }
                    .map_err(driver_err("bl_unary_f32"))?;
            }
            Op::Rope(p) => {
                let (x, pos) = (src(0)?, src(1)?);
                let r = rope_args(&p, x, pos, &c.dst)?;
                let (px, pp, po) = (addr(x, "x")?, addr(pos, "positions")?, addr(&c.dst, "dst")?);
                let f = self.func("bl_rope_f32")?;
                let mut l = self.args(&f);
                l.arg(&px)
                    .arg(&po)
                    .arg(&pp)
                    .arg(&r.head_dim)
                    .arg(&r.n_head)
                    .arg(&r.rows)
                    .arg(&r.neox)
                    .arg(&r.n_dims);
                l.arg(&r.log2_base).arg(&p.freq_scale).arg(&p.ext_factor);
                l.arg(&r.corr[0]).arg(&r.corr[1]).arg(&r.mscale);
                let total = (r.rows * r.n_head * (r.head_dim / 2)) as u64;
                // SAFETY: one thread per (row, head, pair) inside the checked spans.
                unsafe { l.launch(cfg(grid(total.max(1), 256).min(4096), 256)) }
                    .map_err(driver_err("bl_rope_f32"))?;
            }
            Op::CacheStore => {
                let (rows, cache, slots, pos) = (src(0)?, src(1)?, src(2)?, src(3)?);
                if *cache != c.dst {
                    return Err(PluginError::invalid(
                        "CacheStore must write the cache it names",
                    ));
                }
                f32_only(rows, "CacheStore rows")?;
                let name = match cache.dtype {
                    DType::F32 => "bl_cache_store_f32",
                    DType::F16 => "bl_cache_store_f16",
                    t => {
                        return Err(PluginError::unsupported(
                            format!("CacheStore into {t}"),
                            &[],
                        ))
                    }
                };
                let n = rows.rows();
                if rows.ne[0] != cache.ne[0] || slots.elements() != n || pos.elements() != n {
                    return Err(PluginError::invalid("CacheStore shapes"));
                }
                let (pr, pc) = (addr(rows, "rows")?, addr(cache, "cache")?);
                let (ps, pp) = (addr(slots, "slots")?, addr(pos, "positions")?);
                let (w, len, ns) = (cache.ne[0] as i32, cache.ne[1] as i32, cache.ne[2] as i32);
                let err = self.error_word;
                let f = self.func(name)?;
                let mut l = self.args(&f);
                l.arg(&pr)
                    .arg(&pc)
                    .arg(&ps)
                    .arg(&pp)
                    .arg(&w)
                    .arg(&len)
                    .arg(&ns)
                    .arg(&err);
                if n > 0 {
                    // SAFETY: slots and positions are checked on the card; rows inside spans.
                    unsafe { l.launch(cfg(n as u32, 128)) }.map_err(driver_err(name))?;
                }
            }
            Op::Attention(p) => self.attention(&addr, &src, c, p)?,
            Op::RouterTopK(p) | Op::RouterWeights(p) => {
                if p.n_group > 1 {
                    return Err(PluginError::unsupported(
                        "grouped routing on the CUDA bundles",
                        &[],
                    ));
                }
                let logits = src(0)?;
                f32_only(logits, "router logits")?;
                let (n, k) = (p.n_expert as i32, p.k as i32);
                let rows = logits.rows() as i32;
                if logits.ne[0] != u64::from(p.n_expert)
                    || k < 0
                    || k > n
                    || c.dst.elements() != (k as u64) * rows as u64
                {
                    return Err(PluginError::invalid("router shapes"));
                }
                if n > 512 || k > 32 {
                    return Err(PluginError::unsupported(
                        format!(
                            "routing {k} of {n} experts on the CUDA bundles (at most 32 of 512)"
                        ),
                        &[],
                    ));
                }
                let gating = gating_code(p.gating);
                let pl = addr(logits, "logits")?;
                let po = addr(&c.dst, "dst")?;
                let blocks = cfg(grid(rows.max(1) as u64, WARPS), BLOCK);
                if matches!(c.op, Op::RouterTopK(_)) {
                    let pb = if p.bias {
                        let b = src(1)?;
                        f32_only(b, "router bias")?;
                        addr(b, "bias")?
                    } else {
                        0u64
                    };
                    let f = self.func("bl_router_topk")?;
                    let mut l = self.args(&f);
                    l.arg(&pl)
                        .arg(&pb)
                        .arg(&po)
                        .arg(&n)
                        .arg(&k)
                        .arg(&rows)
                        .arg(&gating);
                    // SAFETY: one warp per row inside the checked spans.
                    unsafe { l.launch(blocks) }.map_err(driver_err("bl_router_topk"))?;
                } else {
                    let ids = addr(src(1)?, "ids")?;
                    let (norm, err) = (i32::from(p.norm), self.error_word);
                    let f = self.func("bl_router_weights")?;
                    let mut l = self.args(&f);
                    l.arg(&pl)
                        .arg(&ids)
                        .arg(&po)
                        .arg(&n)
                        .arg(&k)
                        .arg(&rows)
                        .arg(&gating);
                    l.arg(&norm).arg(&p.norm_min).arg(&p.scale).arg(&err);
                    // SAFETY: one warp per row; ids are checked on the card.
                    unsafe { l.launch(blocks) }.map_err(driver_err("bl_router_weights"))?;
                }
            }
            Op::MoeExperts(p) => self.moe(&addr, &src, c, p, held, None)?,
            other => {
                return Err(PluginError::unsupported(
                    format!("op {} on the CUDA bundles", other.kind()),
                    &[],
                ))
            }
        }
        Ok(())
    }

    /// Copy or convert (f32 ↔ f16) a source of any byte strides into a contiguous destination of
    /// the same shape: one block per source row.
    fn copy(
        &self,
        bufs: &dyn Buffers,
        addr: &dyn Fn(&TensorRef, &str) -> Result<u64, PluginError>,
        x: &TensorRef,
        dst: &TensorRef,
    ) -> Result<(), PluginError> {
        let name = match (x.dtype, dst.dtype) {
            (DType::F32, DType::F32) => "bl_copy_f32_f32",
            (DType::F32, DType::F16) => "bl_copy_f32_f16",
            (DType::F16, DType::F32) => "bl_copy_f16_f32",
            (DType::F16, DType::F16) => "bl_copy_f16_f16",
            // 32-bit moves: the f32 kernel's loads and stores keep every bit.
            (DType::I32, DType::I32) => "bl_copy_f32_f32",
            (a, d) => {
                return Err(PluginError::unsupported(
                    format!("Copy {a} to {d} on the CUDA bundles"),
                    &["F32<->F16"],
                ))
            }
        };
        if x.ne != dst.ne {
            return Err(PluginError::invalid(format!(
                "Copy {:?} into {:?}",
                x.ne, dst.ne
            )));
        }
        let es: u64 = if x.dtype == DType::F16 { 2 } else { 4 };
        if !x.offset.is_multiple_of(es) || x.nb.iter().any(|b| !b.is_multiple_of(es)) {
            return Err(PluginError::invalid("Copy: a misaligned source view"));
        }
        if x.elements() == 0 {
            return Ok(());
        }
        // The source spans up to its last element (any strides, also between elements of a row).
        let span = (0..4)
            .try_fold(es, |end, d| {
                x.nb[d]
                    .checked_mul(x.ne[d] - 1)
                    .and_then(|v| end.checked_add(v))
            })
            .ok_or_else(|| PluginError::invalid("Copy: the source view overflows"))?;
        let px = bufs.address(x.buffer, x.offset, span)?;
        let po = addr(dst, "Copy dst")?;
        let rows = x.rows();
        let (ne0, ne1, ne2, nrows) = (x.ne[0] as i64, x.ne[1] as i64, x.ne[2] as i64, rows as i64);
        let [nb0, nb1, nb2, nb3] = x.nb.map(|b| b as i64);
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&po)
            .arg(&ne0)
            .arg(&ne1)
            .arg(&ne2)
            .arg(&nrows);
        l.arg(&nb0).arg(&nb1).arg(&nb2).arg(&nb3);
        let threads = (x.ne[0].div_ceil(32) * 32).clamp(32, 256) as u32;
        // SAFETY: every source element lies inside the checked span (strides and extents as
        // given), every destination element inside the contiguous destination's span; blocks
        // stride over the rows.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (rows.min(1 << 20) as u32, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver_err(name))?;
        Ok(())
    }

    /// Routed experts: x quantized once when a stack is Q8_0, gate/up products and the GLU into
    /// `h`, `h` quantized when down is Q8_0, then the weighted down products. With `shared`, a
    /// sigmoid-gated shared expert joins the decode kernels as one more slot and the gated sum
    /// goes to its output (ops/moe_shared.rs, which checked that the kernels' forms apply).
    fn moe<'c>(
        &self,
        addr: &dyn Fn(&TensorRef, &str) -> Result<u64, PluginError>,
        src: &dyn Fn(usize) -> Result<&'c TensorRef, PluginError>,
        c: &'c OpCall,
        p: bloomery_plugin_api::op::MoeParams,
        held: Option<Quantized>,
        shared: Option<&SharedSlot>,
    ) -> Result<(), PluginError> {
        let (x, ids, w, gate) = (src(0)?, src(1)?, src(2)?, src(3)?);
        let (up, down_i) = if p.fused_gate_up {
            (None, 4)
        } else {
            (Some(src(4)?), 5)
        };
        let down = src(down_i)?;
        let map = if p.expert_map {
            addr(src(down_i + 1)?, "expert map")?
        } else {
            0u64
        };
        let wtype = |t: DType| -> Result<(i32, u64), PluginError> {
            weight_code(t).ok_or_else(|| {
                PluginError::unsupported(format!("MoeExperts with {t} experts"), &[])
            })
        };
        let (n_embd, n_ff, k) = (x.ne[0], u64::from(p.n_ff), u64::from(p.k));
        let rows = x.rows();
        let up_t = up.map_or(gate.dtype, |u| u.dtype);
        let ((wg, bg), (wu, bu), (wd, bd)) = (wtype(gate.dtype)?, wtype(up_t)?, wtype(down.dtype)?);
        let gate_rows = if p.fused_gate_up { 2 * n_ff } else { n_ff };
        if gate.ne[0] != n_embd
            || gate.ne[1] != gate_rows
            || down.ne[0] != n_ff
            || down.ne[1] != n_embd
            || ids.elements() != k * rows
            || w.elements() != k * rows
            || c.dst.ne[0] != n_embd
            || c.dst.rows() != rows
            || n_embd % bg.max(bu) != 0
            || n_ff % bd.max(32) != 0
        {
            return Err(PluginError::invalid("MoeExperts shapes"));
        }
        let align = |b: u64| b.div_ceil(256) * 256;
        if let (Some((_, routed, _)), true, None) = (
            self.mmq.kernels(rows),
            wg >= 1 && wu >= 1 && wd >= 1 && addr(&c.dst, "dst")? % 16 == 0,
            shared,
        ) {
            let stacks = Stacks {
                x: addr(x, "x")?,
                ids: addr(ids, "ids")?,
                weights: addr(w, "weights")?,
                map,
                gate: (
                    addr(gate, "gate")?,
                    gate.nb[1] as i64,
                    gate.nb[2] as i64,
                    wg,
                ),
                up: match up {
                    Some(u) => Some((addr(u, "up")?, u.nb[1] as i64, u.nb[2] as i64, wu)),
                    None => None,
                },
                down: (
                    addr(down, "down")?,
                    down.nb[1] as i64,
                    down.nb[2] as i64,
                    wd,
                ),
                n_stack: gate.ne[2],
                out: addr(&c.dst, "dst")?,
            };
            return self.moe_routed(routed, &stacks, p, n_embd, rows);
        }
        let xq_bytes = if wg >= 1 || wu >= 1 {
            align(rows * (n_embd / 32) * 36)
        } else {
            0
        };
        // Slots of h per row: the shared expert's after the routed ones.
        let hk = k + u64::from(shared.is_some());
        let h_bytes = align(rows * hk * n_ff * 4);
        let pd = addr(down, "down")?;
        let (d_row, d_exp) = (down.nb[1] as i64, down.nb[2] as i64);
        // The hidden rows' Q8_1 blocks, in the pair layout the down kernel reads straight from
        // memory where its rows suit the pair form.
        let hpairs = pairs_ok(wd, pd, d_row, d_exp, n_ff);
        let hq_row = if hpairs {
            (n_ff / 64) * STAGE_PAIR
        } else {
            (n_ff / 32) * 36
        };
        let hq_bytes = if wd >= 1 {
            align(rows * hk * hq_row)
        } else {
            0
        };
        let gs_bytes = if shared.is_some() { align(rows * 4) } else { 0 };
        let base = self.scratch(xq_bytes + h_bytes + hq_bytes + gs_bytes)?;
        let (xq, h, hq) = (base, base + xq_bytes, base + xq_bytes + h_bytes);
        // The shared expert's gate logits.
        let gs = hq + hq_bytes;
        let names = match shared {
            Some(sh) => {
                let forms = (wg == wu && xq_bytes > 0 && hpairs)
                    .then(|| moe_shared_kernels(wg, wd, sh.wtype))
                    .flatten();
                Some(forms.ok_or_else(|| {
                    PluginError::invalid("a shared expert slot off the kernels' pair forms")
                })?)
            }
            None => None,
        };
        let px = addr(x, "x")?;
        let cfg = |tasks: u64| LaunchConfig {
            grid_dim: (tasks.div_ceil(WARPS).max(1) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let nblocks = rows * (n_embd / 32);
        let copy = Quantized {
            x: px,
            nblocks,
            q: xq,
        };
        let quantized_now = xq_bytes > 0 && held != Some(copy);
        if quantized_now {
            self.quantize_q8_1(px, xq, nblocks)?;
        }
        let act = |t: i32| {
            if t >= 1 {
                (xq, ((n_embd / 32) * 36) as i64)
            } else {
                (px, (n_embd * 4) as i64)
            }
        };
        let ((xg, xg_row), (xu, xu_row)) = (act(wg), act(wu));
        let pg = addr(gate, "gate")?;
        let pu = match up {
            Some(u) => addr(u, "up")?,
            None => 0u64,
        };
        let (g_row, g_exp) = (gate.nb[1] as i64, gate.nb[2] as i64);
        let (u_row, u_exp) = up.map_or((0, 0), |u| (u.nb[1] as i64, u.nb[2] as i64));
        let (pids, pw, po) = (addr(ids, "ids")?, addr(w, "weights")?, addr(&c.dst, "dst")?);
        let (ne, nf, ki, ri, nx) = (
            n_embd as i32,
            n_ff as i32,
            k as i32,
            rows as i32,
            p.n_expert as i32,
        );
        let kind: i32 = match p.glu {
            GluKind::SwiGlu => 0,
            GluKind::GeGlu => 1,
        };
        let (fused, err) = (i32::from(p.fused_gate_up), self.error_word);
        let name = match names {
            Some((gate_up, _)) => gate_up,
            None if wg == wu => typed(&MOE_GATE_UP, wg)?,
            None => "bl_moe_gate_up",
        };
        let hki = hk as i32;
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&pg)
            .arg(&pu)
            .arg(&g_row)
            .arg(&g_exp)
            .arg(&u_row)
            .arg(&u_exp)
            .arg(&wg)
            .arg(&wu);
        l.arg(&xg)
            .arg(&xu)
            .arg(&xg_row)
            .arg(&xu_row)
            .arg(&pids)
            .arg(&map)
            .arg(&h);
        l.arg(&ne)
            .arg(&nf)
            .arg(&ki)
            .arg(&ri)
            .arg(&nx)
            .arg(&kind)
            .arg(&p.limit)
            .arg(&fused)
            .arg(&hki)
            .arg(&err);
        let mut tasks = rows * k * n_ff;
        // The shared expert's warps may read x and its copy before waiting only when the kernel
        // before is the routing, not the quantization just launched.
        let early = i32::from(shared.is_some_and(|sh| sh.after_routing) && !quantized_now);
        if let Some(sh) = shared {
            l.arg(&sh.gate.0)
                .arg(&sh.up.0)
                .arg(&sh.gate.1)
                .arg(&sh.up.1)
                .arg(&sh.gate_w)
                .arg(&sh.x)
                .arg(&gs);
            l.arg(&early);
            // A warp per (row, ff row) of the shared expert and one per row for its gate's
            // logit, before the routed warps.
            tasks += rows * n_ff + rows;
        }
        // SAFETY: one warp per (row, expert slot, ff row), with a shared expert after one per
        // (row, ff row) and one per row; expert ids are checked on the card, every stack row lies
        // inside the stacks' checked spans, and h and gs hold hk slots and one logit per row.
        unsafe { l.launch(cfg(tasks)) }.map_err(driver_err(name))?;
        let (hact, h_row) = if wd >= 1 {
            let nblocks = rows * hk * (n_ff / 32);
            if hpairs {
                // In the pair layout (nblocks even: n_ff is a multiple of 64 there).
                let nb = nblocks as i64;
                let name = "bl_quantize_q8_1_pairs";
                let f = self.func(name)?;
                let mut l = self.args(&f);
                l.arg(&h).arg(&hq).arg(&nb);
                // SAFETY: one warp per 32-value block; h holds nblocks blocks, hq as many in
                // pairs of STAGE_PAIR bytes.
                unsafe { l.launch(cfg(nblocks)) }.map_err(driver_err(name))?;
            } else {
                self.quantize_q8_1(h, hq, nblocks)?;
            }
            (hq, hq_row as i64)
        } else {
            (h, (n_ff * 4) as i64)
        };
        let name = match names {
            Some((_, down)) => down,
            None => typed(&MOE_DOWN, wd)?,
        };
        let po = shared.map_or(po, |sh| sh.out);
        let f = self.func(name)?;
        let mut l = self.args(&f);
        let hp = i32::from(hpairs);
        l.arg(&pd)
            .arg(&d_row)
            .arg(&d_exp)
            .arg(&hact)
            .arg(&h_row)
            .arg(&hp)
            .arg(&pids)
            .arg(&map);
        l.arg(&pw)
            .arg(&po)
            .arg(&ne)
            .arg(&nf)
            .arg(&ki)
            .arg(&hki)
            .arg(&ri)
            .arg(&nx)
            .arg(&err);
        if let Some(sh) = shared {
            l.arg(&sh.down.0).arg(&sh.down.1).arg(&gs);
        }
        // SAFETY: one warp per (row, output); rows of the down stacks inside their checked spans,
        // hk staged slots of h per row and, with a shared expert, its logits in gs.
        unsafe { l.launch(cfg(rows * n_embd)) }.map_err(driver_err(name))?;
        Ok(())
    }
}

/// A sigmoid-gated shared expert run as one more slot of the routed experts' decode kernels
/// (ops/moe_shared.rs): device addresses and row strides of its stacks, their type code, its
/// gate's F32 weights, the f32 rows that gate reads, where the whole sum goes, and what ran
/// before.
struct SharedSlot {
    gate: (u64, i64),
    up: (u64, i64),
    down: (u64, i64),
    wtype: i32,
    gate_w: u64,
    x: u64,
    out: u64,
    /// The last kernel launched was the routing's (it writes neither the activations nor the
    /// scratch).
    after_routing: bool,
}

/// The gate/up and down kernels with a shared expert slot, for routed gate/up stacks of type
/// code `gate_up`, a routed down stack of `down` and shared stacks of `shared` (each Q8_0 or
/// Q4_K, the types with a pair form).
fn moe_shared_kernels(
    gate_up: i32,
    down: i32,
    shared: i32,
) -> Option<(&'static str, &'static str)> {
    const GATE_UP: [[&str; 2]; 2] = [
        ["bl_moe_gate_up_sh_1_1", "bl_moe_gate_up_sh_1_2"],
        ["bl_moe_gate_up_sh_2_1", "bl_moe_gate_up_sh_2_2"],
    ];
    const DOWN: [[&str; 2]; 2] = [
        ["bl_moe_down_sh_1_1", "bl_moe_down_sh_1_2"],
        ["bl_moe_down_sh_2_1", "bl_moe_down_sh_2_2"],
    ];
    let at = |t: i32| usize::try_from(t - 1).ok().filter(|&i| i < 2);
    let (g, d, s) = (at(gate_up)?, at(down)?, at(shared)?);
    Some((GATE_UP[g][s], DOWN[d][s]))
}

/// Device addresses of one MoeExperts call: stacks as (pointer, row stride, expert stride, type).
struct Stacks {
    x: u64,
    ids: u64,
    weights: u64,
    map: u64,
    gate: (u64, i64, i64, i32),
    up: Option<(u64, i64, i64, i32)>,
    down: (u64, i64, i64, i32),
    n_stack: u64,
    out: u64,
}

impl Launcher {
    /// Routed experts for batches: the route table sorted by expert on the card, then per expert
    /// one tiled product over all its rows for gate/up and for down (each expert's weights read
    /// once per batch), the GLU between, and the weighted sum in slot order (into `st.out`,
    /// which the caller checked is 16-byte aligned).
    fn moe_routed(
        &self,
        kernel: &'static str,
        st: &Stacks,
        p: bloomery_plugin_api::op::MoeParams,
        n_embd: u64,
        rows: u64,
    ) -> Result<(), PluginError> {
        let (n_ff, k) = (u64::from(p.n_ff), u64::from(p.k));
        let entries = rows * k;
        if st.n_stack > u64::from(TILES_THREADS) {
            return Err(PluginError::unsupported(
                format!(
                    "batches over {} routed experts in one stack on the CUDA bundles (at most {TILES_THREADS})",
                    st.n_stack
                ),
                &[],
            ));
        }
        // Column tiles of all experts together: each expert's count rounded up to whole tiles.
        let max_tiles = entries.div_ceil(MMQ_TILE) + st.n_stack;
        let align = |b: u64| b.div_ceil(256) * 256;
        let sizes = [
            align(rows * (n_embd / 32) * 36),  // x as Q8_1
            align(st.n_stack * entries * 4),   // route lists
            align(st.n_stack * 4),             // route counts
            align(max_tiles * 8),              // column tiles
            align(entries * 2 * n_ff * 4),     // gate | up products
            align(entries * (n_ff / 32) * 36), // GLU as Q8_1
            align(entries * n_embd * 4),       // down products
        ];
        let mut at = [0u64; 7];
        let base = self.scratch(sizes.iter().sum())?;
        let mut off = base;
        for (a, sz) in at.iter_mut().zip(sizes) {
            *a = off;
            off += sz;
        }
        let [xq, list, count, tiles, gu, hq, dbuf] = at;
        let flat = |n: u64| LaunchConfig {
            grid_dim: (n.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.quantize_q8_1(st.x, xq, rows * (n_embd / 32))?;
        let (ne, nf, nx) = (n_embd as i32, n_ff as i32, p.n_expert as i32);
        let (n_entries, list_stride, err) = (entries as i32, entries as i64, self.error_word);
        let f = self.func("bl_moe_route")?;
        let mut l = self.args(&f);
        l.arg(&st.ids).arg(&st.map).arg(&n_entries).arg(&nx);
        l.arg(&list).arg(&list_stride).arg(&count).arg(&err);
        // SAFETY: one block per stack expert writes its own list (at most `entries` long) and count.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (st.n_stack as u32, 1, 1),
                block_dim: (ROUTE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver_err("bl_moe_route"))?;
        // Every expert's column tiles as one list, so that the products launch no empty blocks.
        let (ns, mt) = (st.n_stack as i32, max_tiles as i32);
        let f = self.func("bl_moe_tiles")?;
        let mut l = self.args(&f);
        l.arg(&count).arg(&ns).arg(&tiles).arg(&mt);
        // SAFETY: one block of TILES_THREADS threads, a thread per stack expert (checked above);
        // the tiles area holds max_tiles entries, which bound the tiles of `entries` columns.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (TILES_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver_err("bl_moe_tiles"))?;
        let tiled = self.func(kernel)?;
        let product = |stack: (u64, i64, i64, i32),
                       act: u64,
                       act_row: i64,
                       col_div: i32,
                       y: u64,
                       y_row: i64,
                       kk: u64,
                       nn: u64|
         -> Result<(), PluginError> {
            let (pw, w_row, w_exp, wtype) = stack;
            let (ki, ni) = (kk as i32, nn as i32);
            let mut l = self.args(&tiled);
            l.arg(&pw)
                .arg(&w_row)
                .arg(&w_exp)
                .arg(&wtype)
                .arg(&act)
                .arg(&act_row);
            l.arg(&list)
                .arg(&list_stride)
                .arg(&count)
                .arg(&tiles)
                .arg(&col_div);
            l.arg(&y).arg(&y_row).arg(&ki).arg(&ni);
            let grid = (nn.div_ceil(MMQ_TILE) as u32, max_tiles as u32, 1);
            // SAFETY: a block per (row tile, listed column tile) reads its expert's stack rows
            // (< nn) and listed columns, whose entries index rows of the activation and output
            // areas sized above.
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: grid,
                    block_dim: (MMQ_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map(|_| ())
            .map_err(driver_err(kernel))
        };
        let x_row = ((n_embd / 32) * 36) as i64;
        let (gu_row, ki) = ((2 * n_ff) as i64, k as i32);
        match st.up {
            None => product(st.gate, xq, x_row, ki, gu, gu_row, n_embd, 2 * n_ff)?,
            Some(up) => {
                product(st.gate, xq, x_row, ki, gu, gu_row, n_embd, n_ff)?;
                product(up, xq, x_row, ki, gu + n_ff * 4, gu_row, n_embd, n_ff)?;
            }
        }
        let kind: i32 = match p.glu {
            GluKind::SwiGlu => 0,
            GluKind::GeGlu => 1,
        };
        let n_e = entries as i64;
        let f = self.func("bl_moe_glu_q8_1")?;
        let mut l = self.args(&f);
        l.arg(&gu)
            .arg(&hq)
            .arg(&n_e)
            .arg(&nf)
            .arg(&kind)
            .arg(&p.limit);
        // SAFETY: 8 threads per Q8_1 block of the GLU (entries x n_ff / 32 blocks, whole warps a
        // grid step) read their quads of the gate | up rows (2 n_ff floats each, the layout the
        // products above wrote; 16-byte aligned: a 256-aligned area, n_ff a multiple of 32) and
        // write the block into hq, both areas sized so.
        unsafe { l.launch(flat(entries * n_ff / 4)) }.map_err(driver_err("bl_moe_glu_q8_1"))?;
        let h_row = ((n_ff / 32) * 36) as i64;
        product(st.down, hq, h_row, 1, dbuf, n_embd as i64, n_ff, n_embd)?;
        let ri = rows as i32;
        let f = self.func("bl_moe_combine")?;
        let mut l = self.args(&f);
        l.arg(&dbuf)
            .arg(&st.ids)
            .arg(&st.map)
            .arg(&st.weights)
            .arg(&st.out);
        l.arg(&ne).arg(&ki).arg(&ri).arg(&nx);
        // SAFETY: a thread per four of the rows x n_embd outputs (n_embd a multiple of 32, out
        // 16-byte aligned: checked by the caller, dbuf 256-aligned); only entries with a valid,
        // mapped expert are read.
        unsafe { l.launch(flat(rows * n_embd / 4)) }.map_err(driver_err("bl_moe_combine"))?;
        Ok(())
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            let s = self.scratch.lock().map(|s| s.0).unwrap_or(0);
            let mut all: Vec<u64> = self
                .retired
                .lock()
                .map(|r| r.iter().map(|a| a.0).collect())
                .unwrap_or_default();
            all.push(s);
            // SAFETY: every allocation is owned here and no longer used (the device synchronised
            // and released its graphs before dropping the launcher).
            unsafe {
                for p in all.into_iter().filter(|&p| p != 0) {
                    let _ = result::free_sync(p);
                }
                let _ = result::free_sync(self.error_word);
            }
        }
    }
}

/// The `f` of `bl_unary_f32` and `bl_unary_mul_f32` for a unary function.
/// A checked Rope call's kernel arguments.
struct RopeArgs {
    head_dim: i32,
    n_head: i32,
    rows: i32,
    /// 1 for NEOX pairs (and IMROPE with one position per row), 0 for adjacent pairs.
    neox: i32,
    n_dims: i32,
    /// YaRN correction dims.
    corr: [f32; 2],
    mscale: f64,
    /// log2 of the frequency base, in double (the kernels raise 2 to multiples of it).
    log2_base: f64,
}

/// Checks a Rope call of `x` at `pos` into `dst` for the CUDA kernels.
fn rope_args(
    p: &bloomery_plugin_api::op::RopeParams,
    x: &TensorRef,
    pos: &TensorRef,
    dst: &TensorRef,
) -> Result<RopeArgs, PluginError> {
    for t in [x, dst] {
        if t.dtype != DType::F32 {
            return Err(PluginError::unsupported(
                format!("Rope of type {}", t.dtype),
                &[],
            ));
        }
    }
    let rows = dst.ne[2] * dst.ne[3];
    let neox: i32 = match p.mode {
        RopeMode::Norm => 0,
        RopeMode::Neox => 1,
        // Text positions (one per row) give every section the same position: NEOX.
        RopeMode::Imrope if pos.elements() == rows => {
            if p.sections.iter().all(|&s| s == 0) {
                return Err(PluginError::invalid("IMROPE sections are all zero"));
            }
            1
        }
        RopeMode::Imrope => {
            return Err(PluginError::unsupported(
                "IMROPE with per-axis positions on the CUDA bundles",
                &["one position per row"],
            ))
        }
    };
    if p.inverse {
        return Err(PluginError::unsupported(
            "inverse RoPE on the CUDA bundles",
            &[],
        ));
    }
    let (hd, nh) = (dst.ne[0], dst.ne[1]);
    if x.ne != dst.ne
        || pos.dtype != DType::I32
        || pos.elements() != rows
        || hd % 2 != 0
        || !p.n_dims.is_multiple_of(2)
        || u64::from(p.n_dims) > hd
        || !(p.freq_base > 0.0 && p.freq_scale > 0.0)
    {
        return Err(PluginError::invalid(format!(
            "Rope shapes {:?} with {} positions, n_dims {}",
            x.ne,
            pos.elements(),
            p.n_dims
        )));
    }
    let (corr, mscale) = bloomery_kernels_cpu::ops::rope::RopeParams::from_abi(p).yarn_terms();
    Ok(RopeArgs {
        head_dim: hd as i32,
        n_head: nh as i32,
        rows: rows as i32,
        neox,
        n_dims: p.n_dims as i32,
        corr,
        mscale,
        log2_base: f64::from(p.freq_base).log2(),
    })
}

/// The routers' gating function as the kernels number it.
fn gating_code(g: Gating) -> i32 {
    match g {
        Gating::Softmax => 0,
        Gating::Sigmoid => 1,
        Gating::SoftmaxSelected => 2,
        Gating::SqrtSoftplus => 3,
    }
}

fn unary_code(which: UnaryFn) -> i32 {
    match which {
        UnaryFn::Silu => 0,
        UnaryFn::Sigmoid => 1,
        UnaryFn::Gelu => 2,
        UnaryFn::GeluErf => 3,
        UnaryFn::Softplus => 4,
        UnaryFn::Tanh => 5,
        UnaryFn::Exp => 6,
        UnaryFn::Relu => 7,
    }
}

#[cfg(test)]
mod tests {
    use bloomery_plugin_api::tensor::TensorRef;
    use bloomery_plugin_api::DType;

    /// A contiguous tensor of `dtype` and extents `ne` at `offset` of `buffer`, for the
    /// matchers' tests.
    pub(super) fn tensor_at(buffer: u64, offset: u64, dtype: DType, ne: [u64; 4]) -> TensorRef {
        TensorRef {
            buffer,
            offset,
            dtype,
            ne,
            nb: TensorRef::contiguous_strides(dtype, ne).unwrap(),
        }
    }

    /// Every kernel the launcher names.
    const NAMES: &[&str] = &[
        "bl_add_f32",
        "bl_mul_f32",
        "bl_scale_f32",
        "bl_copy_f32_f32",
        "bl_copy_f32_f16",
        "bl_copy_f16_f32",
        "bl_copy_f16_f16",
        "bl_rms_norm_f32",
        "bl_add_rms_norm_f32",
        "bl_unary_mul_f32",
        "bl_copy_l2_norm_f32",
        "bl_l2_norm_f32",
        "bl_get_rows_f32",
        "bl_get_rows_f16",
        "bl_get_rows_q",
        "bl_quantize_q8_1",
        "bl_quantize_q8_1_quads",
        "bl_quantize_q8_1_pairs",
        "bl_matmul_f32",
        "bl_matmul_f32_split",
        "bl_matmul_f32_tiled",
        "bl_matmul_q_cols",
        "bl_glu_f32",
        "bl_unary_f32",
        "bl_rope_f32",
        "bl_norm_rope_f32",
        "bl_norm_rope_f16",
        "bl_cache_store_f32",
        "bl_cache_store_f16",
        "bl_attention_f32",
        "bl_attention_f16",
        "bl_flash_attn_f16_64",
        "bl_flash_attn_f16_128",
        "bl_flash_attn_f16_256",
        "bl_attn_decode_f16_64",
        "bl_attn_decode_f16_128",
        "bl_attn_decode_f16_256",
        "bl_router_topk",
        "bl_router_weights",
        "bl_router_topk_weights",
        "bl_router_logits_topk",
        "bl_moe_gate_up",
        "bl_mmq_mma",
        "bl_mmq_dp4a",
        "bl_mmq_experts_mma",
        "bl_mmq_experts_dp4a",
        "bl_mmq_parts_mma",
        "bl_mmq_parts_dp4a",
        "bl_moe_route",
        "bl_moe_tiles",
        "bl_moe_glu_q8_1",
        "bl_moe_combine",
        "bl_conv_causal",
        "bl_conv_causal_state",
        "bl_delta_rule_table",
        "bl_delta_rule_step",
        "bl_delta_rule_prep",
        "bl_delta_rule_chunks",
        "bl_hold",
    ];

    /// The integers of a `#define NAME a, b, ...` line of `cu/quant.cuh`.
    fn table(name: &str) -> Vec<i8> {
        let src = include_str!("../cu/quant.cuh");
        let line = src
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("no {name} in quant.cuh"));
        line.split(',').map(|v| v.trim().parse().unwrap()).collect()
    }

    /// The integer of a `#define NAME v` line of a kernel source (tests hold the launch
    /// constants to the kernels').
    pub(super) fn define_in(src: &str, name: &str) -> u64 {
        src.lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `#define {name}` with an integer"))
    }

    /// The integer of a `#define NAME v` line of `cu/kernels.cu`.
    fn kernel_define(name: &str) -> u64 {
        define_in(include_str!("../cu/kernels.cu"), name)
    }

    #[test]
    fn launch_shapes_match_the_kernels() {
        let batch = include_str!("../cu/moe_batch.cuh");
        assert_eq!(
            define_in(batch, "TILES_THREADS"),
            u64::from(super::TILES_THREADS)
        );
        assert_eq!(
            define_in(batch, "ROUTE_THREADS"),
            u64::from(super::ROUTE_THREADS)
        );
        let mmq = include_str!("../cu/mmq.cuh");
        assert_eq!(define_in(mmq, "MMQ_BN"), super::MMQ_TILE);
        assert_eq!(define_in(mmq, "MMQ_THREADS"), u64::from(super::MMQ_THREADS));
        assert_eq!(define_in(mmq, "MMQ_BM"), super::MMQ_TILE);
        assert_eq!(
            super::STAGE_PAIR,
            define_in(include_str!("../cu/quant.cuh"), "STAGE_PAIR")
        );
        assert_eq!(
            super::fused::NORM_QUADS,
            kernel_define("NORM_QUADS"),
            "rows per thread of the norms"
        );
        let gemm = include_str!("../cu/gemm_f32.cuh");
        assert_eq!(define_in(gemm, "F32T_BN"), super::F32_TILE_ROWS);
        assert_eq!(define_in(gemm, "F32T_BM"), super::F32_TILE_COLS);
        assert_eq!(
            define_in(gemm, "F32T_THREADS"),
            u64::from(super::F32_TILE_THREADS)
        );
    }

    #[test]
    fn few_dense_tiles_split_k_in_halves() {
        assert_eq!(super::mmq_k_halves(256, 4096), 2, "an output projection");
        assert_eq!(super::mmq_k_halves(511, 352), 2, "a partial second step");
        assert_eq!(super::mmq_k_halves(512, 4096), 1, "enough tiles");
        assert_eq!(super::mmq_k_halves(8, 256), 1, "one k step");
    }

    #[test]
    fn f32_batches_take_tiles_when_whole_quads_and_aligned() {
        let aligned = [256, 4096, 8192];
        assert!(super::f32_tiles(512, 2048, aligned));
        assert!(super::f32_tiles(16, 352, aligned));
        assert!(!super::f32_tiles(15, 2048, aligned), "decode keeps warps");
        assert!(!super::f32_tiles(512, 2050, aligned), "a partial quad");
        assert!(
            !super::f32_tiles(512, 2048, [256, 4100, 8192]),
            "x off 16 bytes"
        );
        assert!(
            !super::f32_tiles(512, 2048, [256, 4096, 8200]),
            "rows off 16 bytes"
        );
    }

    #[test]
    fn few_column_products_cover_every_column_count_and_name_their_form() {
        for wtype in [1, 2] {
            for m in 2..16 {
                for n in [256, 512, 1024, 2048, 4096] {
                    let f = super::few_cols(wtype, n, m).expect("a form");
                    let (cols, rows) = (f.cols, f.rows);
                    assert!(
                        cols >= m.min(8) && (cols == 2 || cols / 2 < m),
                        "{m} columns in {cols}"
                    );
                    assert_eq!(f.name, format!("bl_matmul_q_few_{wtype}_{cols}_{rows}"));
                    assert_eq!(
                        f.parts,
                        format!("bl_matmul_q_few_parts_{wtype}_{cols}_{rows}")
                    );
                }
            }
        }
        assert_eq!(super::few_cols(1, 4096, 2).map(|f| f.rows), Some(4));
        assert_eq!(super::few_cols(2, 4096, 2).map(|f| f.rows), Some(2));
        assert_eq!(super::few_cols(1, 512, 2).map(|f| f.rows), Some(1));
        assert_eq!(super::few_cols(3, 4096, 2), None, "Q6_K has no pair form");
    }

    #[test]
    fn kernel_lookup_tables_match_the_cpu_reference() {
        use bloomery_kernels_cpu::quant::iq_tables::{KVALUES_E2M1, KVALUES_IQ4NL};
        assert_eq!(table("KVALUES_IQ4NL_LIST"), KVALUES_IQ4NL);
        assert_eq!(table("KVALUES_E2M1_LIST"), KVALUES_E2M1);
        let src = include_str!("../cu/quant.cuh");
        let grid: Vec<u32> = src
            .lines()
            .find_map(|l| l.strip_prefix("#define IQ3XXS_GRID_LIST "))
            .expect("no IQ3XXS_GRID_LIST in quant.cuh")
            .split(',')
            .map(|v| u32::from_str_radix(v.trim().trim_start_matches("0x"), 16).unwrap())
            .collect();
        assert_eq!(grid, bloomery_kernels_cpu::quant::iq_tables::IQ3XXS_GRID);
    }

    #[test]
    fn weight_codes_match_the_kernel_header_and_cover_every_claimed_type() {
        let src = include_str!("../cu/quant.cuh");
        for (t, code) in super::QUANT_TYPES {
            let name = format!("#define WT_{} {code}", t.to_string().to_uppercase());
            assert!(src.contains(&name), "quant.cuh lacks `{name}`");
            assert_eq!(super::weight_code(t).map(|c| c.0), Some(code));
        }
    }

    #[test]
    fn each_bundle_ptx_is_isa_9_0_for_its_target_and_defines_every_kernel() {
        let source = include_str!("ops.rs");
        let launcher = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        let recurrent = include_str!("ops/recurrent.rs");
        let fused = include_str!("ops/fused.rs");
        let attention = include_str!("ops/attention.rs");
        for name in NAMES {
            let quoted = format!("\"{name}\"");
            assert!(
                [launcher, recurrent, fused, attention]
                    .iter()
                    .any(|s| s.contains(&quoted)),
                "{name} is not launched"
            );
        }
        for (ptx, target) in [
            (crate::PTX_SM86, "sm_86"),
            (crate::PTX_SM90, "sm_90"),
            (crate::PTX_SM121, "sm_121"),
        ] {
            if ptx.is_empty() {
                assert!(
                    option_env!("BLOOMERY_REQUIRE_KERNELS").is_none(),
                    "built without kernels although BLOOMERY_REQUIRE_KERNELS was set"
                );
                eprintln!("skipped: built without nvcc");
                continue;
            }
            assert!(ptx.contains(".version 9.0"), "{target}: PTX ISA is not 9.0");
            assert!(ptx.contains(&format!(".target {target}")), "{target}");
            let typed = [
                super::MATMUL_Q,
                super::MATMUL_Q_PARTS,
                super::MOE_GATE_UP,
                super::MOE_DOWN,
            ];
            let few = super::MATMUL_Q_FEW.map(|f| [f.name, f.parts]);
            for name in NAMES
                .iter()
                .chain(typed.iter().flatten())
                .chain(few.iter().flatten())
            {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "{target}: no {name}"
                );
            }
        }
    }
}
