// The K/V cache store (ops/cache_store.rs): rows written at their (slot, position) of a cache.
// Included by kernels.cu after common.cuh.

#pragma once

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
