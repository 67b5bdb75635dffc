// Routed experts for decode batches (a warp per task): gate/up with the GLU into h, the hidden
// rows' quantization in the staged pair layout, and the weighted down products; and the forms
// with a sigmoid-gated shared expert as one more slot (ops/fused/moe_shared.rs). Launched by
// ops/moe.rs; included by kernels.cu after quant.cuh, with PER_WTYPE naming the weight types to
// instantiate; kernels/cuda/sim/moe_test.cpp runs it on the CPU.

// The same blocks in the staged layout of quant.cuh (STAGE_PAIR bytes per two blocks; nblocks
// even), which the routed down products read straight from global memory.
extern "C" __global__ void bl_quantize_q8_1_pairs(const float* x, uint8_t* out, long long nblocks) {
    KERNEL_ENTRY();
    const long long b = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= nblocks) return;
    uint8_t* pair = out + (b >> 1) * STAGE_PAIR;
    quantize_lane(x[b * 32 + (threadIdx.x & (WARP - 1))], pair + 16 + 32 * (b & 1), pair + 4 * (b & 1));
}

// The warp's index over the grid: a task of the one-warp-per-task kernels.
static __device__ __forceinline__ long long warp_task() {
    return (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
}

static __device__ float glu_one(float g, float u, int kind, float limit) {
    if (kind == 1) return gelu_table(g) * u;
    if (limit > 0.0f) {
        const float gc = fminf(g, limit);
        return gc * sigmoid_f(gc) * fminf(fmaxf(u, -limit), limit);
    }
    return g * sigmoid_f(g) * u;
}

// glu(grow . x, urow . x) in the pair form, reduced over the warp: each lane's chunks of the Q8_1
// row x straight from global memory (a row of a few KiB, in L1/L2), both weight rows' loads of a
// chunk issued before either is used.
template <int WT>
static __device__ __forceinline__ float glu_pair_row(const uint8_t* grow, const uint8_t* urow, const uint8_t* x,
                                                     int n_embd, int kind, float limit) {
    const int lane = threadIdx.x & (WARP - 1);
    float g = 0.0f, u = 0.0f;
    for (int c = lane; c < n_embd / 64; c += WARP) {
        const PairW<WT> gw = load_pair<WT>(grow, c), uw = load_pair<WT>(urow, c);
        const XPair xp = load_x_pair_global(x, c);
        g += dot_pair<WT>(gw, xp);
        u += dot_pair<WT>(uw, xp);
    }
    return glu_one(warp_sum(g), warp_sum(u), kind, limit);
}

// h[(r*hk + j)*n_ff + f] = glu(gate_e[f] . x_r, up_e[f] . x_r) with e = ids[r*k + j] (through map
// when given; -1 skips: h stays 0), hk >= k slots of h per row. One warp per (r, j, f). Fused
// stacks: up rows follow gate rows.
// WT >= 0: both stacks are of type WT (a compile-time constant); -1: wtype_g and wtype_u.
template <int WT>
static __device__ void moe_gate_up(long long task, const uint8_t* gate, const uint8_t* up, long long g_row,
                                   long long g_exp,
                                   long long u_row, long long u_exp, int wtype_g, int wtype_u, const void* xg,
                                   const void* xu, long long xg_row, long long xu_row, const int* ids, const int* map,
                                   float* h, int n_embd, int n_ff, int k, int rows, int n_expert, int kind, float limit,
                                   int fused, int hk, int* err) {
    if (WT >= 0) wtype_g = wtype_u = WT;
    const int lane = threadIdx.x & (WARP - 1);
    const long long total = (long long)rows * k * n_ff;
    const int f = (int)(task % n_ff);
    const long long rj = task / n_ff;
    const int r = (int)(rj / k);
    const long long hi = ((long long)r * hk + (rj - (long long)r * k)) * n_ff + f;
    // The expert's rows; a bad id is reported and an unmapped expert leaves h at 0.
    bool live = false;
    const uint8_t *grow = nullptr, *urow = nullptr;
    if (task < total) {
        int e = ids[rj];
        if (e < 0 || e >= n_expert) {
            if (lane == 0) report(err, 4);
        } else {
            if (map) e = map[e];
            if (e < 0) {
                if (lane == 0) h[hi] = 0.0f;
            } else {
                live = true;
                grow = gate + e * g_exp + (long long)f * g_row;
                urow = fused ? gate + e * g_exp + (long long)(n_ff + f) * g_row : up + e * u_exp + (long long)f * u_row;
            }
        }
    }
    if constexpr (HasPair<WT>::value) {
        // The pair form (glu_pair_row): both stacks suit it and read one activation.
        if (pairs_ok<WT>(gate, g_row, g_exp, n_embd) && (fused || pairs_ok<WT>(up, u_row, u_exp, n_embd)) && xg == xu &&
            xg_row == xu_row) {
            if (!live) return;
            const float v = glu_pair_row<WT>(grow, urow, (const uint8_t*)xg + r * xg_row, n_embd, kind, limit);
            if (lane == 0) h[hi] = v;
            return;
        }
    }
    if (!live) return;
    const uint8_t* xgr = (const uint8_t*)xg + r * xg_row;
    const uint8_t* xur = (const uint8_t*)xu + r * xu_row;
    float gv, uv;
    if (wtype_g == 0 || wtype_u == 0) {
        gv = warp_row_dot(grow, wtype_g, xgr, n_embd);
        uv = warp_row_dot(urow, wtype_u, xur, n_embd);
    } else {
        // Both rows in one pass, so their loads are in flight together.
        float g = 0.0f, u = 0.0f;
#pragma unroll 2
        for (int c = lane; c < n_embd / 32; c += WARP) {
            g += block_dot(grow, wtype_g, xgr, c);
            u += block_dot(urow, wtype_u, xur, c);
        }
        gv = warp_sum(g);
        uv = warp_sum(u);
    }
    if (lane == 0) h[hi] = glu_one(gv, uv, kind, limit);
}

#define MOE_GATE_UP_ARGS                                                                                       \
    gate, up, g_row, g_exp, u_row, u_exp, wtype_g, wtype_u, xg, xu, xg_row, xu_row, ids, map, h, n_embd, n_ff, k, \
        rows, n_expert, kind, limit, fused, hk, err
#define MOE_GATE_UP_PARAMS                                                                                      \
    const uint8_t *gate, const uint8_t *up, long long g_row, long long g_exp, long long u_row, long long u_exp,   \
        int wtype_g, int wtype_u, const void *xg, const void *xu, long long xg_row, long long xu_row,            \
        const int *ids, const int *map, float *h, int n_embd, int n_ff, int k, int rows, int n_expert, int kind, \
        float limit, int fused, int hk, int *err
// bl_moe_gate_up_<code>: both stacks of that type; bl_moe_gate_up: of two types (wtype_g, wtype_u).
// At most 64 registers, so that four blocks of 256 threads fit an SM.
#define MOE_GATE_UP_ENTRY(T)                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 4) bl_moe_gate_up_##T(MOE_GATE_UP_PARAMS) { \
        KERNEL_ENTRY();                                                                               \
        moe_gate_up<T>(warp_task(), MOE_GATE_UP_ARGS);                                                \
    }
PER_WTYPE(MOE_GATE_UP_ENTRY)
extern "C" __global__ void bl_moe_gate_up(MOE_GATE_UP_PARAMS) {
    KERNEL_ENTRY();
    moe_gate_up<-1>(warp_task(), MOE_GATE_UP_ARGS);
}

// A sigmoid-gated shared expert as slot k of the routed experts' decode kernels
// (ops/fused/moe_shared.rs): first one warp per (r, f) for h[(r*(k + 1) + k)*n_ff + f] =
// glu(sgate[f] . x_r, sup[f] . x_r) (stacks of type ST, pair form, x the routed Q8_1 rows xg) and
// one warp per row for gs[r] = gw . xf_r (the gate's F32 logit over the f32 rows xf, n_embd values
// each), then the routed warps as moe_gate_up<WT> with k + 1 slots of h per row. The shared expert
// needs no routing: with `early` (the previous kernel was the routing, which writes neither x nor
// the scratch) its warps form their values before waiting on it and only write after, and the first
// blocks, theirs, leave early for the routed ones.
#define MOE_SHARED_PARAMS \
    const uint8_t *sgate, const uint8_t *sup, long long sg_row, long long su_row, const float *gw, const float *xf, \
        float *gs, int early
template <int WT, int ST>
static __device__ void moe_gate_up_shared(MOE_GATE_UP_PARAMS, MOE_SHARED_PARAMS) {
    const long long task = warp_task(), shared = (long long)rows * n_ff + rows;
    if (task >= shared) {
        KERNEL_ENTRY();
        moe_gate_up<WT>(task - shared, MOE_GATE_UP_ARGS);
        return;
    }
    if (!early) KERNEL_ENTRY();
    const int lane = threadIdx.x & (WARP - 1);
    float v;
    float* dst;
    if (task < (long long)rows * n_ff) {
        const int r = (int)(task / n_ff), f = (int)(task % n_ff);
        v = glu_pair_row<ST>(sgate + f * sg_row, sup + f * su_row, (const uint8_t*)xg + r * xg_row, n_embd, kind,
                             limit);
        dst = h + ((long long)r * hk + k) * n_ff + f;
    } else {
        const long long r = task - (long long)rows * n_ff;
        float s = 0.0f;
        for (int i = lane; i < n_embd; i += WARP) s += gw[i] * xf[r * n_embd + i];
        v = warp_sum(s);
        dst = gs + r;
    }
    if (early) KERNEL_ENTRY();
    if (lane == 0) *dst = v;
}

// Expert slot j's row o of the down stack for row r (ids_r, r's k ids), or null: an id out of
// range (reported by bl_moe_gate_up) or unmapped.
static __device__ __forceinline__ const uint8_t* down_row(const uint8_t* down, long long d_row, long long d_exp,
                                                          const int* ids_r, const int* map, int n_expert, int o,
                                                          int j) {
    int e = ids_r[j];
    if (e < 0 || e >= n_expert) return nullptr;
    if (map) e = map[e];
    return e < 0 ? nullptr : down + e * d_exp + (long long)o * d_row;
}

// One batch of a lane's (expert slot, chunk) items of moe_down's pair form, items p0, p0 + WARP,
// ... (pj = slot j, chunk c: pair pj of row r's staged hidden rows): the weight words and routing
// weights loaded apart from their use, so that the first batch can be loaded before waiting on
// the previous kernel (the routing that wrote ids and w ran two kernels earlier).
template <int WT, int B> struct DownBatch {
    PairW<WT> wb[B];
    float wt[B];
    bool used[B];

    __device__ __forceinline__ void load(const uint8_t* down, long long d_row, long long d_exp, const int* ids_r,
                                         const int* map, const float* w_r, int n_expert, int o, int nch, int items,
                                         int p0) {
#pragma unroll
        for (int i = 0; i < B; ++i) {
            const int pj = p0 + i * WARP, j = pj / nch;
            const uint8_t* row = pj < items ? down_row(down, d_row, d_exp, ids_r, map, n_expert, o, j) : nullptr;
            used[i] = row != nullptr;
            if (row) {
                wb[i] = load_pair<WT>(row, pj - j * nch);
                wt[i] = w_r[j];
            }
        }
    }

    // Adds the batch's weighted products with the staged hidden rows hr to acc.
    __device__ __forceinline__ void dot(const uint8_t* hr, int p0, float& acc) const {
        XPair xb[B];
#pragma unroll
        for (int i = 0; i < B; ++i)
            if (used[i]) xb[i] = load_x_pair(hr, p0 + i * WARP);
#pragma unroll
        for (int i = 0; i < B; ++i)
            if (used[i]) acc += wt[i] * dot_pair<WT>(wb[i], xb[i]);
    }
};

// Batches of moe_down's pair form.
#define DOWN_B 2

// The lane's part of sum_j w_r[j] * (down_e[o] . h_(r,j)) in the pair form over the staged hidden
// rows hr, its first batch (from item `lane`) already loaded in `first`; later batches are loaded
// and used in turn.
template <int WT>
static __device__ __forceinline__ float moe_down_pairs(const DownBatch<WT, DOWN_B>& first, const uint8_t* down,
                                                       long long d_row, long long d_exp, const uint8_t* hr,
                                                       const int* ids_r, const int* map, const float* w_r, int n_ff,
                                                       int k, int n_expert, int o) {
    const int lane = threadIdx.x & (WARP - 1);
    const int nch = n_ff / 64, items = k * nch;
    float acc = 0.0f;
    first.dot(hr, lane, acc);
    for (int p0 = lane + WARP * DOWN_B; p0 < items; p0 += WARP * DOWN_B) {
        DownBatch<WT, DOWN_B> b;
        b.load(down, d_row, d_exp, ids_r, map, w_r, n_expert, o, nch, items, p0);
        b.dot(hr, p0, acc);
    }
    return acc;
}

// out[r*n_embd + o] = sum_j w[r*k + j] * (down_e[o] . h_(r,j)). One warp per (r, o); its lanes
// take the (expert slot, chunk) pairs, so every slot's loads are in flight together. hpairs: h is
// in the staged layout (bl_quantize_q8_1_pairs; the host chose it where the rows suit the pair
// form), h_row bytes per slot row and hk >= k slots per row; else Q8_1 (or f32 for F32 stacks)
// blocks.
#define MOE_DOWN_PARAMS                                                                                        \
    const uint8_t *down, long long d_row, long long d_exp, const void *hact, long long h_row, int hpairs,       \
        const int *ids, const int *map, const float *w, float *out, int n_embd, int n_ff, int k, int hk, int rows, \
        int n_expert, int *err
#define MOE_DOWN_ARGS \
    down, d_row, d_exp, hact, h_row, hpairs, ids, map, w, out, n_embd, n_ff, k, hk, rows, n_expert, err
template <int WT>
static __device__ void moe_down(MOE_DOWN_PARAMS) {
    const int lane = threadIdx.x & (WARP - 1);
    const long long task = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (task >= (long long)rows * n_embd) return;
    const int o = (int)(task % n_embd);
    const int r = (int)(task / n_embd);
    const uint8_t* hr = (const uint8_t*)hact + (long long)r * hk * h_row;
    const int* ids_r = ids + (long long)r * k;
    if (hpairs) {
        if constexpr (HasPair<WT>::value) {
            if (pairs_ok<WT>(down, d_row, d_exp, n_ff)) {
                const float* w_r = w + (long long)r * k;
                DownBatch<WT, DOWN_B> first;
                first.load(down, d_row, d_exp, ids_r, map, w_r, n_expert, o, n_ff / 64, k * (n_ff / 64), lane);
                KERNEL_ENTRY();
                const float acc =
                    warp_sum(moe_down_pairs<WT>(first, down, d_row, d_exp, hr, ids_r, map, w_r, n_ff, k, n_expert, o));
                if (lane == 0) out[task] = acc;
                return;
            }
        }
        if (lane == 0) report(err, 6);
        return;
    }
    KERNEL_ENTRY();
    const int nb = n_ff / 32;
    float acc = 0.0f;
#pragma unroll 2
    for (int pj = lane; pj < k * nb; pj += WARP) {
        const int j = pj / nb;
        const uint8_t* row = down_row(down, d_row, d_exp, ids_r, map, n_expert, o, j);
        if (row) acc += w[(long long)r * k + j] * block_dot(row, WT, hr + j * h_row, pj - j * nb);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[task] = acc;
}

// moe_down waits on the previous kernel (KERNEL_ENTRY) once it has loaded its first weights.
#define MOE_DOWN_ENTRY(T)                                              \
    extern "C" __global__ void bl_moe_down_##T(MOE_DOWN_PARAMS) { \
        moe_down<T>(MOE_DOWN_ARGS);                                    \
    }
PER_WTYPE(MOE_DOWN_ENTRY)

// The down products with the shared expert of moe_gate_up_shared as slot k (hk = k + 1 slots of
// staged h per row, the pair form only): out[r*n_embd + o] = the routed sum of moe_down +
// sigmoid(gs[r]) * (sdown[o] . h_(r,k)), sdown of type ST.
template <int WT, int ST>
static __device__ void moe_down_shared(MOE_DOWN_PARAMS, const uint8_t* sdown, long long sd_row, const float* gs) {
    const int lane = threadIdx.x & (WARP - 1);
    const long long task = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (task >= (long long)rows * n_embd) return;
    const int o = (int)(task % n_embd);
    const int r = (int)(task / n_embd);
    if (!hpairs || !pairs_ok<WT>(down, d_row, d_exp, n_ff) || !pairs_ok<ST>(sdown, sd_row, 0, n_ff)) {
        if (lane == 0) report(err, 6);
        return;
    }
    const uint8_t* hr = (const uint8_t*)hact + (long long)r * hk * h_row;
    const int *ids_r = ids + (long long)r * k, nch = n_ff / 64;
    const float* w_r = w + (long long)r * k;
    // The first batch of routed weights, and the shared row's, before waiting (as moe_down).
    DownBatch<WT, DOWN_B> first;
    first.load(down, d_row, d_exp, ids_r, map, w_r, n_expert, o, nch, k * nch, lane);
    const uint8_t* srow = sdown + o * sd_row;
    for (int c = lane * 64; c < n_ff; c += WARP * 64) prefetch_l2(srow + (long long)c / 32 * (ST == WT_Q4_K ? 18 : 34));
    KERNEL_ENTRY();
    float acc = moe_down_pairs<WT>(first, down, d_row, d_exp, hr, ids_r, map, w_r, n_ff, k, n_expert, o);
    const float sig = sigmoid_f(gs[r]);
    for (int c = lane; c < nch; c += WARP)
        acc += sig * dot_pair<ST>(load_pair<ST>(srow, c), load_x_pair(hr, k * nch + c));
    acc = warp_sum(acc);
    if (lane == 0) out[task] = acc;
}

// Entry points for the routed and shared types that have a pair form (T, S: Q8_0 or Q4_K):
// bl_moe_gate_up_sh_<T>_<S> (T the routed gate/up stacks' type) and bl_moe_down_sh_<T>_<S> (T the
// routed down stack's type).
#define MOE_SHARED_ENTRY(T, S)                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 4)                                                    \
        bl_moe_gate_up_sh_##T##_##S(MOE_GATE_UP_PARAMS, MOE_SHARED_PARAMS) {                                \
        moe_gate_up_shared<T, S>(MOE_GATE_UP_ARGS, sgate, sup, sg_row, su_row, gw, xf, gs, early);          \
    }                                                                                                       \
    extern "C" __global__ void bl_moe_down_sh_##T##_##S(MOE_DOWN_PARAMS, const uint8_t* sdown, long long sd_row, \
                                                        const float* gs) {                                  \
        moe_down_shared<T, S>(MOE_DOWN_ARGS, sdown, sd_row, gs);                                            \
    }
MOE_SHARED_ENTRY(1, 1)
MOE_SHARED_ENTRY(1, 2)
MOE_SHARED_ENTRY(2, 1)
MOE_SHARED_ENTRY(2, 2)
