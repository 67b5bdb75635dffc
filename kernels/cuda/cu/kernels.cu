// bloomery CUDA kernels: one translation unit compiled to PTX per bundle (compute_86, compute_90,
// compute_121) by kernels/cuda/build.rs. Every entry point is `extern "C"` with a `bl_` prefix;
// the host side (src/ops.rs) launches them. Tensors are contiguous rows (a Copy source may be any
// view); sizes are checked by the host before launch. common.cuh holds the shared reductions,
// router.cuh the small F32 products and MoE routing, moe.cuh the routed experts of decode batches,
// moe_batch.cuh those of prompt batches around the tiled products, mmq.cuh the tiled quantized
// products of batches (on the tensor-core primitives of mma.cuh), rope.cuh RoPE and the per-head
// norm + RoPE with its cache stores, attention.cuh attention over the K/V cache, recurrent.cuh the
// sequence-state kernels (ConvCausal, DeltaRule). Numerics follow the CPU reference
// (kernels/cpu): quantized products take activations quantized with the same rounding (ties to
// even through 127 / max|x|).

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

// ---- elementwise -------------------------------------------------------------------------------

// out[i] = a[i] + b[(i / bdiv) % nb]: b of the same shape (bdiv 1, nb n), one row broadcast over
// the rows (bdiv 1, nb the row length) or one value per row (bdiv the row length, nb the rows).
extern "C" __global__ void bl_add_f32(const float* a, const float* b, float* out, long long n, long long nb,
                                      long long bdiv) {
    KERNEL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) out[i] = a[i] + b[(i / bdiv) % nb];
}

extern "C" __global__ void bl_mul_f32(const float* a, const float* b, float* out, long long n, long long nb,
                                      long long bdiv) {
    KERNEL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) out[i] = a[i] * b[(i / bdiv) % nb];
}

extern "C" __global__ void bl_scale_f32(const float* x, float* out, float s, long long n) {
    KERNEL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) out[i] = x[i] * s;
}

// ---- Copy: a source with byte strides nb0..nb3 into a contiguous destination, converting ---------
// One block per row (i1, i2, i3), its threads along ne0.
template <typename S, typename D>
static __device__ void copy_rows(const uint8_t* x, D* out, long long ne0, long long ne1, long long ne2, long long rows,
                                 long long nb0, long long nb1, long long nb2, long long nb3) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const long long i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const uint8_t* row = x + i1 * nb1 + i2 * nb2 + i3 * nb3;
        D* y = out + r * ne0;
        for (long long i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = from_f32<D>(to_f32(*(const S*)(row + i * nb0)));
    }
}

#define COPY(name, S, D)                                                                                         \
    extern "C" __global__ void name(const uint8_t* x, D* out, long long ne0, long long ne1, long long ne2,         \
                                    long long rows, long long nb0, long long nb1, long long nb2, long long nb3) { KERNEL_ENTRY(); \
        copy_rows<S, D>(x, out, ne0, ne1, ne2, rows, nb0, nb1, nb2, nb3);                                         \
    }
COPY(bl_copy_f32_f32, float, float)
COPY(bl_copy_f32_f16, float, __half)
COPY(bl_copy_f16_f32, __half, float)
COPY(bl_copy_f16_f16, __half, __half)

// ---- a run of contiguous 4-byte copies in one launch (src/ops/fused.rs `copy_run`) -------------
// One block. Every copy but the last is written first; each thread then fences its writes
// system-wide before the block's barrier, so an observer that sees any of the last copy's words
// (the host polling a signal word in page-locked memory) also sees every earlier copy, as when
// the copies were launched one by one.
#define COPY_RUN_MAX 8
struct CopyWords {
    const unsigned int* src;
    unsigned int* dst;
    long long n;
};
struct CopyRun {
    CopyWords c[COPY_RUN_MAX];
};
extern "C" __global__ void bl_copy_words(CopyRun run, int count) {
    KERNEL_ENTRY();
    for (int j = 0; j + 1 < count; ++j) {
        const CopyWords c = run.c[j];
        for (long long i = threadIdx.x; i < c.n; i += blockDim.x) c.dst[i] = c.src[i];
    }
    __threadfence_system();
    __syncthreads();
    const CopyWords last = run.c[count - 1];
    for (long long i = threadIdx.x; i < last.n; i += blockDim.x) last.dst[i] = last.src[i];
}

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

// ---- RMSNorm and L2 norm: one block of up to 1024 threads per row ---------------------------------

// Quads (float4) of a row each thread of a norm keeps in registers (the host launches
// ceil(ncols / 4 / NORM_QUADS) threads, rounded up to whole warps).
#define NORM_QUADS 4

// RMSNorm of one row per block, d = a (ADDS 0), a + b (1) or c + (a + b) (2, the first sum
// written to m) held in registers as quads: every load is issued before the one reduction. Needs
// ncols % 4 == 0, 16-byte aligned rows and ncols <= 4 * NORM_QUADS * blockDim.x. Writes d (with
// ADDS), out = d / rms(d) (* w) and, when q is given, the Q8_1 copy of out (ncols % 32 == 0).
// Each thread reads only the quads it writes, and all of them before writing, so m, d and out may
// share memory with a, b or c.
template <int ADDS>
static __device__ void rms_norm_quads(const float* a, const float* b, const float* c, float* m, float* d,
                                      const float* w, float* out, uint8_t* q, int ncols, float eps) {
    const long long row = (long long)blockIdx.x * ncols;
    const int nq = ncols / 4;
    const float4* a4 = (const float4*)(a + row);
    float4 v[NORM_QUADS], wv[NORM_QUADS], mv[NORM_QUADS];
    double s = 0.0;
#pragma unroll
    for (int t = 0; t < NORM_QUADS; ++t) {
        const int i = threadIdx.x + t * blockDim.x;
        v[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        wv[t] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        if (i < nq) {
            v[t] = a4[i];
            if (ADDS >= 1) {
                const float4 bv = ((const float4*)(b + row))[i];
                v[t].x += bv.x;
                v[t].y += bv.y;
                v[t].z += bv.z;
                v[t].w += bv.w;
            }
            if (ADDS == 2) {
                // The second Add: c + (a + b), the first sum kept for its own result.
                const float4 cv = ((const float4*)(c + row))[i];
                mv[t] = v[t];
                v[t] = make_float4(cv.x + v[t].x, cv.y + v[t].y, cv.z + v[t].z, cv.w + v[t].w);
            }
            if (w) wv[t] = ((const float4*)w)[i];
        }
    }
#pragma unroll
    for (int t = 0; t < NORM_QUADS; ++t) {
        const int i = threadIdx.x + t * blockDim.x;
        if (i < nq) {
            if (ADDS == 2) ((float4*)(m + row))[i] = mv[t];
            if (ADDS >= 1) ((float4*)(d + row))[i] = v[t];
            s += (double)(v[t].x * v[t].x);
            s += (double)(v[t].y * v[t].y);
            s += (double)(v[t].z * v[t].z);
            s += (double)(v[t].w * v[t].w);
        }
    }
    const float mean = (float)(block_sum_f64(s) / ncols);
    const float inv = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int t = 0; t < NORM_QUADS; ++t) {
        const int i = threadIdx.x + t * blockDim.x;
        // Whole warps take part in the quantization: 8 lanes hold one block, and nq is a multiple
        // of 8 when q is given, so a warp is either wholly inside the row or wholly past it.
        if (t * (int)blockDim.x + (int)(threadIdx.x & ~(WARP - 1)) >= nq) break;
        float4 y = make_float4(v[t].x * inv, v[t].y * inv, v[t].z * inv, v[t].w * inv);
        if (w) y = make_float4(y.x * wv[t].x, y.y * wv[t].y, y.z * wv[t].z, y.w * wv[t].w);
        if (i < nq) ((float4*)(out + row))[i] = y;
        if (q) quantize_quad(y, q + (row / 4 + i) / 8 * 36, i < nq);
    }
}

// q (may be null): the output's Q8_1 copy as well, for the quantized product that reads it (the
// block size is a multiple of 32 and so is ncols, so each warp holds whole blocks). quads: the
// row is held in registers (rms_norm_quads; the host checked its conditions).
extern "C" __global__ void bl_rms_norm_f32(const float* x, const float* w, float* out, uint8_t* q, int ncols,
                                           float eps, int quads) {
    KERNEL_ENTRY();
    if (quads) {
        rms_norm_quads<0>(x, nullptr, nullptr, nullptr, nullptr, w, out, q, ncols, eps);
        return;
    }
    const float* xr = x + (long long)blockIdx.x * ncols;
    float* yr = out + (long long)blockIdx.x * ncols;
    double s = 0.0;
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float v = xr[i];
        s += (double)(v * v);
    }
    const float mean = (float)(block_sum_f64(s) / ncols);
    const float inv = 1.0f / sqrtf(mean + eps);
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float v = xr[i] * inv;
        const float y = w ? v * w[i] : v;
        yr[i] = y;
        if (q) quantize_lane(y, q + ((long long)blockIdx.x * ncols + i) / 32 * 36);
    }
}

// A residual add and the RMS norm of its result in one pass (llama.cpp's add + rms_norm fusion):
// d = a + b is written as the Add would and normed exactly as bl_rms_norm_f32 norms it.
// q (may be null) and quads as for bl_rms_norm_f32.
extern "C" __global__ void bl_add_rms_norm_f32(const float* a, const float* b, float* d, const float* w, float* out,
                                               uint8_t* q, int ncols, float eps, int quads) {
    KERNEL_ENTRY();
    if (quads) {
        rms_norm_quads<1>(a, b, nullptr, nullptr, d, w, out, q, ncols, eps);
        return;
    }
    const long long row = (long long)blockIdx.x * ncols;
    const float* ar = a + row;
    const float* br = b + row;
    float* dr = d + row;
    float* yr = out + row;
    double s = 0.0;
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = ar[i] + br[i];
        dr[i] = v;
        s += (double)(v * v);
    }
    const float mean = (float)(block_sum_f64(s) / ncols);
    const float inv = 1.0f / sqrtf(mean + eps);
    // Each thread reads back only what it wrote, so d may share memory with a or b, and out
    // with a or b (the planner reuses dead inputs' memory).
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = dr[i] * inv;
        const float y = w ? v * w[i] : v;
        yr[i] = y;
        if (q) quantize_lane(y, q + (row + i) / 32 * 36);
    }
}

// Two adds and the RMS norm of the second's result in one pass (a MoE layer's parts summed, then
// the residual): m = a + b and d = c + m are written as the two Adds would, and d is normed
// exactly as bl_rms_norm_f32 norms it. Each thread reads all three inputs of an index before it
// writes that index, so m and d may each be a, b or c exactly (the host checked that they meet no
// other bytes of them). q (may be null) and quads as for bl_rms_norm_f32.
extern "C" __global__ void bl_add2_rms_norm_f32(const float* a, const float* b, const float* c, float* m, float* d,
                                                const float* w, float* out, uint8_t* q, int ncols, float eps,
                                                int quads) {
    KERNEL_ENTRY();
    if (quads) {
        rms_norm_quads<2>(a, b, c, m, d, w, out, q, ncols, eps);
        return;
    }
    const long long row = (long long)blockIdx.x * ncols;
    double s = 0.0;
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float first = a[row + i] + b[row + i];
        const float v = c[row + i] + first;
        m[row + i] = first;
        d[row + i] = v;
        s += (double)(v * v);
    }
    const float mean = (float)(block_sum_f64(s) / ncols);
    const float inv = 1.0f / sqrtf(mean + eps);
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = d[row + i] * inv;
        const float y = w ? v * w[i] : v;
        out[row + i] = y;
        if (q) quantize_lane(y, q + (row + i) / 32 * 36);
    }
}

// A strided copy and the L2 norm of its rows in one pass (q and k split out of the DeltaNet
// convolution): c = the rows of x (row r at i1·nb1 + i2·nb2 + i3·nb3 elements, ne0 contiguous) as
// the Copy writes them, out = c normed as bl_l2_norm_f32 norms it. Each thread reads back only its
// own writes.
extern "C" __global__ void bl_copy_l2_norm_f32(const float* x, long long nb1, long long nb2, long long nb3, int ne1,
                                               int ne2, float* c, float* out, int ncols, float eps) {
    KERNEL_ENTRY();
    const long long r = blockIdx.x;
    const long long i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / ((long long)ne1 * ne2);
    const float* xr = x + i1 * nb1 + i2 * nb2 + i3 * nb3;
    float* cr = c + r * ncols;
    float* yr = out + r * ncols;
    double s = 0.0;
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = xr[i];
        cr[i] = v;
        s += (double)v * (double)v;
    }
    const float inv = (float)(1.0 / sqrt(block_sum_f64(s) + (double)eps));
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = cr[i] * inv;
}

// x / sqrt(sum(x^2) + eps), the sum and the root in f64 as the CPU reference takes them.
extern "C" __global__ void bl_l2_norm_f32(const float* x, float* out, int ncols, float eps) {
    KERNEL_ENTRY();
    const float* xr = x + (long long)blockIdx.x * ncols;
    float* yr = out + (long long)blockIdx.x * ncols;
    double s = 0.0;
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const double v = (double)xr[i];
        s += v * v;
    }
    const float inv = (float)(1.0 / sqrt(block_sum_f64(s) + (double)eps));
#pragma unroll 8
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = xr[i] * inv;
}

// ---- GetRows: one block per id ------------------------------------------------------------------

// Row `id` of a table, element i, as f32: one functor per row type.
struct RowF32 {
    static __device__ float at(const uint8_t* row, int i) { return ((const float*)row)[i]; }
};
struct RowF16 {
    static __device__ float at(const uint8_t* row, int i) { return __half2float(((const __half*)row)[i]); }
};
// One block per id: out row b = table row ids[b] (error 1 for an id outside the table).
template <typename R>
static __device__ void gather_rows(const uint8_t* table, long long stride, const int* ids, float* out, int ncols,
                                   int nrows, int* err) {
    const int id = ids[blockIdx.x];
    float* y = out + (long long)blockIdx.x * ncols;
    if (id < 0 || id >= nrows) {
        report(err, 1);
        return;
    }
    const uint8_t* row = table + (long long)id * stride;
#pragma unroll 4
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) y[i] = R::at(row, i);
}

#define GET_ROWS(name, R)                                                                                       \
    extern "C" __global__ void name(const uint8_t* table, long long stride, const int* ids, float* out, int ncols, \
                                    int nrows, int* err) { KERNEL_ENTRY();                                                      \
        gather_rows<R>(table, stride, ids, out, ncols, nrows, err);                                             \
    }
GET_ROWS(bl_get_rows_f32, RowF32)
GET_ROWS(bl_get_rows_f16, RowF16)

// Quantized rows (any wtype of quant.cuh but F32), a thread per 32-value sub-block; values rounded
// as the CPU reference dequantizes them.
extern "C" __global__ void bl_get_rows_q(const uint8_t* table, long long stride, const int* ids, float* out, int ncols,
                                         int nrows, int* err, int wtype) {
    KERNEL_ENTRY();
    const int id = ids[blockIdx.x];
    float* y = out + (long long)blockIdx.x * ncols;
    if (id < 0 || id >= nrows) {
        report(err, 1);
        return;
    }
    const uint8_t* row = table + (long long)id * stride;
    for (int sb = threadIdx.x; sb < ncols / 32; sb += blockDim.x) {
        Sub s;
        unpack_sub(row, wtype, sb, &s);
#pragma unroll
        for (int i = 0; i < 32; ++i) y[sb * 32 + i] = sub_value(&s, i);
    }
}

// ---- activations to Q8_1 (f16 d, f16 s = d * sum(q), 32 x int8): one warp per block -------------

extern "C" __global__ void bl_quantize_q8_1(const float* x, uint8_t* out, long long nblocks) {
    KERNEL_ENTRY();
    const long long b = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= nblocks) return;
    quantize_lane(x[b * 32 + (threadIdx.x & (WARP - 1))], out + b * 36);
}

// The same with each 32-value block held by 8 lanes as quads (16-byte loads; x 16-byte aligned):
// four blocks per warp, bit for bit those of bl_quantize_q8_1.
extern "C" __global__ void bl_quantize_q8_1_quads(const float* x, uint8_t* out, long long nblocks) {
    KERNEL_ENTRY();
    const long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 8;
    const bool in = b < nblocks;
    const float4 v = in ? ((const float4*)x)[b * 8 + (threadIdx.x & 7)] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    quantize_quad(v, out + (in ? b : 0) * 36, in);
}

// ---- products: y[c*n + j] = W_j . x_c, one warp per (j, c) ----------------------------------------

extern "C" __global__ void bl_matmul_f32(const uint8_t* w, long long w_stride, const float* x, float* y, int k, int n,
                                         int m) {
    KERNEL_ENTRY();
    const long long task = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (task >= (long long)n * m) return;
    const int j = (int)(task % n), c = (int)(task / n);
    const int lane = threadIdx.x & (WARP - 1);
    const float* wr = (const float*)(w + (long long)j * w_stride);
    const float* xc = x + (long long)c * k;
    float s = 0.0f;
#pragma unroll 8
    for (int i = lane; i < k; i += WARP) s += wr[i] * xc[i];
    s = warp_sum(s);
    if (lane == 0) y[(long long)c * n + j] = s;
}

#include "gemm_f32.cuh"

// ---- activations --------------------------------------------------------------------------------

// kind 0: silu(g)*u (limit > 0: silu(min(g, limit)) * clamp(u, ±limit)); kind 1: gelu(g)*u.
// q (may be null, then n % 32 == 0): the output's Q8_1 copy as well, for the quantized product
// that reads it next (a warp holds 32 consecutive values: blocks are whole warps).
extern "C" __global__ void bl_glu_f32(const float* g, const float* u, float* out, uint8_t* q, long long n, int kind,
                                      float limit) {
    KERNEL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float gv = g[i], uv = u[i];
        float y;
        if (kind == 1) {
            y = gelu_table(gv) * uv;
        } else if (limit > 0.0f) {
            const float gc = fminf(gv, limit);
            y = gc * sigmoid_f(gc) * fminf(fmaxf(uv, -limit), limit);
        } else {
            y = gv * sigmoid_f(gv) * uv;
        }
        out[i] = y;
        if (q) quantize_lane(y, q + i / 32 * 36);
    }
}

// f: 0 silu, 1 sigmoid, 2 gelu (table), 3 gelu_erf, 4 softplus, 5 tanh, 6 exp, 7 relu
static __device__ __forceinline__ float unary_one(float v, int f) {
    switch (f) {
        case 0: return silu_f(v);
        case 1: return sigmoid_f(v);
        case 2: return gelu_table(v);
        case 3: return (float)(0.5 * (double)v * (1.0 + erf((double)v * 0.70710678118654752440)));
        case 4: return softplus_f(v);
        case 5: return tanhf(v);
        case 6: return expf(v);
        default: return fmaxf(v, 0.0f);
    }
}

// A unary function and the product of its result with a same-shape tensor in one pass (output
// gates): u = f(x) is written as the Unary would, out = other * u as the Mul would. Each thread
// touches only index i, so u or out may share memory with x or other.
extern "C" __global__ void bl_unary_mul_f32(const float* x, float* u, const float* other, float* out, long long n,
                                            int f) {
    KERNEL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float y = unary_one(x[i], f);
        const float o = other[i];
        u[i] = y;
        out[i] = o * y;
    }
}

extern "C" __global__ void bl_unary_f32(const float* x, float* out, long long n, int f) {
    KERNEL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) {
        out[i] = unary_one(x[i], f);
    }
}

#include "rope.cuh"

// ---- K/V cache store and attention ---------------------------------------------------------------

// Row r goes to cache row (slot * len + pos % len); one block per row.
template <typename T>
static __device__ void cache_store(const float* rows, T* cache, const int* slots, const int* pos, int width, int len,
                                   int n_slots, int* err) {
    const int r = blockIdx.x;
    const int s = slots[r], p = pos[r];
    if (s < 0 || s >= n_slots || p < 0) {
        report(err, 2);
        return;
    }
    T* dst = cache + ((long long)s * len + p % len) * width;
#pragma unroll 4
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = from_f32<T>(rows[(long long)r * width + i]);
}

extern "C" __global__ void bl_cache_store_f32(const float* rows, float* cache, const int* slots, const int* pos,
                                              int width, int len, int n_slots, int* err) {
    KERNEL_ENTRY();
    cache_store(rows, cache, slots, pos, width, len, n_slots, err);
}

extern "C" __global__ void bl_cache_store_f16(const float* rows, __half* cache, const int* slots, const int* pos,
                                              int width, int len, int n_slots, int* err) {
    KERNEL_ENTRY();
    cache_store(rows, cache, slots, pos, width, len, n_slots, err);
}


#include "router.cuh"

// ---- routed experts -------------------------------------------------------------------------------

// Whether the launch gave the block room for `rows` staged rows of nvals values.
static __device__ __forceinline__ bool stage_fits(int rows, long long nvals) {
    return nvals % 64 == 0 && (unsigned long long)rows * (nvals / 64) * STAGE_PAIR <= dynamic_smem_bytes();
}

// The block's dynamic shared memory (16-byte aligned).
static __device__ __forceinline__ uint8_t* dyn_smem() {
    extern __shared__ __align__(16) uint8_t smem[];
    return smem;
}

// For the pair forms: stages the Q8_1 activation rows r0 and r1 (r0 <= r1 <= r0 + 1: those of the
// block's first and last warp task) of x, each nvals values x_row bytes apart, in the block's
// shared memory, synchronises the block, and returns the staged row r (r0 or r1). Every thread
// of the block must call it.
static __device__ const uint8_t* stage_rows(const uint8_t* x, long long x_row, int nvals, long long r0, long long r1,
                                            long long r) {
    uint8_t* sm = dyn_smem();
    const int bytes = nvals / 64 * STAGE_PAIR;
    stage_row(x + r0 * x_row, nvals, sm);
    if (r1 != r0) stage_row(x + r1 * x_row, nvals, sm + bytes);
    __syncthreads();
    return sm + (r == r0 ? 0 : bytes);
}

// One lane's chunks c0, c0 + WARP, ... (B of them, those below nch) of a weight row: a pair-form
// product issues the B chunks' weight loads before using any of them.
template <int WT, int B> struct PairBatch {
    PairW<WT> w[B];

    __device__ __forceinline__ void load(const uint8_t* wrow, int c0, int nch) {
#pragma unroll
        for (int i = 0; i < B; ++i)
            if (c0 + i * WARP < nch) w[i] = load_pair<WT>(wrow, c0 + i * WARP);
    }

    // Adds their part of W_row . x to s in chunk order, x a staged row.
    __device__ __forceinline__ void dot(const uint8_t* xs, int c0, int nch, float& s) const {
#pragma unroll
        for (int i = 0; i < B; ++i)
            if (c0 + i * WARP < nch) s += dot_pair<WT>(w[i], load_x_pair(xs, c0 + i * WARP));
    }
};

// The lane's part of W_row . x over all nch chunks of the row, its first batch (from chunk
// `lane`) already loaded in `first`; later batches are loaded and used in turn.
template <int WT, int B>
static __device__ __forceinline__ float lane_row_dot(const PairBatch<WT, B>& first, const uint8_t* wrow,
                                                     const uint8_t* xs, int nch) {
    const int lane = threadIdx.x & (WARP - 1);
    float s = 0.0f;
    first.dot(xs, lane, nch, s);
    for (int c0 = lane + WARP * B; c0 < nch; c0 += WARP * B) {
        PairBatch<WT, B> b;
        b.load(wrow, c0, nch);
        b.dot(xs, c0, nch, s);
    }
    return s;
}

// Quantized products, any wtype of warp_row_dot: y[c*n + j] = W_j . x_c, one warp per (j, c).
// Calls KERNEL_ENTRY itself: the pair form (whose block's columns, at most two as n >= warps per
// block, are staged) issues its first weight loads before waiting on the previous kernel, since
// no kernel writes weights.
template <int WT>
static __device__ void matmul_q(const uint8_t* w, long long w_stride, const uint8_t* xq, long long x_row, float* y,
                                int k, int n, int m) {
    const int wpb = blockDim.x / WARP;
    const long long first = (long long)blockIdx.x * wpb, total = (long long)n * m;
    const long long task = first + threadIdx.x / WARP;
    const int j = (int)(task % n);
    const long long c = task / n;
    const uint8_t* wrow = w + (long long)j * w_stride;
    float v;
    if constexpr (HasPair<WT>::value) {
        if (pairs_ok<WT>(w, w_stride, 0, k) && n >= wpb && stage_fits(2, k)) {
            PairBatch<WT, 2> b;
            if (task < total) b.load(wrow, threadIdx.x & (WARP - 1), k / 64);
            KERNEL_ENTRY();
            const uint8_t* xs = stage_rows(xq, x_row, k, first / n, (min(first + wpb, total) - 1) / n, c);
            if (task >= total) return;
            v = warp_sum(lane_row_dot(b, wrow, xs, k / 64));
            if ((threadIdx.x & (WARP - 1)) == 0) y[c * n + j] = v;
            return;
        }
    }
    KERNEL_ENTRY();
    if (task >= total) return;
    v = warp_row_dot(wrow, WT, xq + c * x_row, k);
    if ((threadIdx.x & (WARP - 1)) == 0) y[c * n + j] = v;
}

// The single-row products have one entry point per weight type (name_<code>), so that each gets
// the registers its own type needs rather than the most that any type needs (as a switch over the
// types inside one kernel would): more warps per SM for the common types.
#define PER_WTYPE(DEF) DEF(0) DEF(1) DEF(2) DEF(3) DEF(4) DEF(5) DEF(6) DEF(7) DEF(8) DEF(9) DEF(10) DEF(11) DEF(12)

#define MATMUL_Q_ENTRY(T)                                                                                          \
    extern "C" __global__ void bl_matmul_q_##T(const uint8_t* w, long long w_stride, const uint8_t* xq,           \
                                               long long x_row, float* y, int k, int n, int m) {                  \
        matmul_q<T>(w, w_stride, xq, x_row, y, k, n, m);                                                           \
    }
PER_WTYPE(MATMUL_Q_ENTRY)

// Up to three single-column products of one Q8_1 activation row, as one launch (Q, K and V of a
// layer; ops/fused.rs): y_i[j] = W_i,j . x, one warp per row of the concatenated W_0 | W_1 | W_2
// (MatmulPart, quant.cuh).

// x is staged for every part when it fits, and a part whose rows suit the pair form reads it
// there, its first weight loads issued before waiting on the previous kernel (KERNEL_ENTRY is
// called here, as in matmul_q).
template <int WT>
static __device__ void matmul_q_parts(MatmulPart a, MatmulPart b, MatmulPart c, const uint8_t* xq, int k) {
    long long j = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    MatmulPart p = a;
    bool live = true;
    if (j >= a.n) {
        j -= a.n;
        p = b;
        if (j >= b.n) {
            j -= b.n;
            p = c;
            live = j < c.n;
        }
    }
    const uint8_t* wrow = p.w + j * p.stride;
    bool entered = false;
    if constexpr (HasPair<WT>::value) {
        if (stage_fits(1, k)) {
            const bool pairs = live && pairs_ok<WT>(p.w, p.stride, 0, k);
            PairBatch<WT, 1> batch;
            if (pairs) batch.load(wrow, threadIdx.x & (WARP - 1), k / 64);
            KERNEL_ENTRY();
            entered = true;
            const uint8_t* xs = stage_rows(xq, 0, k, 0, 0, 0);
            if (!live) return;
            const float v = warp_sum(pairs ? lane_row_dot(batch, wrow, xs, k / 64) : 0.0f);
            if (pairs) {
                if ((threadIdx.x & (WARP - 1)) == 0) p.y[j] = v;
                return;
            }
        }
    }
    if (!entered) KERNEL_ENTRY();
    if (!live) return;
    const float v = warp_row_dot(wrow, WT, xq, k);
    if ((threadIdx.x & (WARP - 1)) == 0) p.y[j] = v;
}

#define MATMUL_Q_PARTS_ENTRY(T)                                                                                   \
    extern "C" __global__ void bl_matmul_q_parts_##T(MatmulPart a, MatmulPart b, MatmulPart c, const uint8_t* xq, \
                                                     int k) {                                                     \
        matmul_q_parts<T>(a, b, c, xq, k);                                                                         \
    }
PER_WTYPE(MATMUL_Q_PARTS_ENTRY)

// Columns per pass of matmul_q_cols.
#define MQ_COLS 8

// Sums each of v[0 .. MQ_COLS) over the warp in 9 shuffles rather than 8 x 5: three halving
// steps leave every lane with the partial sums of one column, column (lane >> 2) & 7, over 8
// lanes, and two plain steps finish it. Returns that column's sum.
static __device__ __forceinline__ float warp_sum_cols(const float (&v)[MQ_COLS]) {
    const int lane = threadIdx.x & (WARP - 1);
    float a[4], b[2];
    const bool h16 = lane & 16, h8 = lane & 8, h4 = lane & 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float keep = h16 ? v[i + 4] : v[i], give = h16 ? v[i] : v[i + 4];
        a[i] = keep + __shfl_xor_sync(0xffffffffu, give, 16);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float keep = h8 ? a[i + 2] : a[i], give = h8 ? a[i] : a[i + 2];
        b[i] = keep + __shfl_xor_sync(0xffffffffu, give, 8);
    }
    float s = (h4 ? b[1] : b[0]) + __shfl_xor_sync(0xffffffffu, h4 ? b[0] : b[1], 4);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    return s;
}

// Quantized products for a few columns (2 .. 15: decode passes of several streams) of the types
// without a pair form (matmul_q_few below takes Q8_0 and Q4_K): y[c*n + j] = W_j . x_c, one warp
// per weight row j. Each lane unpacks its sub-blocks of W_j once per group of
// MQ_COLS columns and takes every column of the group from it, so W is read once for up to 8
// columns rather than once per column; each (sub-block, column) product is that of matmul_q.
// F32 rows (instantiated by WITH_WTYPE, not launched) go column by column through block_dot.
template <int WT>
static __device__ void matmul_q_cols(const uint8_t* w, long long w_stride, const uint8_t* xq, long long x_row,
                                     float* y, int k, int n, int m) {
    const long long j = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (j >= n) return;
    const int lane = threadIdx.x & (WARP - 1);
    const uint8_t* wrow = w + j * w_stride;
    for (int c0 = 0; c0 < m; c0 += MQ_COLS) {
        const int nc = min(MQ_COLS, m - c0);
        const uint8_t* x0 = xq + (long long)c0 * x_row;
        float s[MQ_COLS];
#pragma unroll
        for (int c = 0; c < MQ_COLS; ++c) s[c] = 0.0f;
#pragma unroll 2
        for (int sb = lane; sb < k / 32; sb += WARP) {
            if (WT == WT_F32) {
#pragma unroll
                for (int c = 0; c < MQ_COLS; ++c)
                    if (c < nc) s[c] += block_dot(wrow, WT, x0 + c * x_row, sb);
            } else {
                Sub sub;
                unpack_sub(wrow, WT, sb, &sub);
#pragma unroll
                for (int c = 0; c < MQ_COLS; ++c)
                    if (c < nc) s[c] += unpacked_dot_q8_1(sub, WT, x0 + c * x_row + sb * 36);
            }
        }
        const float v = warp_sum_cols(s);
        const int c = lane >> 2;
        if ((lane & 3) == 0 && c < nc) y[(long long)(c0 + c) * n + j] = v;
    }
}

extern "C" __global__ void bl_matmul_q_cols(const uint8_t* w, long long w_stride, const uint8_t* xq, long long x_row,
                                            float* y, int k, int n, int m, int wtype) {
    KERNEL_ENTRY();
    WITH_WTYPE(wtype, (matmul_q_cols<WT>(w, w_stride, xq, x_row, y, k, n, m)))
}


// Quantized products for a few columns of a type with a pair form (Q8_0, Q4_K; rows as
// `pairs_ok` asks): y[c*n + j] = W_j . x_c for the columns c0 .. c0 + M - 1 (c0 = M * blockIdx.y,
// those below m). Each warp takes R consecutive weight rows and each lane the chunks lane, lane +
// 32, ... of them, so every weight byte is read once per M columns, the lane's first chunks
// loaded before waiting on the previous kernel; each lane reads its chunks of the activations
// from global memory (the rows are a few KiB, in L1/L2), which measured faster than staging them
// in shared memory (kernels/cuda/bench/cols_bench.cu).
// `warp` is the warp's index among those of this product (rows warp * R ..).
template <int WT, int M, int R>
static __device__ void matmul_q_few(const uint8_t* w, long long w_stride, const uint8_t* xq, long long x_row,
                                    float* y, int k, int n, int m, long long warp) {
    const int lane = threadIdx.x & (WARP - 1);
    const int nch = k / 64;
    const long long j0 = warp * R;
    PairW<WT> wb[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (j0 + r < n && lane < nch) wb[r] = load_pair<WT>(w + (j0 + r) * w_stride, lane);
    KERNEL_ENTRY();
    if (j0 >= n) return;
    const int c0 = blockIdx.y * M, nc = min(M, m - c0);
    const uint8_t* x0 = xq + (long long)c0 * x_row;
    float s[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < M; ++c) s[r][c] = 0.0f;
    for (int p = lane; p < nch; p += WARP) {
        if (p != lane) {
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (j0 + r < n) wb[r] = load_pair<WT>(w + (j0 + r) * w_stride, p);
        }
#pragma unroll
        for (int c = 0; c < M; ++c) {
            if (c >= nc) break;
            const XPair xp = load_x_pair_global(x0 + c * x_row, p);
#pragma unroll
            for (int r = 0; r < R; ++r) s[r][c] += dot_pair<WT>(wb[r], xp);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < M; ++c) {
            const float v = warp_sum(s[r][c]);
            if (lane == 0 && c < nc && j0 + r < n) y[(long long)(c0 + c) * n + j0 + r] = v;
        }
}

// Up to three few-column products of the same activations (Q, K and V of a layer; ops/fused.rs)
// as one launch: the warps of part a, then b's, then c's (a part with no rows takes none).
template <int WT, int M, int R>
static __device__ void matmul_q_few_parts(MatmulPart a, MatmulPart b, MatmulPart c, const uint8_t* xq,
                                          long long x_row, int k, int m) {
    long long g = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const long long wa = (a.n + R - 1) / R, wb = (b.n + R - 1) / R;
    MatmulPart p = a;
    if (g >= wa) {
        g -= wa;
        p = b;
        if (g >= wb) {
            g -= wb;
            p = c;
        }
    }
    matmul_q_few<WT, M, R>(p.w, p.stride, xq, x_row, p.y, k, p.n, m, g);
}

// One entry point per (type, columns per pass M, rows per warp R) that the host picks
// (src/ops.rs `few_cols`): Q8_0 with R 1, 2, 4 and Q4_K with R 1, 2 (the forms that measured
// fastest for some shape), each with M 2, 4, 8; the same for the parts form.
#define MATMUL_Q_FEW_ENTRY(T, M, R)                                                                               \
    extern "C" __global__ void bl_matmul_q_few_##T##_##M##_##R(const uint8_t* w, long long w_stride,            \
                                                               const uint8_t* xq, long long x_row, float* y,    \
                                                               int k, int n, int m) {                           \
        matmul_q_few<T, M, R>(w, w_stride, xq, x_row, y, k, n, m,                                                 \
                              (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP);                 \
    }                                                                                                             \
    extern "C" __global__ void bl_matmul_q_few_parts_##T##_##M##_##R(MatmulPart a, MatmulPart b, MatmulPart c,  \
                                                                     const uint8_t* xq, long long x_row, int k, \
                                                                     int m) {                                   \
        matmul_q_few_parts<T, M, R>(a, b, c, xq, x_row, k, m);                                                   \
    }
#define MATMUL_Q_FEW_M(T, R) MATMUL_Q_FEW_ENTRY(T, 2, R) MATMUL_Q_FEW_ENTRY(T, 4, R) MATMUL_Q_FEW_ENTRY(T, 8, R)
MATMUL_Q_FEW_M(1, 1)
MATMUL_Q_FEW_M(1, 2)
MATMUL_Q_FEW_M(1, 4)
MATMUL_Q_FEW_M(2, 1)
MATMUL_Q_FEW_M(2, 2)

#include "moe.cuh"

#include "mma.cuh"
#include "mmq.cuh"

#include "moe_batch.cuh"

#include "attention.cuh"
#include "recurrent.cuh"
