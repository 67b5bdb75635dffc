// GGUF weight blocks as the CUDA kernels read them: one function per type unpacks a 32-value
// sub-block into int8 quads and its scales, and every quantized kernel (row gathers, dp4a products,
// tiled products, routed experts) reads weights through `unpack_sub`, so each layout is written
// once. Layouts follow the CPU reference (kernels/cpu/src/quant/), which is bit-identical to the
// `gguf` package's dequantizers; offsets are given beside each function.

#pragma once

#include <stdint.h>
#include <cuda_fp16.h>

// Weight type codes (`wtype`), as kernels/cuda/src/ops/quant.rs names them. 0 is F32 (f32
// activations); the others take Q8_1 activations.
#define WT_F32 0
#define WT_Q8_0 1
#define WT_Q4_K 2
#define WT_Q6_K 3
#define WT_Q5_K 4
#define WT_Q5_0 5
#define WT_Q4_0 6
#define WT_Q5_1 7
#define WT_IQ4_XS 8
#define WT_IQ4_NL 9
#define WT_MXFP4 10
#define WT_Q3_K 11
#define WT_IQ3_XXS 12

// The non-linear 4-bit tables (kernels/cpu/src/quant/iq_tables.rs; a test in ops/quant.rs
// compares).
#define KVALUES_IQ4NL_LIST -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
#define KVALUES_E2M1_LIST 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12
// The IQ3_XXS grid: 256 rows of four magnitudes, a byte each (iq_tables.rs IQ3XXS_GRID).
#define IQ3XXS_GRID_LIST 0x04040404, 0x04040414, 0x04040424, 0x04040c0c, 0x04040c1c, 0x04040c3e, 0x04041404, 0x04041414, 0x04041c0c, 0x04042414, 0x04043e1c, 0x04043e2c, 0x040c040c, 0x040c041c, 0x040c0c04, 0x040c0c14, 0x040c140c, 0x040c142c, 0x040c1c04, 0x040c1c14, 0x040c240c, 0x040c2c24, 0x040c3e04, 0x04140404, 0x04140414, 0x04140424, 0x04140c0c, 0x04141404, 0x04141414, 0x04141c0c, 0x04141c1c, 0x04141c3e, 0x04142c0c, 0x04142c3e, 0x04143e2c, 0x041c040c, 0x041c043e, 0x041c0c04, 0x041c0c14, 0x041c142c, 0x041c3e04, 0x04240c1c, 0x04241c3e, 0x04242424, 0x04242c3e, 0x04243e1c, 0x04243e2c, 0x042c040c, 0x042c043e, 0x042c1c14, 0x042c2c14, 0x04341c2c, 0x04343424, 0x043e0c04, 0x043e0c24, 0x043e0c34, 0x043e241c, 0x043e340c, 0x0c04040c, 0x0c04041c, 0x0c040c04, 0x0c040c14, 0x0c04140c, 0x0c04141c, 0x0c041c04, 0x0c041c14, 0x0c041c24, 0x0c04243e, 0x0c042c04, 0x0c0c0404, 0x0c0c0414, 0x0c0c0c0c, 0x0c0c1404, 0x0c0c1414, 0x0c14040c, 0x0c14041c, 0x0c140c04, 0x0c140c14, 0x0c14140c, 0x0c141c04, 0x0c143e14, 0x0c1c0404, 0x0c1c0414, 0x0c1c1404, 0x0c1c1c0c, 0x0c1c2434, 0x0c1c3434, 0x0c24040c, 0x0c24042c, 0x0c242c04, 0x0c2c1404, 0x0c2c1424, 0x0c2c2434, 0x0c2c3e0c, 0x0c34042c, 0x0c3e1414, 0x0c3e2404, 0x14040404, 0x14040414, 0x14040c0c, 0x14040c1c, 0x14041404, 0x14041414, 0x14041434, 0x14041c0c, 0x14042414, 0x140c040c, 0x140c041c, 0x140c042c, 0x140c0c04, 0x140c0c14, 0x140c140c, 0x140c1c04, 0x140c341c, 0x140c343e, 0x140c3e04, 0x14140404, 0x14140414, 0x14140c0c, 0x14140c3e, 0x14141404, 0x14141414, 0x14141c3e, 0x14142404, 0x14142c2c, 0x141c040c, 0x141c0c04, 0x141c0c24, 0x141c3e04, 0x141c3e24, 0x14241c2c, 0x14242c1c, 0x142c041c, 0x142c143e, 0x142c240c, 0x142c3e24, 0x143e040c, 0x143e041c, 0x143e0c34, 0x143e242c, 0x1c04040c, 0x1c040c04, 0x1c040c14, 0x1c04140c, 0x1c04141c, 0x1c042c04, 0x1c04342c, 0x1c043e14, 0x1c0c0404, 0x1c0c0414, 0x1c0c1404, 0x1c0c1c0c, 0x1c0c2424, 0x1c0c2434, 0x1c14040c, 0x1c14041c, 0x1c140c04, 0x1c14142c, 0x1c142c14, 0x1c143e14, 0x1c1c0c0c, 0x1c1c1c1c, 0x1c241c04, 0x1c24243e, 0x1c243e14, 0x1c2c0404, 0x1c2c0434, 0x1c2c1414, 0x1c2c2c2c, 0x1c340c24, 0x1c341c34, 0x1c34341c, 0x1c3e1c1c, 0x1c3e3404, 0x24040424, 0x24040c3e, 0x24041c2c, 0x24041c3e, 0x24042c1c, 0x24042c3e, 0x240c3e24, 0x24141404, 0x24141c3e, 0x24142404, 0x24143404, 0x24143434, 0x241c043e, 0x241c242c, 0x24240424, 0x24242c0c, 0x24243424, 0x242c142c, 0x242c241c, 0x242c3e04, 0x243e042c, 0x243e0c04, 0x243e0c14, 0x243e1c04, 0x2c040c14, 0x2c04240c, 0x2c043e04, 0x2c0c0404, 0x2c0c0434, 0x2c0c1434, 0x2c0c2c2c, 0x2c140c24, 0x2c141c14, 0x2c143e14, 0x2c1c0414, 0x2c1c2c1c, 0x2c240c04, 0x2c24141c, 0x2c24143e, 0x2c243e14, 0x2c2c0414, 0x2c2c1c0c, 0x2c342c04, 0x2c3e1424, 0x2c3e2414, 0x34041424, 0x34042424, 0x34042434, 0x34043424, 0x340c140c, 0x340c340c, 0x34140c3e, 0x34143424, 0x341c1c04, 0x341c1c34, 0x34242424, 0x342c042c, 0x342c2c14, 0x34341c1c, 0x343e041c, 0x343e140c, 0x3e04041c, 0x3e04042c, 0x3e04043e, 0x3e040c04, 0x3e041c14, 0x3e042c14, 0x3e0c1434, 0x3e0c2404, 0x3e140c14, 0x3e14242c, 0x3e142c14, 0x3e1c0404, 0x3e1c0c2c, 0x3e1c1c1c, 0x3e1c3404, 0x3e24140c, 0x3e24240c, 0x3e2c0404, 0x3e2c0414, 0x3e2c1424, 0x3e341c04

static __device__ __forceinline__ float half_at(const uint8_t* p) {
    __half h;
    memcpy(&h, p, 2);
    return __half2float(h);
}

// Four bytes at a 2-byte aligned address.
static __device__ __forceinline__ int load_i32(const uint8_t* p) {
    const uint16_t lo = *(const uint16_t*)p, hi = *(const uint16_t*)(p + 2);
    return (int)((uint32_t)lo | ((uint32_t)hi << 16));
}

// Four bytes at any address (MXFP4 blocks are 17 bytes).
static __device__ __forceinline__ int load_i32_u8(const uint8_t* p) {
    return (int)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

// Bits 0..3 of h to bit 4 of bytes 0..3 (the fifth bits of Q5_0 / Q5_1 values).
static __device__ __forceinline__ uint32_t spread4(uint32_t h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

// Scale and minimum j (0..7) of the 12-byte, 6-bit Q4_K / Q5_K scales.
static __device__ __forceinline__ void scale_min_k4(const uint8_t* sc, int j, int* d, int* m) {
    if (j < 4) {
        *d = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *d = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

// Looks up four 4-bit codes (one per byte, 0..15) in a 16-entry int8 table held as four words.
static __device__ __forceinline__ int lut16(uint32_t codes, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    const uint32_t sel = (codes & 0x7u) | ((codes >> 4) & 0x70u) | ((codes >> 8) & 0x700u) | ((codes >> 12) & 0x7000u);
    const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const uint32_t upper = ((codes >> 3) & 0x01010101u) * 0xFFu;  // 0xFF in bytes whose code is >= 8
    return (int)((lo & ~upper) | (hi & upper));
}

static __device__ __forceinline__ int lut_iq4nl(uint32_t codes) {
    const int8_t k[16] = {KVALUES_IQ4NL_LIST};
    return lut16(codes, pack4(k[0], k[1], k[2], k[3]), pack4(k[4], k[5], k[6], k[7]), pack4(k[8], k[9], k[10], k[11]),
                 pack4(k[12], k[13], k[14], k[15]));
}

static __device__ __forceinline__ int lut_e2m1(uint32_t codes) {
    const int8_t k[16] = {KVALUES_E2M1_LIST};
    return lut16(codes, pack4(k[0], k[1], k[2], k[3]), pack4(k[4], k[5], k[6], k[7]), pack4(k[8], k[9], k[10], k[11]),
                 pack4(k[12], k[13], k[14], k[15]));
}

// Half of an E8M0 scale (the E2M1 table holds doubled values), as gguf: 2^(e - 128).
static __device__ __forceinline__ float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return __uint_as_float(bits);
}

// One 32-value sub-block of a weight row: value i is d[i / 16] * q_i - m, where q[t] holds values
// 4t .. 4t + 3 as signed bytes. d[0] == d[1] except for the types with a scale per 16 values
// (Q6_K, Q3_K; see `two_scales`).
struct Sub {
    int q[8];
    float d[2];
    float m;
};

static __device__ __forceinline__ bool two_scales(int wtype) { return wtype == WT_Q6_K || wtype == WT_Q3_K; }

// Q8_0 (34 bytes): d:f16, qs:i8[32].
static __device__ __forceinline__ void unpack_q8_0(const uint8_t* b, Sub* s) {
    const float d = half_at(b);
#pragma unroll
    for (int t = 0; t < 8; ++t) s->q[t] = load_i32(b + 2 + 4 * t);
    s->d[0] = s->d[1] = d;
    s->m = 0.0f;
}

// Q4_0 (18 bytes): d:f16, qs[16]; element j in the low nibble of qs[j], j + 16 in the high; q - 8.
static __device__ __forceinline__ void unpack_q4_0(const uint8_t* b, Sub* s) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const uint32_t w = (uint32_t)load_i32(b + 2 + 4 * t);
        s->q[t] = (int)__vsub4(w & 0x0F0F0F0Fu, 0x08080808u);
        s->q[t + 4] = (int)__vsub4((w >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
    s->d[0] = s->d[1] = half_at(b);
    s->m = 0.0f;
}

// Q5_0 (22 bytes): d:f16, qh:u32 (bit j: fifth bit of element j), qs[16] as Q4_0; q - 16.
static __device__ __forceinline__ void unpack_q5_0(const uint8_t* b, Sub* s) {
    const uint32_t qh = (uint32_t)load_i32(b + 2);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const uint32_t w = (uint32_t)load_i32(b + 6 + 4 * t);
        s->q[t] = (int)__vsub4((w & 0x0F0F0F0Fu) | spread4(qh >> (4 * t)), 0x10101010u);
        s->q[t + 4] = (int)__vsub4(((w >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * t)), 0x10101010u);
    }
    s->d[0] = s->d[1] = half_at(b);
    s->m = 0.0f;
}

// Q5_1 (24 bytes): d:f16, m:f16, qh:u32, qs[16] as Q5_0; d * q + m.
static __device__ __forceinline__ void unpack_q5_1(const uint8_t* b, Sub* s) {
    const uint32_t qh = (uint32_t)load_i32(b + 4);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const uint32_t w = (uint32_t)load_i32(b + 8 + 4 * t);
        s->q[t] = (int)((w & 0x0F0F0F0Fu) | spread4(qh >> (4 * t)));
        s->q[t + 4] = (int)(((w >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * t)));
    }
    s->d[0] = s->d[1] = half_at(b);
    s->m = -half_at(b + 2);
}

// IQ4_NL (18 bytes): d:f16, qs[16] as Q4_0, codes into KVALUES_IQ4NL.
static __device__ __forceinline__ void unpack_iq4_nl(const uint8_t* b, Sub* s) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const uint32_t w = (uint32_t)load_i32(b + 2 + 4 * t);
        s->q[t] = lut_iq4nl(w & 0x0F0F0F0Fu);
        s->q[t + 4] = lut_iq4nl((w >> 4) & 0x0F0F0F0Fu);
    }
    s->d[0] = s->d[1] = half_at(b);
    s->m = 0.0f;
}

// MXFP4 (17 bytes): e:u8 (E8M0), qs[16] as Q4_0, codes into KVALUES_E2M1 (doubled values).
static __device__ __forceinline__ void unpack_mxfp4(const uint8_t* b, Sub* s) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const uint32_t w = (uint32_t)load_i32_u8(b + 1 + 4 * t);
        s->q[t] = lut_e2m1(w & 0x0F0F0F0Fu);
        s->q[t + 4] = lut_e2m1((w >> 4) & 0x0F0F0F0Fu);
    }
    s->d[0] = s->d[1] = e8m0_half(b[0]);
    s->m = 0.0f;
}

// Q4_K (144 bytes): d:f16, dmin:f16, scales[12], qs[128] (element c*64 + h*32 + l in nibble h of
// qs[c*32 + l]); sub-block j: d * sc_j * q - dmin * m_j.
// Sub-block j of a Q4_K block from its (d, dmin), its scale and min codes, and the 8 words of
// packed values it shares with its neighbour (low nibbles for even j).
static __device__ __forceinline__ void q4_k_sub(float2 dm, int sc, int mn, const int* qs, int j, Sub* s) {
    const int shift = 4 * (j % 2);
#pragma unroll
    for (int t = 0; t < 8; ++t) s->q[t] = (qs[t] >> shift) & 0x0F0F0F0F;
    s->d[0] = s->d[1] = dm.x * (float)sc;
    s->m = dm.y * (float)mn;
}

static __device__ __forceinline__ void unpack_q4_k(const uint8_t* blk, int j, Sub* s) {
    const float2 dm = __half22float2(*(const __half2*)blk);
    int sc, mn;
    scale_min_k4(blk + 4, j, &sc, &mn);
    q4_k_sub(dm, sc, mn, (const int*)(blk + 16 + (j / 2) * 32), j, s);
}

// Q5_K (176 bytes): d:f16, dmin:f16, scales[12], qh[32] (bit j of qh[l]: fifth bit of element
// j*32 + l), qs[128] as Q4_K.
// unpack_q4_k of a 16-byte aligned block in three 16-byte loads: the scales' 16 bytes, then the
// 32 bytes of packed values sub-block j shares with its neighbour. Scale and min j are byte j % 4
// of the scale words (as scale_min_k4 picks them).
static __device__ __forceinline__ void unpack_q4_k_aligned(const uint8_t* blk, int j, Sub* s) {
    const int4 h = *(const int4*)blk;
    const int4* qs = (const int4*)(blk + 16 + (j / 2) * 32);
    const int4 lo = qs[0], hi = qs[1];
    const int sh = 8 * (j & 3);
    const int a = ((unsigned)h.y >> sh) & 0xFF, b = ((unsigned)h.z >> sh) & 0xFF, c = ((unsigned)h.w >> sh) & 0xFF;
    const int sc = j < 4 ? a & 63 : (c & 0x0F) | ((a >> 6) << 4);
    const int mn = j < 4 ? b & 63 : (c >> 4) | ((b >> 6) << 4);
    __half2 dh;
    memcpy(&dh, &h.x, 4);
    const int q[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    q4_k_sub(__half22float2(dh), sc, mn, q, j, s);
}

// IQ3_XXS, 98 bytes per 256 values: d (f16), 64 grid indices (values 4t .. 4t + 3 of sub-block j
// are row qs[8j + t] of the grid), then a 32-bit word per sub-block at 66 + 4j: four 7-bit sign
// indices (values 8l .. 8l + 7) and a 4-bit scale on top; the scale is d (0.5 + s) / 2. A sign
// index i stands for the byte i with an eighth bit that makes the count of set bits even.
static __device__ const uint32_t iq3xxs_grid[256] = {IQ3XXS_GRID_LIST};
static __device__ __forceinline__ void unpack_iq3_xxs(const uint8_t* blk, int j, Sub* s) {
    const uint32_t aux = (uint32_t)load_i32(blk + 66 + 4 * j);
    const uint8_t* qs = blk + 2 + 8 * j;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        const uint32_t i = (aux >> (7 * (t / 2))) & 127u;
        const uint32_t signs = (i | ((uint32_t)(__popc(i) & 1) << 7)) >> (4 * (t % 2));
        // 0xFF in the bytes whose sign bit is set.
        const uint32_t neg = ((((signs & 15u) * 0x00204081u) & 0x01010101u) * 0xFFu);
        const uint32_t g = iq3xxs_grid[qs[t]];
        s->q[t] = (int)((g & ~neg) | (__vsub4(0u, g) & neg));
    }
    s->d[0] = s->d[1] = half_at(blk) * (0.5f + (float)(aux >> 28)) * 0.5f;
    s->m = 0.0f;
}

static __device__ __forceinline__ void unpack_q5_k(const uint8_t* blk, int j, Sub* s) {
    const float2 dm = __half22float2(*(const __half2*)blk);
    int sc, mn;
    scale_min_k4(blk + 4, j, &sc, &mn);
    const int* qh = (const int*)(blk + 16);
    const int* qs = (const int*)(blk + 48 + (j / 2) * 32);
    const int shift = 4 * (j % 2);
#pragma unroll
    for (int t = 0; t < 8; ++t) s->q[t] = ((qs[t] >> shift) & 0x0F0F0F0F) | (((qh[t] >> j) & 0x01010101) << 4);
    s->d[0] = s->d[1] = dm.x * (float)sc;
    s->m = dm.y * (float)mn;
}

// Q6_K (210 bytes): ql[128], qh[64], scales:i8[16], d:f16. Element c*128 + p*32 + l: low nibble
// in nibble p/2 of ql[c*64 + (p%2)*32 + l], top 2 bits in bits 2p of qh[c*32 + l]; q - 32, one
// scale per 16 elements.
static __device__ __forceinline__ void unpack_q6_k(const uint8_t* blk, int j, Sub* s) {
    const int c = j / 4, p = j % 4;
    const uint8_t* ql = blk + c * 64 + (p % 2) * 32;
    const uint8_t* qh = blk + 128 + c * 32;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        const uint32_t lo = ((uint32_t)load_i32(ql + 4 * t) >> (4 * (p / 2))) & 0x0F0F0F0Fu;
        const uint32_t hi = (((uint32_t)load_i32(qh + 4 * t) >> (2 * p)) & 0x03030303u) << 4;
        s->q[t] = (int)__vsub4(lo | hi, 0x20202020u);
    }
    const float d = half_at(blk + 208);
    s->d[0] = d * (float)(int8_t)blk[192 + 2 * j];
    s->d[1] = d * (float)(int8_t)blk[193 + 2 * j];
    s->m = 0.0f;
}

// Q3_K (110 bytes): hmask[32] (bit j of hmask[l] set: element j*32 + l has no -4 offset), qs[64]
// (element c*128 + p*32 + l in bits 2p of qs[c*32 + l]), scales[12] (16 six-bit scales, offset
// 32), d:f16.
static __device__ __forceinline__ int scale_q3_k(const uint8_t* sc, int k) {
    const int lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0F;
    const int hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
    return (lo | (hi << 4)) - 32;
}

static __device__ __forceinline__ void unpack_q3_k(const uint8_t* blk, int j, Sub* s) {
    const int c = j / 4, p = j % 4;
    const uint8_t* qs = blk + 32 + c * 32;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        const uint32_t q2 = ((uint32_t)load_i32(qs + 4 * t) >> (2 * p)) & 0x03030303u;
        const uint32_t h = (((uint32_t)load_i32(blk + 4 * t) >> j) & 0x01010101u) << 2;
        s->q[t] = (int)__vsub4(q2 | h, 0x04040404u);
    }
    const float d = half_at(blk + 108);
    s->d[0] = d * (float)scale_q3_k(blk + 96, 2 * j);
    s->d[1] = d * (float)scale_q3_k(blk + 96, 2 * j + 1);
    s->m = 0.0f;
}

// IQ4_XS (136 bytes): d:f16, scales_h:u16 (2 high bits per sub-block), scales_l[4] (4 low bits
// per sub-block), qs[128] (sub-block ib: qs[16*ib + l] holds elements l and l + 16); scale offset
// 32, codes into KVALUES_IQ4NL.
static __device__ __forceinline__ void unpack_iq4_xs(const uint8_t* blk, int ib, Sub* s) {
    const int sh = (int)blk[2] | ((int)blk[3] << 8);
    const int sc = (((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const uint32_t w = (uint32_t)load_i32(blk + 8 + 16 * ib + 4 * t);
        s->q[t] = lut_iq4nl(w & 0x0F0F0F0Fu);
        s->q[t + 4] = lut_iq4nl((w >> 4) & 0x0F0F0F0Fu);
    }
    s->d[0] = s->d[1] = half_at(blk) * (float)sc;
    s->m = 0.0f;
}

// Sub-block sb of a row of weight type `wtype` (not F32).
static __device__ __forceinline__ void unpack_sub(const uint8_t* row, int wtype, int sb, Sub* s) {
    switch (wtype) {
        case WT_Q8_0: unpack_q8_0(row + (long long)sb * 34, s); break;
        case WT_Q4_K: unpack_q4_k(row + (long long)(sb / 8) * 144, sb % 8, s); break;
        case WT_Q6_K: unpack_q6_k(row + (long long)(sb / 8) * 210, sb % 8, s); break;
        case WT_Q5_K: unpack_q5_k(row + (long long)(sb / 8) * 176, sb % 8, s); break;
        case WT_Q5_0: unpack_q5_0(row + (long long)sb * 22, s); break;
        case WT_Q4_0: unpack_q4_0(row + (long long)sb * 18, s); break;
        case WT_Q5_1: unpack_q5_1(row + (long long)sb * 24, s); break;
        case WT_IQ4_XS: unpack_iq4_xs(row + (long long)(sb / 8) * 136, sb % 8, s); break;
        case WT_IQ4_NL: unpack_iq4_nl(row + (long long)sb * 18, s); break;
        case WT_MXFP4: unpack_mxfp4(row + (long long)sb * 17, s); break;
        case WT_IQ3_XXS: unpack_iq3_xxs(row + (long long)(sb / 8) * 98, sb % 8, s); break;
        default: unpack_q3_k(row + (long long)(sb / 8) * 110, sb % 8, s); break;
    }
}

// Runs CALL with `WT`, a compile-time constant equal to `wtype`: inlined into CALL, unpack_sub's
// switch folds away and each type's loop is straight code (the single-row kernels are specialized
// so; the tiled ones, which unpack once per tile slot, switch at run time).
#define WITH_WTYPE(wtype, CALL)                       \
    switch (wtype) {                                  \
        case WT_F32: {                                \
            constexpr int WT = WT_F32;                \
            CALL;                                     \
        } break;                                      \
        case WT_Q8_0: {                               \
            constexpr int WT = WT_Q8_0;               \
            CALL;                                     \
        } break;                                      \
        case WT_Q4_K: {                               \
            constexpr int WT = WT_Q4_K;               \
            CALL;                                     \
        } break;                                      \
        case WT_Q6_K: {                               \
            constexpr int WT = WT_Q6_K;               \
            CALL;                                     \
        } break;                                      \
        case WT_Q5_K: {                               \
            constexpr int WT = WT_Q5_K;               \
            CALL;                                     \
        } break;                                      \
        case WT_Q5_0: {                               \
            constexpr int WT = WT_Q5_0;               \
            CALL;                                     \
        } break;                                      \
        case WT_Q4_0: {                               \
            constexpr int WT = WT_Q4_0;               \
            CALL;                                     \
        } break;                                      \
        case WT_Q5_1: {                               \
            constexpr int WT = WT_Q5_1;               \
            CALL;                                     \
        } break;                                      \
        case WT_IQ4_XS: {                             \
            constexpr int WT = WT_IQ4_XS;             \
            CALL;                                     \
        } break;                                      \
        case WT_IQ4_NL: {                             \
            constexpr int WT = WT_IQ4_NL;             \
            CALL;                                     \
        } break;                                      \
        case WT_MXFP4: {                              \
            constexpr int WT = WT_MXFP4;              \
            CALL;                                     \
        } break;                                      \
        case WT_IQ3_XXS: {                            \
            constexpr int WT = WT_IQ3_XXS;            \
            CALL;                                     \
        } break;                                      \
        default: {                                    \
            constexpr int WT = WT_Q3_K;               \
            CALL;                                     \
        } break;                                      \
    }

// Value i (0..31) of an unpacked sub-block, rounded as the CPU reference: (d * q) - m, unfused.
static __device__ __forceinline__ float sub_value(const Sub* s, int i) {
    const int q = (int)(int8_t)(uint8_t)((uint32_t)s->q[i / 4] >> (8 * (i % 4)));
    return __fsub_rn(__fmul_rn(s->d[i / 16], (float)q), s->m);
}

// An unpacked weight sub-block . a Q8_1 activation block xb (f16 d, f16 s = d * sum q, 32 x
// int8): d * dx * sum(q * qx) - m * s, the integer sums by dp4a. Apart from the unpacking, so
// that one unpacked sub-block can serve several activation columns.
static __device__ __forceinline__ float unpacked_dot_q8_1(const Sub& s, int wtype, const uint8_t* xb) {
    const int* xq = (const int*)(xb + 4);
    const float2 ds = __half22float2(*(const __half2*)xb);
    int lo = 0, hi = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        lo = __dp4a(s.q[t], xq[t], lo);
        hi = __dp4a(s.q[t + 4], xq[t + 4], hi);
    }
    if (two_scales(wtype)) return ds.x * (s.d[0] * (float)lo + s.d[1] * (float)hi);
    return s.d[0] * ds.x * (float)(lo + hi) - s.m * ds.y;
}

// W_row . x over sub-block sb with the Q8_1 activation block xb.
static __device__ __forceinline__ float sub_dot_q8_1(const uint8_t* wrow, int wtype, const uint8_t* xb, int sb) {
    Sub s;
    unpack_sub(wrow, wtype, sb, &s);
    return unpacked_dot_q8_1(s, wtype, xb);
}

// ---- two sub-blocks at once (64 values: sub-blocks 2p and 2p + 1), for the single-row products --
// Q4_K keeps the two sub-blocks in the low and high nibbles of the same 32 bytes, and two Q8_0
// blocks start on a 4-byte boundary, so one thread reads each byte once with aligned (for Q4_K,
// 16-byte) loads. Rows must then be 16-byte aligned (Q4_K) or 4-byte aligned (Q8_0): `pairs_ok`.
// The activations are staged in shared memory (stage_row).

// Whether WT has a pair form.
template <int WT> struct HasPair { static constexpr bool value = WT == WT_Q4_K || WT == WT_Q8_0; };

// Rows at `base` with byte stride `stride` (and expert stride `estride`) suit the pair form of WT.
template <int WT>
static __device__ __forceinline__ bool pairs_ok(const void* base, long long stride, long long estride, int k) {
    if (!HasPair<WT>::value || k % 64 != 0) return false;
    const long long a = (long long)(uintptr_t)base | stride | estride;
    return WT == WT_Q4_K ? (a & 15) == 0 : (a & 3) == 0;
}

// sum(q * qx) over 8 words of int8 weights and the 8 words of a Q8_1 block's values.
static __device__ __forceinline__ int dot8(const int* q, const int* xq) {
    int s = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) s = __dp4a(q[t], xq[t], s);
    return s;
}

// ---- Q8_1 activation rows staged in shared memory for the pair forms ------------------------------
// A staged row keeps each pair of Q8_1 blocks (64 values) in STAGE_PAIR bytes: the two blocks'
// (d, s) as half2 at bytes 0..7 and their values at 16..47 and 48..79, so that a lane reads a pair
// with one 8-byte and four 16-byte shared loads instead of eighteen 4-byte global ones.
#define STAGE_PAIR 80

// Copies the Q8_1 row at x (nvals values, a multiple of 64; 4-byte aligned) to its staged form
// at s, the block's threads sharing the copy (the caller synchronises before reading).
static __device__ void stage_row(const uint8_t* x, int nvals, uint8_t* s) {
    const int words = nvals / 32 * 9;
    const int* xw = (const int*)x;
    int* sw = (int*)s;
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
        const int b = i / 9, w = i - 9 * b;
        sw[(b >> 1) * (STAGE_PAIR / 4) + (w == 0 ? (b & 1) : 4 + (b & 1) * 8 + w - 1)] = xw[i];
    }
}

// The dynamic shared memory the launch gave the block, in bytes.
static __device__ __forceinline__ unsigned dynamic_smem_bytes() {
    unsigned v;
#if defined(__CUDA_ARCH__)
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
#else
    v = 0;  // The CPU emulation (kernels/cuda/sim) gives no dynamic shared memory.
#endif
    return v;
}

// The weight words of one 64-value chunk (sub-blocks 2p and 2p + 1) of a row whose type has a
// pair form, loaded apart from their use so that kernels can issue every load of a batch (and,
// for weights that no earlier kernel writes, before waiting on that kernel) first.
template <int WT> struct PairW;

// Q4_K: head = the block's d, dmin and 12 scale bytes (bytes 0..15); a, b = the 32 bytes whose
// low nibbles are sub-block 2 (p % 4) and high nibbles the next; j = that sub-block's index.
template <> struct PairW<WT_Q4_K> {
    int4 head, a, b;
    int j;
};

// Q8_0: blocks 2p and 2p + 1 as 17 aligned words: d0 | q0 (bytes 2 .. 33) | d1 | q1.
template <> struct PairW<WT_Q8_0> {
    int v[17];
};

template <int WT>
static __device__ __forceinline__ PairW<WT> load_pair(const uint8_t* wrow, int p) {
    PairW<WT> w;
    if constexpr (WT == WT_Q4_K) {
        const uint8_t* blk = wrow + (long long)(p / 4) * 144;
        w.head = *(const int4*)blk;
        w.a = *(const int4*)(blk + 16 + (p % 4) * 32);
        w.b = *(const int4*)(blk + 32 + (p % 4) * 32);
        w.j = 2 * (p % 4);
    } else {
        const int* src = (const int*)(wrow + (long long)p * 68);
#pragma unroll
        for (int t = 0; t < 17; ++t) w.v[t] = src[t];
    }
    return w;
}

// Byte i (0..11) of the Q4_K scales held in head.y, head.z, head.w.
static __device__ __forceinline__ int q4k_scale_byte(const int4& head, int i) {
    const uint32_t word = i < 4 ? (uint32_t)head.y : i < 8 ? (uint32_t)head.z : (uint32_t)head.w;
    return (int)((word >> ((i & 3) * 8)) & 0xFFu);
}

// scale_min_k4 over the scale bytes held in registers.
static __device__ __forceinline__ void q4k_scale_min(const int4& head, int j, int* d, int* m) {
    if (j < 4) {
        *d = q4k_scale_byte(head, j) & 63;
        *m = q4k_scale_byte(head, j + 4) & 63;
    } else {
        *d = (q4k_scale_byte(head, j + 4) & 0x0F) | ((q4k_scale_byte(head, j - 4) >> 6) << 4);
        *m = (q4k_scale_byte(head, j + 4) >> 4) | ((q4k_scale_byte(head, j) >> 6) << 4);
    }
}

// The activations of one 64-value chunk read from a staged row, for use with every weight row
// a lane takes at that chunk.
struct XPair {
    float2 d0, d1;
    int q0[8], q1[8];
};

static __device__ __forceinline__ XPair load_x_pair(const uint8_t* xs, int p) {
    const uint8_t* sp = xs + p * STAGE_PAIR;
    const uint2 ds = *(const uint2*)sp;
    const int4 xa = *(const int4*)(sp + 16), xb = *(const int4*)(sp + 32), xc = *(const int4*)(sp + 48),
               xd = *(const int4*)(sp + 64);
    return XPair{__half22float2(*(const __half2*)&ds.x),
                 __half22float2(*(const __half2*)&ds.y),
                 {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w},
                 {xc.x, xc.y, xc.z, xc.w, xd.x, xd.y, xd.z, xd.w}};
}

// W_row . x over one chunk from its loaded weight words and activations.
template <int WT>
static __device__ __forceinline__ float dot_pair(const PairW<WT>& w, const XPair& x) {
    const float2 dx0 = x.d0, dx1 = x.d1;
    const int* xq0 = x.q0;
    const int* xq1 = x.q1;
    if constexpr (WT == WT_Q4_K) {
        const int q[8] = {w.a.x, w.a.y, w.a.z, w.a.w, w.b.x, w.b.y, w.b.z, w.b.w};
        int lo[8], hi[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            lo[t] = q[t] & 0x0F0F0F0F;
            hi[t] = (q[t] >> 4) & 0x0F0F0F0F;
        }
        const float2 dm = __half22float2(*(const __half2*)&w.head.x);
        int sc0, mn0, sc1, mn1;
        q4k_scale_min(w.head, w.j, &sc0, &mn0);
        q4k_scale_min(w.head, w.j + 1, &sc1, &mn1);
        const int s0 = dot8(lo, xq0), s1 = dot8(hi, xq1);
        return (dm.x * (float)sc0) * dx0.x * (float)s0 - (dm.y * (float)mn0) * dx0.y +
               (dm.x * (float)sc1) * dx1.x * (float)s1 - (dm.y * (float)mn1) * dx1.y;
    } else {
        const int* v = w.v;
        int q0[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) q0[t] = (int)__funnelshift_r((uint32_t)v[t], (uint32_t)v[t + 1], 16);
        const float d0 = __half2float(__ushort_as_half((unsigned short)(v[0] & 0xFFFF)));
        const float d1 = __half2float(__ushort_as_half((unsigned short)((uint32_t)v[8] >> 16)));
        const int s0 = dot8(q0, xq0), s1 = dot8(v + 9, xq1);
        return d0 * dx0.x * (float)s0 + d1 * dx1.x * (float)s1;
    }
}

// The two Q8_1 blocks of chunk p (values 64p .. 64p + 63) of an activation row in global memory
// (36-byte blocks, the row 4-byte aligned).
static __device__ __forceinline__ XPair load_x_pair_global(const uint8_t* x, int p) {
    const int* a = (const int*)(x + (long long)p * 72);
    XPair r;
    const int da = a[0], db = a[9];
    r.d0 = __half22float2(*(const __half2*)&da);
    r.d1 = __half22float2(*(const __half2*)&db);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        r.q0[t] = a[1 + t];
        r.q1[t] = a[10 + t];
    }
    return r;
}

// ---- one weight row . one activation row -----------------------------------------------------------

// The part of W_row . x that 32-value block sb holds, computed by one thread: F32 rows (wtype 0)
// against f32 activations, every other wtype of quant.cuh against Q8_1 blocks (36 bytes).
static __device__ __forceinline__ float block_dot(const uint8_t* wrow, int wtype, const void* act, int sb) {
    if (wtype == WT_F32) {
        const float* w = (const float*)wrow + sb * 32;
        const float* x = (const float*)act + sb * 32;
        float s = 0.0f;
#pragma unroll 8
        for (int i = 0; i < 32; ++i) s += w[i] * x[i];
        return s;
    }
    return sub_dot_q8_1(wrow, wtype, (const uint8_t*)act + sb * 36, sb);
}

// One weight row . one activation row, reduced over the warp: f32 rows lane-strided (coalesced),
// quantized rows a 32-value block per lane.
static __device__ __forceinline__ float warp_row_dot(const uint8_t* wrow, int wtype, const void* act, int k) {
    const int lane = threadIdx.x & (WARP - 1);
    float s = 0.0f;
    if (wtype == WT_F32) {
        const float* w = (const float*)wrow;
        const float* x = (const float*)act;
#pragma unroll 8
        for (int i = lane; i < k; i += WARP) s += w[i] * x[i];
    } else {
#pragma unroll 4
        for (int sb = lane; sb < k / 32; sb += WARP) s += block_dot(wrow, wtype, act, sb);
    }
    return warp_sum(s);
}

// One of up to three products of the same activations launched together (Q, K and V of a layer):
// n rows of stride bytes at w, written to y.
struct MatmulPart {
    const uint8_t* w;
    long long stride;
    float* y;
    int n;
};
