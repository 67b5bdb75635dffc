// Checks the per-head RMS norm + RoPE with its cache stores (cu/rope.cuh: bl_norm_rope_f32 and
// _f16) on the CPU (sim.h) against an f64 reference: the norm's output within 1e-6 (relative) of
// x / sqrt(mean(x^2) + eps) * w, the rotated output within 2e-6 of the f64 rotation of it (an
// angle of p * base^(-2i / n_dims), cos and sin in f64), K and V cache rows at slot * len + pos % len
// equal to the output and V (f16: rounded), a bad slot reported (error 2) with its cache rows left
// alone, and nothing written past the tensors. Cases: a Q group before K with both stores (NEOX,
// head 128), adjacent pairs with half the dims rotated in place (head 64, no weight), head 256
// into an f16 cache with a bad slot, head 512 (two norm elements a thread). Blocks as the host
// launches them: one per (row, head) of round_up(head_dim / 2, 32) threads, then one per V row.
// Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/rope.cuh"

static std::mt19937 rng(13);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

struct Case {
    const char* name;
    int hd, nh, qnh, rows, neox, n_dims;
    bool weight, in_place, stores, bad_slot;
};

static const float kPoison = -77.0f;
static const double kLog2Base = std::log2(10000.0);

// The f64 reference of one head: normed and rotated.
static void reference(const float* x, const float* w, int hd, int neox, int n_dims, int p, float eps, double* normed,
                      double* rotated) {
    double ss = 0.0;
    for (int i = 0; i < hd; ++i) ss += (double)x[i] * x[i];
    const double inv = 1.0 / std::sqrt(ss / hd + eps);
    for (int i = 0; i < hd; ++i) normed[i] = x[i] * inv * (w ? w[i] : 1.0);
    for (int i = 0; i < hd; ++i) rotated[i] = normed[i];
    for (int i = 0; i < n_dims / 2; ++i) {
        const int a = neox ? i : 2 * i, b = neox ? i + n_dims / 2 : 2 * i + 1;
        const double th = p * std::exp2(-2.0 * i / n_dims * kLog2Base);
        rotated[a] = normed[a] * std::cos(th) - normed[b] * std::sin(th);
        rotated[b] = normed[a] * std::sin(th) + normed[b] * std::cos(th);
    }
}

template <typename T>
static float stored(T v) {
    return to_f32(v);
}

template <typename T>
static bool run_case(const Case& c) {
    const int hd = c.hd, rows = c.rows, len = 8, n_slots = 3, vw = 200;
    const float eps = 1e-6f;
    const long long kw = (long long)hd * c.nh, qw_ = (long long)hd * c.qnh;
    std::vector<float> x(rows * kw), w(hd), qx(rows * qw_ + 1), qwt(hd), v(rows * vw);
    for (auto& a : x) a = uniform(-3.0f, 3.0f);
    for (auto& a : qx) a = uniform(-3.0f, 3.0f);
    for (auto& a : w) a = uniform(0.5f, 1.5f);
    for (auto& a : qwt) a = uniform(0.5f, 1.5f);
    for (auto& a : v) a = uniform(-1.0f, 1.0f);
    std::vector<int> pos(rows), slots(rows);
    for (int r = 0; r < rows; ++r) {
        pos[r] = (int)(rng() % 5000);
        slots[r] = (int)(rng() % n_slots);
    }
    if (c.bad_slot) slots[rows - 1] = n_slots;
    const std::vector<float> x0 = x;
    std::vector<float> out_buf(rows * kw + 8, kPoison), normed(rows * kw + 8, kPoison);
    std::vector<float> qnormed(rows * qw_ + 8, kPoison), qout(rows * qw_ + 8, kPoison);
    std::vector<T> kc((size_t)n_slots * len * kw + 8, from_f32<T>(kPoison)),
        vc((size_t)n_slots * len * vw + 8, from_f32<T>(kPoison));
    float* out = c.in_place ? x.data() : out_buf.data();
    float* nrm = c.in_place ? nullptr : normed.data();
    const float* wp = c.weight ? w.data() : nullptr;
    int err = 0;
    const int blocks = rows * (c.nh + c.qnh + (c.stores ? 1 : 0));
    launch(Dim3{(unsigned)blocks, 1, 1}, (hd / 2 + WARP - 1) / WARP * WARP, [&] {
        norm_rope<T>(x.data(), wp, nrm, out, pos.data(), hd, c.nh, rows, eps, c.neox, c.n_dims, kLog2Base, 1.0f, 0.0f,
                     0.0f, 0.0f, 1.0, c.stores ? kc.data() : nullptr, slots.data(), len, n_slots,
                     c.stores ? v.data() : nullptr, vc.data(), vw, &err, c.qnh ? qx.data() : nullptr,
                     c.qnh ? qwt.data() : nullptr, c.qnh ? qnormed.data() : nullptr, c.qnh ? qout.data() : nullptr,
                     c.qnh);
    });
    int bad = 0;
    double worst_n = 0.0, worst_o = 0.0;
    std::vector<double> rn(hd), ro(hd);
    auto check_head = [&](const float* xh, const float* wh, const float* nh_out, const float* oh, int p) {
        reference(xh, wh, hd, c.neox, c.n_dims, p, eps, rn.data(), ro.data());
        for (int i = 0; i < hd; ++i) {
            if (nh_out) {
                const double e = std::fabs(nh_out[i] - rn[i]) / std::max(1.0, std::fabs(rn[i]));
                worst_n = std::max(worst_n, e);
                if (!(e <= 1e-6) && bad++ < 4) printf("  normed %d: %g, want %g\n", i, nh_out[i], rn[i]);
            }
            const double e = std::fabs(oh[i] - ro[i]);
            worst_o = std::max(worst_o, e);
            if (!(e <= 2e-6 * std::max(1.0, std::fabs(ro[i]))) && bad++ < 4) printf("  out %d: %g, want %g\n", i, oh[i], ro[i]);
        }
    };
    for (int r = 0; r < rows; ++r) {
        for (int h = 0; h < c.qnh; ++h) {
            const long long o = ((long long)r * c.qnh + h) * hd;
            check_head(qx.data() + o, qwt.data(), qnormed.data() + o, qout.data() + o, pos[r]);
        }
        for (int h = 0; h < c.nh; ++h) {
            const long long o = ((long long)r * c.nh + h) * hd;
            check_head(x0.data() + o, wp, nrm ? normed.data() + o : nullptr, out + o, pos[r]);
        }
    }
    // Cache rows: the output (K) and V at each good row's place; every other row still poison.
    std::vector<int> k_owner((size_t)n_slots * len, -1);
    for (int r = 0; r < rows; ++r)
        if (c.stores && slots[r] < n_slots) k_owner[(size_t)slots[r] * len + pos[r] % len] = r;
    for (int cr = 0; cr < n_slots * len; ++cr) {
        const int r = k_owner[cr];
        for (long long i = 0; i < kw; ++i) {
            const float want = r < 0 ? kPoison : stored(from_f32<T>(out[(long long)r * kw + i]));
            if (stored(kc[(size_t)cr * kw + i]) != want && bad++ < 4) printf("  K cache row %d at %lld\n", cr, i);
        }
        for (int i = 0; i < vw; ++i) {
            const float want = r < 0 ? kPoison : stored(from_f32<T>(v[(long long)r * vw + i]));
            if (stored(vc[(size_t)cr * vw + i]) != want && bad++ < 4) printf("  V cache row %d at %d\n", cr, i);
        }
    }
    for (int i = 0; i < 8; ++i) {
        const bool past = out_buf[rows * kw + i] != kPoison || normed[rows * kw + i] != kPoison ||
                          qout[rows * qw_ + i] != kPoison || qnormed[rows * qw_ + i] != kPoison ||
                          stored(kc[kc.size() - 8 + i]) != kPoison || stored(vc[vc.size() - 8 + i]) != kPoison;
        if (past && bad++ < 4) printf("  written past a tensor\n");
    }
    const int want_err = c.bad_slot && c.stores ? 2 : 0;
    if (err != want_err) {
        printf("  error word %d, want %d\n", err, want_err);
        ++bad;
    }
    printf("%s %s: worst normed %.2g, out %.2g\n", bad ? "FAIL" : "ok  ", c.name, worst_n, worst_o);
    return bad == 0;
}

int main() {
    bool ok = true;
    ok &= run_case<float>({"Q group then K with stores, NEOX, head 128", 128, 4, 8, 3, 1, 128, true, false, true, false});
    ok &= run_case<float>(
        {"adjacent pairs, half the dims, in place, no weight", 64, 3, 0, 5, 0, 32, false, true, false, false});
    ok &= run_case<__half>(
        {"head 256 into an f16 cache, a bad slot", 256, 2, 0, 3, 1, 256, true, false, true, true});
    ok &= run_case<float>({"head 512, 12 + 7 heads and a V store", 512, 7, 12, 2, 1, 512, true, false, true, false});
    printf("%s\n", ok ? "all ok" : "FAILED");
    return ok ? 0 : 1;
}
