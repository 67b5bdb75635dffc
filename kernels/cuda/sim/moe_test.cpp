// Checks the routed experts' decode kernels with a sigmoid-gated shared expert as one more slot
// (cu/moe.cuh: bl_moe_gate_up_sh_<T>_<S>, bl_moe_down_sh_<T>_<S>) on the CPU (sim.h) against the
// kernels they replace: the routed gate/up kernel (k slots) and the same kernel over a one-expert
// stack holding the shared expert give the hidden rows bit for bit, and the routed down kernel plus
// sigmoid(logit) times the one-expert down kernel give the output within 1e-5 (the fused kernel
// adds the shared products inside the warp's sum). The gate's logit is checked against an f64 sum.
// Every (routed, shared) type pair of Q8_0 and Q4_K, with the shared warps waiting first or after.
// Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdio>
#include <cstdlib>
#include <random>

#include "../cu/common.cuh"
#include "../cu/quant.cuh"
#define PER_WTYPE(DEF) DEF(1) DEF(2)
#include "../cu/moe.cuh"

static std::mt19937 rng(5);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

// A 64-byte aligned buffer of n bytes, zeroed.
struct Buf {
    uint8_t* p;
    explicit Buf(size_t n) : p((uint8_t*)std::aligned_alloc(64, (n + 63) / 64 * 64)) { std::memset(p, 0, n); }
    ~Buf() { std::free(p); }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
};

static void put_half(uint8_t* p, float v) {
    const __half h = __float2half_rn(v);
    std::memcpy(p, &h, 2);
}

// Bytes of one row of n values of type wt, and random rows of it: Q8_0 blocks (f16 scale, 32
// int8), Q4_K super-blocks (f16 d and dmin, 12 scale bytes, 128 nibble bytes).
static size_t row_bytes(int wt, int n) { return wt == WT_Q8_0 ? n / 32 * 34 : n / 256 * 144; }
static void fill_rows(uint8_t* p, int wt, int n, int nrows) {
    for (int r = 0; r < nrows; ++r) {
        uint8_t* row = p + r * row_bytes(wt, n);
        if (wt == WT_Q8_0) {
            for (int b = 0; b < n / 32; ++b) {
                put_half(row + b * 34, uniform(0.002f, 0.01f));
                for (int i = 0; i < 32; ++i) row[b * 34 + 2 + i] = (uint8_t)(int8_t)(rng() % 255 - 127);
            }
        } else {
            for (int b = 0; b < n / 256; ++b) {
                uint8_t* sb = row + b * 144;
                put_half(sb, uniform(0.001f, 0.004f));
                put_half(sb + 2, uniform(0.0f, 0.002f));
                for (int i = 4; i < 144; ++i) sb[i] = (uint8_t)rng();
            }
        }
    }
}

static int failures = 0;

static void check(bool ok, const char* name, const char* what, double err) {
    std::printf("%s %s: %s (%.2e)\n", ok ? "ok  " : "FAIL", name, what, err);
    if (!ok) ++failures;
}

template <int T, int S>
static void run_case(const char* name, int early) {
    const int n_embd = 256, n_ff = 256, n_expert = 4, k = 2, rows = 2, hk = k + 1, threads = 64;
    const int wpb = threads / WARP;
    auto blocks = [&](long long tasks) { return Dim3{(unsigned)((tasks + wpb - 1) / wpb), 1, 1}; };
    // Routed stacks (type T), the shared expert's (type S), the gate's F32 weights.
    const size_t g_row = row_bytes(T, n_embd), d_row = row_bytes(T, n_ff);
    const size_t sg_row = row_bytes(S, n_embd), sd_row = row_bytes(S, n_ff);
    Buf gate(g_row * n_ff * n_expert), up(g_row * n_ff * n_expert), down(d_row * n_embd * n_expert);
    Buf sgate(sg_row * n_ff), sup(sg_row * n_ff), sdown(sd_row * n_embd);
    fill_rows(gate.p, T, n_embd, n_ff * n_expert);
    fill_rows(up.p, T, n_embd, n_ff * n_expert);
    fill_rows(down.p, T, n_ff, n_embd * n_expert);
    fill_rows(sgate.p, S, n_embd, n_ff);
    fill_rows(sup.p, S, n_embd, n_ff);
    fill_rows(sdown.p, S, n_ff, n_embd);
    std::vector<float> gw(n_embd), xf((size_t)rows * n_embd), w((size_t)rows * k);
    for (float& v : gw) v = uniform(-0.1f, 0.1f);
    for (float& v : xf) v = uniform(-1.0f, 1.0f);
    for (float& v : w) v = uniform(0.1f, 0.6f);
    std::vector<int> ids = {3, 1, 0, 3}, zeros(rows, 0);
    std::vector<float> ones(rows, 1.0f);
    // x's Q8_1 rows, as the norm before writes them.
    const long long xq_row = n_embd / 32 * 36;
    Buf xq(xq_row * rows);
    launch(Dim3{(unsigned)(rows * n_embd / 32), 1, 1}, WARP,
           [&] { quantize_lane(xf[blockIdx.x * 32 + threadIdx.x], xq.p + blockIdx.x * 36); });
    int err = 0;
    const long long ge = (long long)g_row * n_ff, de = (long long)d_row * n_embd;
    // The fused gate/up: k + 1 slots of h per row and the gate's logits.
    std::vector<float> h((size_t)rows * hk * n_ff, -1.0f), gs(rows, 0.0f);
    launch(blocks((long long)rows * n_ff + rows + (long long)rows * k * n_ff), threads, [&] {
        moe_gate_up_shared<T, S>(gate.p, up.p, g_row, ge, g_row, ge, T, T, xq.p, xq.p, xq_row, xq_row, ids.data(),
                                 nullptr, h.data(), n_embd, n_ff, k, rows, n_expert, 0, 0.0f, 0, hk, &err, sgate.p,
                                 sup.p, sg_row, sg_row, gw.data(), xf.data(), gs.data(), early);
    });
    // The kernels it replaces: the routed slots, then the shared expert as a one-expert stack.
    std::vector<float> hr((size_t)rows * k * n_ff), hs((size_t)rows * n_ff);
    launch(blocks((long long)rows * k * n_ff), threads, [&] {
        moe_gate_up<T>(warp_task(), gate.p, up.p, g_row, ge, g_row, ge, T, T, xq.p, xq.p, xq_row, xq_row, ids.data(),
                       nullptr, hr.data(), n_embd, n_ff, k, rows, n_expert, 0, 0.0f, 0, k, &err);
    });
    launch(blocks((long long)rows * n_ff), threads, [&] {
        moe_gate_up<S>(warp_task(), sgate.p, sup.p, sg_row, 0, sg_row, 0, S, S, xq.p, xq.p, xq_row, xq_row,
                       zeros.data(), nullptr, hs.data(), n_embd, n_ff, 1, rows, 1, 0, 0.0f, 0, 1, &err);
    });
    bool same = true;
    for (int r = 0; r < rows; ++r)
        for (int f = 0; f < n_ff; ++f) {
            for (int j = 0; j < k; ++j)
                same &= h[((size_t)r * hk + j) * n_ff + f] == hr[((size_t)r * k + j) * n_ff + f];
            same &= h[((size_t)r * hk + k) * n_ff + f] == hs[(size_t)r * n_ff + f];
        }
    check(same, name, "gate/up: every slot of h equals the separate kernels', bit for bit", 0.0);
    // Relative to the sum of the terms' magnitudes, which bounds an f32 sum's rounding.
    double gerr = 0.0;
    for (int r = 0; r < rows; ++r) {
        double s = 0.0, mag = 0.0;
        for (int i = 0; i < n_embd; ++i) {
            const double t = (double)gw[i] * xf[(size_t)r * n_embd + i];
            s += t;
            mag += std::fabs(t);
        }
        gerr = std::max(gerr, std::fabs(gs[r] - s) / mag);
    }
    check(gerr < 1e-6, name, "the gate's logit within 1e-6 of the f64 sum", gerr);
    // h in the staged pair layout, then the fused down against routed + sigmoid(logit) * shared.
    const long long h_row = n_ff / 64 * STAGE_PAIR, nblocks = (long long)rows * hk * n_ff / 32;
    Buf hq(h_row * rows * hk);
    launch(blocks(nblocks), threads, [&] { bl_quantize_q8_1_pairs(h.data(), hq.p, nblocks); });
    std::vector<float> out((size_t)rows * n_embd), routed(out.size()), sh(out.size());
    launch(blocks((long long)rows * n_embd), threads, [&] {
        moe_down_shared<T, S>(down.p, d_row, de, hq.p, h_row, 1, ids.data(), nullptr, w.data(), out.data(), n_embd,
                              n_ff, k, hk, rows, n_expert, &err, sdown.p, sd_row, gs.data());
    });
    launch(blocks((long long)rows * n_embd), threads, [&] {
        moe_down<T>(down.p, d_row, de, hq.p, h_row, 1, ids.data(), nullptr, w.data(), routed.data(), n_embd, n_ff, k,
                    hk, rows, n_expert, &err);
    });
    launch(blocks((long long)rows * n_embd), threads, [&] {
        moe_down<S>(sdown.p, sd_row, 0, hq.p + k * h_row, h_row, 1, zeros.data(), nullptr, ones.data(), sh.data(),
                    n_embd, n_ff, 1, hk, rows, 1, &err);
    });
    double derr = 0.0, scale = 0.0;
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < n_embd; ++o) {
            const size_t i = (size_t)r * n_embd + o;
            const float want = routed[i] + sh[i] * sigmoid_f(gs[r]);
            derr = std::max(derr, (double)std::fabs(out[i] - want));
            scale = std::max(scale, (double)std::fabs(want));
        }
    derr /= std::max(scale, 1e-30);
    check(derr < 1e-5 && scale > 0.0, name, "down: routed + sigmoid(logit) * shared within 1e-5", derr);
    check(err == 0, name, "no error reported", (double)err);
}

int main() {
    for (int early = 0; early < 2; ++early) {
        run_case<WT_Q8_0, WT_Q8_0>(early ? "Q8_0 + Q8_0 shared, early" : "Q8_0 + Q8_0 shared", early);
        run_case<WT_Q4_K, WT_Q8_0>(early ? "Q4_K + Q8_0 shared, early" : "Q4_K + Q8_0 shared", early);
        run_case<WT_Q8_0, WT_Q4_K>(early ? "Q8_0 + Q4_K shared, early" : "Q8_0 + Q4_K shared", early);
        run_case<WT_Q4_K, WT_Q4_K>(early ? "Q4_K + Q4_K shared, early" : "Q4_K + Q4_K shared", early);
    }
    if (failures) {
        std::printf("%d checks failed\n", failures);
        return 1;
    }
    std::printf("all passed\n");
    return 0;
}
