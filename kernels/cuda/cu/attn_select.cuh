// Attention's selection form (included by attention.cuh, and by kernels/cuda/sim's
// attn_select_test.cpp, which runs it on the CPU): one block of SEL_THREADS threads per (row,
// head) over f32 or f16 caches, for what the other forms do not take: heads of up to SEL_MAX_D
// (512: GLM-5.3's latent rows), values taken from the keys (latent attention: V = the first dv
// values of each key head, the V pointer being the K cache again) and sparse selection. Needs
// WARP, KERNEL_ENTRY and common.cuh.
//
// Row r (slot s, position p) sees, without a selection, lo .. p (lo as visible_from). With a
// selection `sel` (i32 [n_sel, rows]) it sees its listed positions t <= p (-1 entries skipped, a
// position listed twice counted once) and, with window > 0, its window p - window + 1 .. p. A
// listed position other than -1 below 0, or one the cache no longer holds (p - t >= len), is
// error 2 or 3, as a bad slot or too long a window is; such rows are left unwritten.
//
// Shared memory (dynamic): without a selection one score per visible position (len floats at
// most); with one the row's list sorted (npad ints, npad the power of two >= n_sel) and a score
// per window position and list entry (window + npad floats). Every score is kept, then a softmax
// with an f64 sum (sinks included), then p.v, as the CPU reference computes it.

#pragma once

#define SEL_THREADS 128
#define SEL_MAX_D 512
// A list entry that is no position (unused, after the row, or inside the row's window).
#define SEL_NONE 0x7fffffff

// The kernel's dynamic shared memory (bytes, as every kernel of the unit declares it); the
// emulation's test defines its own.
#ifndef SEL_DYNAMIC_SMEM
#define SEL_DYNAMIC_SMEM(name) extern __shared__ __align__(16) uint8_t name[]
#endif

// The smallest power of two >= n (1 for n <= 1).
static __device__ __forceinline__ int sel_pow2(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

// Head kvh (of d values apart) of cache row `row` (of `width` values).
template <typename T>
static __device__ __forceinline__ const T* sel_head(const T* c, long long row, long long width, int kvh, int d) {
    return c + row * width + (long long)kvh * d;
}

template <typename T>
static __device__ void attend_select(const float* q, const T* kc, const T* vc, const int* slots, const int* pos,
                                     const int* sel, int n_sel, float* out, uint8_t* oq, int n_head, int n_head_kv,
                                     int dk, int dv, int len, int n_slots, float scale, float softcap, int window,
                                     const float* sinks, int v_from_k, int* err) {
    SEL_DYNAMIC_SMEM(smem_bytes);
    float* smem = (float*)smem_bytes;
    __shared__ float red[SEL_THREADS / WARP];
    __shared__ double dred[SEL_THREADS / WARP];
    __shared__ int bad, listed;
    const int tid = threadIdx.x, lane = tid & (WARP - 1), warp = tid / WARP, nwarps = blockDim.x / WARP;
    const int r = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int s = slots[r], p = pos[r];
    // The window (nw positions from lo) and, with a selection, the sorted list after it.
    int lo, nw;
    if (sel) {
        if (s < 0 || s >= n_slots || p < 0) {
            if (tid == 0) report(err, 2);
            return;
        }
        lo = window > 0 ? max(0, p - window + 1) : p + 1;
        nw = p - lo + 1;
        if (nw > len) {
            if (tid == 0) report(err, 3);
            return;
        }
    } else {
        lo = visible_from(slots, pos, r, len, n_slots, window);
        if (lo < 0) {
            if (tid == 0) report(err, -lo);
            return;
        }
        nw = p - lo + 1;
    }
    const int npad = sel ? sel_pow2(n_sel) : 0;
    int* cand = (int*)smem;
    float* sc = smem + npad;
    if (tid == 0) {
        bad = 0;
        listed = 0;
    }
    __syncthreads();
    if (sel) {
        const int* list = sel + (long long)r * n_sel;
        for (int i = tid; i < npad; i += blockDim.x) {
            int t = i < n_sel ? list[i] : -1;
            if (t < -1) atomicCAS(&bad, 0, 2);
            if (t >= 0 && t <= p && p - t >= len) atomicCAS(&bad, 0, 3);
            // Unused, after the row, or already in the window: no entry.
            if (t < 0 || t > p || t >= lo) t = SEL_NONE;
            cand[i] = t;
        }
        __syncthreads();
        if (bad) {
            if (tid == 0) report(err, bad);
            return;
        }
        // Bitonic sort, ascending: duplicates end up side by side, SEL_NONE at the end.
        for (int k = 2; k <= npad; k <<= 1)
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = tid; i < npad; i += blockDim.x) {
                    const int o = i ^ j;
                    if (o > i) {
                        const int a = cand[i], b = cand[o];
                        if ((a > b) == ((i & k) == 0)) {
                            cand[i] = b;
                            cand[o] = a;
                        }
                    }
                }
                __syncthreads();
            }
        for (int i = tid; i < npad; i += blockDim.x)
            if (cand[i] != SEL_NONE && (i + 1 == npad || cand[i + 1] == SEL_NONE)) listed = i + 1;
        __syncthreads();
    }
    const int n = nw + listed;
    // Entry i's position: the window's first, then the list's; -1 for a repeated list entry.
    auto position = [&](int i) {
        if (i < nw) return lo + i;
        const int j = i - nw;
        return j > 0 && cand[j] == cand[j - 1] ? -1 : cand[j];
    };
    const int kvh = h / (n_head / n_head_kv);
    const float* qh = q + ((long long)r * n_head + h) * dk;
    const long long kw = (long long)dk * n_head_kv;
    // Values: the first dv of the key head (the K cache's rows and head stride), or V's own.
    const long long vw = v_from_k ? kw : (long long)dv * n_head_kv;
    const int vstride = v_from_k ? dk : dv;
    float qr[SEL_MAX_D / WARP];
#pragma unroll
    for (int j = 0; j < SEL_MAX_D / WARP; ++j) qr[j] = lane + j * WARP < dk ? qh[lane + j * WARP] : 0.0f;
    float mx = -INFINITY;
    for (int i = warp; i < n; i += nwarps) {
        const int t = position(i);
        float d = -INFINITY;
        if (t >= 0) {
            const T* kr = sel_head(kc, (long long)s * len + t % len, kw, kvh, dk);
            d = 0.0f;
#pragma unroll
            for (int j = 0; j < SEL_MAX_D / WARP; ++j)
                if (lane + j * WARP < dk) d += qr[j] * to_f32(kr[lane + j * WARP]);
            d = warp_sum(d) * scale;
            if (softcap > 0.0f) d = softcap * tanhf(d / softcap);
        }
        if (lane == 0) sc[i] = d;
        mx = fmaxf(mx, d);
    }
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < nwarps; ++w) mx = fmaxf(mx, red[w]);
    const float sink = sinks ? sinks[h] : -INFINITY;
    mx = fmaxf(mx, sink);
    double sum = 0.0;
    for (int i = tid; i < n; i += blockDim.x) {
        // A row that sees nothing (every score -inf, no sink) gets weights 0, not NaN.
        const float e = sc[i] == -INFINITY ? 0.0f : expf(sc[i] - mx);
        sc[i] = e;
        sum += (double)e;
    }
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) dred[warp] = sum;
    __syncthreads();
    double total = sinks ? (double)expf(sink - mx) : 0.0;
    for (int w = 0; w < nwarps; ++w) total += dred[w];
    const float inv = total > 0.0 ? (float)(1.0 / total) : 0.0f;
    float* o = out + ((long long)r * n_head + h) * dv;
    // Whole warps take part in the Q8_1 copy (dv a multiple of 32 when oq is set).
    for (int e0 = 0; e0 < dv; e0 += blockDim.x) {
        const int e = e0 + tid;
        float acc = 0.0f;
        if (e < dv)
            for (int i = 0; i < n; ++i) {
                if (sc[i] == 0.0f) continue;
                const T* vr = sel_head(vc, (long long)s * len + position(i) % len, vw, kvh, vstride);
                acc += sc[i] * inv * to_f32(vr[e]);
            }
        if (e < dv) o[e] = acc;
        if (oq && e0 + warp * WARP < dv) quantize_lane(acc, oq + (((long long)r * n_head + h) * dv + e) / 32 * 36);
    }
}

#define ATTEND_SELECT(name, T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(SEL_THREADS)                                                      \
        name(const float* q, const T* kc, const T* vc, const int* slots, const int* pos, const int* sel, int n_sel, \
             float* out, uint8_t* oq, int n_head, int n_head_kv, int dk, int dv, int len, int n_slots, float scale,  \
             float softcap, int window, const float* sinks, int v_from_k, int* err) {                               \
        KERNEL_ENTRY();                                                                                            \
        attend_select(q, kc, vc, slots, pos, sel, n_sel, out, oq, n_head, n_head_kv, dk, dv, len, n_slots, scale,  \
                      softcap, window, sinks, v_from_k, err);                                                      \
    }
ATTEND_SELECT(bl_attention_sel_f32, float)
ATTEND_SELECT(bl_attention_sel_f16, __half)
