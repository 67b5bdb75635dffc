// Attention's selection form (included by attention.cuh, and by kernels/cuda/sim's
// attn_select_test.cpp, which runs it on the CPU), over f32 or f16 caches, for what the other
// forms do not take: heads of up to SEL_MAX_D (512: GLM-5.3's latent rows), values taken from the
// keys (latent attention: V = the first dv values of each key head, the V pointer being the K
// cache again) and sparse selection. Needs WARP, KERNEL_ENTRY, common.cuh and attn_split.cuh.
//
// Row r (slot s, position p) sees, without a selection, lo .. p (lo as visible_from). With a
// selection `sel` (i32 [n_sel, rows]) it sees its listed positions t <= p (-1 entries skipped, a
// position listed twice counted once) and, with window > 0, its window p - window + 1 .. p. A
// listed position other than -1 below 0, or one the cache no longer holds (p - t >= len), is
// error 2 or 3, as a bad slot or too long a window is; such rows are left unwritten.
// With a second key source (DeepSeek-V4's compressed rows, SelComp, launched from attn_comp.cuh)
// the row also sees the compressed rows its count (and list) names, in the same softmax.
//
// Up to three launches:
// 1. With a selection, bl_attn_sel_list (a block per row) sorts the row's list, drops what the
//    row does not see through it (-1, later positions, those inside its window) and repeats, and
//    writes the rest ascending into `list` [n_sel, rows] with their number in `count` [rows]
//    (-1 for a bad row).
// 2. bl_attention_sel_<f32|f16> (grid: S splits, head chunks, rows; SEL_THREADS threads) takes
//    up to SEL_HEADS heads of one KV head, which share every key (and value) row it loads: the
//    row's n = listed + window positions (list first, then the window; without a selection its
//    visible span) are cut into S runs of ceil(n / S), run z for block z. Tiles of SEL_TILE
//    positions go into shared memory as f32 and serve all of the block's heads: the scores
//    (warp w: positions 4w .. 4w + 3, lane: head lane % 16 and half lane / 16 of the dims), an
//    online softmax per head (a warp per head), then p.v (thread: output columns tid + 256 k,
//    every head). With S = 1 the block writes the normalised output (sinks counted) and its
//    Q8_1 copy; else its unnormalised output, maximum and sum as attn_split.cuh's partials.
// 3. With S > 1, bl_attn_sel_merge (a block per output row and head) merges the S partials with
//    the head's sink into the output and its Q8_1 copy.

#pragma once

#define SEL_THREADS 256
#define SEL_WARPS (SEL_THREADS / WARP)
#define SEL_MAX_D 512
// Heads a block takes (one KV head's) and positions a tile holds.
#define SEL_HEADS 16
#define SEL_TILE 32
// Output columns a thread owns in p.v.
#define SEL_COLS (SEL_MAX_D / SEL_THREADS)
// A list entry that is no position (unused, after the row, or inside the row's window).
#define SEL_NONE 0x7fffffff

// The kernels' dynamic shared memory (bytes, as every kernel of the unit declares it); the
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

// The first position of row r's window (p + 1 when it has none, with a selection), or a negative
// error code: -2 for a bad slot or position, -3 for a window longer than the cache holds.
static __device__ __forceinline__ int sel_window_from(const int* slots, const int* pos, int r, int len, int n_slots,
                                                      int window) {
    const int s = slots[r], p = pos[r];
    if (s < 0 || s >= n_slots || p < 0) return -2;
    const int lo = window > 0 ? max(0, p - window + 1) : p + 1;
    return p - lo + 1 > len ? -3 : lo;
}

// Sorts cand[0 .. npad) ascending (npad a power of two; shared memory), then writes its distinct
// entries other than SEL_NONE, ascending, to out and their number to *count. Every thread of the
// block calls it.
static __device__ void sel_sort_unique(int* cand, int npad, int* out, int* count) {
    __shared__ int part[SEL_THREADS];
    const int tid = threadIdx.x;
    // Bitonic sort, ascending: repeats end up side by side, SEL_NONE at the end.
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
    // Thread tid keeps the first of each run of equal entries in its span of the list, written
    // after the kept entries of the spans before it.
    const int span = (npad + SEL_THREADS - 1) / SEL_THREADS, i0 = min(npad, tid * span), i1 = min(npad, i0 + span);
    const auto kept = [&](int i) { return cand[i] != SEL_NONE && (i == 0 || cand[i] != cand[i - 1]); };
    int mine = 0;
    for (int i = i0; i < i1; ++i) mine += kept(i);
    part[tid] = mine;
    __syncthreads();
    if (tid == 0) {
        int total = 0;
        for (int t = 0; t < SEL_THREADS; ++t) {
            const int c = part[t];
            part[t] = total;
            total += c;
        }
        *count = total;
    }
    __syncthreads();
    for (int i = i0, o = part[tid]; i < i1; ++i)
        if (kept(i)) out[o++] = cand[i];
}

// ---- 1. the rows' lists -------------------------------------------------------------------------

// Dynamic shared memory: the list padded to npad (the power of two >= n_sel) ints.
extern "C" __global__ void __launch_bounds__(SEL_THREADS)
    bl_attn_sel_list(const int* slots, const int* pos, const int* sel, int n_sel, int len, int n_slots, int window,
                     int* list, int* count, int* err) {
    KERNEL_ENTRY();
    SEL_DYNAMIC_SMEM(list_smem);
    int* cand = (int*)list_smem;
    __shared__ int bad;
    const int tid = threadIdx.x, r = blockIdx.x;
    const int lo = sel_window_from(slots, pos, r, len, n_slots, window);
    if (lo < 0) {
        if (tid == 0) {
            report(err, -lo);
            count[r] = -1;
        }
        return;
    }
    const int p = pos[r], npad = sel_pow2(n_sel);
    if (tid == 0) bad = 0;
    __syncthreads();
    const int* in = sel + (long long)r * n_sel;
    for (int i = tid; i < npad; i += blockDim.x) {
        int t = i < n_sel ? in[i] : -1;
        if (t < -1) atomicCAS(&bad, 0, 2);
        if (t >= 0 && t <= p && p - t >= len) atomicCAS(&bad, 0, 3);
        if (t < 0 || t > p || t >= lo) t = SEL_NONE;
        cand[i] = t;
    }
    __syncthreads();
    if (bad) {
        if (tid == 0) {
            report(err, bad);
            count[r] = -1;
        }
        return;
    }
    sel_sort_unique(cand, npad, list + (long long)r * n_sel, count + r);
}

// ---- 2. the blocks' runs ------------------------------------------------------------------------

// A second key source beside the cache (DeepSeek-V4's compressed rows, attn_comp.cuh): f32 rows
// [dk * n_head_kv, len, n_slots], values from the keys; per query row the number it reads
// (`count`, -1 for a bad row, reported by bl_attn_comp_list) and, with `list` (n_list a row,
// ascending), which; without a list rows 0 .. count - 1. `rows` null: none.
struct SelComp {
    const float* rows;
    const int* list;
    const int* count;
    int n_list, len;
};

// Row r's visible positions: its slot, the cache row base of the slot, its position, the first
// of its window (lo), how many listed positions come before the window (`listed`) and how many
// compressed rows after it (`comp`); false for a bad row (reported by bl_attn_sel_list with a
// selection, here by `report` without one; by bl_attn_comp_list for the compressed rows).
struct SelRow {
    long long base;
    int slot, p, lo, listed, comp;
};
static __device__ __forceinline__ bool sel_row(const int* slots, const int* pos, const int* count, const SelComp& c,
                                               int r, int len, int n_slots, int window, SelRow* row, int* err) {
    int lo;
    if (count) {
        if (count[r] < 0) return false;
        lo = sel_window_from(slots, pos, r, len, n_slots, window);
        row->listed = count[r];
    } else {
        lo = visible_from(slots, pos, r, len, n_slots, window);
        if (lo < 0) {
            if (err && threadIdx.x == 0) report(err, -lo);
            return false;
        }
        row->listed = 0;
    }
    if (c.count && c.count[r] < 0) return false;
    row->comp = c.count ? c.count[r] : 0;
    row->slot = slots[r];
    row->base = (long long)slots[r] * len;
    row->p = pos[r];
    row->lo = lo;
    return true;
}

// The kv head, first head and number of heads of head chunk y (chunks of up to SEL_HEADS of one KV
// head's g heads).
static __device__ __forceinline__ void sel_chunk(int y, int g, int* kvh, int* h0, int* nh) {
    const int per = (g + SEL_HEADS - 1) / SEL_HEADS;
    *kvh = y / per;
    const int c = y % per;
    *h0 = *kvh * g + c * SEL_HEADS;
    *nh = min(SEL_HEADS, g - c * SEL_HEADS);
}

// Key (and value) widths padded for the tiles: dims to a multiple of 8, a q row 4 floats more
// (so that 16 heads' quads fall in distinct banks).
static __device__ __forceinline__ int sel_pad(int d) { return (d + 7) / 8 * 8; }

template <typename T>
static __device__ void attend_select(const float* q, const T* kc, const T* vc, const int* slots, const int* pos,
                                     const int* list, const int* count, int n_sel, float* out, uint8_t* oq,
                                     float* part, int n_head, int n_head_kv, int dk, int dv, int len, int n_slots,
                                     float scale, float softcap, int window, const float* sinks, int v_from_k,
                                     SelComp comp, int* err) {
    SEL_DYNAMIC_SMEM(smem_bytes);
    const int tid = threadIdx.x, lane = tid & (WARP - 1), warp = tid / WARP;
    const int S = gridDim.x, z = blockIdx.x, r = blockIdx.z;
    SelRow row;
    if (!sel_row(slots, pos, count, comp, r, len, n_slots, window, &row,
                 blockIdx.x == 0 && blockIdx.y == 0 ? err : nullptr))
        return;
    const int g = n_head / n_head_kv;
    int kvh, h0, nh;
    sel_chunk(blockIdx.y, g, &kvh, &h0, &nh);
    const int nw = row.p - row.lo + 1, n = row.listed + nw + row.comp;
    const int run = (n + S - 1) / S, i0 = min(n, z * run), i1 = min(n, i0 + run);
    // Shared: q rows [SEL_HEADS][DQ], the key tile [SEL_TILE][DK], a separate value tile
    // [SEL_TILE][DV] (values not from the keys), scores then weights [SEL_HEADS][SEL_TILE], the
    // tile's positions, and per head the running maximum, sum and last rescale.
    const int DK = sel_pad(dk), DQ = DK + 4, DV = sel_pad(dv);
    float* qs = (float*)smem_bytes;
    float* ks = qs + SEL_HEADS * DQ;
    float* vs = v_from_k ? ks : ks + SEL_TILE * DK;
    const int VS = v_from_k ? DK : DV;
    float* sc = (v_from_k ? ks + SEL_TILE * DK : vs + SEL_TILE * DV);
    int* tpos = (int*)(sc + SEL_HEADS * SEL_TILE);
    float* hm = (float*)(tpos + SEL_TILE);
    float* hl = hm + SEL_HEADS;
    float* ha = hl + SEL_HEADS;
    for (int h = warp; h < SEL_HEADS; h += SEL_WARPS) {
        const float* qh = q + ((long long)r * n_head + h0 + h) * dk;
        for (int d = lane; d < DK; d += WARP) qs[h * DQ + d] = h < nh && d < dk ? qh[d] : 0.0f;
    }
    if (tid < SEL_HEADS) {
        hm[tid] = -INFINITY;
        hl[tid] = 0.0f;
    }
    __syncthreads();
    const long long kw = (long long)dk * n_head_kv;
    const long long vw = v_from_k ? kw : (long long)dv * n_head_kv;
    const T* kh = kc + (long long)kvh * dk;
    const T* vh = vc + (long long)kvh * (v_from_k ? dk : dv);
    const int* rl = count ? list + (long long)r * n_sel : nullptr;
    float acc[SEL_COLS][SEL_HEADS];
#pragma unroll
    for (int c = 0; c < SEL_COLS; ++c)
#pragma unroll
        for (int h = 0; h < SEL_HEADS; ++h) acc[c][h] = 0.0f;
    for (int t0 = i0; t0 < i1; t0 += SEL_TILE) {
        if (tid < SEL_TILE) {
            const int i = t0 + tid;
            // The list, the window, then the compressed rows (row j as -2 - j).
            const int k = i - row.listed - nw;
            tpos[tid] = i >= i1             ? -1
                        : i < row.listed    ? rl[i]
                        : k < 0             ? row.lo + i - row.listed
                        : comp.list         ? -2 - comp.list[(long long)r * comp.n_list + k]
                                            : -2 - k;
        }
        __syncthreads();
        // A warp a cache (or compressed) row at a time, its lanes along the row.
        for (int j = warp; j < SEL_TILE; j += SEL_WARPS) {
            const int t = tpos[j];
            if (t < -1) {
                const float* cr = comp.rows + ((long long)row.slot * comp.len + (-2 - t)) * kw + (long long)kvh * dk;
                for (int d = lane; d < DK; d += WARP) ks[j * DK + d] = d < dk ? cr[d] : 0.0f;
                continue;
            }
            const T* kr = kh + (row.base + (t < 0 ? 0 : t % len)) * kw;
            for (int d = lane; d < DK; d += WARP) ks[j * DK + d] = t >= 0 && d < dk ? to_f32(kr[d]) : 0.0f;
            if (!v_from_k) {
                const T* vr = vh + (row.base + (t < 0 ? 0 : t % len)) * vw;
                for (int e = lane; e < DV; e += WARP) vs[j * DV + e] = t >= 0 && e < dv ? to_f32(vr[e]) : 0.0f;
            }
        }
        __syncthreads();
        // Scores: warp w's 4 positions, lane's head and half of the dims' quads.
        {
            constexpr int PW = SEL_TILE / SEL_WARPS;
            const int h = lane % SEL_HEADS, half = lane / SEL_HEADS;
            float d[PW];
#pragma unroll
            for (int j = 0; j < PW; ++j) d[j] = 0.0f;
            if (h < nh)
                for (int c = half; c < DK / 4; c += 2) {
                    const float4 a = *(const float4*)(qs + h * DQ + 4 * c);
#pragma unroll
                    for (int j = 0; j < PW; ++j) {
                        const float4 b = *(const float4*)(ks + (warp * PW + j) * DK + 4 * c);
                        d[j] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                    }
                }
#pragma unroll
            for (int j = 0; j < PW; ++j) {
                float s = (d[j] + __shfl_xor_sync(0xffffffffu, d[j], SEL_HEADS)) * scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                if (half == 0) sc[h * SEL_TILE + warp * PW + j] = tpos[warp * PW + j] != -1 ? s : -INFINITY;
            }
        }
        __syncthreads();
        // Online softmax: warp w takes heads w, w + SEL_WARPS; lane j the tile's position j.
        for (int h = warp; h < nh; h += SEL_WARPS) {
            const float s = sc[h * SEL_TILE + lane], m0 = hm[h];
            const float m1 = fmaxf(m0, warp_max(s));
            const float e = s == -INFINITY ? 0.0f : expf(s - m1);
            const float a = m1 == -INFINITY ? 1.0f : expf(m0 - m1);
            const float sum = warp_sum(e);
            sc[h * SEL_TILE + lane] = e;
            __syncwarp();
            if (lane == 0) {
                hm[h] = m1;
                hl[h] = hl[h] * a + sum;
                ha[h] = a;
            }
        }
        __syncthreads();
        // p.v: thread tid's columns, every head.
        const int nt = min(SEL_TILE, i1 - t0);
#pragma unroll
        for (int h = 0; h < SEL_HEADS; ++h)
            if (h < nh) {
                const float a = ha[h];
#pragma unroll
                for (int c = 0; c < SEL_COLS; ++c) acc[c][h] *= a;
            }
        for (int j = 0; j < nt; ++j) {
            float v[SEL_COLS];
#pragma unroll
            for (int c = 0; c < SEL_COLS; ++c) {
                const int e = tid + c * SEL_THREADS;
                v[c] = e < dv ? vs[j * VS + e] : 0.0f;
            }
#pragma unroll
            for (int h = 0; h < SEL_HEADS; ++h)
                if (h < nh) {
                    const float w = sc[h * SEL_TILE + j];
#pragma unroll
                    for (int c = 0; c < SEL_COLS; ++c) acc[c][h] += w * v[c];
                }
        }
        __syncthreads();
    }
    // The block's output: normalised (one run), or the run's partial.
    const long long outs = (long long)gridDim.z * n_head;
#pragma unroll
    for (int h = 0; h < SEL_HEADS; ++h) {
        if (h >= nh) break;
        const long long i = (long long)r * n_head + h0 + h;
        const float m = hm[h], l = hl[h];
        float f = 1.0f;
        if (S == 1) {
            const float sink = sinks ? sinks[h0 + h] : -INFINITY, mx = fmaxf(m, sink);
            const float k = mx == -INFINITY ? 0.0f : expf(m - mx);
            const float total = l * k + (sink == -INFINITY ? 0.0f : expf(sink - mx));
            f = total > 0.0f ? k / total : 0.0f;
        } else if (tid == 0) {
            float* ml = part_ml(part, S, z, outs, i, dv);
            ml[0] = m;
            ml[1] = l;
        }
        float* o = S == 1 ? out + i * dv : part_o(part, z, outs, i, dv);
#pragma unroll
        for (int c = 0; c < SEL_COLS; ++c) {
            const int e = tid + c * SEL_THREADS;
            const float y = acc[c][h] * f;
            if (e < dv) o[e] = y;
            // Whole warps take part in the Q8_1 copy (dv a multiple of 32 when oq is set).
            if (S == 1 && oq && c * SEL_THREADS + warp * WARP < dv) quantize_lane(y, oq + (i * dv + e) / 32 * 36);
        }
    }
}

#define ATTEND_SELECT(name, T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(SEL_THREADS)                                                      \
        name(const float* q, const T* kc, const T* vc, const int* slots, const int* pos, const int* list,           \
             const int* count, int n_sel, float* out, uint8_t* oq, float* part, int n_head, int n_head_kv, int dk,  \
             int dv, int len, int n_slots, float scale, float softcap, int window, const float* sinks,              \
             int v_from_k, int* err) {                                                                             \
        KERNEL_ENTRY();                                                                                            \
        attend_select(q, kc, vc, slots, pos, list, count, n_sel, out, oq, part, n_head, n_head_kv, dk, dv, len,    \
                      n_slots, scale, softcap, window, sinks, v_from_k, SelComp{}, err);                           \
    }
ATTEND_SELECT(bl_attention_sel_f32, float)
ATTEND_SELECT(bl_attention_sel_f16, __half)

// ---- 3. the merge of S runs ---------------------------------------------------------------------

// Block i = r * n_head + h: o = sum_z w_z o_z / (sum_z w_z l_z + e^(sink - M)), w_z = e^(m_z - M),
// M the largest of the m_z and the sink; rows bl_attention_sel left unwritten stay so (`ccount`:
// the compressed rows' counts of a call that has them, else null).
extern "C" __global__ void __launch_bounds__(SEL_THREADS)
    bl_attn_sel_merge(const float* part, int S, const int* slots, const int* pos, const int* count, int n_head,
                      int dv, int len, int n_slots, int window, const float* sinks, const int* ccount, float* out,
                      uint8_t* oq) {
    KERNEL_ENTRY();
    __shared__ float wz[FA_MAX_SPLITS];
    const long long i = blockIdx.x;
    const int r = (int)(i / n_head), h = (int)(i % n_head), tid = threadIdx.x, warp = tid / WARP;
    SelRow row;
    if (!sel_row(slots, pos, count, SelComp{nullptr, nullptr, ccount, 0, 0}, r, len, n_slots, window, &row, nullptr))
        return;
    const long long outs = (long long)gridDim.x;
    if (tid == 0) {
        const float sink = sinks ? sinks[h] : -INFINITY;
        float M = sink;
        for (int z = 0; z < S; ++z) M = fmaxf(M, __ldcg(part_ml((float*)part, S, z, outs, i, dv)));
        float total = sink == -INFINITY ? 0.0f : expf(sink - M);
        for (int z = 0; z < S; ++z) {
            const float* ml = part_ml((float*)part, S, z, outs, i, dv);
            const float m = __ldcg(ml);
            wz[z] = m == -INFINITY ? 0.0f : expf(m - M);
            total += wz[z] * __ldcg(ml + 1);
        }
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int z = 0; z < S; ++z) wz[z] *= inv;
    }
    __syncthreads();
    for (int e0 = 0; e0 < dv; e0 += SEL_THREADS) {
        const int e = e0 + tid;
        float y = 0.0f;
        if (e < dv)
            for (int z = 0; z < S; ++z)
                if (wz[z] != 0.0f) y += wz[z] * __ldcg(part_o((float*)part, z, outs, i, dv) + e);
        if (e < dv) out[i * dv + e] = y;
        if (oq && e0 + warp * WARP < dv) quantize_lane(y, oq + (i * dv + e) / 32 * 36);
    }
}
