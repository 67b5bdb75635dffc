// MatMul over a stack of per-head matrices (ops/matmul_heads.rs; included by matmul.cuh, and by
// kernels/cuda/sim's matmul_heads_test.cpp): w [k, n, H] times x [k, H, m] gives y [n, H, m],
// y[(h + H*c)*n + j] = W_h,j . x_(h + H*c), one warp per (j, h, c) over the grid (striding past
// its end). Column col = h + H*c of the activations is x_row bytes from the previous: f32 values
// for F32 weights, Q8_1 blocks for quantized ones (warp_row_dot, quant.cuh). Needs WARP,
// KERNEL_ENTRY, common.cuh and quant.cuh.

#pragma once

extern "C" __global__ void bl_matmul_heads(const uint8_t* w, long long w_stride, long long w_head, const uint8_t* x,
                                           long long x_row, float* y, int k, int n, int heads, int m, int wtype) {
    KERNEL_ENTRY();
    const long long warps = (long long)gridDim.x * (blockDim.x / WARP), total = (long long)n * heads * m;
    for (long long task = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP; task < total;
         task += warps) {
        const int j = (int)(task % n);
        const long long col = task / n;
        const int h = (int)(col % heads);
        const uint8_t* wrow = w + h * w_head + j * w_stride;
        const float v = warp_row_dot(wrow, wtype, x + col * x_row, k);
        if ((threadIdx.x & (WARP - 1)) == 0) y[col * n + j] = v;
    }
}
