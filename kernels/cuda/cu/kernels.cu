// bloomery CUDA kernels: one translation unit compiled to PTX per bundle (compute_86, compute_90,
// compute_121) by kernels/cuda/build.rs. Every entry point is `extern "C"` with a `bl_` prefix;
// the host side (src/ops/) launches them, each family's launcher in the Rust file named as its
// source here: elementwise.cuh (Add, Mul, Scale, GLU, unary functions), copy.cuh (strided copies,
// row gathers), norm.cuh (RMSNorm, L2 norm), activations.cuh (activations to Q8_1), matmul.cuh
// (products of single rows and few columns; gemm_f32.cuh the F32 tiles of batches, mmq.cuh the
// quantized tiles on the tensor-core primitives of mma.cuh), rope.cuh (RoPE, and the per-head norm
// + RoPE with its cache stores), cache_store.cuh (the K/V cache store), router.cuh (small F32
// products and MoE routing), moe.cuh and moe_batch.cuh (routed experts of decode and of prompt
// batches), attention.cuh (attention over the K/V cache), recurrent.cuh (ConvCausal, DeltaRule),
// dense.cuh (LayerNorm, Softmax, Concat, span means, attention between graph tensors), hyper.cuh
// (Sinkhorn, stream mixing and update of hyper-connection residual streams), kpool.cuh (the k-pool
// DSA indexer's selection).
// common.cuh holds the shared reductions and quant.cuh the GGUF weight blocks. Tensors are
// contiguous rows (a Copy source may be any view); sizes are checked by the host before launch.
// Numerics follow the CPU reference (kernels/cpu): quantized products take activations quantized
// with the same rounding (ties to even through 127 / max|x|).

#include <stdint.h>
#include <cuda_fp16.h>

#define WARP 32

// Every kernel opens with this. From compute capability 9.0 the host launches kernels with
// programmatic stream serialization (src/ops/launch.rs): a kernel may start while its
// predecessor finishes, so it first waits for the predecessor's grid and its writes
// (griddepcontrol.wait), then lets its own successor start launching.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KERNEL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define KERNEL_ENTRY() \
    do {               \
    } while (0)
#endif

#include "common.cuh"
#include "quant.cuh"

// The single-row products have one entry point per weight type (name_<code>), so that each gets
// the registers its own type needs rather than the most that any type needs (as a switch over the
// types inside one kernel would): more warps per SM for the common types.
#define PER_WTYPE(DEF) DEF(0) DEF(1) DEF(2) DEF(3) DEF(4) DEF(5) DEF(6) DEF(7) DEF(8) DEF(9) DEF(10) DEF(11) DEF(12)

#include "elementwise.cuh"
#include "copy.cuh"
#include "norm.cuh"
#include "activations.cuh"
#include "matmul.cuh"
#include "rope.cuh"
#include "cache_store.cuh"
#include "router.cuh"
#include "moe.cuh"
#include "mma.cuh"
#include "mmq.cuh"
#include "moe_batch.cuh"
#include "attention.cuh"
#include "recurrent.cuh"
#include "dense.cuh"
#include "hyper.cuh"
#include "kpool.cuh"
#include "compress.cuh"

// ---- profiling: hold the stream for `ns` nanoseconds (one thread), so that the host can queue a
// whole pass before its first kernel runs and event pairs then time kernels, not launches.
extern "C" __global__ void bl_hold(long long ns) {
    KERNEL_ENTRY();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(100000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while ((long long)(t - t0) < ns);
}
