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
// BM weight rows and BN activation columns: MMQ_BM x MMQ_BN here, MMQ2_BM x MMQ2_BN for mmq_tile2.
template <int BM, int BN>
struct __align__(16) MmqSmemT {
    static constexpr int ROWS = BM, COLS = BN;
    int w[BM * MMQ_LD];
    int x[BN * MMQ_LD];
    float2 wdm[MMQ_SB * BM];
    float2 xds[MMQ_SB * BN];
};
using MmqSmem = MmqSmemT<MMQ_BM, MMQ_BN>;

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

// How many of its slots a thread loads before storing any: their global loads are then in flight
// together. (All four at once kept more registers and measured slower, 533 against 522 µs a layer
// of routed tiles.) A thread stages ROWS * MMQ_SB / THREADS weight slots and COLS * MMQ_SB /
// THREADS activation slots a k step.
#define MMQ_GROUP 2

// The column (activations) of the thread's i-th slot in a k step (blocks of THREADS); its slot is
// threadIdx.x % MMQ_SB. A warp's half holds two adjacent columns.
template <int THREADS>
static __device__ __forceinline__ int mmq_slot_line(int i) {
    return threadIdx.x / MMQ_SB + i * (THREADS / MMQ_SB);
}

// The weight row of the thread's i-th slot: rows 2v, 2v + 8, 2v + 1, 2v + 9 of the 16 rows 16 (w /
// 4) .. (+ THREADS / 8 i) for the four eights of lanes of warp w (v = w % 4), so that a warp's half
// holds rows g and g + 8, whose scales lie side by side (mmq_wdm_pos).
template <int THREADS>
static __device__ __forceinline__ int mmq_slot_row(int i) {
    // (q < 16 in blocks of 128: mmq_tile's arithmetic as it was, its registers and spills unchanged.)
    const int q = threadIdx.x / MMQ_SB, v = THREADS > 128 ? q & 15 : q, u = THREADS > 128 ? 16 * (q >> 4) : 0;
    return u + 2 * (v >> 2) + ((q & 1) << 3) + ((q >> 1) & 1) + i * (THREADS / MMQ_SB);
}

// Stages weight rows row0 .. row0 + S::ROWS - 1 (sub-blocks sb0 ..) of one matrix of type wt: the
// thread's slots (mmq_slot_row), unpacked MMQ_GROUP at a time. WT is wt as a compile-time constant
// (the unpacking and R fold to one type's code), or -1 (wt and R read at run time). WIDE: Q4_K rows
// 16-byte aligned, read by unpack_q4_k_aligned.
template <int WT, bool WIDE, int THREADS, class S>
static __device__ __forceinline__ void mmq_load_w_t(S* sm, const uint8_t* w, long long w_stride, int wt, int row0,
                                                    int n, int sb0, int nsb, int R) {
    constexpr int PER = S::ROWS * MMQ_SB / THREADS;
    const int type = WT >= 0 ? WT : wt;
    if (WT >= 0) R = two_scales(WT) ? 2 : 1;
    const int j = threadIdx.x % MMQ_SB, sb = sb0 + j / R;
#pragma unroll
    for (int i0 = 0; i0 < PER; i0 += MMQ_GROUP) {
        Sub s[MMQ_GROUP];
#pragma unroll
        for (int i = 0; i < MMQ_GROUP; ++i) {
            const int r = mmq_slot_row<THREADS>(i0 + i);
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
            const int r = mmq_slot_row<THREADS>(i0 + i);
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
            sm->wdm[mmq_scale_at(j, mmq_wdm_pos(r), S::ROWS)] = make_float2(d, s[i].m);
        }
    }
}

// mmq_load_w_t, with the types of the usual prompt products (Q4_K experts, Q8_0 attention)
// unpacked by code of their own; `wide`: w and its row stride are 16-byte aligned.
template <int THREADS, class S>
static __device__ __forceinline__ void mmq_load_w(S* sm, const uint8_t* w, long long w_stride, int wt, int row0, int n,
                                                  int sb0, int nsb, int R, bool wide) {
    if (wt == WT_Q4_K && wide)
        mmq_load_w_t<WT_Q4_K, true, THREADS>(sm, w, w_stride, wt, row0, n, sb0, nsb, R);
    else if (wt == WT_Q4_K)
        mmq_load_w_t<WT_Q4_K, false, THREADS>(sm, w, w_stride, wt, row0, n, sb0, nsb, R);
    else if (wt == WT_Q8_0)
        mmq_load_w_t<WT_Q8_0, false, THREADS>(sm, w, w_stride, wt, row0, n, sb0, nsb, R);
    else
        mmq_load_w_t<-1, false, THREADS>(sm, w, w_stride, wt, row0, n, sb0, nsb, R);
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

// Stages activation columns col0 .. col0 + S::COLS - 1 (Q8_1 rows of x_row bytes), the thread's
// slots as in mmq_load_w_t; blocks below `wide_below` through q8_1_block_wide. Columns past ncols
// are not stored: their sums are never written, and an integer product cannot carry their stale
// bytes into another column's.
template <int THREADS, class S>
static __device__ __forceinline__ void mmq_load_x(S* sm, const uint8_t* xq, long long x_row, const int* cols,
                                                  int col_div, int col0, int ncols, int sb0, int nsb, int R,
                                                  int wide_below) {
    constexpr int PER = S::COLS * MMQ_SB / THREADS;
    const int j = threadIdx.x % MMQ_SB, sb = sb0 + j / R;
#pragma unroll
    for (int i0 = 0; i0 < PER; i0 += MMQ_GROUP) {
        int q[MMQ_GROUP][8];
        float2 ds[MMQ_GROUP];
#pragma unroll
        for (int i = 0; i < MMQ_GROUP; ++i) {
            const int c = mmq_slot_line<THREADS>(i0 + i);
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
            const int c = mmq_slot_line<THREADS>(i0 + i);
            if (col0 + c < ncols) {
                mmq_store_slot(sm->x + c * MMQ_LD + j * 8, j, q[i]);
                sm->xds[mmq_scale_at(j, c, S::COLS)] = ds[i];
            }
        }
    }
}

// The f32 bits of 1.5 * 2^23: an mma accumulator started at these bits ends as those of 1.5 * 2^23
// + s for its integer sum s (|s| <= 32 * 128 * 128 = 2^19 keeps the exponent), so that s as f32 is
// one exact subtraction (MMQ_MAGIC_F) instead of an int-to-float conversion, which on sm_80/90
// issues at a quarter of the f32 rate (mmq_tile2; mmq_tile converts, as fast there: measured
// alike on an H100, docs/performance.md). Same f32 as the conversion.
#define MMQ_MAGIC 0x4B400000
#define MMQ_MAGIC_F 12582912.0f

// An mma sum started at MMQ_MAGIC, as f32.
static __device__ __forceinline__ float mmq_magic_f32(int c) { return __uint_as_float((unsigned)c) - MMQ_MAGIC_F; }

// One (row tile, column tile) of y = W . x. The lane owns, for each 16 x 8 tile, rows g and g + 8
// and columns 2t and 2t + 1 (g = lane / 4, t = lane % 4), the mma accumulator layout. MIN: the
// weight type has a min term. A warp whose 16
// columns all lie past ncols (routed experts with few rows) only helps stage the tiles.
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
        mmq_load_w<MMQ_THREADS>(sm, w, w_stride, wtype, row0, n, sb0, sb_hi, R, wide_w);
        mmq_load_x<MMQ_THREADS>(sm, xq, x_row, cols, col_div, col0, ncols, sb0, sb_hi, R, wide_below);
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
#define MMQ_TILE_CALL(USE_MMA, wtype, ...)         \
    do {                                           \
        if (has_min(wtype))                        \
            mmq_tile<USE_MMA, true>(__VA_ARGS__);  \
        else                                       \
            mmq_tile<USE_MMA, false>(__VA_ARGS__); \
    } while (0)

// Dense: grid (row tiles, column tiles, 1 or 2). y[c * n + j] = W_j . x_c. With two along z (few
// tiles: more blocks for the SMs), each block sums half of the k steps and adds its sums to y,
// which the caller has zeroed: 0 + a + b and 0 + b + a are the same f32, so the result does not
// depend on which half adds first.
template <bool USE_MMA>
static __device__ void mmq_dense(const uint8_t* w, long long w_stride, int wtype, const uint8_t* xq, long long x_row,
                                 float* y, int k, int n, int m) {
    __shared__ MmqSmem sm;
    MMQ_TILE_CALL(USE_MMA, wtype, &sm, w, w_stride, wtype, xq, x_row, nullptr, 1, y, n, k, n, m,
                  blockIdx.x * MMQ_BM, blockIdx.y * MMQ_BN);
}
#define MMQ_DENSE(name, USE_MMA)                                                                            \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS, MMQ_MIN_BLOCKS)                                      \
        name(const uint8_t* w, long long w_stride, int wtype, const uint8_t* xq, long long x_row, float* y, int k, \
             int n, int m) {                                                                                       \
        KERNEL_ENTRY();                                                                                            \
        mmq_dense<USE_MMA>(w, w_stride, wtype, xq, x_row, y, k, n, m);                                      \
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
#define MMQ_PARTS(name, USE_MMA)                                                                      \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS, MMQ_MIN_BLOCKS)                                \
        name(MatmulPart a, MatmulPart b, MatmulPart c, int wtype, const uint8_t* xq, long long x_row, int k, \
             int m) {                                                                                        \
        KERNEL_ENTRY();                                                                                      \
        mmq_parts<USE_MMA>(a, b, c, wtype, xq, x_row, k, m);                                          \
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
    MMQ_TILE_CALL(USE_MMA, wtype, &sm, w + e * w_exp, w_stride, wtype, xq, x_row, list + e * list_stride,
                  col_div, y, y_row, k, n, count[e], blockIdx.x * MMQ_BM, tile.y);
}
#define MMQ_EXPERTS(name, USE_MMA)                                                                              \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS, MMQ_MIN_BLOCKS)                                          \
        name(const uint8_t* w, long long w_stride, long long w_exp, int wtype, const uint8_t* xq, long long x_row,     \
             const int* list, long long list_stride, const int* count, const int2* tiles, int col_div, float* y,       \
             long long y_row, int k, int n) {                                                                          \
        KERNEL_ENTRY();                                                                                                \
        mmq_experts<USE_MMA>(w, w_stride, w_exp, wtype, xq, x_row, list, list_stride, count, tiles, col_div, y, \
                             y_row, k, n);                                                                             \
    }
MMQ_EXPERTS(bl_mmq_experts_mma, true)
MMQ_EXPERTS(bl_mmq_experts_dp4a, false)

// ---- the wide tile of long prompts (BLOOMERY_CUDA_MMQ=mma2) --------------------------------------

// A block of 8 warps computes MMQ2_BM weight rows x MMQ2_BN activation columns over the same k
// steps, slots and shared-memory layout as mmq_tile; warp w owns rows 32 (w % 4) .. + 31 and
// columns 32 (w / 4) .. + 31: 2 x 4 tiles of 16 x 8, so that each ldmatrix (a weight tile or
// two activation tiles) feeds 4 mma, against 2 and 8 in mmq_tile (0.5 ldmatrix an mma, not
// 0.625), and a k step stages 192 rows for 512 mma, not 128 for 256. The integer sums reach f32
// through MMQ_MAGIC. Its 63 KB of shared memory are dynamic (more than the 48 KB a static block
// may have): two blocks an SM, 16 warps. The outputs are the same f32 bits as mmq_tile's: each
// sub-block's term rounds as there, and the k halves along z split where mmq_tile's do.
#define MMQ2_BM 128
#define MMQ2_BN 64
#define MMQ2_THREADS 256
#define MMQ2_MIN_BLOCKS 2
using Mmq2Smem = MmqSmemT<MMQ2_BM, MMQ2_BN>;

// The launch's dynamic shared memory, as a Mmq2Smem (the emulation's test defines its own).
#ifndef MMQ2_DYNAMIC_SMEM
#define MMQ2_DYNAMIC_SMEM(name)                                 \
    extern __shared__ __align__(16) unsigned char name##_raw[]; \
    Mmq2Smem* name = (Mmq2Smem*)name##_raw
#endif

// mmq_tile on the wide tile (int8 mma only). Rows and columns as mmq_tile's; a warp whose 32
// columns all lie past ncols only helps stage the tiles.
template <bool MIN>
static __device__ void mmq_tile2(Mmq2Smem* sm, const uint8_t* w, long long w_stride, int wtype, const uint8_t* xq,
                                 long long x_row, float* y, long long y_row, int k, int n, int ncols, int row0,
                                 int col0) {
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP;
    const int g = lane >> 2, t = lane & 3;
    const int wr = 32 * (warp & 3), wc = 32 * (warp >> 2);
    const bool active = col0 + wc < ncols;
    float acc[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[a][b][i] = 0.0f;
    const int nsb = k / 32;
    const int R = two_scales(wtype) ? 2 : 1;
    // ldmatrix rows as in mmq_tile, from the warp's first row and column.
    const int* wl = sm->w + (wr + (lane & 15)) * MMQ_LD + 4 * (lane >> 4);
    const int* xl = sm->x + (wc + (lane & 7) + 8 * (lane >> 4)) * MMQ_LD + 4 * ((lane >> 3) & 1);
    // This block's share of the k steps, split along z as in mmq_tile.
    const int step = MMQ_SB / R, per = ((nsb + step - 1) / step + gridDim.z - 1) / gridDim.z;
    const int sb_lo = blockIdx.z * per * step, sb_hi = min(nsb, sb_lo + per * step);
    const bool wide_w = (((uintptr_t)w | (uintptr_t)w_stride) & 15) == 0;
    const int wide_below = (((uintptr_t)xq | (uintptr_t)x_row) & 15) == 0 ? nsb - 1 : 0;
    for (int sb0 = sb_lo; sb0 < sb_hi; sb0 += step) {
        __syncthreads();
        mmq_load_w<MMQ2_THREADS>(sm, w, w_stride, wtype, row0, n, sb0, sb_hi, R, wide_w);
        mmq_load_x<MMQ2_THREADS>(sm, xq, x_row, nullptr, 1, col0, ncols, sb0, sb_hi, R, wide_below);
        __syncthreads();
        if (!active) continue;
#pragma unroll 2
        for (int j = 0; j < MMQ_SB; ++j) {
            // The activation fragments (columns 16h .. 16h + 15: tiles 2h and 2h + 1) and the
            // 8 columns' scales, once per slot for both row tiles.
            int bf[2][4];
            float2 xds[4][2];
#pragma unroll
            for (int h = 0; h < 2; ++h) ldsm_x4((unsigned*)bf[h], smem_addr(xl + 16 * h * MMQ_LD + j * 8));
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const float4 v = *(const float4*)&sm->xds[mmq_scale_at(j, wc + b * 8 + 2 * t, MMQ2_BN)];
                xds[b][0] = make_float2(v.x, v.y);
                xds[b][1] = make_float2(v.z, v.w);
            }
#pragma unroll
            for (int a = 0; a < 2; ++a) {
                int af[4], ci[4][4];
                ldsm_x4((unsigned*)af, smem_addr(wl + a * 16 * MMQ_LD + j * 8));
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    ci[b][0] = ci[b][1] = ci[b][2] = ci[b][3] = MMQ_MAGIC;
                    mma_s8(ci[b], af, bf[b >> 1] + 2 * (b & 1));
                }
                const float4 v = *(const float4*)&sm->wdm[mmq_scale_at(j, wr + a * 16 + 2 * g, MMQ2_BM)];
                const float2 wdm[2] = {make_float2(v.x, v.y), make_float2(v.z, v.w)};
#pragma unroll
                for (int b = 0; b < 4; ++b)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        // Rounded as the CPU reference rounds each sub-block's term.
                        const float2 wv = wdm[i >> 1], xv = xds[b][i & 1];
                        if (MIN)
                            acc[a][b][i] += wv.x * xv.x * mmq_magic_f32(ci[b][i]) - wv.y * xv.y;
                        else
                            acc[a][b][i] += __fmul_rn(wv.x * xv.x, mmq_magic_f32(ci[b][i]));
                    }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = row0 + wr + a * 16 + g + (i >= 2 ? 8 : 0), c = col0 + wc + b * 8 + 2 * t + (i & 1);
                if (r < n && c < ncols) {
                    if (gridDim.z > 1)
                        atomicAdd(&y[(long long)c * y_row + r], acc[a][b][i]);
                    else
                        y[(long long)c * y_row + r] = acc[a][b][i];
                }
            }
}

// mmq_tile2 for wtype, its min term taken only for the types that have one.
#define MMQ_TILE2_CALL(wtype, ...)         \
    do {                                   \
        if (has_min(wtype))                \
            mmq_tile2<true>(__VA_ARGS__);  \
        else                               \
            mmq_tile2<false>(__VA_ARGS__); \
    } while (0)

// mmq_dense on the wide tile: grid (row tiles of MMQ2_BM, column tiles of MMQ2_BN, 1 or 2), the
// k halves along z as there; MMQ2 dynamic shared memory sizeof(Mmq2Smem).
extern "C" __global__ void __launch_bounds__(MMQ2_THREADS, MMQ2_MIN_BLOCKS)
    bl_mmq2_mma(const uint8_t* w, long long w_stride, int wtype, const uint8_t* xq, long long x_row, float* y, int k,
                int n, int m) {
    KERNEL_ENTRY();
    MMQ2_DYNAMIC_SMEM(sm);
    MMQ_TILE2_CALL(wtype, sm, w, w_stride, wtype, xq, x_row, y, n, k, n, m, blockIdx.x * MMQ2_BM,
                   blockIdx.y * MMQ2_BN);
}

// mmq_parts on the wide tile: grid (row tiles of MMQ2_BM of all parts, column tiles of MMQ2_BN).
extern "C" __global__ void __launch_bounds__(MMQ2_THREADS, MMQ2_MIN_BLOCKS)
    bl_mmq2_parts_mma(MatmulPart pa, MatmulPart pb, MatmulPart pc, int wtype, const uint8_t* xq, long long x_row,
                      int k, int m) {
    KERNEL_ENTRY();
    MMQ2_DYNAMIC_SMEM(sm);
    const int ta = (pa.n + MMQ2_BM - 1) / MMQ2_BM, tb = (pb.n + MMQ2_BM - 1) / MMQ2_BM;
    int tile = blockIdx.x;
    MatmulPart p = pa;
    if (tile >= ta + tb) {
        p = pc;
        tile -= ta + tb;
    } else if (tile >= ta) {
        p = pb;
        tile -= ta;
    }
    MMQ_TILE2_CALL(wtype, sm, p.w, p.stride, wtype, xq, x_row, p.y, p.n, k, p.n, m, tile * MMQ2_BM,
                   blockIdx.y * MMQ2_BN);
}
