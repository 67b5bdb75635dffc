// Checks the decode attention of cu/attn_split.cuh (bl_attn_decode_<type>_<D>) on the CPU (sim.h)
// against an f64 reference written here from the definition: for each row and head, the scores
// scale * q.k over the row's visible positions (softcapped), a softmax that counts the head's sink,
// and the weighted sum of the values, with K and V read from f16, Q8_0 or Q4_0 caches (the
// reference decodes the blocks itself, from the formats' definitions; the caches are filled by
// cu/kv_quant.cuh's store quantizer). Cases cover heads of 64,
// 128 and 256, 1 to 8 heads per KV head, one run and several runs merged by the last block,
// windows, sinks, softcap, and bad rows (error codes, output left as it was). Each case launches
// twice on fresh inputs, so a split counter left set fails the second; the second runs the blocks
// in a shuffled order. The output's Q8_1 copy is checked to dequantize to the output (within 0.6 of
// a step: half a step, and the f16 rounding of the step times up to 127). Prints one line per
// case; exits 1 on a failure.
#include "sim.h"

#include <cstdint>
#include <cstring>
#include <cstdio>
#include <random>
#include <string>

#include "../cu/common.cuh"
#include "../cu/attn_split.cuh"

static std::mt19937 rng(5);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

struct Case {
    const char* name;
    int d, n_head, n_kv, len, n_slots, splits, window;
    float softcap;
    bool sinks;
    std::vector<int> slots, pos;  // per row; a bad row's expected error code in `bad`
    std::vector<int> bad;         // 0: a good row, else the error the kernel must report
    int ct = KV_F16;              // the caches' type (kv_quant.cuh)
};

using Kernel = void (*)(const float*, const void*, const void*, const int*, const int*, float*, uint8_t*, float*,
                        int*, int, int, int, int, int, int, float, float, int, const float*, int*);

static Kernel kernel_for(int d, int ct) {
    if (ct == KV_Q8_0) return d == 64 ? bl_attn_decode_q8_0_64 : d == 128 ? bl_attn_decode_q8_0_128 : bl_attn_decode_q8_0_256;
    if (ct == KV_Q4_0) return d == 64 ? bl_attn_decode_q4_0_64 : d == 128 ? bl_attn_decode_q4_0_128 : bl_attn_decode_q4_0_256;
    return d == 64 ? bl_attn_decode_f16_64 : d == 128 ? bl_attn_decode_f16_128 : bl_attn_decode_f16_256;
}

static const char* type_name(int ct) { return ct == KV_Q8_0 ? "q8_0" : ct == KV_Q4_0 ? "q4_0" : "f16"; }

// Bytes of a head row of d values of type ct.
static size_t head_bytes(int ct, int d) { return ct == KV_Q8_0 ? d / 32 * 34 : ct == KV_Q4_0 ? d / 32 * 18 : 2 * d; }

static float f16_at(const uint8_t* p) {
    __half h;
    std::memcpy(&h, p, 2);
    return __half2float(h);
}

// Value i of the head row at p, from the formats' definitions: Q8_0 blocks of d:f16 and 32 int8;
// Q4_0 blocks of d:f16 and 16 bytes, value j (< 16) in the low nibble of byte j, j + 16 in its
// high nibble, minus 8.
static double value_at(int ct, const uint8_t* p, int i) {
    if (ct == KV_Q8_0) {
        const uint8_t* b = p + i / 32 * 34;
        return (double)f16_at(b) * (int8_t)b[2 + i % 32];
    }
    if (ct == KV_Q4_0) {
        const uint8_t* b = p + i / 32 * 18;
        const int j = i % 32, q = j < 16 ? b[2 + j] & 15 : b[2 + j - 16] >> 4;
        return (double)f16_at(b) * (q - 8);
    }
    return f16_at(p + 2 * i);
}

// The reference output row (n_head * d values) of row r.
static std::vector<double> reference(const Case& c, int r, const std::vector<float>& q, const std::vector<uint8_t>& kc,
                                     const std::vector<uint8_t>& vc, const std::vector<float>& sinks, float scale) {
    const int d = c.d, G = c.n_head / c.n_kv, s = c.slots[r], p = c.pos[r];
    const size_t hb = head_bytes(c.ct, d);
    const int lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
    std::vector<double> o((size_t)c.n_head * d, 0.0);
    for (int h = 0; h < c.n_head; ++h) {
        const int kvh = h / G;
        std::vector<double> sc;
        for (int t = lo; t <= p; ++t) {
            const size_t row = ((size_t)s * c.len + t % c.len) * c.n_kv + kvh;
            double v = 0.0;
            for (int i = 0; i < d; ++i)
                v += (double)q[((size_t)r * c.n_head + h) * d + i] * value_at(c.ct, kc.data() + row * hb, i);
            v *= scale;
            if (c.softcap > 0.0f) v = c.softcap * std::tanh(v / c.softcap);
            sc.push_back(v);
        }
        double m = c.sinks ? sinks[h] : -INFINITY;
        for (double v : sc) m = std::max(m, v);
        double l = c.sinks ? std::exp(sinks[h] - m) : 0.0;
        for (double& v : sc) l += v = std::exp(v - m);
        for (int t = lo; t <= p; ++t) {
            const size_t row = ((size_t)s * c.len + t % c.len) * c.n_kv + kvh;
            for (int i = 0; i < d; ++i)
                o[(size_t)h * d + i] += sc[t - lo] / l * value_at(c.ct, vc.data() + row * hb, i);
        }
    }
    return o;
}

// A cache of n head rows of d values of type ct, random in [-1, 1] (quantized by the store's
// block quantizer).
static std::vector<uint8_t> random_cache(int ct, int d, size_t n) {
    const size_t hb = head_bytes(ct, d);
    std::vector<uint8_t> c(n * hb);
    std::vector<float> x(d);
    for (size_t r = 0; r < n; ++r) {
        for (auto& v : x) v = uniform(-1.0f, 1.0f);
        if (ct == KV_F16)
            for (int i = 0; i < d; ++i) {
                const __half h = __float2half_rn(x[i]);
                std::memcpy(c.data() + r * hb + 2 * i, &h, 2);
            }
        else
            for (int b = 0; b < d / 32; ++b) kv_quantize_block(ct, x.data() + 32 * b, c.data() + r * hb + b * (hb / (d / 32)));
    }
    return c;
}

// hb: the fewest heads a block takes (dividing G), as the launch passes it (ops/attention.rs); the
// launch has at least G / hb blocks along z.
static bool run_case(const Case& c, std::vector<int>& counters, int hb) {
    const int rows = (int)c.pos.size(), d = c.d, G = c.n_head / c.n_kv, S = std::max(c.splits, G / hb);
    const float scale = 1.0f / std::sqrt((float)d);
    const size_t outs = (size_t)rows * c.n_head;
    bool ok = true;
    for (int launch_no = 0; launch_no < 2; ++launch_no) {
        std::vector<float> q(outs * d), sinks(c.n_head);
        const size_t heads = (size_t)c.n_slots * c.len * c.n_kv;
        const std::vector<uint8_t> kc = random_cache(c.ct, d, heads), vc = random_cache(c.ct, d, heads);
        for (auto& v : q) v = uniform(-1.0f, 1.0f);
        for (auto& v : sinks) v = uniform(-2.0f, 2.0f);
        std::vector<float> out(outs * d, NAN), part((size_t)S * outs * (d + 2), NAN);
        std::vector<uint8_t> oq(outs * d / 32 * 36, 0xAB);
        int err = 0;
        const Kernel k = kernel_for(d, c.ct);
        // The second launch runs the blocks in a shuffled order.
        g_block_shuffle = launch_no;
        launch(Dim3{(unsigned)rows, (unsigned)c.n_kv, (unsigned)S}, DEC_THREADS, [&] {
            k(q.data(), kc.data(), vc.data(), c.slots.data(), c.pos.data(), out.data(), oq.data(), part.data(),
              counters.data(), rows, hb, c.n_head, c.n_kv, c.len, c.n_slots, scale, c.softcap, c.window,
              c.sinks ? sinks.data() : nullptr, &err);
        });
        int want_err = 0;
        for (int b : c.bad) want_err = want_err ? want_err : b;
        if (err != want_err) {
            std::printf("FAIL %s (launch %d): error %d, expected %d\n", c.name, launch_no, err, want_err);
            ok = false;
        }
        for (int v : counters)
            if (v != 0) {
                std::printf("FAIL %s (launch %d): a split counter left at %d\n", c.name, launch_no, v);
                ok = false;
                break;
            }
        double worst = 0.0, qworst = 0.0;
        for (int r = 0; r < rows; ++r) {
            const float* o = out.data() + (size_t)r * c.n_head * d;
            if (c.bad[r]) {
                for (int i = 0; i < c.n_head * d; ++i)
                    if (!std::isnan(o[i])) {
                        std::printf("FAIL %s: bad row %d written\n", c.name, r);
                        return false;
                    }
                continue;
            }
            const std::vector<double> ref = reference(c, r, q, kc, vc, sinks, scale);
            for (int h = 0; h < c.n_head; ++h) {
                double amax = 0.0, e = 0.0;
                for (int i = 0; i < d; ++i) amax = std::max(amax, std::fabs(ref[(size_t)h * d + i]));
                // An output left unwritten (NaN) counts as an infinite error (std::max drops NaN).
                for (int i = 0; i < d; ++i) {
                    const double diff = std::fabs(o[h * d + i] - ref[(size_t)h * d + i]);
                    e = std::isnan(diff) ? INFINITY : std::max(e, diff);
                }
                worst = std::max(worst, e / std::max(amax, 1e-30));
            }
            // The Q8_1 copy: each block's values d * q within half a step of the output.
            for (int b = 0; b < c.n_head * d / 32; ++b) {
                const uint8_t* blk = oq.data() + ((size_t)r * c.n_head * d / 32 + b) * 36;
                __half dh;
                std::memcpy(&dh, blk, 2);
                const double step = __half2float(dh);
                for (int i = 0; i < 32; ++i) {
                    const double v = step * (int8_t)blk[4 + i], want = o[b * 32 + i];
                    const double diff = std::fabs(v - want) / std::max(step, 1e-30);
                    qworst = std::isnan(diff) ? INFINITY : std::max(qworst, diff);
                }
            }
        }
        const bool good = worst <= 1e-5 && qworst <= 0.6;
        // The parts each row's heads were split into (as the kernel picks them).
        std::string parts;
        for (int r = 0; r < rows; ++r) {
            const int lo = c.window > 0 ? std::max(0, c.pos[r] - c.window + 1) : 0;
            const int f = decode_head_parts(G / hb, (c.pos[r] - lo) / DEC_KT + 1, S);
            parts += (r ? "," : "") + std::to_string(f);
        }
        std::printf("%s %s, %s caches (at least %d heads a block, parts %s, launch %d): rel error %.2e, Q8_1 copy "
                    "within %.2f steps\n",
                    good ? "ok  " : "FAIL", c.name, type_name(c.ct), hb, parts.c_str(), launch_no, worst, qworst);
        ok = ok && good;
    }
    return ok;
}

int main() {
    std::vector<int> counters(1024, 0);
    const std::vector<Case> cases = {
        // Eight heads per KV head (Qwen3-MoE): a short context in one block, and runs of 2 tiles.
        {"d 128, gqa 32/4, one run and merged runs", 128, 32, 4, 300, 2, 8, 0, 0.0f, false, {1, 0, 1}, {5, 130, 299},
         {0, 0, 0}},
        // Sixteen heads over two (Qwen3.6): sinks with one run and with several.
        {"d 256, gqa 16/2, sinks", 256, 16, 2, 600, 1, 4, 0, 0.0f, true, {0, 0}, {520, 40}, {0, 0}},
        // A window inside a ring cache, softcap and sinks; four heads per KV head.
        {"d 64, gqa 8/2, window 200, softcap 30, sinks", 64, 8, 2, 1000, 1, 16, 200, 30.0f, true, {0, 0}, {999, 70},
         {0, 0}},
        // Positions past the cache's length wrap with a window; one head per KV head, 16 runs.
        {"d 64, mha 4/4, window 900 over a ring of 1000", 64, 4, 4, 1000, 1, 16, 900, 0.0f, false, {0}, {2500}, {0}},
        // Bad rows: a slot outside the cache, then more visible positions than it holds.
        {"bad slot (error 2)", 64, 8, 2, 100, 1, 2, 0, 0.0f, false, {0, 3}, {50, 10}, {0, 2}},
        {"context past the cache (error 3)", 64, 8, 2, 100, 1, 2, 0, 0.0f, false, {0}, {150}, {3}},
    };
    // Quantized caches through the same cases' shapes: one run and merged runs, sinks, a window.
    const std::vector<Case> quantized = {cases[0], cases[1], cases[2]};
    bool ok = true;
    for (int ct : {KV_Q8_0, KV_Q4_0})
        for (Case c : quantized) {
            c.ct = ct;
            const int G = c.n_head / c.n_kv;
            ok = run_case(c, counters, G) && ok;
            ok = run_case(c, counters, 1) && ok;
        }
    // Each case with the heads of a KV head kept together, with parts down to one head (the
    // launch's choice, ops/attention.rs decode_parts) and, where two divide G, down to two heads.
    for (const Case& c : cases) {
        const int G = c.n_head / c.n_kv;
        ok = run_case(c, counters, G) && ok;
        if (G > 1) ok = run_case(c, counters, 1) && ok;
        if (G % 2 == 0 && G > 2) ok = run_case(c, counters, 2) && ok;
    }
    std::printf(ok ? "all decode attention cases passed\n" : "decode attention cases FAILED\n");
    return ok ? 0 : 1;
}
