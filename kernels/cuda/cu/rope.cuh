// RoPE (NORM: pairs (2i, 2i+1); NEOX: pairs (i, i + n_dims/2)), YaRN as ggml (ops/rope.rs), and
// the per-head RMS norm + RoPE with its K/V cache stores (ops/fused/norm_rope.rs). Included by
// kernels.cu after common.cuh; kernels/cuda/sim/rope_test.cpp runs it on the CPU.

#pragma once

// Cosine and sine (times mscale) of pair i's angle at position p. The angle is computed in double
// as the CPU reference computes it (freq_base^e as 2^(e * log2_base), log2_base from the host),
// reduced to [-pi, pi] in double, and its cosine and sine taken in f32: within an ulp or two of
// f32 of the reference's double cos/sin, at a fraction of their cost.
static __device__ __forceinline__ float2 rope_cs(int i, int p, int n_dims, double log2_base, float freq_scale,
                                                 float ext_factor, float corr0, float corr1, double mscale) {
    const double exponent = -2.0 * (double)i / (double)n_dims;
    const double theta_extrap = (double)p * exp2(exponent * log2_base);
    const double theta_interp = (double)freq_scale * theta_extrap;
    double theta = theta_interp;
    if (ext_factor != 0.0f) {
        const float y = ((float)i - corr0) / fmaxf(corr1 - corr0, 0.001f);
        const float ramp = 1.0f - fminf(fmaxf(y, 0.0f), 1.0f);
        const double mix = (double)(ramp * ext_factor);
        theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
    }
    // 2 pi as a double and the double nearest its remainder (Cody-Waite).
    const double two_pi_hi = 6.283185307179586, two_pi_lo = 2.4492935982947064e-16;
    const double turns = rint(theta * (1.0 / two_pi_hi));
    const double red = fma(-turns, two_pi_lo, fma(-turns, two_pi_hi, theta));
    float sn, cs;
    sincosf((float)red, &sn, &cs);
    const float m = (float)mscale;
    return make_float2(cs * m, sn * m);
}

// The two elements of a head that pair `pair` rotates (a < b); pairs from n_dims / 2 on are not
// rotated and name the two elements they copy.
static __device__ __forceinline__ int2 rope_elems(int pair, int neox, int n_dims) {
    const int half = n_dims / 2;
    if (pair >= half) {
        const int a = n_dims + 2 * (pair - half);
        return make_int2(a, a + 1);
    }
    return neox ? make_int2(pair, pair + half) : make_int2(2 * pair, 2 * pair + 1);
}

// One thread per (row, head, pair). Dims offset .. offset + n_dims rotate (pairs counted from
// offset, offset even); the rest are copied. With `inverse` the angle is negated (DeepSeek-V4's
// inverse rope of the attention output).
extern "C" __global__ void bl_rope_f32(const float* x, float* out, const int* pos, int head_dim, int n_head, int rows,
                                       int neox, int n_dims, double log2_base, float freq_scale, float ext_factor,
                                       float corr0, float corr1, double mscale, int offset, int inverse) {
    KERNEL_ENTRY();
    const long long total = (long long)rows * n_head * (head_dim / 2);
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; t < total; t += (long long)gridDim.x * blockDim.x) {
        const int pair = (int)(t % (head_dim / 2));
        const long long rh = t / (head_dim / 2);
        const int r = (int)(rh / n_head);
        const float* xh = x + rh * head_dim;
        float* oh = out + rh * head_dim;
        int2 e = rope_elems(pair, neox, n_dims);
        // Copied pairs name the dims outside the rotated span; rotated ones start at offset.
        if (pair >= n_dims / 2) {
            const int a = e.x - n_dims;
            e = a < offset ? make_int2(a, a + 1) : e;
        } else {
            e = make_int2(e.x + offset, e.y + offset);
        }
        const float x0 = xh[e.x], x1 = xh[e.y];
        if (pair >= n_dims / 2) {
            oh[e.x] = x0;
            oh[e.y] = x1;
            continue;
        }
        const float2 cs = rope_cs(pair, pos[r], n_dims, log2_base, freq_scale, ext_factor, corr0, corr1, mscale);
        const float sn = inverse ? -cs.y : cs.y;
        oh[e.x] = x0 * cs.x - x1 * sn;
        oh[e.y] = x0 * sn + x1 * cs.x;
    }
}

// An RMS norm over each head and the RoPE of its result in one kernel (ops/fused/norm_rope.rs),
// optionally storing the rotated rows into a cache and another tensor's rows (V) into a second
// cache. One block per (row, head) of round_up(head_dim / 2, 32) threads, plus (with v) one block
// per row of V. The norm sums squares in f64 as bl_rms_norm_f32 does, and `normed` (the norm's own
// result) is written too unless null (no later call reads it). Every input is read before the first
// barrier and the rotated values are written after a second, so x, normed and out may share memory.
// With qnh > 0 another group of heads of the same rows and rope (Q, while the main group is K)
// comes first: rows * qnh blocks normed by qw from qx into qnormed and qout, with no store.
template <typename T>
static __device__ void norm_rope(const float* x, const float* w, float* normed, float* out, const int* pos, int hd,
                                 int nh, int rows, float eps, int neox, int n_dims, double log2_base, float freq_scale,
                                 float ext_factor, float corr0, float corr1, double mscale, T* kc, const int* slots,
                                 int len, int n_slots, const float* v, T* vc, int vw, int* err, const float* qx,
                                 const float* qw, float* qnormed, float* qout, int qnh) {
    int b = blockIdx.x;
    if (b < rows * qnh) {
        x = qx;
        w = qw;
        normed = qnormed;
        out = qout;
        nh = qnh;
        kc = nullptr;
    } else {
        b -= rows * qnh;
    }
    if (b >= rows * nh) {
        const int r = b - rows * nh;
        const int s = slots[r], p = pos[r];
        if (s < 0 || s >= n_slots || p < 0) {
            if (threadIdx.x == 0) report(err, 2);
            return;
        }
        T* dst = vc + ((long long)s * len + p % len) * vw;
        for (int i = threadIdx.x; i < vw; i += blockDim.x) dst[i] = from_f32<T>(v[(long long)r * vw + i]);
        return;
    }
    const int r = b / nh, h = b % nh;
    const float* xh = x + (long long)b * hd;
    const int t = threadIdx.x;
    // At most two norm elements per thread (the block has at least hd / 2 threads).
    const float n0 = t < hd ? xh[t] : 0.0f;
    const float n1 = t + (int)blockDim.x < hd ? xh[t + blockDim.x] : 0.0f;
    const bool rotates = t < hd / 2;
    const int2 e = rope_elems(rotates ? t : 0, neox, n_dims);
    const float x0 = rotates ? xh[e.x] : 0.0f, x1 = rotates ? xh[e.y] : 0.0f;
    double s = 0.0;
    if (t < hd) s += (double)(n0 * n0);
    if (t + (int)blockDim.x < hd) s += (double)(n1 * n1);
    const float mean = (float)(block_sum_f64(s) / hd);
    const float inv = 1.0f / sqrtf(mean + eps);
    if (normed) {
        float* nr = normed + (long long)b * hd;
        if (t < hd) nr[t] = w ? (n0 * inv) * w[t] : n0 * inv;
        if (t + (int)blockDim.x < hd) nr[t + blockDim.x] = w ? (n1 * inv) * w[t + blockDim.x] : n1 * inv;
    }
    __syncthreads();
    if (!rotates) return;
    const float y0 = w ? (x0 * inv) * w[e.x] : x0 * inv, y1 = w ? (x1 * inv) * w[e.y] : x1 * inv;
    float o0 = y0, o1 = y1;
    if (t < n_dims / 2) {
        const float2 cs = rope_cs(t, pos[r], n_dims, log2_base, freq_scale, ext_factor, corr0, corr1, mscale);
        o0 = y0 * cs.x - y1 * cs.y;
        o1 = y0 * cs.y + y1 * cs.x;
    }
    float* oh = out + (long long)b * hd;
    oh[e.x] = o0;
    oh[e.y] = o1;
    if (kc) {
        const int sl = slots[r], p = pos[r];
        if (sl < 0 || sl >= n_slots || p < 0) {
            report(err, 2);
            return;
        }
        T* dst = kc + ((long long)sl * len + p % len) * ((long long)hd * nh) + (long long)h * hd;
        dst[e.x] = from_f32<T>(o0);
        dst[e.y] = from_f32<T>(o1);
    }
}

#define NORM_ROPE(name, T)                                                                                            \
    extern "C" __global__ void name(const float* x, const float* w, float* normed, float* out, const int* pos, int hd, \
                                    int nh, int rows, float eps, int neox, int n_dims, double log2_base,               \
                                    float freq_scale, float ext_factor, float corr0, float corr1, double mscale,       \
                                    T* kc, const int* slots, int len, int n_slots, const float* v, T* vc, int vw,      \
                                    int* err, const float* qx, const float* qw, float* qnormed, float* qout,           \
                                    int qnh) {                                                                         \
        KERNEL_ENTRY();                                                                                                \
        norm_rope<T>(x, w, normed, out, pos, hd, nh, rows, eps, neox, n_dims, log2_base, freq_scale, ext_factor,       \
                     corr0, corr1, mscale, kc, slots, len, n_slots, v, vc, vw, err, qx, qw, qnormed, qout, qnh);       \
    }
NORM_ROPE(bl_norm_rope_f32, float)
NORM_ROPE(bl_norm_rope_f16, __half)
