// Attention over the K/V cache (Op::Attention), included by kernels.cu after its helpers (WARP,
// report, quantize_lane, KERNEL_ENTRY) and the tensor-core primitives of mma.cuh.
//
// Row r names a slot and a position p: it sees positions lo .. p of that slot (lo = p - window + 1
// with a window, else 0), position t at cache row slot * len + t % len. A slot outside the cache
// or a negative position is error 2 and more visible positions than the cache holds error 3; such
// rows are left unwritten.
//
// Two kernels: a flash form on the f16 tensor cores (K and V caches of one type, f16 or quantized
// and dequantized on load, heads of 64, 128 or 256: batches in one launch, decode split along the
// positions), and one block per (row, head) holding every score (f32 caches, other head sizes,
// and any pair of K and V types through bl_attention_kv). Values from the keys, sparse selection
// and heads above 256 take the selection form of attn_select.cuh, DeepSeek-V4's compressed rows
// its two-source kernels of attn_comp.cuh.

#include "attn_split.cuh"
#include "attn_select.cuh"
#include "attn_comp.cuh"

// One block of 128 threads per (row, head): every score (dynamic shared memory, one per visible
// position), softmax with an f64 sum (sinks included), then p.v. window 0 = unbounded.
// Head dimensions up to ATT_MAX_D.
#define ATT_MAX_D 256
// Head kvh (of d values) of cache row `row` (of `width` values): a pointer into an f32 or f16
// cache (a run-time-typed one, KvAny, has its own below).
template <typename T>
static __device__ __forceinline__ const T* head_of(const T* c, long long row, long long width, int kvh, int d) {
    return c + row * width + (long long)kvh * d;
}

template <typename K, typename V>
static __device__ void attend(const float* q, const K kc, const V vc, const int* slots, const int* pos, float* out,
                              uint8_t* oq, int n_head, int n_head_kv, int dk, int dv, int len, int n_slots, float scale,
                              float softcap, int window, const float* sinks, int* err) {
    extern __shared__ float sc[];
    __shared__ float red[128 / WARP];
    __shared__ double dred[128 / WARP];
    const int r = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int lo = visible_from(slots, pos, r, len, n_slots, window);
    if (lo < 0) {
        if (threadIdx.x == 0) report(err, -lo);
        return;
    }
    const int s = slots[r], p = pos[r], n = p - lo + 1;
    const int kvh = h / (n_head / n_head_kv);
    const float* qh = q + ((long long)r * n_head + h) * dk;
    const long long kw = (long long)dk * n_head_kv, vw = (long long)dv * n_head_kv;
    // Scores: warp w takes positions w, w + 4, ...; its lanes split the head dimension (coalesced
    // reads of each key row), q held in registers.
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP, nwarps = blockDim.x / WARP;
    float qr[ATT_MAX_D / WARP];
#pragma unroll
    for (int j = 0; j < ATT_MAX_D / WARP; ++j) qr[j] = lane + j * WARP < dk ? qh[lane + j * WARP] : 0.0f;
    float mx = -INFINITY;
    for (int i = warp; i < n; i += nwarps) {
        const int t = lo + i;
        const auto kr = head_of(kc, (long long)s * len + t % len, kw, kvh, dk);
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_MAX_D / WARP; ++j)
            if (lane + j * WARP < dk) d += qr[j] * to_f32(kr[lane + j * WARP]);
        d = warp_sum(d) * scale;
        if (softcap > 0.0f) d = softcap * tanhf(d / softcap);
        if (lane == 0) sc[i] = d;
        mx = fmaxf(mx, d);
    }
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < blockDim.x / WARP; ++w) mx = fmaxf(mx, red[w]);
    const float sink = sinks ? sinks[h] : -INFINITY;
    mx = fmaxf(mx, sink);
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(sc[i] - mx);
        sc[i] = e;
        sum += (double)e;
    }
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & (WARP - 1)) == 0) dred[threadIdx.x / WARP] = sum;
    __syncthreads();
    double total = sinks ? (double)expf(sink - mx) : 0.0;
    for (int w = 0; w < blockDim.x / WARP; ++w) total += dred[w];
    const float inv = total > 0.0 ? (float)(1.0 / total) : 0.0f;
    float* o = out + ((long long)r * n_head + h) * dv;
    for (int e = threadIdx.x; e < dv; e += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int i = 0; i < n; ++i) {
            const int t = lo + i;
            const auto vr = head_of(vc, (long long)s * len + t % len, vw, kvh, dv);
            acc += sc[i] * inv * to_f32(vr[e]);
        }
        o[e] = acc;
        // The output's Q8_1 copy for the product that reads it (dv a multiple of 32, so each
        // warp holds whole blocks).
        if (oq) quantize_lane(acc, oq + (((long long)r * n_head + h) * dv + e) / 32 * 36);
    }
}

#define ATTEND(name, K, V)                                                                                         \
    extern "C" __global__ void name(const float* q, const K* kc, const V* vc, const int* slots, const int* pos,       \
                                    float* out, uint8_t* oq, int n_head, int n_head_kv, int dk, int dv, int len,     \
                                    int n_slots, float scale, float softcap, int window, const float* sinks,         \
                                    int* err) {                                                                      \
        KERNEL_ENTRY();                                                                                              \
        attend(q, kc, vc, slots, pos, out, oq, n_head, n_head_kv, dk, dv, len, n_slots, scale, softcap, window,      \
               sinks, err);                                                                                          \
    }
ATTEND(bl_attention_f32, float, float)
ATTEND(bl_attention_f16, __half, __half)

// A cache of any kv_quant.cuh type, chosen at run time, read a value at a time (every pair of K
// and V types the fast forms do not take: mixed types, quantized heads of other sizes).
struct KvAny {
    const uint8_t* base;
    int t;
    long long row;  // bytes of a cache row (n_head_kv heads)
};
struct KvAnyHead {
    const uint8_t* p;
    int t;
    __device__ __forceinline__ float operator[](int i) const { return kv_elem(t, p, i); }
};
// Head kvh (of d values) of cache row `row` (found by argument-dependent lookup from attend).
static __device__ __forceinline__ KvAnyHead head_of(const KvAny& c, long long row, long long, int kvh, int d) {
    return {c.base + row * c.row + kv_row_bytes(c.t, (long long)kvh * d), c.t};
}

// bl_attention_kv: the scores form over K and V caches of types kt and vt (kv_quant.cuh codes).
extern "C" __global__ void bl_attention_kv(const float* q, const void* kc, const void* vc, const int* slots,
                                           const int* pos, float* out, uint8_t* oq, int n_head, int n_head_kv,
                                           int dk, int dv, int len, int n_slots, float scale, float softcap,
                                           int window, const float* sinks, int* err, int kt, int vt) {
    KERNEL_ENTRY();
    const KvAny k = {(const uint8_t*)kc, kt, kv_row_bytes(kt, (long long)dk * n_head_kv)};
    const KvAny v = {(const uint8_t*)vc, vt, kv_row_bytes(vt, (long long)dv * n_head_kv)};
    attend(q, k, v, slots, pos, out, oq, n_head, n_head_kv, dk, dv, len, n_slots, scale, softcap, window, sinks, err);
}

// ---- flash attention ------------------------------------------------------------------------------
// A block of FA_WARPS warps takes pb <= FA_ROWS (row, head) pairs of one KV head (blockIdx.y):
// pair i is row i / G, head kv_head * G + i % G (G = n_head / n_head_kv), so the heads that share
// a KV head share each staged key tile. Warp w owns pairs 16w .. 16w + 15 as the 16 rows of its
// mma tiles. Batches take pb = FA_ROWS; decode takes pb = G, a block per row, so that the rows of
// several sequences run in parallel blocks rather than one after another.
// Keys and values are staged KT positions at a time (f16 rows, as the cache holds them); the
// block walks, for each distinct slot among its rows, the union of their visible positions, and
// each row masks the positions it does not see.
//
// Split (decode): with gridDim.z = S > 1, block z takes the z-th of S equal runs of each slot's
// visible key tiles (so the work follows the positions, not the cache's length) and writes its
// unnormalized partial (o, running max, sum) per pair to `part`; the last of the S blocks of a
// (pair block, KV head) to finish, counted in `counters`, merges them (and the sinks) into the
// output and sets its counter back to zero for the next launch.
//
// Precision: q * scale and the softmax weights are split into an f16 high part and an f16
// remainder and both go through the tensor cores (the cache's f16 values times each part are exact
// in the f32 accumulators), so scores and outputs keep about 22 bits, close to the f32 reference.
// The softmax is online (a running max and sum per row, in f32).

// Key positions per staged tile, by head dimension.
#define FA_KT_64 64
#define FA_KT_128 64
#define FA_KT_256 32

// c0 and c1 (two adjacent 16 x 8 tiles) += (hi + lo) . b, b holding both tiles' operands (b[0..1],
// b[2..3]): both parts of a split operand through the tensor cores.
static __device__ __forceinline__ void mma_f16_split(float* c0, float* c1, const unsigned* hi, const unsigned* lo,
                                                     const unsigned* b) {
    mma_f16(c0, hi, b);
    mma_f16(c0, lo, b);
    mma_f16(c1, hi, b + 2);
    mma_f16(c1, lo, b + 2);
}

// (x, y) as f16 pairs hi + lo with hi + lo ~ (x, y) to about 22 bits (x in the low half).
static __device__ __forceinline__ void split_f16x2(float x, float y, unsigned* hi, unsigned* lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    *hi = *(const unsigned*)&h;
    *lo = *(const unsigned*)&l;
}

// The block's pairs pair0 .. pend - 1 (info; later entries none), then the distinct slots among
// them with the union of their visible positions (dslot, dlo, dhi; *ndist of them), by warp 0.
static __device__ __forceinline__ void flash_rows(const int* slots, const int* pos, int pair0, int pend, int G,
                                                  int len, int n_slots, int window, int* err, FaRow* info, int* dslot,
                                                  int* dlo, int* dhi, int* ndist) {
    const int tid = threadIdx.x;
    if (tid < FA_ROWS) {
        const int i = pair0 + tid;
        FaRow f = {-1, 0, -1};
        if (i < pend) {
            const int r = i / G;
            const int lo = visible_from(slots, pos, r, len, n_slots, window);
            if (lo < 0)
                report(err, -lo);
            else
                f = {slots[r], lo, pos[r]};
        }
        info[tid] = f;
    }
    __syncthreads();
    if (tid < WARP) {
        const FaRow a = info[tid], b = info[tid + WARP];
        bool da = a.slot < 0, db = b.slot < 0;
        int n = 0;
        for (;;) {
            const unsigned ma = __ballot_sync(0xffffffffu, !da), mb = __ballot_sync(0xffffffffu, !db);
            if (!ma && !mb) break;
            const int from = ma ? __ffs(ma) - 1 : WARP + __ffs(mb) - 1;
            const int s = __shfl_sync(0xffffffffu, from < WARP ? a.slot : b.slot, from % WARP);
            int lo = INT_MAX, hi = -1;
            if (!da && a.slot == s) {
                lo = a.lo;
                hi = a.hi;
                da = true;
            }
            if (!db && b.slot == s) {
                lo = min(lo, b.lo);
                hi = max(hi, b.hi);
                db = true;
            }
            lo = __reduce_min_sync(0xffffffffu, lo);
            hi = __reduce_max_sync(0xffffffffu, hi);
            if (tid == 0) {
                dslot[n] = s;
                dlo[n] = lo;
                dhi[n] = hi;
            }
            ++n;
        }
        if (tid == 0) *ndist = n;
    }
    __syncthreads();
}

template <int D, int KT, int CT>
static __device__ void flash_attend(const float* q, const uint8_t* kc, const uint8_t* vc, const int* slots,
                                    const int* pos, float* out, uint8_t* oq, float* part, int* counters, int rows,
                                    int pb, int n_head, int n_head_kv, int len, int n_slots, float scale,
                                    float softcap, int window, const float* sinks, int* err) {
    // Halfs per staged row: 16 bytes of padding put the 8 rows of an ldmatrix on distinct banks.
    constexpr int LD = D + 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __half* qh = (__half*)fa_smem;  // FA_ROWS x LD: high parts of q * scale
    __half* ql = qh + FA_ROWS * LD;  // FA_ROWS x LD: remainders
    __half* ks = ql + FA_ROWS * LD;  // KT x LD
    __half* vs = ks + KT * LD;       // KT x LD
    __shared__ FaRow info[FA_ROWS];
    __shared__ int dslot[FA_ROWS], dlo[FA_ROWS], dhi[FA_ROWS];
    __shared__ int ndist;

    const int G = n_head / n_head_kv, kvh = blockIdx.y;
    // The block's pairs are pair0 .. pend - 1; the last pairs see the most positions: their
    // blocks start first. Only the warps holding pairs stage q.
    const int pair0 = (gridDim.x - 1 - blockIdx.x) * pb, pend = min(rows * G, pair0 + pb);
    const int tid = threadIdx.x, lane = tid & (WARP - 1), warp = tid / WARP, g = lane >> 2, t = lane & 3;

    for (int e = tid; e < min(FA_ROWS, (pb + 15) / 16 * 16) * D / 2; e += blockDim.x) {
        const int m = e / (D / 2), d = (e % (D / 2)) * 2, i = pair0 + m;
        float2 v = make_float2(0.0f, 0.0f);
        if (i < pend) {
            v = *(const float2*)(q + ((long long)(i / G) * n_head + kvh * G + i % G) * D + d);
            v.x *= scale;
            v.y *= scale;
        }
        unsigned hi, lo;
        split_f16x2(v.x, v.y, &hi, &lo);
        *(unsigned*)(qh + m * LD + d) = hi;
        *(unsigned*)(ql + m * LD + d) = lo;
    }
    flash_rows(slots, pos, pair0, pend, G, len, n_slots, window, err, info, dslot, dlo, dhi, &ndist);

    // This lane's two rows of the warp's tile: g and g + 8.
    const FaRow ra = info[warp * 16 + g], rb = info[warp * 16 + g + 8];
    // ldmatrix addresses: q as the A operand (lane i: row i % 16, column 8 * (i / 16)); keys as
    // the B operand of q.k (lane i: key i % 8 + 8 * (i / 16), dimension 8 * (i / 8 % 2)); values
    // transposed as the B operand of p.v (lane i: key i % 8 + 8 * (i / 8 % 2), dimension 8 * (i / 16)).
    const unsigned qa_hi = smem_addr(qh + (warp * 16 + (lane & 15)) * LD + 8 * (lane >> 4));
    const unsigned qa_lo = smem_addr(ql + (warp * 16 + (lane & 15)) * LD + 8 * (lane >> 4));
    const unsigned ka = smem_addr(ks + ((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1));
    const unsigned va = smem_addr(vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4));

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Running max and this lane's part of the running sum of each row; a sink starts the row with
    // its own term, exp(sink - sink) = 1, counted once (lane t == 0).
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;
    const int S = gridDim.z, z = blockIdx.z;
    if (sinks && S == 1) {
        const int iA = pair0 + warp * 16 + g, iB = iA + 8;
        if (ra.slot >= 0) {
            mA = sinks[kvh * G + iA % G];
            lA = t == 0 ? 1.0f : 0.0f;
        }
        if (rb.slot >= 0) {
            mB = sinks[kvh * G + iB % G];
            lB = t == 0 ? 1.0f : 0.0f;
        }
    }

    for (int di = 0; di < ndist; ++di) {
        const int s = dslot[di], k0 = dlo[di], k1 = dhi[di];
        const bool inA = ra.slot == s, inB = rb.slot == s;
        // This split's run of the slot's tiles: whole tiles from k0, so only the slot's last tile
        // holds positions past `last`, all of them past every row's own.
        const int ntiles = (k1 - k0) / KT + 1, per = (ntiles + S - 1) / S;
        const int first = k0 + min(ntiles, z * per) * KT, last = min(k1, k0 + (z + 1) * per * KT - 1);
        for (int t0 = first; t0 <= last; t0 += KT) {
            // The tile's keys and values, every copy in flight at once (zeros past `last`).
            __syncthreads();
            for (int c = tid; c < KT * D / 8; c += blockDim.x) {
                const int i = c / (D / 8), part = (c % (D / 8)) * 8, tt = t0 + i;
                const bool ok = tt <= last;
                const long long row = ok ? ((long long)s * len + tt % len) * n_head_kv + kvh : 0;
                using CR = KvRead<CT>;
                if constexpr (CR::F16) {
                    cp_async16(smem_addr(ks + i * LD + part), kc + row * D * 2 + part * 2, ok);
                    cp_async16(smem_addr(vs + i * LD + part), vc + row * D * 2 + part * 2, ok);
                } else {
                    // Quantized caches: dequantized on load, staged as f16 for the tensor cores.
                    float f[8];
                    __half2 h[4];
                    const uint8_t* rows[2] = {kc, vc};
                    __half* dst[2] = {ks + i * LD + part, vs + i * LD + part};
#pragma unroll
                    for (int kv = 0; kv < 2; ++kv) {
                        CR::decode(ok ? CR::load(rows[kv] + row * CR::row_bytes(D), part) : make_uint4(0, 0, 0, 0), f);
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            h[j] = ok ? __floats2half2_rn(f[2 * j], f[2 * j + 1]) : __floats2half2_rn(0.0f, 0.0f);
                        *(uint4*)dst[kv] = *(const uint4*)h;
                    }
                }
            }
            cp_async_wait_all();
            __syncthreads();
            const bool live = (inA && ra.lo < t0 + KT && ra.hi >= t0) || (inB && rb.lo < t0 + KT && rb.hi >= t0);
            if (!__any_sync(0xffffffffu, live)) continue;

            float sc[KT / 8][4];
#pragma unroll
            for (int n = 0; n < KT / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                unsigned ah[4], al[4];
                ldsm_x4(ah, qa_hi + kk * 32);
                ldsm_x4(al, qa_lo + kk * 32);
#pragma unroll
                for (int n = 0; n < KT / 8; n += 2) {
                    unsigned b[4];
                    ldsm_x4(b, ka + (n * 8 * LD + kk * 16) * 2);
                    mma_f16_split(sc[n], sc[n + 1], ah, al, b);
                }
            }
            // Softcap, mask, and the rows' maxima over the tile (the four lanes of a row).
            float xA = -INFINITY, xB = -INFINITY;
#pragma unroll
            for (int n = 0; n < KT / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int tt = t0 + n * 8 + 2 * t + (e & 1);
                    const bool ok = e < 2 ? inA && tt >= ra.lo && tt <= ra.hi : inB && tt >= rb.lo && tt <= rb.hi;
                    float v = sc[n][e];
                    if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
                    v = ok ? v : -INFINITY;
                    sc[n][e] = v;
                    if (e < 2)
                        xA = fmaxf(xA, v);
                    else
                        xB = fmaxf(xB, v);
                }
#pragma unroll
            for (int o2 = 1; o2 < 4; o2 <<= 1) {
                xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, o2));
                xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, o2));
            }
            const float nA = fmaxf(mA, xA), nB = fmaxf(mB, xB);
            const float cA = nA == -INFINITY ? 1.0f : expf(mA - nA), cB = nB == -INFINITY ? 1.0f : expf(mB - nB);
            mA = nA;
            mB = nB;
            lA *= cA;
            lB *= cB;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                o[n][0] *= cA;
                o[n][1] *= cA;
                o[n][2] *= cB;
                o[n][3] *= cB;
            }
#pragma unroll
            for (int n = 0; n < KT / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float v = sc[n][e];
                    const float p = v == -INFINITY ? 0.0f : expf(v - (e < 2 ? nA : nB));
                    sc[n][e] = p;
                    if (e < 2)
                        lA += p;
                    else
                        lB += p;
                }
            // o += p . v, p as the A operand straight from the score accumulators (two key
            // octets of a 16-key step).
#pragma unroll
            for (int kk = 0; kk < KT / 16; ++kk) {
                unsigned ph[4], pl[4];
                split_f16x2(sc[2 * kk][0], sc[2 * kk][1], &ph[0], &pl[0]);
                split_f16x2(sc[2 * kk][2], sc[2 * kk][3], &ph[1], &pl[1]);
                split_f16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], &ph[2], &pl[2]);
                split_f16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], &ph[3], &pl[3]);
#pragma unroll
                for (int n = 0; n < D / 8; n += 2) {
                    unsigned b[4];
                    ldsm_x4_t(b, va + (kk * 16 * LD + n * 8) * 2);
                    mma_f16_split(o[n], o[n + 1], ph, pl, b);
                }
            }
        }
    }

    // Each row's sum over its four lanes, then o / sum to the output (and its Q8_1 copy, 32-value
    // blocks of which the row's four lanes hold 8 values each, quantized as quantize_lane does).
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        lA += __shfl_xor_sync(0xffffffffu, lA, o2);
        lB += __shfl_xor_sync(0xffffffffu, lB, o2);
    }
    if (S > 1) {
        const long long outs = (long long)rows * n_head;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if ((half ? rb : ra).slot < 0) continue;
            const int i = pair0 + warp * 16 + g + 8 * half;
            const long long orow = (long long)(i / G) * n_head + kvh * G + i % G;
            float* po = part_o(part, z, outs, orow, D);
#pragma unroll
            for (int n = 0; n < D / 8; ++n) *(float2*)(po + n * 8 + 2 * t) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
            if (t == 0) *(float2*)part_ml(part, S, z, outs, orow, D) = half ? make_float2(mB, lB) : make_float2(mA, lA);
        }
        // The last split block of this (pair block, KV head) merges.
        if (!last_split_block(counters + blockIdx.y * gridDim.x + blockIdx.x, S)) return;
        __shared__ int zrun[2 * FA_ROWS];
        flash_merge<D>(part, S, S, outs, FA_ROWS, pair0, G, n_head, kvh, info, sinks, (float*)fa_smem, zrun, out,
                       oq);
        return;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const bool ok = (half ? rb : ra).slot >= 0;
        const float l = half ? lB : lA;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int i = pair0 + warp * 16 + g + 8 * half;
        const long long orow = ok ? ((long long)(i / G) * n_head + kvh * G + i % G) * D : 0;
#pragma unroll
        for (int b = 0; b < D / 32; ++b) {
            float v[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                v[2 * j] = o[4 * b + j][2 * half] * inv;
                v[2 * j + 1] = o[4 * b + j][2 * half + 1] * inv;
                if (ok) *(float2*)(out + orow + (4 * b + j) * 8 + 2 * t) = make_float2(v[2 * j], v[2 * j + 1]);
            }
            if (oq) {
                float amax = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
                int qv[8], sum = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    qv[j] = __float2int_rn(v[j] * id);
                    sum += qv[j];
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                if (ok) {
                    uint8_t* blk = oq + (orow / 32 + b) * 36;
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        *(uint16_t*)(blk + 4 + j * 8 + 2 * t) =
                            (uint16_t)((uint8_t)(int8_t)qv[2 * j] | ((uint8_t)(int8_t)qv[2 * j + 1] << 8));
                    if (t == 0) {
                        const float d = amax / 127.0f;
                        *(__half2*)blk = __halves2half2(__float2half_rn(d), __float2half_rn((float)sum * d));
                    }
                }
            }
        }
    }
}

// bl_flash_attn_<type>_<D>: K and V caches of one type (f16 copied to shared memory as it is; q8_0
// and q4_0 dequantized on load to f16; the other types take bl_attention_kv), dk = dv = D. Grid (ceil(rows * G /
// pb), n_head_kv, splits), pb <= FA_ROWS pairs per block, FA_WARPS warps, dynamic shared memory
// (2 * FA_ROWS + 2 * KT) * (D + 8) * 2 bytes; with more than one split, part holds their partials
// and counters one zeroed int per (x, y) block.
#define FLASH_ATTEND(NAME, T, D)                                                                                   \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * WARP)                                                 \
        bl_flash_attn_##NAME##_##D(const float* q, const void* kc, const void* vc, const int* slots, const int* pos, \
                                   float* out, uint8_t* oq, float* part, int* counters, int rows, int pb,          \
                                   int n_head, int n_head_kv, int len, int n_slots, float scale, float softcap,   \
                                   int window, const float* sinks, int* err) {                                     \
        KERNEL_ENTRY();                                                                                            \
        flash_attend<D, FA_KT_##D, T>(q, (const uint8_t*)kc, (const uint8_t*)vc, slots, pos, out, oq, part,       \
                                      counters, rows, pb, n_head, n_head_kv, len, n_slots, scale, softcap, window, \
                                      sinks, err);                                                                 \
    }
#define FLASH_ATTEND_SIZES(NAME, T) FLASH_ATTEND(NAME, T, 64) FLASH_ATTEND(NAME, T, 128) FLASH_ATTEND(NAME, T, 256)
FLASH_ATTEND_SIZES(f16, KV_F16)
FLASH_ATTEND_SIZES(q8_0, KV_Q8_0)
FLASH_ATTEND_SIZES(q4_0, KV_Q4_0)
