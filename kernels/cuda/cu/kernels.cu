// bloomery CUDA kernels: one translation unit compiled to PTX per bundle (compute_86, compute_90,
// compute_121) by kernels/cuda/build.rs. Every entry point is `extern "C"` with a `bl_` prefix;
// the host side (src/ops.rs) launches them. Tensors are contiguous rows; sizes are checked by the
// host before launch. Numerics follow the CPU reference (kernels/cpu): quantized products take
// activations quantized with the same rounding (ties to even through 127 / max|x|).

#include <stdint.h>
#include <cuda_fp16.h>

#define WARP 32

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float half_at(const uint8_t* p) {
    __half h;
    memcpy(&h, p, 2);
    return __half2float(h);
}

// Reports a bad input (an id outside a table) to the host: the first error code wins.
static __device__ __forceinline__ void report(int* err, int code) {
    if (err) atomicCAS(err, 0, code);
}

// ---- elementwise -------------------------------------------------------------------------------

// out[i] = a[i] + b[i % nb]  (b broadcast over rows when shorter)
extern "C" __global__ void bl_add_f32(const float* a, const float* b, float* out, long long n, long long nb) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) out[i] = a[i] + b[i % nb];
}

extern "C" __global__ void bl_mul_f32(const float* a, const float* b, float* out, long long n, long long nb) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) out[i] = a[i] * b[i % nb];
}

extern "C" __global__ void bl_scale_f32(const float* x, float* out, float s, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) out[i] = x[i] * s;
}

// ---- RMSNorm: one block of 256 threads per row -------------------------------------------------

extern "C" __global__ void bl_rms_norm_f32(const float* x, const float* w, float* out, int ncols, float eps) {
    const float* xr = x + (long long)blockIdx.x * ncols;
    float* yr = out + (long long)blockIdx.x * ncols;
    __shared__ double part[256 / WARP];
    double s = 0.0;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float v = xr[i];
        s += (double)(v * v);
    }
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & (WARP - 1)) == 0) part[threadIdx.x / WARP] = s;
    __syncthreads();
    if (threadIdx.x < WARP) {
        double t = threadIdx.x < blockDim.x / WARP ? part[threadIdx.x] : 0.0;
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    const float mean = (float)(part[0] / ncols);
    const float inv = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float v = xr[i] * inv;
        yr[i] = w ? v * w[i] : v;
    }
}

// ---- GetRows: one block per id ------------------------------------------------------------------

extern "C" __global__ void bl_get_rows_f32(const uint8_t* table, long long stride, const int* ids, float* out,
                                           int ncols, int nrows, int* err) {
    const int id = ids[blockIdx.x];
    float* y = out + (long long)blockIdx.x * ncols;
    if (id < 0 || id >= nrows) {
        report(err, 1);
        return;
    }
    const float* row = (const float*)(table + (long long)id * stride);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) y[i] = row[i];
}

extern "C" __global__ void bl_get_rows_f16(const uint8_t* table, long long stride, const int* ids, float* out,
                                           int ncols, int nrows, int* err) {
    const int id = ids[blockIdx.x];
    float* y = out + (long long)blockIdx.x * ncols;
    if (id < 0 || id >= nrows) {
        report(err, 1);
        return;
    }
    const __half* row = (const __half*)(table + (long long)id * stride);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) y[i] = __half2float(row[i]);
}

// Q8_0 block: f16 d, 32 x int8.
extern "C" __global__ void bl_get_rows_q8_0(const uint8_t* table, long long stride, const int* ids, float* out,
                                            int ncols, int nrows, int* err) {
    const int id = ids[blockIdx.x];
    float* y = out + (long long)blockIdx.x * ncols;
    if (id < 0 || id >= nrows) {
        report(err, 1);
        return;
    }
    const uint8_t* row = table + (long long)id * stride;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const uint8_t* b = row + (i / 32) * 34;
        y[i] = half_at(b) * (float)(int8_t)b[2 + (i % 32)];
    }
}

// ---- activations to Q8_1 (f16 d, f16 s = d * sum(q), 32 x int8): one warp per block -------------

extern "C" __global__ void bl_quantize_q8_1(const float* x, uint8_t* out, long long nblocks) {
    const long long b = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= nblocks) return;
    const int lane = threadIdx.x & (WARP - 1);
    const float v = x[b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = __float2int_rn(v * id);
    const float sum = warp_sum((float)q);
    uint8_t* blk = out + b * 36;
    blk[4 + lane] = (uint8_t)(int8_t)q;
    if (lane == 0) {
        // d and s as one aligned 32-bit store (blocks are 36 bytes, the buffer 256-aligned).
        const float d = amax / 127.0f;
        *(__half2*)blk = __halves2half2(__float2half_rn(d), __float2half_rn(sum * d));
    }
}

// ---- products: y[c*n + j] = W_j . x_c, one warp per (j, c) ----------------------------------------

extern "C" __global__ void bl_matmul_f32(const uint8_t* w, long long w_stride, const float* x, float* y, int k, int n,
                                         int m) {
    const long long task = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (task >= (long long)n * m) return;
    const int j = (int)(task % n), c = (int)(task / n);
    const int lane = threadIdx.x & (WARP - 1);
    const float* wr = (const float*)(w + (long long)j * w_stride);
    const float* xc = x + (long long)c * k;
    float s = 0.0f;
    for (int i = lane; i < k; i += WARP) s += wr[i] * xc[i];
    s = warp_sum(s);
    if (lane == 0) y[(long long)c * n + j] = s;
}

static __device__ __forceinline__ int load_i32(const uint8_t* p) {
    // 2-byte aligned in Q8_0 blocks: assemble from two halves.
    const uint16_t lo = *(const uint16_t*)p, hi = *(const uint16_t*)(p + 2);
    return (int)((uint32_t)lo | ((uint32_t)hi << 16));
}

// Q8_0 weights (34-byte blocks) . Q8_1 activations (36-byte blocks).
extern "C" __global__ void bl_matmul_q8_0_q8_1(const uint8_t* w, long long w_stride, const uint8_t* xq, float* y, int k,
                                               int n, int m) {
    const long long task = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (task >= (long long)n * m) return;
    const int j = (int)(task % n), c = (int)(task / n);
    const int lane = threadIdx.x & (WARP - 1);
    const int nb = k / 32;
    const uint8_t* wr = w + (long long)j * w_stride;
    const uint8_t* xr = xq + (long long)c * nb * 36;
    float s = 0.0f;
    for (int b = lane; b < nb; b += WARP) {
        const uint8_t* wb = wr + b * 34;
        const uint8_t* xb = xr + b * 36;
        int sumi = 0;
#pragma unroll
        for (int t = 0; t < 8; ++t) sumi = __dp4a(load_i32(wb + 2 + 4 * t), *(const int*)(xb + 4 + 4 * t), sumi);
        s += half_at(wb) * __low2float(*(const __half2*)xb) * (float)sumi;
    }
    s = warp_sum(s);
    if (lane == 0) y[(long long)c * n + j] = s;
}
