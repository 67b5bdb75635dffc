// DeepSeek-V4's compressed rows (ops/compress.rs): the compressor that pools every `ratio`
// positions of a sequence into one normed, roped row (Op::Compress; its Plain form leaves the row
// unroped, its Store form norms and ropes rows made elsewhere), and the indexer that picks the
// compressed rows each query row reads (Op::CompSelect). Included by kernels.cu after rope.cuh;
// kernels/cuda/sim/compress_test.cpp runs them on the CPU. Bad slots, positions and rows outside
// a cache report error 11.

#pragma once

// The most values a compressed row holds, and the most compressed rows CompSelect ranks (its
// scores live in shared memory); the host refuses larger calls by name.
#define COMP_MAX_WIDTH 1024
#define COMP_MAX_ROWS 8192

// Writes the normed row `src` (w values, in shared memory) into `out`, roped at position `first`
// (NORM or NEOX pairs of the rope's n_dims dims from `offset`, the other dims copied).
static __device__ void comp_rope_row(const float* src, float* out, int w, int first, int neox, int n_dims, int offset,
                                     double log2_base, float freq_scale, float ext_factor, float corr0, float corr1,
                                     double mscale) {
    for (int pair = threadIdx.x; pair < w / 2; pair += blockDim.x) {
        int2 e = rope_elems(pair, neox, n_dims);
        if (pair >= n_dims / 2) {
            const int a = e.x - n_dims;
            e = a < offset ? make_int2(a, a + 1) : e;
            out[e.x] = src[e.x];
            out[e.y] = src[e.y];
            continue;
        }
        e = make_int2(e.x + offset, e.y + offset);
        const float2 cs = rope_cs(pair, first, n_dims, log2_base, freq_scale, ext_factor, corr0, corr1, mscale);
        const float x0 = src[e.x], x1 = src[e.y];
        out[e.x] = x0 * cs.x - x1 * cs.y;
        out[e.y] = x0 * cs.y + x1 * cs.x;
    }
}

// One block per call row: a row whose position completes compressed row j = p / ratio pools its
// taps (the window, and with `overlap` the window before it through the first series), then norms
// and ropes the pooled row into comp row j of its slot. Each tap's [kv | score] comes from this
// call's rows when the row `p - q` back holds position q of the same slot, else from raw. Per
// dimension: the softmax of score + ape over the taps (exponentials in f32, sums in f64), then
// the RMS norm (squares summed in f64) times `norm`, then the rope at position j * ratio.
// With `plain` (CompressForm::Plain) the normed row is written unroped at column r of `plain`
// instead ([w, rows]; zeros for a row that completes none) and `comp` is not touched.
extern "C" __global__ void bl_compress_f32(const float* kv, const float* score, const float* ape, const float* norm,
                                           const float* raw, float* comp, float* plain, const int* slots,
                                           const int* pos, int ratio, int overlap, int w, int len_raw, int len_comp,
                                           int n_slots, float eps, int neox, int n_dims, int offset, double log2_base,
                                           float freq_scale, float ext_factor, float corr0, float corr1, double mscale,
                                           int* err) {
    KERNEL_ENTRY();
    __shared__ float pooled[COMP_MAX_WIDTH];
    const int r = blockIdx.x, slot = slots[r], p = pos[r];
    if (slot < 0 || slot >= n_slots || p < 0) {
        if (threadIdx.x == 0) report(err, 11);
        return;
    }
    if ((p + 1) % ratio != 0) {
        if (plain)
            for (int d = threadIdx.x; d < w; d += blockDim.x) plain[(long long)r * w + d] = 0.0f;
        return;
    }
    const int j = p / ratio;
    if (!plain && j >= len_comp) {
        if (threadIdx.x == 0) report(err, 11);
        return;
    }
    const int sw = overlap ? 2 * w : w, first = j * ratio;
    const int before = overlap && j > 0 ? ratio : 0, n_taps = before + ratio;
    // Tap k: its position, its offset into the series and its bias row.
    auto tap = [&](int k, int* q, int* o, int* t) {
        if (k < before) {
            *q = first - ratio + k;
            *o = 0;
            *t = k;
        } else {
            *q = first + k - before;
            *o = overlap ? w : 0;
            *t = k - before;
        }
    };
    // The kv row of position q (its score row follows sw values later in raw, or in `score`).
    auto row_of = [&](int q, const float** k, const float** s) {
        const int back = p - q, rr = r - back;
        if (rr >= 0 && slots[rr] == slot && pos[rr] == q) {
            *k = kv + (long long)rr * sw;
            *s = score + (long long)rr * sw;
        } else {
            const float* at = raw + ((long long)slot * len_raw + q % len_raw) * 2 * sw;
            *k = at;
            *s = at + sw;
        }
    };
    double ss = 0.0;
    for (int d = threadIdx.x; d < w; d += blockDim.x) {
        float mx = -INFINITY;
        for (int k = 0; k < n_taps; ++k) {
            int q, o, t;
            const float *kr, *sr;
            tap(k, &q, &o, &t);
            row_of(q, &kr, &sr);
            mx = fmaxf(mx, sr[o + d] + ape[(long long)t * sw + o + d]);
        }
        double num = 0.0, den = 0.0;
        for (int k = 0; k < n_taps; ++k) {
            int q, o, t;
            const float *kr, *sr;
            tap(k, &q, &o, &t);
            row_of(q, &kr, &sr);
            const double e = (double)expf(sr[o + d] + ape[(long long)t * sw + o + d] - mx);
            den += e;
            num += e * (double)kr[o + d];
        }
        const float v = (float)(num / den);
        pooled[d] = v;
        ss += (double)v * (double)v;
    }
    const float inv = (float)(1.0 / sqrt(block_sum_f64(ss) / w + (double)eps));
    if (plain) {
        for (int d = threadIdx.x; d < w; d += blockDim.x) plain[(long long)r * w + d] = pooled[d] * inv * norm[d];
        return;
    }
    for (int d = threadIdx.x; d < w; d += blockDim.x) pooled[d] = pooled[d] * inv * norm[d];
    __syncthreads();
    comp_rope_row(pooled, comp + ((long long)slot * len_comp + j) * w, w, first, neox, n_dims, offset, log2_base,
                  freq_scale, ext_factor, corr0, corr1, mscale);
}

// CompressForm::Store, one block per call row: a row at position p with (p + 1) % ratio == 0
// writes its x row (w values), RMS-normed (squares summed in f64) times `norm` and roped at
// (p / ratio) * ratio, at comp row p / ratio of its slot; other rows write nothing.
extern "C" __global__ void bl_comp_store_f32(const float* x, const float* norm, float* comp, const int* slots,
                                             const int* pos, int ratio, int w, int len_comp, int n_slots, float eps,
                                             int neox, int n_dims, int offset, double log2_base, float freq_scale,
                                             float ext_factor, float corr0, float corr1, double mscale, int* err) {
    KERNEL_ENTRY();
    __shared__ float row[COMP_MAX_WIDTH];
    const int r = blockIdx.x, slot = slots[r], p = pos[r];
    if (slot < 0 || slot >= n_slots || p < 0 || ((p + 1) % ratio == 0 && p / ratio >= len_comp)) {
        if (threadIdx.x == 0) report(err, 11);
        return;
    }
    if ((p + 1) % ratio != 0) return;
    const int j = p / ratio;
    const float* xr = x + (long long)r * w;
    double ss = 0.0;
    for (int d = threadIdx.x; d < w; d += blockDim.x) ss += (double)xr[d] * (double)xr[d];
    const float inv = (float)(1.0 / sqrt(block_sum_f64(ss) / w + (double)eps));
    for (int d = threadIdx.x; d < w; d += blockDim.x) row[d] = xr[d] * inv * norm[d];
    __syncthreads();
    comp_rope_row(row, comp + ((long long)slot * len_comp + j) * w, w, j * ratio, neox, n_dims, offset, log2_base,
                  freq_scale, ext_factor, corr0, corr1, mscale);
}

// After bl_compress_f32 (which reads raw): each call row's [kv | score] into raw row
// `position % len_raw` of its slot. One block per row; bad rows were reported and are skipped.
// A row that a later row of the call overwrites (same slot and ring row: a call longer than the
// ring) writes nothing, so the ring holds the latest positions whatever order the blocks run in.
extern "C" __global__ void bl_compress_store_f32(const float* kv, const float* score, float* raw, const int* slots,
                                                 const int* pos, int sw, int len_raw, int n_slots) {
    KERNEL_ENTRY();
    const int r = blockIdx.x, slot = slots[r], p = pos[r];
    if (slot < 0 || slot >= n_slots || p < 0) return;
    int overwritten = 0;
    for (int r2 = r + 1 + (int)threadIdx.x; r2 < (int)gridDim.x; r2 += blockDim.x)
        overwritten |= slots[r2] == slot && pos[r2] >= 0 && pos[r2] % len_raw == p % len_raw;
    if (__syncthreads_or(overwritten)) return;
    float* at = raw + ((long long)slot * len_raw + p % len_raw) * 2 * sw;
    for (int i = threadIdx.x; i < sw; i += blockDim.x) {
        at[i] = kv[(long long)r * sw + i];
        at[sw + i] = score[(long long)r * sw + i];
    }
}

// Whether (sa, ja) ranks before (sb, jb): the higher score, then the lower row.
static __device__ __forceinline__ bool comp_before(float sa, int ja, float sb, int jb) {
    return sa > sb || (sa == sb && (unsigned)ja < (unsigned)jb);
}

// One block per query row (blockDim a multiple of 32): each visible compressed row j < (p + 1) /
// ratio scored as sum_h w[h] * relu(q_h . key_j) in f32 in the CPU reference's order (products
// rounded on their own, no fused multiply-adds), then the min(top_k, visible) best listed by
// descending score (ties: lower row) one block-wide arg-max at a time, then -1.
extern "C" __global__ void bl_comp_select_f32(const float* q, const float* w, const float* keys, const int* slots,
                                              const int* pos, int* out, int nh, int dh, int ratio, int top_k, int len,
                                              int n_slots, int* err) {
    KERNEL_ENTRY();
    __shared__ float sc[COMP_MAX_ROWS];
    __shared__ float best_s[1024 / WARP];
    __shared__ int best_j[1024 / WARP];
    const int r = blockIdx.x, slot = slots[r], p = pos[r];
    int* o = out + (long long)r * top_k;
    const int visible = p < 0 ? 0 : (p + 1) / ratio;
    if (slot < 0 || slot >= n_slots || p < 0 || visible > len || visible > COMP_MAX_ROWS) {
        if (threadIdx.x == 0) report(err, 11);
        return;
    }
    const float* qr = q + (long long)r * nh * dh;
    const float* kc = keys + (long long)slot * len * dh;
    for (int j = threadIdx.x; j < visible; j += blockDim.x) {
        const float* key = kc + (long long)j * dh;
        float s = 0.0f;
        for (int h = 0; h < nh; ++h) {
            float dot = 0.0f;
            for (int i = 0; i < dh; ++i) dot += __fmul_rn(qr[h * dh + i], key[i]);
            s += __fmul_rn(w[(long long)r * nh + h], fmaxf(dot, 0.0f));
        }
        sc[j] = s;
    }
    __syncthreads();
    const int kept = visible < top_k ? visible : top_k;
    for (int i = 0; i < kept; ++i) {
        float bs = -INFINITY;
        int bj = -1;
        for (int j = threadIdx.x; j < visible; j += blockDim.x)
            if (sc[j] == sc[j] && (bj < 0 || comp_before(sc[j], j, bs, bj))) {
                bs = sc[j];
                bj = j;
            }
        for (int m = WARP / 2; m > 0; m >>= 1) {
            const float os = __shfl_xor_sync(0xffffffffu, bs, m);
            const int oj = __shfl_xor_sync(0xffffffffu, bj, m);
            if (oj >= 0 && (bj < 0 || comp_before(os, oj, bs, bj))) {
                bs = os;
                bj = oj;
            }
        }
        if ((threadIdx.x & (WARP - 1)) == 0) {
            best_s[threadIdx.x / WARP] = bs;
            best_j[threadIdx.x / WARP] = bj;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 1; k < (int)blockDim.x / WARP; ++k)
                if (best_j[k] >= 0 && (bj < 0 || comp_before(best_s[k], best_j[k], bs, bj))) {
                    bs = best_s[k];
                    bj = best_j[k];
                }
            o[i] = bj;
            // Taken: NaN is skipped by every later pass.
            if (bj >= 0) sc[bj] = NAN;
        }
        __syncthreads();
    }
    for (int i = kept + threadIdx.x; i < top_k; i += blockDim.x) o[i] = -1;
}
