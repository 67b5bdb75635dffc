// Matrix products of single rows and few columns (ops/matmul.rs): F32 weights a warp per output
// (with gemm_f32.cuh for batches), and quantized weights of any type of quant.cuh on Q8_1
// activations: one warp per (row, column), the pair form's staged activations, up to three
// products of the same activations in one launch (ops/fused/matmul_parts.rs), and the few-column
// forms of decode with several streams. Batches of 16 rows or more take the tiled products of
// mmq.cuh. Included by kernels.cu after common.cuh and quant.cuh, with PER_WTYPE defined.

#pragma once

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

#define MATMUL_Q_ENTRY(T)                                                                                          \
    extern "C" __global__ void bl_matmul_q_##T(const uint8_t* w, long long w_stride, const uint8_t* xq,           \
                                               long long x_row, float* y, int k, int n, int m) {                  \
        matmul_q<T>(w, w_stride, xq, x_row, y, k, n, m);                                                           \
    }
PER_WTYPE(MATMUL_Q_ENTRY)

// Up to three single-column products of one Q8_1 activation row, as one launch (Q, K and V of a
// layer; ops/fused/matmul_parts.rs): y_i[j] = W_i,j . x, one warp per row of the concatenated
// W_0 | W_1 | W_2 (MatmulPart, quant.cuh).

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

// Up to three few-column products of the same activations (Q, K and V of a layer;
// ops/fused/matmul_parts.rs) as one launch: the warps of part a, then b's, then c's (a part with
// no rows takes none).
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
// (src/ops/matmul.rs `few_cols`): Q8_0 with R 1, 2, 4 and Q4_K with R 1, 2 (the forms that measured
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

#include "matmul_heads.cuh"
