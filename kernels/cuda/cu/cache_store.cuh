// The K/V cache store (ops/cache_store.rs): rows written at their (slot, position) of a cache.
// Included by kernels.cu after common.cuh.

#pragma once

#include "kv_quant.cuh"

// ---- K/V cache store ---------------------------------------------------------------------------

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

// Quantized caches (kv_quant.cuh's types t): row r's blocks quantized into cache row (slot * len
// + pos % len), one block per row, a thread per 32-value block (width a multiple of 32).
extern "C" __global__ void bl_cache_store_quant(const float* rows, uint8_t* cache, const int* slots, const int* pos,
                                                int width, int len, int n_slots, int t, int* err) {
    KERNEL_ENTRY();
    const int r = blockIdx.x;
    const int s = slots[r], p = pos[r];
    if (s < 0 || s >= n_slots || p < 0) {
        if (threadIdx.x == 0) report(err, 2);
        return;
    }
    const int nb = width / 32, bb = kv_block_bytes(t);
    uint8_t* dst = cache + ((long long)s * len + p % len) * nb * bb;
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        kv_quantize_block(t, rows + (long long)r * width + 32 * b, dst + (long long)b * bb);
}

// ---- Walsh-Hadamard rotation ---------------------------------------------------------------------

// y = x rotated in chunks of n values (a power of two) by the orthonormal Walsh-Hadamard transform,
// as llama.cpp rotates the rows of a quantized K/V cache, the queries that read it and the output
// of its values: each value times 1/sqrt(n), then butterflies (u + v, u - v) of widths 1, 2, 4 ...
// n/2, in f32 (the CPU reference's order: kernels/cpu ops/hadamard.rs), so the bits equal the
// CPU's. One block per chunk; x may be y.
extern "C" __global__ void bl_fwht_f32(const float* x, float* y, int n) {
    KERNEL_ENTRY();
    const long long base = (long long)blockIdx.x * n;
    const float scale = 1.0f / sqrtf((float)n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[base + i] = x[base + i] * scale;
    __syncthreads();
    for (int len = 1; len < n; len *= 2) {
        for (int k = threadIdx.x; k < n / 2; k += blockDim.x) {
            const long long i = base + (long long)(k / len) * 2 * len + k % len;
            const float u = y[i], v = y[i + len];
            y[i] = u + v;
            y[i + len] = u - v;
        }
        __syncthreads();
    }
}
