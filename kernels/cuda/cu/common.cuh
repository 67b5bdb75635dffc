// Helpers every kernel source shares: warp and block reductions, the sigmoid, the error report.
// Included by kernels.cu after WARP (and by kernels/cuda/sim's tests after sim.h).

#pragma once

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

// Reports a bad input (an id outside a table) to the host: the first error code wins.
static __device__ __forceinline__ void report(int* err, int code) {
    if (err) atomicCAS(err, 0, code);
}

// The sum of every thread's `s` over the block, returned to all threads.
static __device__ double block_sum_f64(double s) {
    __shared__ double part[1024 / WARP];
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
    return part[0];
}

static __device__ __forceinline__ float sigmoid_f(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
}
