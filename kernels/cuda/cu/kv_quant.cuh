// K/V cache element types (ops/cache_store.rs, ops/attention.rs name the codes): the block
// quantizers of the cache store, which follow llama.cpp's CUDA cache copies (ggml's reference
// rules: Q8_0 rounds half away from zero through 1 / d; IQ4_NL takes the least-squares scale of
// its first pick), and the readers of attention: eight values of a head row at a time, loaded as
// one uint4 of raw bits (so that the kernels keep their f16 register layout) and decoded to f32
// where they are used, or one value at a time for the one-block-per-(row, head) form. Every
// quantized type packs 32 values a block; a head's width is a whole number of blocks. Included
// by cache_store.cuh and attn_split.cuh (and kernels/cuda/sim's tests) after <cuda_fp16.h>.

#pragma once

#include <stdint.h>
#include <string.h>

#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2
#define KV_Q4_0 3
#define KV_Q4_1 4
#define KV_Q5_0 5
#define KV_Q5_1 6
#define KV_IQ4_NL 7

#define KV_IQ4NL_VALUES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113

// Bytes of a 32-value block of quantized type t.
static __device__ __forceinline__ int kv_block_bytes(int t) {
    switch (t) {
        case KV_Q8_0: return 34;
        case KV_Q4_1: return 20;
        case KV_Q5_0: return 22;
        case KV_Q5_1: return 24;
        default: return 18;  // Q4_0, IQ4_NL
    }
}

// Bytes of a row of n values of type t.
static __device__ __forceinline__ long long kv_row_bytes(int t, long long n) {
    return t == KV_F32 ? 4 * n : t == KV_F16 ? 2 * n : n / 32 * kv_block_bytes(t);
}

static __device__ __forceinline__ float kv_half(const uint8_t* p) {
    __half h;
    memcpy(&h, p, 2);
    return __half2float(h);
}

// v rounded to f16 at p (2-byte aligned: every block and every field of one is), as one 16-bit
// store. Not as two byte stores: nvcc emits those from the f16 register itself (memcpy of a
// __half, or its bits' bytes), and ptxas 13.0 compiles a byte store of an f16 register as a
// conversion of its value to an integer (F2I.U8.F16), so a scale below 1 lost its low byte.
static __device__ __forceinline__ void kv_put_half(uint8_t* p, float v) {
    *(uint16_t*)p = __half_as_ushort(__float2half_rn(v));
}

static __device__ __forceinline__ float kv_half_bits(unsigned bits) {
    __half h;
    const uint16_t b = (uint16_t)bits;
    memcpy(&h, &b, 2);
    return __half2float(h);
}

// ---- the store's block quantizers ------------------------------------------------------------

static __device__ __forceinline__ int kv_iq4nl_nearest(float x) {
    const int8_t v[16] = {KV_IQ4NL_VALUES};
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid])
            hi = mid;
        else
            lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

// The 32 values at x into block b of type t.
static __device__ void kv_quantize_block(int t, const float* x, uint8_t* b) {
    if (t == KV_Q8_0) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        kv_put_half(b, d);
        for (int j = 0; j < 32; ++j) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        return;
    }
    if (t == KV_Q4_1 || t == KV_Q5_1) {
        // d = (max - min) / (2^bits - 1), values (x - min) / d + 0.5 truncated.
        const bool five = t == KV_Q5_1;
        float mn = x[0], mx = x[0];
        for (int j = 1; j < 32; ++j) {
            mn = fminf(mn, x[j]);
            mx = fmaxf(mx, x[j]);
        }
        const float d = (mx - mn) / (five ? 31.0f : 15.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
        kv_put_half(b, d);
        kv_put_half(b + 2, mn);
        uint8_t* qs = b + (five ? 8 : 4);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            int a = (int)(int8_t)((x[j] - mn) * id + 0.5f), c = (int)(int8_t)((x[j + 16] - mn) * id + 0.5f);
            if (!five) {
                a = min(15, a);
                c = min(15, c);
            }
            qs[j] = (uint8_t)((a & 0xf) | ((c & 0xf) << 4));
            qh |= (uint32_t)((a >> 4) & 1) << j | (uint32_t)((c >> 4) & 1) << (j + 16);
        }
        if (five) memcpy(b + 4, &qh, 4);
        return;
    }
    // Q4_0, Q5_0, IQ4_NL: the value of largest magnitude m sets the scale.
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < 32; ++j)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            m = x[j];
        }
    if (t == KV_IQ4_NL) {
        const int8_t v[16] = {KV_IQ4NL_VALUES};
        const float d = m / v[0], id = d != 0.0f ? 1.0f / d : 0.0f;
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int j = 0; j < 16; ++j) {
            const int a = kv_iq4nl_nearest(x[j] * id), c = kv_iq4nl_nearest(x[j + 16] * id);
            b[2 + j] = (uint8_t)(a | (c << 4));
            const float va = v[a], vc = v[c], wa = x[j] * x[j], wc = x[j + 16] * x[j + 16];
            sumqx += wa * va * x[j] + wc * vc * x[j + 16];
            sumq2 += wa * va * va + wc * vc * vc;
        }
        kv_put_half(b, sumq2 > 0.0f ? sumqx / sumq2 : d);
        return;
    }
    const bool five = t == KV_Q5_0;
    const float d = m / (five ? -16.0f : -8.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
    const float off = five ? 16.5f : 8.5f;
    const int top = five ? 31 : 15;
    kv_put_half(b, d);
    uint8_t* qs = b + (five ? 6 : 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        const int a = min(top, (int)(int8_t)(x[j] * id + off)), c = min(top, (int)(int8_t)(x[j + 16] * id + off));
        qs[j] = (uint8_t)((a & 0xf) | ((c & 0xf) << 4));
        qh |= (uint32_t)((a >> 4) & 1) << j | (uint32_t)((c >> 4) & 1) << (j + 16);
    }
    if (five) memcpy(b + 2, &qh, 4);
}

// ---- attention's readers ---------------------------------------------------------------------

// Two bytes at a 2-byte aligned address.
static __device__ __forceinline__ unsigned kv_u16(const uint8_t* p) { return *(const uint16_t*)p; }

// Eight bytes at a 2-byte aligned address, as two words.
static __device__ __forceinline__ void kv_8bytes(const uint8_t* p, unsigned* lo, unsigned* hi) {
    *lo = kv_u16(p) | kv_u16(p + 2) << 16;
    *hi = kv_u16(p + 4) | kv_u16(p + 6) << 16;
}

// A reader of head rows of type T: `load(row, e)` the raw bits of values e .. e + 7 (e a
// multiple of 8) of the head row at `row`, `decode(raw, f)` them as f32, `row_bytes(d)` a head
// row's bytes.
template <int T>
struct KvRead;

template <>
struct KvRead<KV_F16> {
    static constexpr bool F16 = true;
    static __device__ __forceinline__ long long row_bytes(int d) { return 2LL * d; }
    static __device__ __forceinline__ uint4 load(const uint8_t* row, int e) { return *(const uint4*)(row + 2 * e); }
    static __device__ __forceinline__ void decode(const uint4& r, float* f) {
        const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            f[2 * j] = kv_half_bits(w[j] & 0xffffu);
            f[2 * j + 1] = kv_half_bits(w[j] >> 16);
        }
    }
};

// The raw bits of the 4-bit types (Q4_0, Q4_1, IQ4_NL, and Q5's low bits): x, y the eight bytes
// whose low (values 0..15 of a block) or high nibbles (16..31) hold the values; z the scale (and
// Q4_1's minimum above it); w the nibble's shift (and Q5's fifth bits above it).
static __device__ __forceinline__ uint4 kv_load_nibbles(const uint8_t* blk, int qs, int j, unsigned zw) {
    uint4 r;
    kv_8bytes(blk + qs + (j & 15), &r.x, &r.y);
    r.z = zw;
    r.w = j >= 16 ? 4u : 0u;
    return r;
}

static __device__ __forceinline__ int kv_nibble(const uint4& r, int k) {
    const unsigned w = k < 4 ? r.x : r.y;
    return (int)((w >> (8 * (k & 3) + (r.w & 0xffu))) & 0xfu);
}

template <>
struct KvRead<KV_Q8_0> {
    static constexpr bool F16 = false;
    static __device__ __forceinline__ long long row_bytes(int d) { return d / 32 * 34LL; }
    static __device__ __forceinline__ uint4 load(const uint8_t* row, int e) {
        const uint8_t* blk = row + e / 32 * 34;
        uint4 r;
        kv_8bytes(blk + 2 + e % 32, &r.x, &r.y);
        r.z = kv_u16(blk);
        r.w = 0;
        return r;
    }
    static __device__ __forceinline__ void decode(const uint4& r, float* f) {
        const float d = kv_half_bits(r.z);
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = d * (float)(int8_t)(((k < 4 ? r.x : r.y) >> (8 * (k & 3))) & 0xffu);
    }
};

template <>
struct KvRead<KV_Q4_0> {
    static constexpr bool F16 = false;
    static __device__ __forceinline__ long long row_bytes(int d) { return d / 32 * 18LL; }
    static __device__ __forceinline__ uint4 load(const uint8_t* row, int e) {
        const uint8_t* blk = row + e / 32 * 18;
        return kv_load_nibbles(blk, 2, e % 32, kv_u16(blk));
    }
    static __device__ __forceinline__ void decode(const uint4& r, float* f) {
        const float d = kv_half_bits(r.z);
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = d * (float)(kv_nibble(r, k) - 8);
    }
};

template <>
struct KvRead<KV_IQ4_NL> {
    static constexpr bool F16 = false;
    static __device__ __forceinline__ long long row_bytes(int d) { return d / 32 * 18LL; }
    static __device__ __forceinline__ uint4 load(const uint8_t* row, int e) {
        const uint8_t* blk = row + e / 32 * 18;
        return kv_load_nibbles(blk, 2, e % 32, kv_u16(blk));
    }
    static __device__ __forceinline__ void decode(const uint4& r, float* f) {
        const int8_t v[16] = {KV_IQ4NL_VALUES};
        const float d = kv_half_bits(r.z);
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = d * (float)v[kv_nibble(r, k)];
    }
};

template <>
struct KvRead<KV_Q4_1> {
    static constexpr bool F16 = false;
    static __device__ __forceinline__ long long row_bytes(int d) { return d / 32 * 20LL; }
    static __device__ __forceinline__ uint4 load(const uint8_t* row, int e) {
        const uint8_t* blk = row + e / 32 * 20;
        return kv_load_nibbles(blk, 4, e % 32, kv_u16(blk) | kv_u16(blk + 2) << 16);
    }
    static __device__ __forceinline__ void decode(const uint4& r, float* f) {
        const float d = kv_half_bits(r.z & 0xffffu), m = kv_half_bits(r.z >> 16);
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = d * (float)kv_nibble(r, k) + m;
    }
};

// Q5_0 / Q5_1: the fifth bits of the eight values in bits 8..15 of w.
template <int T>
static __device__ __forceinline__ uint4 kv_load_q5(const uint8_t* row, int e) {
    constexpr int BB = T == KV_Q5_0 ? 22 : 24, QH = T == KV_Q5_0 ? 2 : 4;
    const uint8_t* blk = row + e / 32 * BB;
    const unsigned qh = kv_u16(blk + QH) | kv_u16(blk + QH + 2) << 16;
    const unsigned z = T == KV_Q5_0 ? kv_u16(blk) : (kv_u16(blk) | kv_u16(blk + 2) << 16);
    uint4 r = kv_load_nibbles(blk, QH + 4, e % 32, z);
    r.w |= ((qh >> (e % 32)) & 0xffu) << 8;
    return r;
}

static __device__ __forceinline__ int kv_q5(const uint4& r, int k) {
    return kv_nibble(r, k) | (int)((r.w >> (8 + k)) & 1u) << 4;
}

template <>
struct KvRead<KV_Q5_0> {
    static constexpr bool F16 = false;
    static __device__ __forceinline__ long long row_bytes(int d) { return d / 32 * 22LL; }
    static __device__ __forceinline__ uint4 load(const uint8_t* row, int e) { return kv_load_q5<KV_Q5_0>(row, e); }
    static __device__ __forceinline__ void decode(const uint4& r, float* f) {
        const float d = kv_half_bits(r.z);
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = d * (float)(kv_q5(r, k) - 16);
    }
};

template <>
struct KvRead<KV_Q5_1> {
    static constexpr bool F16 = false;
    static __device__ __forceinline__ long long row_bytes(int d) { return d / 32 * 24LL; }
    static __device__ __forceinline__ uint4 load(const uint8_t* row, int e) { return kv_load_q5<KV_Q5_1>(row, e); }
    static __device__ __forceinline__ void decode(const uint4& r, float* f) {
        const float d = kv_half_bits(r.z & 0xffffu), m = kv_half_bits(r.z >> 16);
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = d * (float)kv_q5(r, k) + m;
    }
};

// Value i of the row at `row` (any type t), for the one-block-per-(row, head) form.
static __device__ __forceinline__ float kv_elem(int t, const uint8_t* row, int i) {
    float f[8];
    const int e = i & ~7;
    switch (t) {
        case KV_F32: return ((const float*)row)[i];
        case KV_F16: return kv_half(row + 2 * i);
        case KV_Q8_0: KvRead<KV_Q8_0>::decode(KvRead<KV_Q8_0>::load(row, e), f); break;
        case KV_Q4_0: KvRead<KV_Q4_0>::decode(KvRead<KV_Q4_0>::load(row, e), f); break;
        case KV_Q4_1: KvRead<KV_Q4_1>::decode(KvRead<KV_Q4_1>::load(row, e), f); break;
        case KV_Q5_0: KvRead<KV_Q5_0>::decode(KvRead<KV_Q5_0>::load(row, e), f); break;
        case KV_Q5_1: KvRead<KV_Q5_1>::decode(KvRead<KV_Q5_1>::load(row, e), f); break;
        default: KvRead<KV_IQ4_NL>::decode(KvRead<KV_IQ4_NL>::load(row, e), f); break;
    }
    return f[i & 7];
}
