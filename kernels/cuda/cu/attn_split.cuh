// Attention's split-launch pieces (included by attention.cuh, and by kernels/cuda/sim's
// attention_test.cpp, which runs the decode form on the CPU): the rows' visible positions, the
// partials of split launches, the count that finds each group's last block and the merge it
// runs, and the decode form of few rows (`bl_attn_decode_f16_<D>`). Needs WARP, KERNEL_ENTRY and
// common.cuh.

#pragma once

#include "kv_quant.cuh"

// The first position row r sees (lo above), or a negative error code: -2 for a bad slot or
// position, -3 for more visible positions than the cache holds.
static __device__ __forceinline__ int visible_from(const int* slots, const int* pos, int r, int len, int n_slots,
                                                   int window) {
    const int s = slots[r], p = pos[r];
    if (s < 0 || s >= n_slots || p < 0) return -2;
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    return p - lo + 1 > len ? -3 : lo;
}

// Warps of a flash block and its (row, head) pairs (16 rows of tensor-core tiles per warp).
#define FA_WARPS 4
#define FA_ROWS (FA_WARPS * 16)

// A pair's visible positions lo .. hi of `slot` (-1: none: past the batch or a bad row).
struct FaRow {
    int slot, lo, hi;
};

// The partials of split z for output row i (of rows * n_head): o (D floats) at part +
// (z * outs + i) * D, then every split's maxima and sums after all the o's.
static __device__ __forceinline__ float* part_o(float* part, int z, long long outs, long long i, int D) {
    return part + (z * outs + i) * D;
}
static __device__ __forceinline__ float* part_ml(float* part, int S, int z, long long outs, long long i, int D) {
    return part + S * outs * D + (z * outs + i) * 2;
}

// Whether this block is the last of the n blocks of its group to get here, counted in the
// group's zeroed counter `c`, which the last block sets back to zero: what every block wrote before
// the call is visible to the last one after it. Every thread of the block must call it.
static __device__ bool last_split_block(int* c, int n) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(c, 1) == n - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// Merges the first nz of the S splits' partials of the block's nrows pairs into out (and its Q8_1
// copy), by the last split block of a (pair block, KV head): o = sum_z e_z o_z / (sum_z e_z l_z + e_sink), e_z =
// exp(m_z - M), M the largest of the m_z and the sink. First a warp per pair turns the splits'
// maxima and sums into weights e_z / (sum) in shared memory `wz` (FA_ROWS x FA_MAX_SPLITS, lane j
// holding splits j and j + 32) and finds the run of splits that saw any of its positions; then
// each thread takes quads of the pairs' outputs, reading the run's partials eight splits at a
// time. The partials, written by other blocks of this launch, are read past L1.
#define FA_MAX_SPLITS 64
template <int D>
static __device__ void flash_merge(const float* part, int S, int nz, long long outs, int nrows, int pair0, int G,
                                   int n_head, int kvh, const FaRow* info, const float* sinks, float* wz, int* zrun,
                                   float* out, uint8_t* oq) {
    const int tid = threadIdx.x, lane = tid & (WARP - 1), warp = tid / WARP;
    const auto orow = [&](int m) {
        const int i = pair0 + m;
        return (long long)(i / G) * n_head + kvh * G + i % G;
    };
    for (int m = warp; m < nrows; m += FA_WARPS) {
        if (info[m].slot < 0) continue;
        const long long i = orow(m);
        const float sink = sinks ? sinks[kvh * G + (pair0 + m) % G] : -INFINITY;
        float mz[2], lz[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int z = lane + h * WARP;
            mz[h] = -INFINITY;
            lz[h] = 0.0f;
            if (z < nz) {
                const float2 ml = __ldcg((const float2*)part_ml((float*)part, S, z, outs, i, D));
                mz[h] = ml.x;
                lz[h] = ml.y;
            }
        }
        const float M = fmaxf(sink, warp_max(fmaxf(mz[0], mz[1])));
        float w[2], L = lane == 0 && sink != -INFINITY ? expf(sink - M) : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            w[h] = mz[h] == -INFINITY ? 0.0f : expf(mz[h] - M);
            L += w[h] * lz[h];
        }
        L = warp_sum(L);
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        wz[m * FA_MAX_SPLITS + lane] = w[0] * inv;
        wz[m * FA_MAX_SPLITS + lane + WARP] = w[1] * inv;
        const unsigned long long live = (unsigned long long)__ballot_sync(0xffffffffu, mz[0] != -INFINITY) |
                                        (unsigned long long)__ballot_sync(0xffffffffu, mz[1] != -INFINITY) << 32;
        if (lane == 0) {
            zrun[2 * m] = live ? __ffsll(live) - 1 : 0;
            zrun[2 * m + 1] = live ? 64 - __clzll(live) : 0;
        }
    }
    __syncthreads();
    // Quad q of pair m is item m * D / 4 + q: a warp's 32 items hold whole Q8_1 blocks of a row.
    constexpr int QUADS = D / 4;
    for (int it0 = warp * WARP; it0 < nrows * QUADS; it0 += FA_WARPS * WARP) {
        const int it = it0 + lane, m = it / QUADS, q = it % QUADS;
        const bool ok = info[m].slot >= 0;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const long long i = ok ? orow(m) : 0;
        const int z0 = ok ? zrun[2 * m] : 0, z1 = ok ? zrun[2 * m + 1] : 0;
        const float* wm = wz + m * FA_MAX_SPLITS;
#pragma unroll 8
        for (int z = z0; z < z1; ++z) {
            const float4 p = __ldcg((const float4*)part_o((float*)part, z, outs, i, D) + q);
            const float wt = wm[z];
            v.x += wt * p.x;
            v.y += wt * p.y;
            v.z += wt * p.z;
            v.w += wt * p.w;
        }
        if (ok) ((float4*)(out + i * D))[q] = v;
        if (oq && __any_sync(0xffffffffu, ok)) quantize_quad(v, oq + (i * D + 4 * q) / 32 * 36, ok);
    }
}

// ---- decode attention -----------------------------------------------------------------------------
// Few rows (decode) over f16 or quantized caches (read through kv_quant.cuh's KvRead, eight values a
// load, decoded to f32 where used), at most DEC_MAX_G heads per KV head: the flash form's split
// launch (grid (rows, n_head_kv, S), the same arguments) without the tensor cores, whose 16-row
// tiles a row's G heads would leave mostly empty. Per row, from its visible positions, the S
// blocks along z of (row, KV head) are shared out among f parts of the KV head's heads
// (decode_head_parts): a short context, whose few runs would leave most of the card idle, splits
// the heads instead, each part reading the KV head's tiles again (from L2); a long one keeps
// them together (f = 1), each tile read once. Block z takes part z / (S / f) and run z % (S / f).
// Each part's positions are cut into runs of whole DEC_KT-position tiles as the flash form cuts
// them, but at least DEC_MIN_RUN tiles a run, so a short context is one block per part that
// writes the output itself; blocks past the last run return.
// Per tile: two threads per position form its G scores (q * scale in f32, each thread half of the
// dimensions, the keys loaded from global memory straight into registers), warp w takes the
// online softmax of heads w, w + 4, then each thread adds the tile's values of 8 dimensions over a
// share of the positions to every head's sums. With several runs each block writes the flash
// form's partials and the last one merges them (flash_merge).
#define DEC_THREADS 128
#define DEC_KT 64
#define DEC_MAX_G 8
#define DEC_MIN_RUN 2
// Longest run, in tiles, of a part when the heads are split (measured on the H200: 4 beat 2 at
// 1,024 and 4,096 positions, docs/performance.md).
#define DEC_PART_RUN 4
static_assert(DEC_THREADS == 2 * DEC_KT && DEC_KT == 2 * WARP && DEC_THREADS / WARP == FA_WARPS, "decode layout");

// The parts f that the heads of a KV head are shared out in, for a row of `ntiles` DEC_KT-position
// tiles over S blocks: the most, doubling from 1 while 2f divides fmax (the launch's most parts) and
// each part keeps S / f >= ceil(ntiles / DEC_PART_RUN) blocks, runs of DEC_PART_RUN tiles or fewer.
static __device__ __forceinline__ int decode_head_parts(int fmax, int ntiles, int S) {
    const int runs = (ntiles + DEC_PART_RUN - 1) / DEC_PART_RUN;
    int f = 1;
    while (fmax % (2 * f) == 0 && 2 * f * runs <= S) f *= 2;
    return f;
}

template <int D, int KT, int VT>
static __device__ void attend_decode(const uint8_t* kc, const uint8_t* vc, const float* q, const int* slots,
                                     const int* pos, float* out, uint8_t* oq, float* part, int* counters, int rows,
                                     int hb, int n_head, int n_head_kv, int len, int n_slots, float scale,
                                     float softcap, int window, const float* sinks, int* err) {
    // q of head h is staged as two halves HD floats apart: a position's two threads read the same
    // offset of both halves, and HD = D / 2 + 4 puts those on different banks.
    constexpr int HD = D / 2 + 4, DG = D / 8, PG = DEC_THREADS / DG, VP = DEC_KT / PG;
    // Values loaded with the keys where the registers allow (every head's sums take 64).
    constexpr bool EARLY_V = D <= 128;
    // q, then each position group's sums of every head.
    __shared__ __align__(16) float sm[PG * DEC_MAX_G * D];
    static_assert(DEC_MAX_G * 2 * HD <= PG * DEC_MAX_G * D && DEC_MAX_G * FA_MAX_SPLITS <= PG * DEC_MAX_G * D,
                  "staging");
    __shared__ float sc[DEC_MAX_G][DEC_KT];
    __shared__ float mrow[DEC_MAX_G], lrow[DEC_MAX_G], crow[DEC_MAX_G];
    __shared__ FaRow info[DEC_MAX_G];
    __shared__ int zrun[2 * DEC_MAX_G];

    // The block takes G of the GK heads of KV head kvh (part `sub` of f) of row r, run z.
    const int GK = n_head / n_head_kv, kvh = blockIdx.y, S = gridDim.z, r = gridDim.x - 1 - blockIdx.x;
    const int tid = threadIdx.x, lane = tid & (WARP - 1), warp = tid / WARP;
    const int lo = visible_from(slots, pos, r, len, n_slots, window);
    if (lo < 0) {
        if (blockIdx.z == 0 && tid == 0) report(err, -lo);
        return;
    }
    const int slot = slots[r], hi = pos[r], ntiles = (hi - lo) / DEC_KT + 1;
    const int f = decode_head_parts(GK / hb, ntiles, S), G = GK / f, SZ = S / f;
    const int sub = blockIdx.z / SZ, z = blockIdx.z % SZ;
    if (sub >= f) return;
    const int per = max((ntiles + SZ - 1) / SZ, DEC_MIN_RUN), nz = (ntiles + per - 1) / per;
    if (z >= nz) return;
    const int first = lo + z * per * DEC_KT, last = min(hi, first + per * DEC_KT - 1);
    const long long orow0 = (long long)r * n_head + kvh * GK + sub * G;

    const float* qr = q + orow0 * D;
    for (int e = tid; e < G * D / 4; e += DEC_THREADS) {
        const int h = e / (D / 4), d = (e % (D / 4)) * 4;
        float4 v = ((const float4*)qr)[e];
        v.x *= scale;
        v.y *= scale;
        v.z *= scale;
        v.w *= scale;
        *(float4*)(sm + (2 * h + d / (D / 2)) * HD + d % (D / 2)) = v;
    }
    if (tid < G) {
        // With one run the sink's term starts the row, exp(sink - sink) = 1; the merge adds it
        // otherwise.
        const bool sink = sinks && nz == 1;
        mrow[tid] = sink ? sinks[kvh * GK + sub * G + tid] : -INFINITY;
        lrow[tid] = sink ? 1.0f : 0.0f;
    }
    __syncthreads();

    const int hf = tid & 1, tk = tid >> 1, dg = tid % DG, pg = tid / DG;
    using KR = KvRead<KT>;
    using VR = KvRead<VT>;
    const auto cache_row = [&](int t) { return ((long long)slot * len + t % len) * n_head_kv + kvh; };
    float acc[DEC_MAX_G][8];
#pragma unroll
    for (int h = 0; h < DEC_MAX_G; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;

    for (int t0 = first; t0 <= last; t0 += DEC_KT) {
        const int tt = t0 + tk;
        const bool kok = tt <= last;
        const uint8_t* krow = kc + cache_row(kok ? tt : t0) * KR::row_bytes(D);
        uint4 kv[D / 16];
#pragma unroll
        for (int i = 0; i < D / 16; ++i) kv[i] = kok ? KR::load(krow, hf * (D / 2) + 8 * i) : make_uint4(0, 0, 0, 0);
        uint4 vv[VP];
        const auto load_v = [&]() {
#pragma unroll
            for (int j = 0; j < VP; ++j) {
                const int tv = t0 + pg + j * PG;
                vv[j] = tv <= last ? VR::load(vc + cache_row(tv) * VR::row_bytes(D), dg * 8) : make_uint4(0, 0, 0, 0);
            }
        };
        if constexpr (EARLY_V) load_v();

        // A warp whose positions all lie past the run (a short context's tile) forms no scores.
        const bool kwarp = __any_sync(0xffffffffu, kok);
        float s[DEC_MAX_G];
#pragma unroll
        for (int h = 0; h < DEC_MAX_G; ++h) s[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < D / 16; ++i) {
            if (!kwarp) break;
            float kf[8];
            KR::decode(kv[i], kf);
#pragma unroll
            for (int h = 0; h < DEC_MAX_G; ++h) {
                if (h >= G) break;
                const float* qh = sm + (2 * h + hf) * HD + 8 * i;
                const float4 qa = *(const float4*)qh, qb = *(const float4*)(qh + 4);
                float v = s[h];
                v = fmaf(qa.x, kf[0], v);
                v = fmaf(qa.y, kf[1], v);
                v = fmaf(qa.z, kf[2], v);
                v = fmaf(qa.w, kf[3], v);
                v = fmaf(qb.x, kf[4], v);
                v = fmaf(qb.y, kf[5], v);
                v = fmaf(qb.z, kf[6], v);
                v = fmaf(qb.w, kf[7], v);
                s[h] = v;
            }
        }
#pragma unroll
        for (int h = 0; h < DEC_MAX_G; ++h) {
            const float v = s[h] + __shfl_xor_sync(0xffffffffu, s[h], 1);
            if (hf == 0 && h < G) sc[h][tk] = kok ? (softcap > 0.0f ? softcap * tanhf(v / softcap) : v) : -INFINITY;
        }
        if constexpr (!EARLY_V) load_v();
        __syncthreads();

        // Online softmax of the tile: new maxima, the tile's weights in place of its scores, the
        // old sums' factor.
        for (int h = warp; h < G; h += DEC_THREADS / WARP) {
            const float a = sc[h][lane], b = sc[h][lane + WARP], mo = mrow[h];
            const float mn = fmaxf(mo, warp_max(fmaxf(a, b)));
            const float pa = a == -INFINITY ? 0.0f : expf(a - mn), pb = b == -INFINITY ? 0.0f : expf(b - mn);
            sc[h][lane] = pa;
            sc[h][lane + WARP] = pb;
            const float ps = warp_sum(pa + pb);
            if (lane == 0) {
                const float c = mn == -INFINITY ? 1.0f : expf(mo - mn);
                crow[h] = c;
                mrow[h] = mn;
                lrow[h] = lrow[h] * c + ps;
            }
        }
        __syncthreads();

#pragma unroll
        for (int h = 0; h < DEC_MAX_G; ++h) {
            if (h >= G) break;
            const float c = crow[h];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[h][e] *= c;
        }
#pragma unroll
        for (int j = 0; j < VP; ++j) {
            const int t = pg + j * PG;
            if (t0 + t > last) break;
            float vf[8];
            VR::decode(vv[j], vf);
#pragma unroll
            for (int h = 0; h < DEC_MAX_G; ++h) {
                if (h >= G) break;
                const float p = sc[h][t];
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[h][e] = fmaf(p, vf[e], acc[h][e]);
            }
        }
        __syncthreads();
    }

    // Every position group's sums to shared memory (q is no longer read): sm[(pg * G + h) * D + d].
#pragma unroll
    for (int h = 0; h < DEC_MAX_G; ++h) {
        if (h >= G) break;
        float* o = sm + (pg * G + h) * D + dg * 8;
        *(float4*)o = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
        *(float4*)(o + 4) = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
    }
    __syncthreads();
    const auto summed = [&](int i) {
        float v = 0.0f;
#pragma unroll
        for (int p = 0; p < PG; ++p) v += sm[p * G * D + i];
        return v;
    };
    if (nz == 1) {
        // The output and its Q8_1 copy: a warp per 32-value block of the G heads' rows.
        for (int b = warp; b < G * D / 32; b += DEC_THREADS / WARP) {
            const int i = b * 32 + lane;
            const float l = lrow[i / D];
            const float v = summed(i) * (l > 0.0f ? 1.0f / l : 0.0f);
            out[orow0 * D + i] = v;
            if (oq) quantize_lane(v, oq + (orow0 * D + i) / 32 * 36);
        }
        return;
    }
    const long long outs = (long long)rows * n_head;
    for (int i = tid; i < G * D; i += DEC_THREADS) part_o(part, z, outs, orow0 + i / D, D)[i % D] = summed(i);
    if (tid < G) *(float2*)part_ml(part, S, z, outs, orow0 + tid, D) = make_float2(mrow[tid], lrow[tid]);
    // The last run's block merges.
    if (!last_split_block(counters + (sub * gridDim.y + kvh) * gridDim.x + blockIdx.x, nz)) return;
    if (tid < DEC_MAX_G) info[tid] = tid < G ? FaRow{slot, lo, hi} : FaRow{-1, 0, -1};
    __syncthreads();
    flash_merge<D>(part, S, nz, outs, G, r * GK + sub * G, GK, n_head, kvh, info, sinks, sm, zrun, out, oq);
}

// bl_attn_decode_<type>_<D>: K and V caches of one type (f16, q8_0 or q4_0; the other types take
// bl_attention_kv), dk = dv = D, G <= DEC_MAX_G; the flash form's arguments (pb: the fewest heads a
// block takes, dividing G; grid (rows, n_head_kv, S) with S >= G / pb), DEC_THREADS threads, no
// dynamic shared memory; split counters for rows * n_head_kv * G / pb.
#define ATTEND_DECODE(NAME, T, D)                                                                                 \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                                     \
        bl_attn_decode_##NAME##_##D(const float* q, const void* kc, const void* vc, const int* slots,             \
                                    const int* pos, float* out, uint8_t* oq, float* part, int* counters, int rows, \
                                    int hb, int n_head, int n_head_kv, int len, int n_slots, float scale,          \
                                    float softcap, int window, const float* sinks, int* err) {                     \
        KERNEL_ENTRY();                                                                                           \
        attend_decode<D, T, T>((const uint8_t*)kc, (const uint8_t*)vc, q, slots, pos, out, oq, part, counters,    \
                               rows, hb, n_head, n_head_kv, len, n_slots, scale, softcap, window, sinks, err);    \
    }
#define ATTEND_DECODE_SIZES(NAME, T) ATTEND_DECODE(NAME, T, 64) ATTEND_DECODE(NAME, T, 128) ATTEND_DECODE(NAME, T, 256)
ATTEND_DECODE_SIZES(f16, KV_F16)
ATTEND_DECODE_SIZES(q8_0, KV_Q8_0)
ATTEND_DECODE_SIZES(q4_0, KV_Q4_0)
