//! The ops the CUDA bundles run, one module per op family, each beside its kernel source
//! (`cu/<family>.cuh`): `elementwise` (Add, Mul, Scale, GLU and unary functions), `copy` (strided
//! copies, f32 and f16 either way, and row gathers of f32, f16 and every type of [`QUANT_TYPES`]),
//! `norm` (RMSNorm, L2 norm), `matmul` (f32 weights; quantized weights of [`QUANT_TYPES`] with
//! activations quantized to Q8_1 on the card: dp4a for single rows and small batches, int8
//! tensor-core tiles for batches of 16 rows or more), `rope` (NORM, NEOX, IMROPE with text
//! positions, YaRN), `cache_store` (the K/V cache store), `attention` (over an f32 or f16 cache),
//! `router` (MoE routing), `moe` and `moe_batch` (routed experts of F32 or [`QUANT_TYPES`] stacks,
//! decode and prompt batches), `recurrent` (the causal conv and gated delta rule of
//! linear-attention layers), `dense` (LayerNorm, Softmax, Concat, span means and attention between
//! graph tensors: the ops of decision heads), `hyper` (Sinkhorn, StreamMix and StreamUpdate of
//! hyper-connection residual streams, GroupDotGate), `kpool` (the k-pool DSA indexer's selection over an f32 or
//! f16 cache); `fused` launches runs of consecutive calls as one kernel, one module
//! per pattern. The quantized types are Q8_0, Q4_K, Q6_K, Q5_K, Q5_0, Q4_0, Q5_1, IQ4_XS, IQ4_NL,
//! MXFP4, Q3_K and IQ3_XXS; `cu/quant.cuh` unpacks each GGUF block layout once for all of these
//! kernels (`quant`). This module holds what no op owns: the [`Launcher`] (the loaded kernels, the
//! scratch of `scratch`, the record of `activations` of which Q8_1 copy the scratch holds), the
//! dispatch of one call to its family, and [`capabilities`]: the families' claims, which list
//! exactly what [`Launcher::run`] implements.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use abi_stable::std_types::RVec;
use bloomery_plugin_api::op::{Op, OpKind, OpSupport};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::{result, CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig};

use crate::probe::Bundle;

mod activations;
mod attention;
mod attention_comp;
mod attention_select;
mod cache_store;
mod compress;
mod copy;
mod dense;
mod elementwise;
mod fused;
mod hyper;
mod kpool;
mod launch;
mod matmul;
mod matmul_heads;
mod moe;
mod moe_batch;
mod norm;
mod quant;
mod recurrent;
mod rope;
mod rotate;
mod router;
mod scratch;

use activations::{is_routing, quantized_reader, Quantized};
use matmul::{Mmq, MMQ_MIN_ROWS};

pub use fused::{add2_norms, copy_runs, gated_adds, gdn_steps, shared_moes};
pub use launch::Args;
pub use quant::QUANT_TYPES;

/// Each family's claim: the `(op, dtypes)` pairs its launcher implements, each op in one family.
const FAMILIES: [fn() -> Vec<OpSupport>; 14] = [
    elementwise::claims,
    copy::claims,
    norm::claims,
    matmul::claims,
    rope::claims,
    cache_store::claims,
    attention::claims,
    router::claims,
    moe::claims,
    recurrent::claims,
    dense::claims,
    hyper::claims,
    kpool::claims,
    compress::claims,
];

/// Every `(op, dtype)` pair the kernels implement (none for a bundle built without them): the
/// families' claims in op order.
pub fn capabilities(bundle: &Bundle) -> RVec<OpSupport> {
    if bundle.ptx.is_empty() {
        return RVec::new();
    }
    let mut list: Vec<OpSupport> = FAMILIES.iter().flat_map(|claims| claims()).collect();
    list.sort_by_key(|s| s.op);
    list.into()
}

/// The claim of `op` for `dtypes`.
fn claim(op: OpKind, dtypes: &[DType]) -> OpSupport {
    OpSupport {
        op,
        dtypes: dtypes.to_vec().into(),
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

fn driver_err(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> PluginError + '_ {
    move |e| PluginError::device(format!("{what}: {e:?}"))
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

/// Threads per block of the row-per-warp kernels.
const BLOCK: u32 = 256;
/// Warps per block of the row-per-warp kernels.
const WARPS: u64 = (BLOCK / 32) as u64;

/// How a family's launcher finds the device address of a contiguous tensor (`what` names it in
/// errors).
type Addr<'a> = &'a dyn Fn(&TensorRef, &str) -> Result<u64, PluginError>;

/// How a family's launcher reaches source `i` of its call.
type Src<'a, 'c> = &'a dyn Fn(usize) -> Result<&'c TensorRef, PluginError>;

/// Blocks for `n` items at `per` a block: at least 1, at most 65,535 × 64 (kernels stride over
/// the rest).
fn grid(n: u64, per: u64) -> u32 {
    n.div_ceil(per).clamp(1, 65_535 * 64) as u32
}

/// A launch of `g` blocks of `b` threads along x, without dynamic shared memory.
fn cfg(g: u32, b: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (g, 1, 1),
        block_dim: (b, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// How [`Launcher::run`] reaches the device's buffer table.
pub trait Buffers {
    /// The device address of `len` bytes at `offset` in `buffer`, when they lie inside it.
    fn address(&self, buffer: u64, offset: u64, len: u64) -> Result<u64, PluginError>;
}

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
    /// for its reader (ops/norm.rs, ops/fused/add_norm.rs); kept across routing calls, which touch
    /// neither.
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

    /// Launches one call by its family's launcher; `held` is the Q8_1 copy the scratch holds.
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
        match c.op {
            Op::Add | Op::Mul => self.add_mul(&addr, &src, c),
            Op::Scale { s } => self.scale(&addr, &src, c, s),
            Op::Glu { kind, limit } => self.glu(&addr, &src, c, kind, limit),
            Op::Unary { f } => self.unary(&addr, &src, c, f),
            Op::Copy => self.copy(bufs, &addr, src(0)?, &c.dst),
            Op::GetRows => self.get_rows(&addr, &src, c),
            Op::RmsNorm { eps } => self.rms_norm(&addr, &src, c, eps),
            Op::L2Norm { eps } => self.l2_norm(&addr, &src, c, eps),
            Op::MatMul => self.matmul(&addr, &src, c, held),
            Op::Rope(p) => self.rope(&addr, &src, c, p),
            Op::CacheStore { rot } => self.cache_store(&addr, &src, c, rot),
            Op::Attention(p) => self.attention(&addr, &src, c, p),
            Op::RouterTopK(p) | Op::RouterWeights(p) => self.route(&addr, &src, c, p),
            Op::TopK { k } => self.top_k(&addr, &src, c, k),
            Op::MoeExperts(p) => self.moe(&addr, &src, c, p, held, None),
            Op::ConvCausal { taps, dilation } => self.conv_causal(&addr, &src, c, taps, dilation),
            Op::DeltaRule(p) => self.delta_rule(&addr, &src, c, p),
            Op::LayerNorm { eps } => self.layer_norm(&addr, &src, c, eps),
            Op::Softmax { scale } => self.softmax(&addr, &src, c, scale),
            Op::Concat => self.concat(&addr, &src, c),
            Op::SpanMean => self.span_mean(&addr, &src, c),
            Op::KPoolSelect(p) => self.kpool_select(&addr, &src, c, p),
            Op::AttentionDense { scale, causal } => {
                self.attention_dense(&addr, &src, c, scale, causal)
            }
            Op::Sinkhorn { iters, eps } => self.sinkhorn(&addr, &src, c, iters, eps),
            Op::StreamMix => self.stream_mix(&addr, &src, c),
            Op::StreamUpdate => self.stream_update(&addr, &src, c),
            Op::GroupDotGate { scale, floor } => self.group_dot_gate(&addr, &src, c, scale, floor),
            Op::Compress(p) => self.compress(&addr, &src, c, p),
            Op::CompSelect(p) => self.comp_select(&addr, &src, c, p),
            Op::EngramGate { eps, scale, floor } => {
                self.engram_gate(&addr, &src, c, (eps, scale, floor))
            }
        }
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

#[cfg(test)]
mod tests {
    use bloomery_plugin_api::tensor::TensorRef;
    use bloomery_plugin_api::DType;

    /// A contiguous tensor of `dtype` and extents `ne` at `offset` of `buffer`, for the
    /// matchers' tests.
    pub(crate) fn tensor_at(buffer: u64, offset: u64, dtype: DType, ne: [u64; 4]) -> TensorRef {
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
        "bl_fwht_f32",
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
        "bl_mmq2_mma",
        "bl_mmq2_parts_mma",
        "bl_moe_route",
        "bl_moe_tiles",
        "bl_moe_glu_q8_1",
        "bl_moe_combine",
        "bl_conv_causal",
        "bl_conv_causal_state",
        "bl_conv_causal_rows",
        "bl_delta_rule_table",
        "bl_delta_rule_step",
        "bl_delta_rule_prep",
        "bl_delta_rule_prep_dim",
        "bl_delta_rule_chunks",
        "bl_layer_norm_f32",
        "bl_softmax_f32",
        "bl_concat_f32",
        "bl_span_mean_f32",
        "bl_attention_dense_f32",
        "bl_sinkhorn_f32",
        "bl_stream_mix_f32",
        "bl_stream_update_f32",
        "bl_stream_mix_el_f32",
        "bl_stream_update_id_f32",
        "bl_group_dot_gate_f32",
        "bl_engram_gate_f32",
        "bl_kpool_pool_f32",
        "bl_kpool_pool_f16",
        "bl_kpool_scores_f32",
        "bl_kpool_scores_f16",
        "bl_kpool_select",
        "bl_hold",
    ];

    /// The integer of a `#define NAME v` line of a kernel source (tests hold the launch
    /// constants to the kernels').
    pub(crate) fn define_in(src: &str, name: &str) -> u64 {
        src.lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `#define {name}` with an integer"))
    }

    #[test]
    fn each_op_is_claimed_by_one_family() {
        let mut ops: Vec<_> = super::FAMILIES
            .iter()
            .flat_map(|claims| claims())
            .map(|s| s.op)
            .collect();
        let claimed = ops.len();
        ops.sort();
        ops.dedup();
        assert_eq!(ops.len(), claimed, "an op is claimed by two families");
    }

    #[test]
    fn each_bundle_ptx_is_isa_9_0_for_its_target_and_defines_every_kernel() {
        let source = include_str!("mod.rs");
        let launcher = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        let families = [
            include_str!("activations.rs"),
            include_str!("attention.rs"),
            include_str!("cache_store.rs"),
            include_str!("copy.rs"),
            include_str!("dense.rs"),
            include_str!("elementwise.rs"),
            include_str!("hyper.rs"),
            include_str!("kpool.rs"),
            include_str!("matmul.rs"),
            include_str!("moe.rs"),
            include_str!("moe_batch.rs"),
            include_str!("norm.rs"),
            include_str!("recurrent.rs"),
            include_str!("rope.rs"),
            include_str!("rotate.rs"),
            include_str!("router.rs"),
        ];
        let fused = [
            include_str!("fused/add_norm.rs"),
            include_str!("fused/copy_l2_norm.rs"),
            include_str!("fused/copy_run.rs"),
            include_str!("fused/gated_add.rs"),
            include_str!("fused/gdn.rs"),
            include_str!("fused/matmul_parts.rs"),
            include_str!("fused/moe_shared.rs"),
            include_str!("fused/norm_rope.rs"),
            include_str!("fused/routing.rs"),
            include_str!("fused/unary_mul.rs"),
        ];
        for name in NAMES {
            let quoted = format!("\"{name}\"");
            assert!(
                std::iter::once(launcher)
                    .chain(families)
                    .chain(fused)
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
                super::matmul::MATMUL_Q,
                super::matmul::MATMUL_Q_PARTS,
                super::moe::MOE_GATE_UP,
                super::moe::MOE_DOWN,
            ];
            let few = super::matmul::MATMUL_Q_FEW.map(|f| [f.name, f.parts]);
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

    /// The kernels of `ptx` that store an f16 register through a byte store (`st.*.u8` /
    /// `.s8` / `.b8` of a register written by a `cvt` to f16), with the offending line.
    ///
    /// ptxas 13.0 compiles such a store as a conversion of the f16 value to an integer
    /// (`F2I.U8.F16`) rather than a store of its low byte: the quantized cache store wrote every
    /// block's f16 scale with its low byte 0 that way (opcheck on the H100, 2026-12-06), while
    /// the CPU emulation of the same source, which has no ptxas, stored the right bytes.
    fn byte_stores_of_f16_registers(ptx: &str) -> Vec<String> {
        let mut found = Vec::new();
        let (mut kernel, mut halves) = ("", std::collections::HashSet::new());
        for line in ptx.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix(".visible .entry ") {
                kernel = rest.split('(').next().unwrap_or(rest);
                halves.clear();
            }
            // `cvt.rn.f16.f32 %rs1, %f2;` (inside inline asm braces, as cuda_fp16.h writes it).
            let code = line.trim_start_matches('{').trim();
            if code.starts_with("cvt.") && code.contains(".f16.") {
                if let Some(dst) = code.split_whitespace().nth(1) {
                    halves.insert(dst.trim_end_matches(',').to_owned());
                }
            }
            let byte_store = code.starts_with("st.")
                && [".u8 ", ".s8 ", ".b8 "].iter().any(|t| code.contains(t));
            if byte_store {
                let src = code
                    .rsplit(',')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_end_matches(';');
                if halves.contains(src) {
                    found.push(format!("{kernel}: {code}"));
                }
            }
        }
        found
    }

    #[test]
    fn no_kernel_stores_an_f16_register_byte_by_byte() {
        // The pattern as nvcc 13.0 wrote it for the cache store's scale (memcpy of a __half).
        let bad =
            ".visible .entry k(\n{  cvt.rn.f16.f32 %rs7, %f3;}\n\tst.global.u8 [%rd8], %rs7;\n}";
        assert_eq!(byte_stores_of_f16_registers(bad).len(), 1);
        for (ptx, target) in [
            (crate::PTX_SM86, "sm_86"),
            (crate::PTX_SM90, "sm_90"),
            (crate::PTX_SM121, "sm_121"),
        ] {
            if ptx.is_empty() {
                eprintln!("skipped {target}: built without nvcc");
                continue;
            }
            let found = byte_stores_of_f16_registers(ptx);
            assert!(
                found.is_empty(),
                "{target}: byte stores of f16 registers (ptxas converts the value):\n{}",
                found.join("\n")
            );
        }
    }
}
