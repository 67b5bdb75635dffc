// Single-row products over weight types whose 32-value blocks are not 4-byte aligned (Q8_0's
// 34 bytes): loaded lane by lane, each block costs sixteen 2-byte loads, and decode reads these
// weights at well under the card's bandwidth. Here each warp first copies a stretch of its row
// into shared memory with 16-byte loads, then unpacks the blocks from there; the arithmetic and
// each lane's order of blocks are those of matmul_q, so the result is the same bits.
// Included at the end of kernels.cu (uses warp_sum, unpack_sub, unpacked_dot_q8_1).

// Blocks staged per warp and pass: 128 blocks of 32 values (4,352 bytes of Q8_0), a multiple of
// 16 bytes for every 32-value block size used here.
#define MV_BLOCKS 128
#define MV_WARPS 4

// y[j] = W_j . x for one Q8_1 activation row x: one warp per weight row j, MV_WARPS rows per
// thread block. The host launches it only when w and w_stride are multiples of 16 bytes.
template <int WT, int BYTES>
static __device__ void matvec_staged(const uint8_t* w, long long w_stride, const uint8_t* xq, float* y, int k,
                                     int n) {
    __shared__ __align__(16) uint8_t stage[MV_WARPS][MV_BLOCKS * BYTES];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1);
    const long long j = (long long)blockIdx.x * MV_WARPS + warp;
    if (j >= n) return;
    const uint8_t* row = w + j * w_stride;
    uint8_t* st = stage[warp];
    const int nb = k / 32;
    float s = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MV_BLOCKS) {
        const int cb = min(MV_BLOCKS, nb - b0);
        const int bytes = cb * BYTES, whole = bytes & ~15;
        const uint8_t* src = row + (long long)b0 * BYTES;
        for (int off = lane * 16; off < whole; off += WARP * 16)
            *(uint4*)(st + off) = __ldg((const uint4*)(src + off));
        if (lane < bytes - whole) st[whole + lane] = src[whole + lane];
        __syncwarp();
#pragma unroll 4
        for (int b = lane; b < cb; b += WARP) {
            Sub sub;
            unpack_sub(st, WT, b, &sub);
            s += unpacked_dot_q8_1(sub, WT, xq + (long long)(b0 + b) * 36);
        }
        __syncwarp();
    }
    s = warp_sum(s);
    if (lane == 0) y[j] = s;
}

extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP)
    bl_matvec_q8_0(const uint8_t* w, long long w_stride, const uint8_t* xq, float* y, int k, int n) {
    matvec_staged<WT_Q8_0, 34>(w, w_stride, xq, y, k, n);
}
