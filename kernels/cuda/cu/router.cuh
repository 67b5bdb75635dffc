// F32 products with few outputs (routers, gates) and MoE routing: the router's top-k and weights,
// and the router's logits fused with them. Included by kernels.cu after its helpers (common.cuh);
// kernels/cuda/sim/router_test.cpp runs it on the CPU.

// The same product for few (j, c) pairs (routers, gates: n of 1 to a few hundred at decode): one
// block of SPLIT_THREADS per pair splits k, so that a small product still fills the card.
#define SPLIT_THREADS 128

// The sum of wr[i] * xr[i] over i < k by the block's first SPLIT_THREADS threads (each a strided
// share, then warp sums, then the warps' sums in order), returned to thread 0: the order both
// split products keep. Every thread of the block must call it.
static __device__ float split_dot(const float* wr, const float* xr, int k) {
    __shared__ float part[SPLIT_THREADS / WARP];
    if (threadIdx.x < SPLIT_THREADS) {
        float s = 0.0f;
#pragma unroll 4
        for (int i = threadIdx.x; i < k; i += SPLIT_THREADS) s += wr[i] * xr[i];
        s = warp_sum(s);
        if ((threadIdx.x & (WARP - 1)) == 0) part[threadIdx.x / WARP] = s;
    }
    __syncthreads();
    float t = 0.0f;
    if (threadIdx.x == 0)
#pragma unroll
        for (int i = 0; i < SPLIT_THREADS / WARP; i++) t += part[i];
    return t;
}

extern "C" __global__ void bl_matmul_f32_split(const uint8_t* w, long long w_stride, const float* x, float* y, int k,
                                               int n, int m) {
    KERNEL_ENTRY();
    const long long task = blockIdx.x;
    if (task >= (long long)n * m) return;
    const int j = (int)(task % n), c = (int)(task / n);
    const float t = split_dot((const float*)(w + (long long)j * w_stride), x + (long long)c * k, k);
    if (threadIdx.x == 0) y[(long long)c * n + j] = t;
}

// The sigmoid-gated shared expert added to the routed experts' sum (qwen35moe's FFN output): per
// row c, s = sigmoid(w . x_c) as bl_matmul_f32_split and the Unary form it, then out_c = moe_c +
// sh_c * s as the Mul and the Add would: four calls in one launch. Grid (row, slice): every block
// of a row forms s and writes its slice of the row. Each thread writes only indices it read, so
// out may be sh or moe itself; with one slice per row every write follows a barrier after all
// reads of x_c, so out may then be x as well.
extern "C" __global__ void bl_gated_add_f32(const float* w, const float* x, const float* sh, const float* moe,
                                            float* out, int k) {
    KERNEL_ENTRY();
    __shared__ float gate;
    const long long row = (long long)blockIdx.x * k;
    const float t = split_dot(w, x + row, k);
    if (threadIdx.x == 0) gate = sigmoid_f(t);
    __syncthreads();
    const float s = gate;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < k; i += gridDim.y * blockDim.x)
        out[row + i] = moe[row + i] + sh[row + i] * s;
}

// ---- MoE routing: one warp per row; lane l holds experts l, l + 32, ... (n_expert <= 32 * PER, PER
// the smallest of 4, 8, 16 that holds them, chosen per launch by WITH_ROUTE_PER)
// gating: 0 softmax, 1 sigmoid, 2 softmax over the selected, 3 sqrt(softplus)

// Runs CALL with PER, a compile-time constant: the experts each lane holds.
#define WITH_ROUTE_PER(n, CALL)        \
    if ((n) <= 4 * WARP) {             \
        constexpr int PER = 4;         \
        CALL;                          \
    } else if ((n) <= 8 * WARP) {      \
        constexpr int PER = 8;         \
        CALL;                          \
    } else {                           \
        constexpr int PER = 16;        \
        CALL;                          \
    }

static __device__ float gate_score(float l, int gating, float mx, float inv_sum) {
    switch (gating) {
        case 0: return expf(l - mx) * inv_sum;
        case 1: return sigmoid_f(l);
        case 2: return l;
        default: return sqrtf(fmaxf(l, 0.0f) + log1pf(expf(-fabsf(l))));
    }
}

// Softmax max and 1/sum over a row held across the warp (f64 sum, like the CPU kernels).
template <int PER>
static __device__ void warp_softmax_stats(const float* v, int n, float* mx, float* inv_sum) {
    const int lane = threadIdx.x & (WARP - 1);
    float m = -INFINITY;
#pragma unroll
    for (int t = 0; t < PER; ++t)
        if (lane + t * WARP < n) m = fmaxf(m, v[t]);
    m = warp_max(m);
    double s = 0.0;
#pragma unroll
    for (int t = 0; t < PER; ++t)
        if (lane + t * WARP < n) s += (double)expf(v[t] - m);
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    *mx = m;
    *inv_sum = (float)(1.0 / s);
}

// Top-k of score + bias (the lower id wins ties; NaN ranks lowest), best first, of one row held by
// a warp: writes ids[0 .. k) and returns choice `lane` to lanes below k.
// With softmax gating, its max and 1/sum go to *mx and *inv.
template <int PER>
static __device__ int router_topk_row(const float* row, const float* bias, int* ids, int n_expert, int k, int gating,
                                      float* mx_out, float* inv_out) {
    const int lane = threadIdx.x & (WARP - 1);
    float v[PER];
#pragma unroll
    for (int t = 0; t < PER; ++t) {
        const int e = lane + t * WARP;
        v[t] = e < n_expert ? row[e] : -INFINITY;
    }
    float mx = 0.0f, inv = 1.0f;
    if (gating == 0) warp_softmax_stats<PER>(v, n_expert, &mx, &inv);
    *mx_out = mx;
    *inv_out = inv;
    float key[PER];
#pragma unroll
    for (int t = 0; t < PER; ++t) {
        const int e = lane + t * WARP;
        float kk = -INFINITY;
        if (e < n_expert) {
            kk = gate_score(v[t], gating, mx, inv) + (bias ? bias[e] : 0.0f);
            if (isnan(kk)) kk = -INFINITY;
        }
        key[t] = kk;
    }
    unsigned taken = 0;
    int mine = 0;
    for (int j = 0; j < k; ++j) {
        float bk = -INFINITY;
        int be = 0x7fffffff;
#pragma unroll
        for (int t = 0; t < PER; ++t) {
            const int e = lane + t * WARP;
            if (e < n_expert && !(taken >> t & 1u) && (be == 0x7fffffff || key[t] > bk)) {
                bk = key[t];
                be = e;
            }
        }
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) {
            const float ok = __shfl_xor_sync(0xffffffffu, bk, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe != 0x7fffffff && (be == 0x7fffffff || ok > bk || (ok == bk && oe < be))) {
                bk = ok;
                be = oe;
            }
        }
        if (be == 0x7fffffff) be = 0;
        if ((be & (WARP - 1)) == lane) taken |= 1u << (be / WARP);
        if (lane == 0) ids[j] = be;
        if (lane == j) mine = be;
    }
    return mine;
}

extern "C" __global__ void bl_router_topk(const float* logits, const float* bias, int* ids, int n_expert, int k, int rows,
                                          int gating) {
    KERNEL_ENTRY();
    const int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= rows) return;
    float mx, inv;
    WITH_ROUTE_PER(n_expert, (router_topk_row<PER>(logits + (long long)r * n_expert, bias, ids + (long long)r * k,
                                                   n_expert, k, gating, &mx, &inv)))
}

// Weights of the chosen experts: gating scores (softmax over all, or over the chosen), optional
// renormalisation (sum raised to norm_min) and scale, of one row held by a warp whose lane j < k
// holds choice e; lane j < k writes o[j]. `stats`: the softmax max and 1/sum are known (mx, inv).
template <int PER>
static __device__ void router_weights_row(const float* row, int e, float* o, int n_expert, int k, int gating, int norm,
                                          float norm_min, float scale, int* err, bool stats, float mx, float inv) {
    const int lane = threadIdx.x & (WARP - 1);
    const bool bad = lane < k && (e < 0 || e >= n_expert);
    if (__any_sync(0xffffffffu, bad)) {
        if (lane == 0) report(err, 4);
        return;
    }
    const float l = lane < k ? row[e] : -INFINITY;
    float w = 0.0f;
    if (gating == 2) {
        const float m = warp_max(l);
        double s = lane < k ? (double)expf(l - m) : 0.0;
#pragma unroll
        for (int off = WARP / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane < k) w = expf(l - m) * (float)(1.0 / s);
    } else {
        if (gating == 0 && !stats) {
            float v[PER];
#pragma unroll
            for (int t = 0; t < PER; ++t) {
                const int x = lane + t * WARP;
                v[t] = x < n_expert ? row[x] : -INFINITY;
            }
            warp_softmax_stats<PER>(v, n_expert, &mx, &inv);
        }
        if (lane < k) w = gate_score(l, gating, mx, inv);
    }
    if (norm) {
        // Summed in expert-slot order, as the CPU kernels do.
        float s = 0.0f;
        for (int j = 0; j < k; ++j) s += __shfl_sync(0xffffffffu, w, j);
        s = fmaxf(s, norm_min);
        w /= s;
    }
    if (scale != 0.0f && scale != 1.0f) w *= scale;
    if (lane < k) o[lane] = w;
}


// One warp per row.
extern "C" __global__ void bl_router_weights(const float* logits, const int* ids, float* out, int n_expert, int k,
                                             int rows, int gating, int norm, float norm_min, float scale, int* err) {
    KERNEL_ENTRY();
    const int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x & (WARP - 1);
    if (r >= rows) return;
    const int e = lane < k ? ids[(long long)r * k + lane] : 0;
    WITH_ROUTE_PER(n_expert, (router_weights_row<PER>(logits + (long long)r * n_expert, e, out + (long long)r * k,
                                                      n_expert, k, gating, norm, norm_min, scale, err, false, 0.0f,
                                                      1.0f)))
}

// The maximum over the block of every thread's v, returned to all threads (blocks of whole warps).
static __device__ float block_max(float v) {
    __shared__ float part[1024 / WARP];
    v = warp_max(v);
    if ((threadIdx.x & (WARP - 1)) == 0) part[threadIdx.x / WARP] = v;
    __syncthreads();
    float m = part[0];
    for (int w = 1; w < (int)blockDim.x / WARP; ++w) m = fmaxf(m, part[w]);
    __syncthreads();
    return m;
}

// RouterTopK and RouterWeights of the same logits as one kernel (ops/fused/routing.rs): one block
// per row of round_up(n_expert, 32) threads (n_expert <= 512), a thread per expert. An expert's
// rank is the number of experts ahead of it (a higher key, or an equal key and a lower id; NaN
// ranks lowest), so the top k come from one pass of comparisons instead of k rounds of a warp-wide
// arg-max; then warp 0 writes ids and weights as bl_router_weights does, the softmax statistics
// reused.
// The body of bl_router_topk_weights for one row of logits (`row`, in global or shared memory),
// writing its k ids and weights; every thread of the block (at least n_expert) calls it.
static __device__ void router_topk_weights_row(const float* row, const float* bias, int* ids, float* out, int n_expert,
                                               int k, int gating, int norm, float norm_min, float scale, int* err) {
    __shared__ float keys[512];
    __shared__ int chosen[WARP];
    const int e = threadIdx.x;
    const bool live = e < n_expert;
    const float l = live ? row[e] : -INFINITY;
    const float b = live && bias ? bias[e] : 0.0f;
    float mx = 0.0f, inv = 1.0f;
    if (gating == 0) {
        mx = block_max(l);
        inv = (float)(1.0 / block_sum_f64(live ? (double)expf(l - mx) : 0.0));
    }
    if (live) {
        const float key = gate_score(l, gating, mx, inv) + b;
        keys[e] = isnan(key) ? -INFINITY : key;
    }
    __syncthreads();
    if (live) {
        const float key = keys[e];
        int rank = 0;
#pragma unroll 8
        for (int j = 0; j < n_expert; ++j) {
            const float o = keys[j];
            rank += (o > key) | ((o == key) & (j < e));
        }
        if (rank < k) chosen[rank] = e;
    }
    __syncthreads();
    if (e >= WARP) return;
    const int c = e < k ? chosen[e] : 0;
    if (e < k) ids[e] = c;
    // The statistics are known, so router_weights_row does not read the row through PER.
    router_weights_row<4>(row, c, out, n_expert, k, gating, norm, norm_min, scale, err, true, mx, inv);
}

extern "C" __global__ void bl_router_topk_weights(const float* logits, const float* bias, int* ids, float* out,
                                                  int n_expert, int k, int rows, int gating, int norm, float norm_min,
                                                  float scale, int* err) {
    KERNEL_ENTRY();
    const int r = blockIdx.x;
    if (r >= rows) return;
    router_topk_weights_row(logits + (long long)r * n_expert, bias, ids + (long long)r * k, out + (long long)r * k,
                            n_expert, k, gating, norm, norm_min, scale, err);
}

// The router's logits and then its choice, as one kernel (ops/fused/routing.rs): block b computes
// logit b % n_expert of row b / n_expert as bl_matmul_f32_split does (its first SPLIT_THREADS
// threads, the same sums in the same order), and the last block of a row to finish (a counter per
// row in `counters`, which it sets back to zero) runs bl_router_topk_weights' body on that row.
// Blocks of max(SPLIT_THREADS, n_expert rounded up to a warp) threads, n_expert <= 512; rows <= the
// counters.
extern "C" __global__ void bl_router_logits_topk(const uint8_t* w, long long w_stride, const float* x, int n_embd,
                                                 float* logits, const float* bias, int* ids, float* out, int n_expert,
                                                 int k, int gating, int norm, float norm_min, float scale, int* err,
                                                 int* counters) {
    __shared__ float row[512];
    __shared__ bool last;
    const int j = blockIdx.x % n_expert, r = blockIdx.x / n_expert;
    const uint8_t* wj = w + (long long)j * w_stride;
    // The logit's weights into L2 while the previous kernel finishes.
    for (long long b = (long long)threadIdx.x * 128; b < (long long)n_embd * 4; b += (long long)blockDim.x * 128)
        prefetch_l2(wj + b);
    KERNEL_ENTRY();
    const float t = split_dot((const float*)wj, x + (long long)r * n_embd, n_embd);
    if (threadIdx.x == 0) {
        logits[(long long)r * n_expert + j] = t;
        // The logit is visible before the count that may let another block read it.
        __threadfence();
        last = atomicAdd(&counters[r], 1) == n_expert - 1;
        if (last) counters[r] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Every block's logit of this row, read past L1 (written by other blocks).
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) row[e] = __ldcg(logits + (long long)r * n_expert + e);
    __syncthreads();
    router_topk_weights_row(row, bias, ids + (long long)r * k, out + (long long)r * k, n_expert, k, gating, norm,
                            norm_min, scale, err);
}

// ---- TopK: the k largest entries of each row (k <= TOPK_MAX), largest first, ties to the lower
// index, in the order of Rust's f32::total_cmp as the CPU kernels rank them (-NaN < -inf < -0 < +0
// < +inf < +NaN). One block of TOPK_THREADS per row, for rows as long as a vocabulary (a draft
// step's choice over 248,320 logits). An entry and its index rank as one 64-bit key, never 0, all
// distinct. Each warp keeps the best k of the entries it reads spread over its lanes (lane j holds
// the j-th), in registers: a round of 32 x TOPK_LOADS loads is ranked against the warp's k-th best
// with one ballot, and only entries above it (after the first few rounds, almost none of a
// vocabulary) are inserted, one shuffle step each. The warps' lists then meet in shared memory,
// where each candidate's rank among them is its place in the answer. (The form before kept each
// thread's best in an array that the compiler put in local memory: an entry above a thread's k-th
// best shifted it with dependent local loads, 0.29 ms over 248,320 logits on an H100; with 256
// threads and one load in flight each, 0.67 ms.)
#define TOPK_MAX 16
#define TOPK_THREADS 1024
#define TOPK_LOADS 16

// The rank of entry i of value v: v's bits in total order above the index's complement.
static __device__ __forceinline__ unsigned long long topk_key(float v, int i) {
    const unsigned b = __float_as_uint(v);
    const unsigned ordered = (b >> 31) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)ordered << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned)i);
}

// Ranks this lane's `key` against the warp's best k (`best`: lane j's is the j-th, highest first,
// 0 where the warp has fewer; `floor` lane k - 1's), inserting each lane's key that is above it.
static __device__ __forceinline__ void topk_offer(unsigned long long& best, unsigned long long& floor, int k,
                                                  unsigned long long key) {
    const int lane = threadIdx.x & (WARP - 1);
    unsigned above = __ballot_sync(0xffffffffu, key > floor);
    while (above) {
        const int src = __ffs((int)above) - 1;
        above &= above - 1;
        const unsigned long long c = __shfl_sync(0xffffffffu, key, src);
        if (c <= floor) continue;  // an earlier insertion raised the floor past it
        // c's place is the first j whose entry is below it; entries from there move down one.
        const unsigned long long prev = __shfl_up_sync(0xffffffffu, best, 1);
        const unsigned long long up = lane == 0 ? ~0ull : prev;
        if (best < c) best = up > c ? c : up;
        floor = __shfl_sync(0xffffffffu, best, k - 1);
    }
}

// ids[r * k + j] = the j-th largest of row r of x (n entries a row); blocks of TOPK_THREADS.
extern "C" __global__ void bl_top_k(const float* x, int* ids, int n, int k) {
    KERNEL_ENTRY();
    __shared__ unsigned long long cand[TOPK_THREADS / WARP * TOPK_MAX];
    const float* row = x + (long long)blockIdx.x * n;
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP, warps = (int)blockDim.x / WARP;
    unsigned long long best = 0, floor = 0;
    // Warp w reads rounds of WARP * TOPK_LOADS consecutive entries, every warps-th round; a warp's
    // loads of one u are one 128-byte line.
    const long long round = (long long)WARP * TOPK_LOADS;
    for (long long base = warp * round; base < n; base += warps * round) {
        float v[TOPK_LOADS];
#pragma unroll
        for (int u = 0; u < TOPK_LOADS; ++u) {
            const long long i = base + u * WARP + lane;
            v[u] = i < n ? row[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < TOPK_LOADS; ++u) {
            const long long i = base + u * WARP + lane;
            topk_offer(best, floor, k, i < n ? topk_key(v[u], (int)i) : 0ull);
        }
    }
    if (lane < k) cand[warp * k + lane] = best;
    __syncthreads();
    // A candidate's rank among all (distinct keys; the 0s of short lists rank after the k real
    // ones, since k <= n) is its place in the answer.
    const int total = warps * k;
    for (int t = threadIdx.x; t < total; t += blockDim.x) {
        const unsigned long long key = cand[t];
        int rank = 0;
        for (int o = 0; o < total; ++o) rank += cand[o] > key;
        if (rank < k) ids[(long long)blockIdx.x * k + rank] = (int)(0xFFFFFFFFu - (unsigned)(key & 0xFFFFFFFFull));
    }
}
