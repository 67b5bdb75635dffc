// Ops over whole graph tensors, as decision heads use them (ops/dense.rs): LayerNorm with an
// optional weight and bias, Softmax with a scale and an additive mask, Concat along ne0, span
// means, and dense attention between graph tensors (every query row against every key row of the
// call, no cache). f32 data; sums in f64 as the CPU reference (kernels/cpu/src/ops) takes them.
// Included by kernels.cu after common.cuh (and by kernels/cuda/sim/dense_test.cpp after sim.h).

#pragma once

// Threads of a dense attention block (one block per query row and head), and the value width a
// thread can hold: dv <= DENSE_THREADS * DENSE_DV_PER.
#define DENSE_THREADS 128
#define DENSE_DV_PER 4
// The widest query/key row a block stages in shared memory.
#define DENSE_DK_MAX 512

// The error code of a bad span, reported through the error word (device.rs names it).
#define ERR_SPAN 7

// The largest of every thread's `v` over the block, returned to all threads.
static __device__ double block_max_f64(double v) {
    __shared__ double part[1024 / WARP];
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & (WARP - 1)) == 0) part[threadIdx.x / WARP] = v;
    __syncthreads();
    if (threadIdx.x < WARP) {
        double t = threadIdx.x < blockDim.x / WARP ? part[threadIdx.x] : -INFINITY;
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) t = fmax(t, __shfl_xor_sync(0xffffffffu, t, o));
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    const double r = part[0];
    // Every thread has read the result before a later call may overwrite it.
    __syncthreads();
    return r;
}

// LayerNorm of one row per block: (x - mean) / sqrt(var + eps) with the population variance,
// mean and variance in f64 (two passes), the normed value rounded to f32, then * w and + b when
// given (null: none). out may be x.
extern "C" __global__ void bl_layer_norm_f32(const float* x, const float* w, const float* b, float* out, int ncols,
                                             float eps) {
    KERNEL_ENTRY();
    const long long row = (long long)blockIdx.x * ncols;
    const float* xr = x + row;
    float* yr = out + row;
    double s = 0.0;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) s += (double)xr[i];
    const double mean = block_sum_f64(s) / ncols;
    // Every thread has read the sum before the next one overwrites block_sum_f64's words.
    __syncthreads();
    double d2 = 0.0;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const double d = (double)xr[i] - mean;
        d2 += d * d;
    }
    const double inv = 1.0 / sqrt(block_sum_f64(d2) / ncols + (double)eps);
    // Each thread reads back only the elements it writes, so out may be x.
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float y = (float)(((double)xr[i] - mean) * inv);
        if (w) y *= w[i];
        if (b) y += b[i];
        yr[i] = y;
    }
}

// Softmax of one row per block: softmax(x * scale + mask), mask row r % mask_rows when mask is
// given (null: none); the exponentials in f32 and their sum in f64, as the CPU reference. A row
// whose every entry is -inf becomes zeros; a NaN entry makes the row NaN (through the sum).
// out may be x.
extern "C" __global__ void bl_softmax_f32(const float* x, const float* mask, float* out, int ncols, int mask_rows,
                                          float scale) {
    KERNEL_ENTRY();
    const long long r = blockIdx.x;
    const float* xr = x + r * ncols;
    const float* mr = mask ? mask + (r % mask_rows) * ncols : nullptr;
    float* yr = out + r * ncols;
    double mx = -INFINITY;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float v = xr[i] * scale;
        if (mr) v += mr[i];
        yr[i] = v;
        mx = fmax(mx, (double)v);
    }
    // fmax passes NaNs over, as the CPU's maximum does.
    const float m = (float)block_max_f64(mx);
    if (m == -INFINITY) {
        for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = 0.0f;
        return;
    }
    double s = 0.0;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float e = expf(yr[i] - m);
        yr[i] = e;
        s += (double)e;
    }
    const float inv = (float)(1.0 / block_sum_f64(s));
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] *= inv;
}

// Concat along ne0: out row r = a row r (na values) then b row r (nb values); a thread per
// output element, grid-stride.
extern "C" __global__ void bl_concat_f32(const float* a, const float* b, float* out, long long na, long long nb,
                                         long long rows) {
    KERNEL_ENTRY();
    const long long w = na + nb, n = w * rows;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / w, c = i % w;
        out[i] = c < na ? a[r * na + c] : b[r * nb + (c - na)];
    }
}

// Span means: out[:, s] = the mean of rows start..end of x [n, rows] for span s (start, end at
// spans[2s], spans[2s + 1]); the sums in f64. Grid (spans, column blocks), a thread per column.
// A span that is empty or outside x reports ERR_SPAN and writes nothing.
extern "C" __global__ void bl_span_mean_f32(const float* x, const int* spans, float* out, int n, int rows, int* err) {
    KERNEL_ENTRY();
    const int s = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    const int start = spans[2 * s], end = spans[2 * s + 1];
    if (start < 0 || end <= start || end > rows) {
        if (c == 0) report(err, ERR_SPAN);
        return;
    }
    if (c >= n) return;
    double sum = 0.0;
    for (int r = start; r < end; ++r) sum += (double)x[(long long)r * n + c];
    out[(long long)s * n + c] = (float)(sum / (double)(end - start));
}

// Dense attention, one block of DENSE_THREADS threads per (head h, query row i): out[:, h, i] =
// sum_j softmax_j(scale * q[:, h, i] . k[:, g, j]) v[:, g, j] over the keys the row sees (all,
// or 0..=i when causal), g = h / (n_head / n_head_kv). q [dk, n_head, n_q], k [dk, n_head_kv,
// n_k], v [dv, n_head_kv, n_k], out [dv, n_head, n_q]. Scores, the softmax and the weighted sums
// in f64, as the CPU reference; the keys go in chunks of a thread each under a running maximum
// (online softmax). Needs dk <= DENSE_DK_MAX and dv <= DENSE_THREADS * DENSE_DV_PER (the host
// checks both).
extern "C" __global__ void __launch_bounds__(DENSE_THREADS)
    bl_attention_dense_f32(const float* q, const float* k, const float* v, float* out, int dk, int dv, int n_head,
                           int n_head_kv, int n_q, int n_k, float scale, int causal) {
    KERNEL_ENTRY();
    __shared__ float qs[DENSE_DK_MAX];
    __shared__ double p[DENSE_THREADS];
    const int h = blockIdx.x, i = blockIdx.y, t = threadIdx.x;
    const int g = h / (n_head / n_head_kv);
    const float* qr = q + ((long long)i * n_head + h) * dk;
    for (int c = t; c < dk; c += DENSE_THREADS) qs[c] = qr[c];
    __syncthreads();
    const int seen = causal ? min(i + 1, n_k) : n_k;
    double m = -INFINITY, l = 0.0;
    double acc[DENSE_DV_PER];
#pragma unroll
    for (int u = 0; u < DENSE_DV_PER; ++u) acc[u] = 0.0;
    for (int j0 = 0; j0 < seen; j0 += DENSE_THREADS) {
        const int j = j0 + t;
        double sc = -INFINITY;
        if (j < seen) {
            const float* kr = k + ((long long)j * n_head_kv + g) * dk;
            double dot = 0.0;
            for (int c = 0; c < dk; ++c) dot += (double)qs[c] * (double)kr[c];
            sc = dot * (double)scale;
        }
        const double nm = fmax(m, block_max_f64(sc));
        const double e = j < seen ? exp(sc - nm) : 0.0;
        // The earlier chunks' weights against the new maximum (0 before the first chunk).
        const double corr = exp(m - nm);
        p[t] = e;
        l = l * corr + block_sum_f64(e);
        const int chunk = min(DENSE_THREADS, seen - j0);
#pragma unroll
        for (int u = 0; u < DENSE_DV_PER; ++u) {
            // A guard, not a break: the accumulators stay in registers under the full unroll.
            const int d = t + u * DENSE_THREADS;
            if (d < dv) {
                double a = acc[u] * corr;
                for (int jj = 0; jj < chunk; ++jj)
                    a += p[jj] * (double)v[((long long)(j0 + jj) * n_head_kv + g) * dv + d];
                acc[u] = a;
            }
        }
        m = nm;
        // Every thread has read this chunk's weights before the next chunk writes them.
        __syncthreads();
    }
    float* o = out + ((long long)i * n_head + h) * dv;
#pragma unroll
    for (int u = 0; u < DENSE_DV_PER; ++u) {
        const int d = t + u * DENSE_THREADS;
        if (d < dv) o[d] = (float)(acc[u] / l);
    }
}
