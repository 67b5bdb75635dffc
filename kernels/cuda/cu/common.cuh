// Helpers every kernel source shares: warp and block reductions, the sigmoid, SiLU and softplus,
// the error report, the per-warp Q8_1 quantizers of activations.
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

// f32 to and from the stored element types (f32, f16).
template <typename T> static __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
static __device__ __forceinline__ float to_f32(float v) { return v; }
static __device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

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

// Asks for the 128-byte line at p in L2 (a hint: no value, no fault). Kernels issue it for
// weights before waiting on the previous kernel (KERNEL_ENTRY), which never writes them.
static __device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

static __device__ __forceinline__ float sigmoid_f(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
}

static __device__ __forceinline__ float silu_f(float x) { return x * sigmoid_f(x); }

static __device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Four table entries as one little-endian word.
static __device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
    return (uint32_t)(uint8_t)a | ((uint32_t)(uint8_t)b << 8) | ((uint32_t)(uint8_t)c << 16) |
           ((uint32_t)(uint8_t)d << 24);
}

// ---- activations to Q8_1 (f16 d, f16 s = d * sum(q), 32 x int8) ----------------------------------

// Lane `lane` of a warp holding one 32-value block (value v each) writes its Q8_1 byte to
// qs[lane]; lane 0 writes d and s to ds (4-byte aligned). Every lane of the warp must call it.
static __device__ __forceinline__ void quantize_lane(float v, uint8_t* qs, uint8_t* ds) {
    const int lane = threadIdx.x & (WARP - 1);
    const float amax = warp_max(fabsf(v));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = __float2int_rn(v * id);
    const float sum = warp_sum((float)q);
    qs[lane] = (uint8_t)(int8_t)q;
    if (lane == 0) {
        // d and s as one aligned 32-bit store.
        const float d = amax / 127.0f;
        *(__half2*)ds = __halves2half2(__float2half_rn(d), __float2half_rn(sum * d));
    }
}

// quantize_lane into a 36-byte Q8_1 block (blocks are 36 bytes, the buffer 256-aligned).
static __device__ __forceinline__ void quantize_lane(float v, uint8_t* blk) { quantize_lane(v, blk + 4, blk); }

// The Q8_1 block of 32 values that 8 consecutive lanes hold as one quad each (lane & 7 = the
// quad's place in the block): each lane writes its 4 bytes, the first also d and s. Every lane
// of the warp must call it; groups of 8 with `store` false (past the row) write nothing.
static __device__ __forceinline__ void quantize_quad(float4 y, uint8_t* blk, bool store) {
    const int sub = threadIdx.x & 7;
    float amax = fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q0 = __float2int_rn(y.x * id), q1 = __float2int_rn(y.y * id), q2 = __float2int_rn(y.z * id),
              q3 = __float2int_rn(y.w * id);
    float sum = (float)(q0 + q1 + q2 + q3);
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (!store) return;
    *(uint32_t*)(blk + 4 + 4 * sub) = pack4(q0, q1, q2, q3);
    if (sub == 0) {
        const float d = amax / 127.0f;
        *(__half2*)blk = __halves2half2(__float2half_rn(d), __float2half_rn(sum * d));
    }
}

// GELU (tanh form) as ggml's CPU table computes it: on the f16 rounding of x, result rounded to
// f16; 0 at or below -10, x at or above 10.
static __device__ __forceinline__ float gelu_table(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float h = __half2float(__float2half_rn(x));
    const float y = 0.5f * h * (1.0f + tanhf(0.7978846f * h * (1.0f + 0.044715f * h * h)));
    return __half2float(__float2half_rn(y));
}
