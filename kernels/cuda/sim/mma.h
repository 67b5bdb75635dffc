// The CPU emulation of cu/mma.cuh (sim.h must come first): ldmatrix and the int8 mma of the tiled
// products (cu/mmq.cuh) as warp-wide exchanges between the lanes' threads, with the register
// layouts PTX gives them. Shared memory is host memory here, so an address is a pointer.
#pragma once

// Per warp: what each lane gives an ldmatrix or an mma.
struct MmaExchange {
    const void* row[WARP];
    int a[WARP][4];
    int b[WARP][2];
};
inline MmaExchange g_mma[32];

inline const void* smem_addr(const void* p) { return p; }

// Four 8 x 8 b16 matrices: lane i gives row i % 8 of matrix i / 8; lane L receives, of matrix m,
// the 4 bytes at byte 4 (L % 4) of row L / 4.
inline void ldsm_x4(unsigned* r, const void* row) {
    const unsigned lane = threadIdx.x % WARP;
    WarpExchange& w = *g_warps[threadIdx.x / WARP];
    MmaExchange& e = g_mma[threadIdx.x / WARP];
    e.row[lane] = row;
    w.bar.arrive_and_wait();
    for (unsigned m = 0; m < 4; ++m) std::memcpy(&r[m], (const char*)e.row[m * 8 + lane / 4] + 4 * (lane % 4), 4);
    w.bar.arrive_and_wait();
}

// c += A . B for a 16 x 8 tile over k = 32 (m16n8k32, row.col, s8 x s8 -> s32). With g = lane / 4
// and t = lane % 4: a[0..3] hold A's row g, k 4t..4t+3 / row g + 8, same k / row g, k 16 + 4t.. /
// row g + 8, k 16 + 4t..; b[0..1] hold B's column g, k 4t..4t+3 / k 16 + 4t..; c[0..3] are
// (row g, column 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
inline void mma_s8(int* c, const int* a, const int* b) {
    const unsigned lane = threadIdx.x % WARP;
    WarpExchange& w = *g_warps[threadIdx.x / WARP];
    MmaExchange& e = g_mma[threadIdx.x / WARP];
    std::memcpy(e.a[lane], a, sizeof e.a[lane]);
    std::memcpy(e.b[lane], b, sizeof e.b[lane]);
    w.bar.arrive_and_wait();
    const auto byte = [](int word, int k) { return (int)(int8_t)(word >> (8 * (k % 4))); };
    const auto A = [&](int r, int k) { return byte(e.a[4 * (r % 8) + k % 16 / 4][(r >= 8) + 2 * (k >= 16)], k); };
    const auto B = [&](int k, int n) { return byte(e.b[4 * n + k % 16 / 4][k >= 16], k); };
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int r = g + (i >= 2 ? 8 : 0), n = 2 * t + (i & 1);
        for (int k = 0; k < 32; ++k) c[i] += A(r, k) * B(k, n);
    }
    w.bar.arrive_and_wait();
}
