// Tiled quantized products for batches of 16 or more activation rows (prompts): dense, up to
// three parts of the same activations (Q, K, V), and routed experts over a prompt's route table.
// Uses the primitives of mma.cuh, the weight readers of quant.cuh and MatmulPart.

// A block of 4 warps computes a tile of MMQ_BM weight rows x MMQ_BN activation columns, stepping k by
// 256 values (8 sub-blocks of 32; 128 for types with a scale per 16). Both operands are staged in
// shared memory as int8 quads with one scale per (row, slot) and a min term (Q4_K, Q5_K, Q5_1);
// each slot's integer sums come from the int8 tensor cores (mma m16n8k32, USE_MMA) or dp4a, and
// are scaled into f32 accumulators.
// Warp w owns columns 16w .. 16w + 15 and all 64 rows: 4 x 2 tiles of 16 x 8.
// Columns can be gathered (`cols`, for routed experts): column c reads activation row
// cols[c] / col_div and writes output row cols[c].

#define MMQ_BM 64
#define MMQ_BN 64
#define MMQ_SB 8
#define MMQ_LD (MMQ_SB * 8 + 4)
#define MMQ_THREADS 128
// Blocks an SM keeps resident (the tiles' launch bounds): five, at most 102 registers a thread
// (and 5 x 43 KB of shared memory). The staging then spills ~100-160 bytes a thread to L1, which
// costs less than the fifth block gains: 30B-A3B pp512 +3% against four blocks with no spills
// (H200, docs/performance.md). Uncapped, the staging's loads in flight take ~135 registers.
#define MMQ_MIN_BLOCKS 5

// Rows of MMQ_LD ints (16 bytes of padding: the 8 rows an ldmatrix reads fall on distinct banks);
// per (slot, row) the weight scale and min term (wdm), per (slot, column) the activation scale and
// its scaled sum (xds). Slot-major, so that a warp's scale loads of one slot read adjacent words;
// wdm's rows are stored in mmq_wdm_pos order, rows g and g + 8 of each 16 side by side (the two
// rows an mma lane owns: one 16-byte load). Within each slot j, position p holds row (column) p ^ 2j
// (mmq_scale_at): the 8 slots of a row then lie on distinct banks, and the 16 lanes of a staging
// store (8 slots of two rows or columns whose positions differ in bit 0) on 32 distinct banks.
struct __align__(16) MmqSmem {
    int w[MMQ_BM * MMQ_LD];
    int x[MMQ_BN * MMQ_LD];
    float2 wdm[MMQ_SB * MMQ_BM];
    float2 xds[MMQ_SB * MMQ_BN];
};

// Where row r's scales lie among a slot's MMQ_BM, before mmq_scale_at (see MmqSmem).
static __device__ __forceinline__ int mmq_wdm_pos(int r) { return (r & ~15) | ((r & 7) << 1) | ((r >> 3) & 1); }

// The index of position p's scales in slot j (wdm or xds; see MmqSmem).
static __device__ __forceinline__ int mmq_scale_at(int j, int p, int len) { return j * len + (p ^ (2 * j)); }

// Stores a slot's 8 ints (two 16-byte halves) at dst, row-slot (r, j) of a tile. The 8 lanes of a
// quarter warp (one row, slots 0..7) store together; slots 4..7 store their second half first, so
// that each store instruction's quarter covers 32 distinct banks (slot j starts at bank 8j % 32).
static __device__ __forceinline__ void mmq_store_slot(int* dst, int j, const int* q) {
    const int4 lo = make_int4(q[0], q[1], q[2], q[3]), hi = make_int4(q[4], q[5], q[6], q[7]);
    const bool swap = j & 4;
    *(int4*)(dst + (swap ? 4 : 0)) = swap ? hi : lo;
    *(int4*)(dst + (swap ? 0 : 4)) = swap ? lo : hi;
}

// Whether a weight type's values carry a min term (d * q - m): the products then subtract m times
// the activations' sum.
static __device__ __forceinline__ bool has_min(int wtype) {
    return wtype == WT_Q4_K || wtype == WT_Q5_K || wtype == WT_Q5_1;
}

// Each of the MMQ_SB slots of a k step holds one 32-value sub-block with one scale, or, for the
// types with a scale per 16 values (`two_scales`: R = 2), one half of a sub-block, the other half
// zeroed; a k step then covers MMQ_SB / R sub-blocks and slot j holds sub-block sb0 + j / R.

// Slots each thread stages per operand and k step, and how many of them it loads before storing
// any: their global loads are then in flight together. (All four at once kept more registers and
// measured slower, 533 against 522 µs a layer of routed tiles.)
#define MMQ_PER (MMQ_BM * MMQ_SB / MMQ_THREADS)
#define MMQ_GROUP 2

// The column (activations) of the thread's i-th slot in a k step; its slot is threadIdx.x % MMQ_SB.
// A warp's half holds two adjacent columns.
static __device__ __forceinline__ int mmq_slot_line(int i) {
    return threadIdx.x / MMQ_SB + i * (MMQ_THREADS / MMQ_SB);
}

// The weight row of the thread's i-th slot: rows 2w, 2w + 8, 2w + 1, 2w + 9 (+ 16 i) for the four
// eights of lanes of warp w, so that a warp's half holds rows g and g + 8, whose scales lie side
// by side (mmq_wdm_pos).
static __device__ __forceinline__ int mmq_slot_row(int i) {
    const int q = threadIdx.x / MMQ_SB;
    return 2 * (q >> 2) + ((q & 1) << 3) + ((q >> 1) & 1) + i * (MMQ_THREADS / MMQ_SB);
}

// Stages weight rows row0 .. row0 + 63 (sub-blocks sb0 ..) of one matrix of type wt: the thread's
// slots (mmq_slot_row), unpacked MMQ_GROUP at a time. WT is wt as a compile-time constant (the
// unpacking and R fold to one type's code), or -1 (wt and R read at run time). WIDE: Q4_K rows
// 16-byte aligned, read by unpack_q4_k_aligned.
template <int WT, bool WIDE = false>
static __device__ __forceinline__ void mmq_load_w_t(MmqSmem* sm, const uint8_t* w, long long w_stride, int wt,
                                                    int row0, int n, int sb0, int nsb, int R) {
    const int type = WT >= 0 ? WT : wt;
    if (WT >= 0) R = two_scales(WT) ? 2 : 1;
    const int j = threadIdx.x % MMQ_SB, sb = sb0 + j / R;
#pragma unroll
    for (int i0 = 0; i0 < MMQ_PER; i0 += MMQ_GROUP) {
        Sub s[MMQ_GROUP];
#pragma unroll
        for (int i = 0; i < MMQ_GROUP; ++i) {
            const int r = mmq_slot_row(i0 + i);
            if (row0 + r < n && sb < nsb) {
                const uint8_t* row = w + (long long)(row0 + r) * w_stride;
                if (WIDE)
                    unpack_q4_k_aligned(row + (long long)(sb / 8) * 144, sb % 8, &s[i]);
                else
                    unpack_sub(row, type, sb, &s[i]);
            } else {
#pragma unroll
                for (int t = 0; t < 8; ++t) s[i].q[t] = 0;
                s[i].d[0] = s[i].d[1] = s[i].m = 0.0f;
            }
        }
#pragma unroll
        for (int i = 0; i < MMQ_GROUP; ++i) {
            const int r = mmq_slot_row(i0 + i);
            int q[8];
            float d;
            if (R == 2) {
                const int h = j % 2;
#pragma unroll
                for (int t = 0; t < 8; ++t) q[t] = t / 4 == h ? s[i].q[t] : 0;
                d = h ? s[i].d[1] : s[i].d[0];
            } else {
#pragma unroll
                for (int t = 0; t < 8; ++t) q[t] = s[i].q[t];
                d = s[i].d[0];
            }
            mmq_store_slot(sm->w + r * MMQ_LD + j * 8, j, q);
            sm->wdm[mmq_scale_at(j, mmq_wdm_pos(r), MMQ_BM)] = make_float2(d, s[i].m);
        }
    }
}

// mmq_load_w_t, with the types of the usual prompt products (Q4_K experts, Q8_0 attention)
// unpacked by code of their own; `wide`: w and its row stride are 16-byte aligned.
static __device__ __forceinline__ void mmq_load_w(MmqSmem* sm, const uint8_t* w, long long w_stride, int wt, int row0,
                                                  int n, int sb0, int nsb, int R, bool wide) {
    if (wt == WT_Q4_K && wide)
        mmq_load_w_t<WT_Q4_K, true>(sm, w, w_stride, wt, row0, n, sb0, nsb, R);
    else if (wt == WT_Q4_K)
        mmq_load_w_t<WT_Q4_K>(sm, w, w_stride, wt, row0, n, sb0, nsb, R);
    else if (wt == WT_Q8_0)
        mmq_load_w_t<WT_Q8_0>(sm, w, w_stride, wt, row0, n, sb0, nsb, R);
    else
        mmq_load_w_t<-1>(sm, w, w_stride, wt, row0, n, sb0, nsb, R);
}

// One 36-byte Q8_1 block (sb of a row, the row 16-byte aligned) as its 9 words, from the three
// 16-byte words around it: the block starts at word sb % 4 of the first (36 = 9 words). Reads up to
// 12 bytes past the block, so not for a row's last block.
static __device__ __forceinline__ void q8_1_block_wide(const uint8_t* b, int sb, int* out) {
    const int o = sb & 3;
    const int4* a = (const int4*)(b - 4 * o);
    const int4 v0 = a[0], v1 = a[1], v2 = a[2];
    const int v[12] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w, v2.x, v2.y, v2.z, v2.w};
#pragma unroll
    for (int u = 0; u < 9; ++u) out[u] = o == 0 ? v[u] : o == 1 ? v[u + 1] : o == 2 ? v[u + 2] : v[u + 3];
}

// Stages activation columns col0 .. col0 + 63 (Q8_1 rows of x_row bytes), the thread's slots as
// in mmq_load_w_t; blocks below `wide_below` through q8_1_block_wide. Columns past ncols are not
// stored: their sums are never written, and an integer product cannot carry their stale bytes into
// another column's.
static __device__ __forceinline__ void mmq_load_x(MmqSmem* sm, const uint8_t* xq, long long x_row, const int* cols,
                                                  int col_div, int col0, int ncols, int sb0, int nsb, int R,
                                                  int wide_below) {
    const int j = threadIdx.x % MMQ_SB, sb = sb0 + j / R;
#pragma unroll
    for (int i0 = 0; i0 < MMQ_PER; i0 += MMQ_GROUP) {
        int q[MMQ_GROUP][8];
        float2 ds[MMQ_GROUP];
#pragma unroll
        for (int i = 0; i < MMQ_GROUP; ++i) {
            const int c = mmq_slot_line(i0 + i);
            if (col0 + c < ncols && sb < nsb) {
                const int xr = cols ? cols[col0 + c] / col_div : col0 + c;
                const uint8_t* b = xq + (long long)xr * x_row + (long long)sb * 36;
                int blk[9];
                if (sb < wide_below) {
                    q8_1_block_wide(b, sb, blk);
                } else {
#pragma unroll
                    for (int u = 0; u < 9; ++u) blk[u] = ((const int*)b)[u];
                }
                __half2 dh;
                memcpy(&dh, &blk[0], 4);
                ds[i] = __half22float2(dh);
#pragma unroll
                for (int t = 0; t < 8; ++t) q[i][t] = blk[1 + t];
            } else {
                ds[i] = make_float2(0.0f, 0.0f);
#pragma unroll
                for (int t = 0; t < 8; ++t) q[i][t] = 0;
            }
        }
#pragma unroll
        for (int i = 0; i < MMQ_GROUP; ++i) {
            const int c = mmq_slot_line(i0 + i);
            if (col0 + c < ncols) {
                mmq_store_slot(sm->x + c * MMQ_LD + j * 8, j, q[i]);
                sm->xds[mmq_scale_at(j, c, MMQ_BN)] = ds[i];
            }
        }
    }
}

// One (row tile, column tile) of y = W . x. The lane owns, for each 16 x 8 tile, rows g and g + 8
// and columns 2t and 2t + 1 (g = lane / 4, t = lane % 4), the mma accumulator layout. MIN: the
// weight type has a min term. A warp whose 16 columns all lie past ncols (routed experts with few
// rows) only helps stage the tiles.
template <bool USE_MMA, bool MIN>
static __device__ void mmq_tile(MmqSmem* sm, const uint8_t* w, long long w_stride, int wtype, const uint8_t* xq,
                                long long x_row, const int* cols, int col_div, float* y, long long y_row, int k, int n,
                                int ncols, int row0, int col0) {
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP;
    const int g = lane >> 2, t = lane & 3;
    const bool active = col0 + warp * 16 < ncols;
    float acc[4][2][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[a][b][i] = 0.0f;
    const int nsb = k / 32;
    const int R = two_scales(wtype) ? 2 : 1;
    // ldmatrix rows: weights, lane i row (i % 16) and bytes 16 * (i / 16) of a 32-byte slot;
    // activations, lane i column (i % 8) + 8 * (i / 16) and bytes 16 * (i / 8 % 2).
    const int* wl = sm->w + (lane & 15) * MMQ_LD + 4 * (lane >> 4);
    const int* xl = sm->x + (warp * 16 + (lane & 7) + 8 * (lane >> 4)) * MMQ_LD + 4 * ((lane >> 3) & 1);
    // This block's share of the k steps (grid z splits them; see mmq_dense).
    const int step = MMQ_SB / R, per = ((nsb + step - 1) / step + gridDim.z - 1) / gridDim.z;
    const int sb_lo = blockIdx.z * per * step, sb_hi = min(nsb, sb_lo + per * step);
    // 16-byte loads where the rows are 16-byte aligned (mmq_load_w, q8_1_block_wide).
    const bool wide_w = (((uintptr_t)w | (uintptr_t)w_stride) & 15) == 0;
    const int wide_below = (((uintptr_t)xq | (uintptr_t)x_row) & 15) == 0 ? nsb - 1 : 0;
    for (int sb0 = sb_lo; sb0 < sb_hi; sb0 += step) {
        __syncthreads();
        mmq_load_w(sm, w, w_stride, wtype, row0, n, sb0, sb_hi, R, wide_w);
        mmq_load_x(sm, xq, x_row, cols, col_div, col0, ncols, sb0, sb_hi, R, wide_below);
        __syncthreads();
        if (!active) continue;
#pragma unroll 2
        for (int j = 0; j < MMQ_SB; ++j) {
            int ci[4][2][4];
            if (USE_MMA) {
                int bf[4];
                ldsm_x4((unsigned*)bf, smem_addr(xl + j * 8));
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    int af[4];
                    ldsm_x4((unsigned*)af, smem_addr(wl + a * 16 * MMQ_LD + j * 8));
#pragma unroll
                    for (int b = 0; b < 2; ++b) {
                        ci[a][b][0] = ci[a][b][1] = ci[a][b][2] = ci[a][b][3] = 0;
                        mma_s8(ci[a][b], af, bf + 2 * b);
                    }
                }
            } else {
#pragma unroll
                for (int a = 0; a < 4; ++a)
#pragma unroll
                    for (int b = 0; b < 2; ++b)
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const int r = a * 16 + g + (i >= 2 ? 8 : 0), c = warp * 16 + b * 8 + 2 * t + (i & 1);
                            const int* wr = sm->w + r * MMQ_LD + j * 8;
                            const int* xc = sm->x + c * MMQ_LD + j * 8;
                            int s = 0;
#pragma unroll
                            for (int q = 0; q < 8; ++q) s = __dp4a(wr[q], xc[q], s);
                            ci[a][b][i] = s;
                        }
            }
            // This lane's 8 rows and 4 columns: their scales once per sub-block, rows g and g + 8
            // (columns 2t and 2t + 1) as one 16-byte load.
            float2 wdm[4][2], xds[2][2];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                const float4 v = *(const float4*)&sm->wdm[mmq_scale_at(j, a * 16 + 2 * g, MMQ_BM)];
                wdm[a][0] = make_float2(v.x, v.y);
                wdm[a][1] = make_float2(v.z, v.w);
            }
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const float4 v = *(const float4*)&sm->xds[mmq_scale_at(j, warp * 16 + b * 8 + 2 * t, MMQ_BN)];
                xds[b][0] = make_float2(v.x, v.y);
                xds[b][1] = make_float2(v.z, v.w);
            }
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 2; ++b)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        // Rounded as the CPU reference rounds each sub-block's term.
                        const float2 wv = wdm[a][i >> 1], xv = xds[b][i & 1];
                        if (MIN)
                            acc[a][b][i] += wv.x * xv.x * (float)ci[a][b][i] - wv.y * xv.y;
                        else
                            acc[a][b][i] += __fmul_rn(wv.x * xv.x, (float)ci[a][b][i]);
                    }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = row0 + a * 16 + g + (i >= 2 ? 8 : 0), c = col0 + warp * 16 + b * 8 + 2 * t + (i & 1);
                if (r < n && c < ncols) {
                    const long long orow = cols ? cols[c] : c;
                    if (gridDim.z > 1)
                        atomicAdd(&y[orow * y_row + r], acc[a][b][i]);
                    else
                        y[orow * y_row + r] = acc[a][b][i];
                }
            }
}

// mmq_tile for wtype, its min term taken only for the types that have one.
#define MMQ_TILE_CALL(USE_MMA, wtype, ...)               \
    do {                                                 \
        if (has_min(wtype))                              \
            mmq_tile<USE_MMA, true>(__VA_ARGS__);        \
        else                                             \
            mmq_tile<USE_MMA, false>(__VA_ARGS__);       \
    } while (0)

// Dense: grid (row tiles, column tiles, 1 or 2). y[c * n + j] = W_j . x_c. With two along z (few
// tiles: more blocks for the SMs), each block sums half of the k steps and adds its sums to y,
// which the caller has zeroed: 0 + a + b and 0 + b + a are the same f32, so the result does not
// depend on which half adds first.
template <bool USE_MMA>
static __device__ void mmq_dense(const uint8_t* w, long long w_stride, int wtype, const uint8_t* xq, long long x_row,
                                 float* y, int k, int n, int m) {
    __shared__ MmqSmem sm;
    MMQ_TILE_CALL(USE_MMA, wtype, &sm, w, w_stride, wtype, xq, x_row, nullptr, 1, y, n, k, n, m, blockIdx.x * MMQ_BM,
                  blockIdx.y * MMQ_BN);
}
#define MMQ_DENSE(name, USE_MMA)                                                                          \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS, MMQ_MIN_BLOCKS)                              \
        name(const uint8_t* w, long long w_stride, int wtype, const uint8_t* xq, long long x_row, float* y, int k, \
             int n, int m) {                                                                               \
        KERNEL_ENTRY();                                                                                    \
        mmq_dense<USE_MMA>(w, w_stride, wtype, xq, x_row, y, k, n, m);                                     \
    }
MMQ_DENSE(bl_mmq_mma, true)
MMQ_DENSE(bl_mmq_dp4a, false)

// Up to three products of the same activations (Q, K and V of a prompt;
// ops/fused/matmul_parts.rs), as one launch: grid (row tiles of all parts, column tiles). Part p
// is y_p[c * n_p + j] = W_p,j . x_c.
template <bool USE_MMA>
static __device__ void mmq_parts(MatmulPart pa, MatmulPart pb, MatmulPart pc, int wtype, const uint8_t* xq,
                                 long long x_row, int k, int m) {
    __shared__ MmqSmem sm;
    const int ta = (pa.n + MMQ_BM - 1) / MMQ_BM, tb = (pb.n + MMQ_BM - 1) / MMQ_BM;
    int tile = blockIdx.x;
    MatmulPart p = pa;
    if (tile >= ta + tb) {
        p = pc;
        tile -= ta + tb;
    } else if (tile >= ta) {
        p = pb;
        tile -= ta;
    }
    MMQ_TILE_CALL(USE_MMA, wtype, &sm, p.w, p.stride, wtype, xq, x_row, nullptr, 1, p.y, p.n, k, p.n, m,
                  tile * MMQ_BM, blockIdx.y * MMQ_BN);
}
#define MMQ_PARTS(name, USE_MMA)                                                                          \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS, MMQ_MIN_BLOCKS)                              \
        name(MatmulPart a, MatmulPart b, MatmulPart c, int wtype, const uint8_t* xq, long long x_row, int k,   \
             int m) {                                                                                      \
        KERNEL_ENTRY();                                                                                    \
        mmq_parts<USE_MMA>(a, b, c, wtype, xq, x_row, k, m);                                               \
    }
MMQ_PARTS(bl_mmq_parts_mma, true)
MMQ_PARTS(bl_mmq_parts_dp4a, false)

// Routed experts: grid (row tiles, column tiles). Column tile y is tiles[y] = (stack expert e,
// first column) from bl_moe_tiles (e < 0: no tile); expert e's columns are list[e * list_stride
// ..] (count[e] of them), entries r * k + j of the route table.
template <bool USE_MMA>
static __device__ void mmq_experts(const uint8_t* w, long long w_stride, long long w_exp, int wtype, const uint8_t* xq,
                                   long long x_row, const int* list, long long list_stride, const int* count,
                                   const int2* tiles, int col_div, float* y, long long y_row, int k, int n) {
    __shared__ MmqSmem sm;
    const int2 tile = tiles[blockIdx.y];
    if (tile.x < 0) return;
    const int e = tile.x;
    MMQ_TILE_CALL(USE_MMA, wtype, &sm, w + e * w_exp, w_stride, wtype, xq, x_row, list + e * list_stride, col_div, y,
                  y_row, k, n, count[e], blockIdx.x * MMQ_BM, tile.y);
}
#define MMQ_EXPERTS(name, USE_MMA)                                                                                \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS, MMQ_MIN_BLOCKS)                                     \
        name(const uint8_t* w, long long w_stride, long long w_exp, int wtype, const uint8_t* xq, long long x_row,  \
             const int* list, long long list_stride, const int* count, const int2* tiles, int col_div, float* y,    \
             long long y_row, int k, int n) {                                                                       \
        KERNEL_ENTRY();                                                                                           \
        mmq_experts<USE_MMA>(w, w_stride, w_exp, wtype, xq, x_row, list, list_stride, count, tiles, col_div, y,     \
                             y_row, k, n);                                                                        \
    }
MMQ_EXPERTS(bl_mmq_experts_mma, true)
MMQ_EXPERTS(bl_mmq_experts_dp4a, false)
