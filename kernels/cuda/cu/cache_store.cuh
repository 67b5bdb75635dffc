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
