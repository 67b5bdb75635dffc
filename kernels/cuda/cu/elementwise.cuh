// Elementwise kernels (ops/elementwise.rs): Add and Mul with broadcasts, Scale, the GLUs and the
// unary functions, and the Unary + Mul of an output gate in one pass (ops/fused/unary_mul.rs).
// Included by kernels.cu after common.cuh and quant.cuh.

#pragma once

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
