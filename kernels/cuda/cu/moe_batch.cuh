// Routed experts for prompt batches, around the tiled products of kernels.cu: the route table
// (each stack expert's entries in order), the list of column tiles, the GLU of the gate | up
// products straight into Q8_1, and the weighted combine of the down products. Included by
// kernels.cu after moe.cuh with MMQ_BN defined; kernels/cuda/sim/moe_batch_test.cpp runs it on
// the CPU.

#pragma once

// The inclusive prefix sum of v over the warp's lanes.
static __device__ __forceinline__ int warp_prefix(int v) {
    const int lane = threadIdx.x & (WARP - 1);
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

// The exclusive prefix sum of v over the block's threads (blockDim.x a multiple of WARP, at most
// 1024) and, in *total, the sum of all. Every thread calls it; the block must pass a barrier
// before calling it again.
static __device__ int block_prefix(int v, int* total) {
    __shared__ int warp_total[1024 / WARP];
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    const int incl = warp_prefix(v);
    if (lane == WARP - 1) warp_total[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int t = warp_prefix(lane < nw ? warp_total[lane] : 0);
        if (lane < nw) warp_total[lane] = t;
    }
    __syncthreads();
    *total = warp_total[nw - 1];
    return incl - v + (warp > 0 ? warp_total[warp - 1] : 0);
}

// Threads of bl_moe_route: a chunk of ROUTE_THREADS * WARP entries a round.
#define ROUTE_THREADS 1024

// The route table by stack expert: block e lists, in order, the entries r * k + j whose expert
// (through map when given) is e, and count[e]. Bad ids are reported (error 4) and listed nowhere.
// A round marks a chunk's hits as bit words (a warp's ballot per 32 entries, coalesced loads);
// thread t then owns word t, and one prefix sum over the block places every thread's hits.
extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
    bl_moe_route(const int* ids, const int* map, int entries, int n_expert, int* list, long long list_stride,
                 int* count, int* err) {
    KERNEL_ENTRY();
    __shared__ unsigned hits[ROUTE_THREADS];
    const int e = blockIdx.x, lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP;
    const int nw = blockDim.x / WARP;
    int* out = list + e * list_stride;
    int base = 0;
    for (int c0 = 0; c0 < entries; c0 += WARP * (int)blockDim.x) {
        const int words = min((int)blockDim.x, (entries - c0 + WARP - 1) / WARP);
#pragma unroll 4
        for (int w = warp; w < words; w += nw) {
            const int i = c0 + w * WARP + lane;
            bool hit = false;
            if (i < entries) {
                int x = ids[i];
                if (x < 0 || x >= n_expert) {
                    if (e == 0) report(err, 4);
                } else {
                    if (map) x = map[x];
                    hit = x == e;
                }
            }
            const unsigned bal = __ballot_sync(0xffffffffu, hit);
            if (lane == 0) hits[w] = bal;
        }
        __syncthreads();
        const unsigned mine = (int)threadIdx.x < words ? hits[threadIdx.x] : 0u;
        int total;
        int at = base + block_prefix(__popc(mine), &total);
        for (unsigned m = mine; m; m &= m - 1u) out[at++] = c0 + (int)threadIdx.x * WARP + (__ffs((int)m) - 1);
        base += total;
        __syncthreads();
    }
    if (threadIdx.x == 0) count[e] = base;
}

// The column tiles of every stack expert after bl_moe_route, in expert order: tiles[i] = (e,
// first column) for each MMQ_BN columns of count[e], then (-1, 0) up to max_tiles. One block of
// TILES_THREADS threads, a thread per expert (n_expert <= TILES_THREADS; max_tiles covers
// ceil(entries / MMQ_BN) + n_expert).
#define TILES_THREADS 1024
extern "C" __global__ void __launch_bounds__(TILES_THREADS) bl_moe_tiles(const int* count, int n_expert, int2* tiles,
                                                                         int max_tiles) {
    KERNEL_ENTRY();
    const int e = threadIdx.x;
    const int mine = e < n_expert ? (count[e] + MMQ_BN - 1) / MMQ_BN : 0;
    int total;
    const int start = block_prefix(mine, &total);
    for (int t = 0; t < mine; ++t) tiles[start + t] = make_int2(e, t * MMQ_BN);
    for (int i = total + threadIdx.x; i < max_tiles; i += blockDim.x) tiles[i] = make_int2(-1, 0);
}

// The GLU of every route entry's gate | up products (row i of gu: n_ff gate values, then n_ff up
// values) as Q8_1 blocks for the down products: block b holds glu(gate, up) of entry
// i = b / (n_ff / 32) for the 32 f from (b % (n_ff / 32)) * 32, bit for bit bl_quantize_q8_1 of
// the f32 GLU. Eight lanes hold a block as quads (n_ff % 32 == 0, gu 16-byte aligned).
extern "C" __global__ void bl_moe_glu_q8_1(const float* gu, uint8_t* hq, long long entries, int n_ff, int kind,
                                           float limit) {
    KERNEL_ENTRY();
    const int per_entry = n_ff / 32, lane = threadIdx.x & (WARP - 1);
    const long long nblocks = entries * per_entry, stride = (long long)gridDim.x * blockDim.x;
    // Whole warps take each step (quantize_quad exchanges values over the warp).
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; (t - lane) / 8 < nblocks; t += stride) {
        const long long b = t / 8;
        const bool in = b < nblocks;
        float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (in) {
            const float* g = gu + (b / per_entry) * 2 * n_ff + (b % per_entry) * 32 + (t & 7) * 4;
            const float4 gv = *(const float4*)g, uv = *(const float4*)(g + n_ff);
            y = make_float4(glu_one(gv.x, uv.x, kind, limit), glu_one(gv.y, uv.y, kind, limit),
                            glu_one(gv.z, uv.z, kind, limit), glu_one(gv.w, uv.w, kind, limit));
        }
        quantize_quad(y, hq + (in ? b : 0) * 36, in);
    }
}

// out[r * n_embd + o] = sum_j w[r * k + j] * d[(r * k + j) * n_embd + o], in slot order, skipping
// entries whose expert is bad or unmapped (their rows of d were never written). A thread per four
// outputs: n_embd is a multiple of 4 and d and out are 16-byte aligned.
extern "C" __global__ void bl_moe_combine(const float* d, const int* ids, const int* map, const float* w, float* out,
                                          int n_embd, int k, int rows, int n_expert) {
    KERNEL_ENTRY();
    const int n4 = n_embd / 4;
    const long long total = (long long)rows * n4;
    for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(x / n4), o = (int)(x % n4) * 4;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int j = 0; j < k; ++j) {
            const long long i = (long long)r * k + j;
            int e = ids[i];
            if (e < 0 || e >= n_expert) continue;
            if (map) e = map[e];
            if (e < 0) continue;
            const float wi = w[i];
            const float4 dv = *(const float4*)(d + i * n_embd + o);
            acc.x += wi * dv.x;
            acc.y += wi * dv.y;
            acc.z += wi * dv.z;
            acc.w += wi * dv.w;
        }
        *(float4*)(out + (long long)r * n_embd + o) = acc;
    }
}
