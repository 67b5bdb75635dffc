// Row norms (ops/norm.rs): RMSNorm and L2 norm, and the fused forms that end in one: a residual
// Add or two Adds and the RMSNorm of the sum (ops/fused/add_norm.rs), a strided Copy and the L2
// norm of its rows (ops/fused/copy_l2_norm.rs). Included by kernels.cu after common.cuh.

#pragma once

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
