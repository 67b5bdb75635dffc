// F32 products of batches (a prompt's router logits, the f32 test models' weights): y[c * n + j] =
// W_j . x_c for many columns at once, in tiles staged in shared memory, so that each weight row
// and activation row is read once per tile instead of once per output (bl_matmul_f32, a warp per
// output, keeps decode and the shapes this kernel does not take).
// Included by kernels.cu after WARP and KERNEL_ENTRY (and by kernels/cuda/sim's tests after sim.h).

#pragma once

// A block's tile: F32T_BN weight rows by F32T_BM columns, k stepped by F32T_KC; the block's two
// halves of F32T_THREADS / 2 threads take the even and the odd k steps (twice the warps in flight
// on the few tiles of a router's products).
#define F32T_BN 16
#define F32T_BM 32
#define F32T_KC 64
// Shared rows of F32T_KC + 4 floats: 8 rows' 16-byte loads at one offset fall on distinct banks.
#define F32T_LD (F32T_KC + 4)
#define F32T_THREADS 256

// Grid (ceil(n / F32T_BN), ceil(m / F32T_BM)), F32T_THREADS threads. k is a multiple of 4 (quads
// past k read as zeros); W's rows (w_stride bytes apart), w and x are 16-byte aligned. In each
// half, thread t sums weight rows 2 (t / 16) and 2 (t / 16) + 1 against columns t % 16 and
// t % 16 + 16 of the tile over its k steps in order; the output is the even steps' sum plus the
// odd steps'. Staging: thread t loads quad t % 16 of its half's step from weight rows t / 16 + 8 i
// and columns t / 16 + 8 i; the next step's quads are read into registers while this step is
// summed.
extern "C" __global__ void __launch_bounds__(F32T_THREADS)
    bl_matmul_f32_tiled(const uint8_t* w, long long w_stride, const float* x, float* y, int k, int n, int m) {
    KERNEL_ENTRY();
    constexpr int HALF = F32T_THREADS / 2;
    __shared__ __align__(16) float ws[2][F32T_BN * F32T_LD];
    __shared__ __align__(16) float xs[2][F32T_BM * F32T_LD];
    constexpr int WQ = F32T_BN * F32T_KC / 4 / HALF, XQ = F32T_BM * F32T_KC / 4 / HALF;
    constexpr int STEP = HALF / (F32T_KC / 4);
    const int half = threadIdx.x / HALF, t = threadIdx.x % HALF;
    const int n0 = blockIdx.x * F32T_BN, m0 = blockIdx.y * F32T_BM;
    const int sr = t / (F32T_KC / 4), sq = (t % (F32T_KC / 4)) * 4 + half * F32T_KC;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float* wsh = ws[half];
    float* xsh = xs[half];
    const float* wp[WQ];
    const float* xp[XQ];
    float4 wv[WQ], xv[XQ];
#pragma unroll
    for (int i = 0; i < WQ; ++i) {
        const int r = n0 + sr + STEP * i;
        wp[i] = r < n ? (const float*)(w + (long long)r * w_stride) + sq : nullptr;
        wv[i] = wp[i] && sq < k ? *(const float4*)wp[i] : zero;
    }
#pragma unroll
    for (int i = 0; i < XQ; ++i) {
        const int c = m0 + sr + STEP * i;
        xp[i] = c < m ? x + (long long)c * k + sq : nullptr;
        xv[i] = xp[i] && sq < k ? *(const float4*)xp[i] : zero;
    }
    const int tr = (t / 16) * 2, tc = t % 16;
    const int q0 = sq - half * F32T_KC;
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int k0 = 0; k0 < k; k0 += 2 * F32T_KC) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < WQ; ++i) *(float4*)&wsh[(sr + STEP * i) * F32T_LD + q0] = wv[i];
#pragma unroll
        for (int i = 0; i < XQ; ++i) *(float4*)&xsh[(sr + STEP * i) * F32T_LD + q0] = xv[i];
        __syncthreads();
        const int next = k0 + 2 * F32T_KC;
        if (next < k) {
            const bool in = next + sq < k;
#pragma unroll
            for (int i = 0; i < WQ; ++i) wv[i] = wp[i] && in ? *(const float4*)(wp[i] + next) : zero;
#pragma unroll
            for (int i = 0; i < XQ; ++i) xv[i] = xp[i] && in ? *(const float4*)(xp[i] + next) : zero;
        }
#pragma unroll
        for (int kk = 0; kk < F32T_KC; kk += 4) {
            float4 a[2], b[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                a[i] = *(const float4*)&wsh[(tr + i) * F32T_LD + kk];
                b[i] = *(const float4*)&xsh[(tc + 16 * i) * F32T_LD + kk];
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    float s = acc[i][j];
                    s = fmaf(a[i].x, b[j].x, s);
                    s = fmaf(a[i].y, b[j].y, s);
                    s = fmaf(a[i].z, b[j].z, s);
                    s = fmaf(a[i].w, b[j].w, s);
                    acc[i][j] = s;
                }
        }
    }
    // The odd steps' sums to the even half, through its half's weight tile.
    __syncthreads();
    float* part = ws[1];
    if (half == 1)
#pragma unroll
        for (int i = 0; i < 4; ++i) part[i * HALF + t] = acc[i / 2][i % 2];
    __syncthreads();
    if (half == 1) return;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int r = n0 + tr + i, c = m0 + tc + 16 * j;
            if (r < n && c < m) y[(long long)c * n + r] = acc[i][j] + part[(2 * i + j) * HALF + t];
        }
}
