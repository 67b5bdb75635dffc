// Activations quantized to Q8_1 for the quantized products (ops/activations.rs, which records
// which activations the scratch holds a copy of). Included by kernels.cu after common.cuh.

#pragma once

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
