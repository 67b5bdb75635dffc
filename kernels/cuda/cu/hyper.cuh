// Hyper-connections (ops/hyper.rs): Sinkhorn normalisation of each token's stream mixing matrix
// (GLM-5.3's mHC), the weighted sum of a token's residual streams (per stream, or per element for
// Qwen3.8-Flash-Next's gated mean), the streams' update from a block's output (by a mixing matrix,
// or the identity), and the sigmoid gate of a group's dot product (Qwen3.8-Flash-Next's n-gram
// table layer); layouts and steps as plugin-api's Op::Sinkhorn, Op::StreamMix, Op::StreamUpdate
// and Op::GroupDotGate. f32 in the CPU reference's order (kernels/cpu/src/ops/hyper.rs): sums of a
// matrix's rows and columns in f64 rounded to f32, products kept apart from the adds they feed
// (__fmul_rn: no contraction into fma), so the card rounds as the CPU does but for expf.
// Included by kernels.cu after common.cuh (and by kernels/cuda/sim/hyper_test.cpp after sim.h).

#pragma once

// The most streams a Sinkhorn block takes: a thread per matrix element.
#define HC_MAX_STREAMS 32

// The sum of m[first + stride*k] for k < n, in f64 in order of k, rounded to f32.
static __device__ float hc_sum(const float* m, int first, int stride, int n) {
    double s = 0.0;
    for (int k = 0; k < n; ++k) s += (double)m[first + stride * k];
    return (float)s;
}

// Sinkhorn of one [n, n] matrix per block (matrix r at x + r*n*n, element (i, j) at i + n*j, i the
// destination stream, j the source), a thread per element (blockDim a multiple of WARP covering
// n*n, n <= HC_MAX_STREAMS): softmax over i for each j (a column of -inf becomes zeros), + eps,
// x / (sum over j + eps) for each i, then iters - 1 times x / (sum over i + eps) and
// x / (sum over j + eps). iters >= 1 (the host checks).
extern "C" __global__ void bl_sinkhorn_f32(const float* x, float* out, int n, int iters, float eps) {
    KERNEL_ENTRY();
    __shared__ float m[HC_MAX_STREAMS * HC_MAX_STREAMS];
    const int nn = n * n, t = threadIdx.x, i = t % n, j = t / n;
    const bool mine = t < nn;
    const long long base = (long long)blockIdx.x * nn;
    if (mine) m[t] = x[base + t];
    __syncthreads();
    float v = 0.0f;
    if (mine) {
        float mx = -INFINITY;
        for (int k = 0; k < n; ++k) mx = fmaxf(mx, m[k + n * j]);
        if (mx != -INFINITY) {
            double s = 0.0;
            for (int k = 0; k < n; ++k) s += (double)expf(m[k + n * j] - mx);
            v = expf(m[t] - mx) * (float)(1.0 / s);
        }
        v += eps;
    }
    // Each step: every thread has read m before any writes its new value, and the writes are
    // seen before the next step's reads.
    __syncthreads();
    if (mine) m[t] = v;
    __syncthreads();
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {
            if (mine) v = m[t] / (hc_sum(m, n * j, 1, n) + eps);
            __syncthreads();
            if (mine) m[t] = v;
            __syncthreads();
        }
        if (mine) v = m[t] / (hc_sum(m, i, n, n) + eps);
        __syncthreads();
        if (mine) m[t] = v;
        __syncthreads();
    }
    if (mine) out[base + t] = v;
}

// out[c, r] = sum_j w[j, r] * x[c, j, r] for x [n, s, rows], w [s, rows], out [n, rows]: a thread
// per output element (grid-stride), the products added in order of j.
extern "C" __global__ void bl_stream_mix_f32(const float* x, const float* w, float* out, int n, int s,
                                             long long rows) {
    KERNEL_ENTRY();
    const long long total = rows * n;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / n, c = e % n;
        const float* xr = x + r * s * n + c;
        const float* wr = w + r * s;
        float o = 0.0f;
        for (int k = 0; k < s; ++k) o += __fmul_rn(xr[(long long)k * n], wr[k]);
        out[e] = o;
    }
}

// out[c, i, r] = post[i, r] * y[c, r] + sum_j comb[i, j, r] * x[c, j, r] for x and out [n, s, rows],
// comb [s, s, rows] (element (i, j) at i + s*j), post [s, rows], y [n, rows]: a thread per output
// element (grid-stride), the products added in order of j after the block output's.
extern "C" __global__ void bl_stream_update_f32(const float* x, const float* comb, const float* post,
                                                const float* y, float* out, int n, int s, long long rows) {
    KERNEL_ENTRY();
    const long long total = rows * s * n;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long c = e % n, i = e / n % s, r = e / ((long long)n * s);
        const float* xr = x + r * s * n + c;
        const float* cr = comb + r * s * s + i;
        float o = __fmul_rn(y[r * n + c], post[r * s + i]);
        for (int k = 0; k < s; ++k) o += __fmul_rn(xr[(long long)k * n], cr[(long long)s * k]);
        out[e] = o;
    }
}

// Op::StreamMix with per-element weights: out[c, r] = sum_j w[c, j, r] * x[c, j, r] for x and w
// [n, s, rows] and out [n, rows]: a thread per output element (grid-stride), the products added
// in order of j.
extern "C" __global__ void bl_stream_mix_el_f32(const float* x, const float* w, float* out, int n, int s,
                                                long long rows) {
    KERNEL_ENTRY();
    const long long total = rows * n;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / n, c = e % n, base = r * s * n + c;
        float o = 0.0f;
        for (int k = 0; k < s; ++k) o += __fmul_rn(x[base + (long long)k * n], w[base + (long long)k * n]);
        out[e] = o;
    }
}

// Op::StreamUpdate with the identity comb: out[c, i, r] = post[i, r] * y[c, r] + x[c, i, r] for x
// and out [n, s, rows], post [s, rows], y [n, rows]: a thread per output element (grid-stride).
extern "C" __global__ void bl_stream_update_id_f32(const float* x, const float* post, const float* y, float* out,
                                                   int n, int s, long long rows) {
    KERNEL_ENTRY();
    const long long total = rows * s * n;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long c = e % n, i = e / n % s, r = e / ((long long)n * s);
        out[e] = __fmul_rn(y[r * n + c], post[r * s + i]) + x[e];
    }
}

// Op::GroupDotGate: for a and b [n, groups] and out [groups], d = scale * (the f32 products
// a[i] * b[i] summed in f64, rounded to f32) and out = sigmoid(sign(d) * sqrt(max(|d|, floor))),
// sign(0) = 0: a block per group (grid-stride over groups).
extern "C" __global__ void bl_group_dot_gate_f32(const float* a, const float* b, float* out, int n,
                                                 long long groups, float scale, float floor_) {
    KERNEL_ENTRY();
    for (long long g = blockIdx.x; g < groups; g += gridDim.x) {
        const float* ag = a + g * n;
        const float* bg = b + g * n;
        double s = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)__fmul_rn(ag[i], bg[i]);
        const float d = __fmul_rn((float)block_sum_f64(s), scale);
        if (threadIdx.x == 0) out[g] = sigmoid_f(d == 0.0f ? 0.0f : copysignf(sqrtf(fmaxf(fabsf(d), floor_)), d));
        __syncthreads();  // block_sum_f64's shared words serve the next group
    }
}

// Op::EngramGate (DeepSeek-V4.1's Engram): for streams x [n, s, rows], kv [n*(s+1), rows] laid out
// [key_0 | .. | key_{s-1} | value], per-stream norm weights qn, kn [n, s] and out [n, s, rows]:
// out[:, j, r] = x[:, j, r] + g * value_r, g = sigmoid(sign(d) * sqrt(max(|d|, floor))), sign(0) = 0,
// d = scale * sum_i (x_i * ih * qn_i * kn_i) * (k_i * ik) (the f32 products summed in f64, rounded
// to f32), ih and ik 1 / sqrtf(mean of squares + eps) (squares in f32 summed in f64, the mean in
// f32), as the CPU reference (kernels/cpu/src/ops/engram.rs). A block per (row, stream) group,
// grid-stride over the rows * s groups.
extern "C" __global__ void bl_engram_gate_f32(const float* x, const float* kv, const float* qn, const float* kn,
                                              float* out, int n, int s, long long rows, float eps, float scale,
                                              float floor_) {
    KERNEL_ENTRY();
    const long long groups = rows * s;
    for (long long g = blockIdx.x; g < groups; g += gridDim.x) {
        const long long r = g / s;
        const int j = (int)(g % s);
        const float* h = x + g * n;
        const float* kvr = kv + r * (long long)n * (s + 1);
        const float* key = kvr + (long long)j * n;
        const float* value = kvr + (long long)s * n;
        const float* q = qn + (long long)j * n;
        const float* w = kn + (long long)j * n;
        double sh = 0.0, sk = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            sh += (double)__fmul_rn(h[i], h[i]);
            sk += (double)__fmul_rn(key[i], key[i]);
        }
        const float mh = (float)(block_sum_f64(sh) / n);
        __syncthreads();  // block_sum_f64's shared words serve the next sum
        const float mk = (float)(block_sum_f64(sk) / n);
        __syncthreads();
        const float ih = 1.0f / sqrtf(mh + eps), ik = 1.0f / sqrtf(mk + eps);
        double dot = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float a = __fmul_rn(__fmul_rn(__fmul_rn(h[i], ih), q[i]), w[i]);
            dot += (double)__fmul_rn(a, __fmul_rn(key[i], ik));
        }
        const float d = __fmul_rn((float)block_sum_f64(dot), scale);
        const float gate = sigmoid_f(d == 0.0f ? 0.0f : copysignf(sqrtf(fmaxf(fabsf(d), floor_)), d));
        float* o = out + g * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = __fmul_rn(gate, value[i]) + h[i];
        __syncthreads();  // block_sum_f64's shared words serve the next group
    }
}
