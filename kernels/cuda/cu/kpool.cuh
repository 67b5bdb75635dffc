// The k-pool indexer's selection (Op::KPoolSelect; ops/kpool.rs): GLM-5.3's DSA (SoftmaxGate) and
// Qwen3.8-Flash-Next's QSA (MeanNormRope), in three kernels per call, as the CPU reference
// (kernels/cpu/src/ops/kpool.rs) takes it:
//   bl_kpool_pool_<t>:   DSA, a block per row; a row at a pool's last position pools it (per
//                        dimension a softmax over the pool's positions of gate + ape, weighting
//                        the keys, in f64) into that row's pooled section;
//   bl_kpool_pool_qsa_<t>: QSA, a block per row; a row at a pool's last position pools it (the
//                        mean of the raw keys and its RMS norm in f64, times k_norm, to f32, then
//                        roped at the pool's first position as bl_rope_f32 ropes) into that row's
//                        pooled section;
//   bl_kpool_scores_<t>: a block per (row, KPOOL_BLOCK_POOLS pools), a warp per pool: the lanes
//                        take the heads (q staged in shared memory), sum_h w[h]·relu(q_h·pooled)
//                        (w[h] the row's head weights, or QSA's one scale)
//                        in f64, ranked as an f32 score and the pool in one 64-bit key;
//   bl_kpool_select:     a block per row: a bitonic sort of the row's keys (in shared memory up to
//                        KPOOL_SORT_SHARED keys, else in place in the scratch), then the output.
// <t> is the cache's element type (f32, f16). Cache rows are `sections` sections of dh, at
// (slot·len + position)·sections·dh: [key | gate | pooled] (DSA, 3) or [raw key | pooled] (QSA, 2).
// Included by kernels.cu after common.cuh and rope.cuh (and by kernels/cuda/sim/kpool_test.cpp
// after sim.h).

#pragma once

// Threads of a score block (a warp per pool), and the pools one block scores.
#define KPOOL_THREADS 256
#define KPOOL_BLOCK_POOLS 64
// The most q values (n_head·(dh + 1), padded rows) and the widest head a score block stages.
#define KPOOL_Q_MAX 8448
#define KPOOL_DH_MAX 256
// Threads of a select block (the sort of a decode row's keys is one block's work).
#define KPOOL_SELECT_THREADS 512
// Keys a select block sorts in shared memory (larger rows sort in place in the scratch); the
// emulation's test sets fewer to reach the in-place sort with fewer pools.
#ifndef KPOOL_SORT_SHARED
#define KPOOL_SORT_SHARED 4096
#endif
// A slot or position outside the cache, reported through the error word (device.rs names it).
#define ERR_KPOOL 8

// The ranking key of a pool: the f32 score's bits in value order (-0 as +0) above the pool's
// complement, so that descending keys list pools by descending score, ties by ascending pool.
static __device__ __forceinline__ unsigned long long kpool_key(double score, int pool) {
    float s = (float)score;
    if (s == 0.0f) s = 0.0f;
    const unsigned b = __float_as_uint(s);
    const unsigned ordered = (b >> 31) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)ordered << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned)pool);
}

static __device__ __forceinline__ int kpool_key_pool(unsigned long long key) {
    return (int)(0xFFFFFFFFu - (unsigned)(key & 0xFFFFFFFFull));
}

// Whether slot s and position p address the cache.
static __device__ __forceinline__ bool kpool_in_cache(int s, int p, int len, int n_slots) {
    return s >= 0 && s < n_slots && p >= 0 && p < len;
}

template <typename T>
static __device__ void kpool_pool(T* cache, const float* ape, const int* slots, const int* pos, int dh, int kpool,
                                  int len, int n_slots, int* err) {
    const int r = blockIdx.x;
    const int p = pos[r];
    if (!kpool_in_cache(slots[r], p, len, n_slots)) {
        if (threadIdx.x == 0) report(err, ERR_KPOOL);
        return;
    }
    if ((p + 1) % kpool != 0) return;
    const long long w = 3LL * dh;
    T* first = cache + ((long long)slots[r] * len + p + 1 - kpool) * w;
    for (int d = threadIdx.x; d < dh; d += blockDim.x) {
        double m = -INFINITY;
        for (int t = 0; t < kpool; ++t)
            m = fmax(m, (double)to_f32(first[t * w + dh + d]) + (double)ape[t * dh + d]);
        double num = 0.0, den = 0.0;
        for (int t = 0; t < kpool; ++t) {
            const double e = exp((double)to_f32(first[t * w + dh + d]) + (double)ape[t * dh + d] - m);
            den += e;
            num += e * (double)to_f32(first[t * w + d]);
        }
        // To nearest f32, then to nearest of T: the CPU reference's CacheValue::put.
        first[(kpool - 1) * w + 2 * dh + d] = from_f32<T>((float)(num / den));
    }
}

// The QSA pooled key of the pool that ends at row r's position (a block of at most 1024 threads
// per row): per dimension the mean of the pool's raw keys in f64, the RMS norm over the dh means
// (eps inside the root) times k_norm, rounded to f32, roped with NEOX pairs of n_dims at the pool's
// first position (rope_cs and the f32 rotation of bl_rope_f32), rounded to T.
template <typename T>
static __device__ void kpool_pool_qsa(T* cache, const float* k_norm, const int* slots, const int* pos, int dh,
                                      int kpool, int len, int n_slots, float eps, int n_dims, double log2_base,
                                      float freq_scale, float ext_factor, float corr0, float corr1, double mscale,
                                      int* err) {
    __shared__ double mean[KPOOL_DH_MAX];
    __shared__ float key[KPOOL_DH_MAX];
    const int r = blockIdx.x;
    const int p = pos[r];
    if (!kpool_in_cache(slots[r], p, len, n_slots)) {
        if (threadIdx.x == 0) report(err, ERR_KPOOL);
        return;
    }
    // The same for every thread of the block: the barriers below are reached by all or none.
    if ((p + 1) % kpool != 0) return;
    const long long w = 2LL * dh;
    const int start = p + 1 - kpool;
    T* first = cache + ((long long)slots[r] * len + start) * w;
    double ss = 0.0;
    for (int d = threadIdx.x; d < dh; d += blockDim.x) {
        double sum = 0.0;
        for (int t = 0; t < kpool; ++t) sum += (double)to_f32(first[t * w + d]);
        const double m = sum / (double)kpool;
        mean[d] = m;
        ss += m * m;
    }
    const double inv = 1.0 / sqrt(block_sum_f64(ss) / (double)dh + (double)eps);
    for (int d = threadIdx.x; d < dh; d += blockDim.x) key[d] = (float)(mean[d] * inv * (double)k_norm[d]);
    __syncthreads();
    T* pooled = first + (long long)(kpool - 1) * w + dh;
    for (int pair = threadIdx.x; pair < dh / 2; pair += blockDim.x) {
        const int2 e = rope_elems(pair, 1, n_dims);
        const float x0 = key[e.x], x1 = key[e.y];
        if (pair >= n_dims / 2) {
            pooled[e.x] = from_f32<T>(x0);
            pooled[e.y] = from_f32<T>(x1);
            continue;
        }
        const float2 cs = rope_cs(pair, start, n_dims, log2_base, freq_scale, ext_factor, corr0, corr1, mscale);
        pooled[e.x] = from_f32<T>(x0 * cs.x - x1 * cs.y);
        pooled[e.y] = from_f32<T>(x0 * cs.y + x1 * cs.x);
    }
}

// Head h of row r weighs wts[r·n_head + h] (DSA), or `scale` when wts is null (QSA).
template <typename T>
static __device__ void kpool_scores(const float* q, const float* wts, float scale, const T* cache, const int* slots,
                                    const int* pos, unsigned long long* keys, int n_head, int dh, int sections,
                                    int kpool, int len, int n_slots, long long stride) {
    __shared__ float qs[KPOOL_Q_MAX];
    __shared__ float ks[KPOOL_THREADS / WARP][KPOOL_DH_MAX];
    const int r = blockIdx.y;
    const int s = slots[r], p = pos[r];
    // Rows outside the cache are reported by bl_kpool_pool, which runs first.
    if (!kpool_in_cache(s, p, len, n_slots)) return;
    const int complete = (p + 1) / kpool;
    const int g0 = blockIdx.x * KPOOL_BLOCK_POOLS;
    if (g0 >= complete) return;
    const int qw = dh + 1;  // padded rows: the lanes' heads fall in different banks
    const float* qr = q + (long long)r * n_head * dh;
    for (int i = threadIdx.x; i < n_head * dh; i += blockDim.x) qs[(i / dh) * qw + i % dh] = qr[i];
    __syncthreads();
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g1 = min(g0 + KPOOL_BLOCK_POOLS, complete);
    const long long w = (long long)sections * dh;
    for (int g = g0 + warp; g < g1; g += KPOOL_THREADS / WARP) {
        const T* pooled = cache + ((long long)s * len + (long long)g * kpool + kpool - 1) * w + w - dh;
        for (int d = lane; d < dh; d += WARP) ks[warp][d] = to_f32(pooled[d]);
        __syncwarp();
        double acc = 0.0;
        for (int h = lane; h < n_head; h += WARP) {
            double dot = 0.0;
            for (int d = 0; d < dh; ++d) dot += (double)qs[h * qw + d] * (double)ks[warp][d];
            const float wh = wts ? wts[(long long)r * n_head + h] : scale;
            acc += (double)wh * fmax(dot, 0.0);
        }
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) keys[(long long)r * stride + g] = kpool_key(acc, g);
        // Every lane has read this pool's key before the next one overwrites it.
        __syncwarp();
    }
}

#define KPOOL_KERNELS(T, name)                                                                                    \
    extern "C" __global__ void bl_kpool_pool_##name(T* cache, const float* ape, const int* slots, const int* pos,  \
                                                    int dh, int kpool, int len, int n_slots, int* err) {          \
        KERNEL_ENTRY();                                                                                            \
        kpool_pool<T>(cache, ape, slots, pos, dh, kpool, len, n_slots, err);                                       \
    }                                                                                                              \
    extern "C" __global__ void bl_kpool_pool_qsa_##name(                                                           \
        T* cache, const float* k_norm, const int* slots, const int* pos, int dh, int kpool, int len, int n_slots,  \
        float eps, int n_dims, double log2_base, float freq_scale, float ext_factor, float corr0, float corr1,      \
        double mscale, int* err) {                                                                                 \
        KERNEL_ENTRY();                                                                                            \
        kpool_pool_qsa<T>(cache, k_norm, slots, pos, dh, kpool, len, n_slots, eps, n_dims, log2_base, freq_scale,  \
                          ext_factor, corr0, corr1, mscale, err);                                                  \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(KPOOL_THREADS)                                                   \
        bl_kpool_scores_##name(const float* q, const float* wts, float scale, const T* cache, const int* slots,    \
                               const int* pos, unsigned long long* keys, int n_head, int dh, int sections,         \
                               int kpool, int len, int n_slots, long long stride) {                                \
        KERNEL_ENTRY();                                                                                            \
        kpool_scores<T>(q, wts, scale, cache, slots, pos, keys, n_head, dh, sections, kpool, len, n_slots,         \
                        stride);                                                                                   \
    }

KPOOL_KERNELS(float, f32)
KPOOL_KERNELS(__half, f16)

// Sorts a[0..n) (n a power of two) in descending order; every thread of the block takes part.
static __device__ void kpool_sort_desc(unsigned long long* a, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int l = i ^ j;
                if (l > i) {
                    const unsigned long long x = a[i], y = a[l];
                    // Descending runs where bit k of i is clear, ascending where set: the last
                    // merge (k = n) leaves the whole array descending.
                    if (((i & k) == 0) ? (x < y) : (x > y)) {
                        a[i] = y;
                        a[l] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// A block per row: the row's keys (written by bl_kpool_scores at keys + r·stride, stride a power
// of two at least the row's complete pools) sorted, then out[:, r]: the first min(n_top,
// complete) pools' positions, each ascending, -1 up to kpool·n_top; with tail the (p + 1) % kpool
// positions after the last complete pool, ascending, -1 up to n_sel.
extern "C" __global__ void __launch_bounds__(KPOOL_SELECT_THREADS) bl_kpool_select(unsigned long long* keys, const int* slots, const int* pos, int* out,
                                           int kpool, int n_top, int tail, int n_sel, int len, int n_slots,
                                           long long stride) {
    KERNEL_ENTRY();
    __shared__ unsigned long long sh[KPOOL_SORT_SHARED];
    const int r = blockIdx.x;
    const int s = slots[r], p = pos[r];
    int* o = out + (long long)r * n_sel;
    if (!kpool_in_cache(s, p, len, n_slots)) {
        for (int j = threadIdx.x; j < n_sel; j += blockDim.x) o[j] = -1;
        return;
    }
    const int complete = (p + 1) / kpool;
    int n = 1;
    while (n < complete) n <<= 1;
    unsigned long long* row = keys + (long long)r * stride;
    unsigned long long* a = n <= KPOOL_SORT_SHARED ? sh : row;
    // Key 0 is no pool's (a pool's complement is never all ones): padding sorts last.
    for (int i = threadIdx.x; i < n; i += blockDim.x) a[i] = i < complete ? row[i] : 0ull;
    __syncthreads();
    kpool_sort_desc(a, n);
    const int kept = min(n_top, complete), pools_end = kpool * n_top;
    const int n_tail = (p + 1) % kpool;
    for (int j = threadIdx.x; j < n_sel; j += blockDim.x) {
        int v = -1;
        if (j < pools_end) {
            if (j / kpool < kept) v = kpool_key_pool(a[j / kpool]) * kpool + j % kpool;
        } else if (tail && j - pools_end < n_tail) {
            v = p + 1 - n_tail + (j - pools_end);
        }
        o[j] = v;
    }
}
