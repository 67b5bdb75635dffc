// Checks the tiled f32 product of cu/gemm_f32.cuh (bl_matmul_f32_tiled) on the CPU (sim.h): every
// output equals, bit for bit, the kernel's order of f32 sums (over the even k steps of F32T_KC
// values in order with one rounding per product-add, fmaf, plus the same over the odd steps), and lies within 1e-6 of the f64 sum relative to the sum of |products|;
// nothing past the output is written. Shapes: the router of a 512-row prompt's first rows
// (k = 2048, 128 experts), partial row and column tiles, a partial last k step (k = 352), padded
// weight rows. Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "../cu/gemm_f32.cuh"

static std::mt19937 rng(3);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

struct Case {
    const char* name;
    int k, n, m, pad;  // pad: floats after each weight row
};

static bool run_case(const Case& c) {
    const int k = c.k, n = c.n, m = c.m, stride = k + c.pad;
    std::vector<float> w((size_t)n * stride), x((size_t)m * k), y((size_t)m * n + 64, -7.0f);
    for (auto& v : w) v = uniform(-0.1f, 0.1f);
    for (auto& v : x) v = uniform(-2.0f, 2.0f);
    launch(Dim3{(unsigned)((n + F32T_BN - 1) / F32T_BN), (unsigned)((m + F32T_BM - 1) / F32T_BM), 1}, F32T_THREADS,
           [&] {
               bl_matmul_f32_tiled((const uint8_t*)w.data(), (long long)stride * 4, x.data(), y.data(), k, n, m);
           });
    int bad = 0;
    double worst = 0.0;
    for (int col = 0; col < m; ++col)
        for (int r = 0; r < n; ++r) {
            float part[2] = {0.0f, 0.0f};
            double ref = 0.0, mag = 0.0;
            for (int i = 0; i < k; ++i) {
                const float a = w[(size_t)r * stride + i], b = x[(size_t)col * k + i];
                part[i / F32T_KC % 2] = std::fmaf(a, b, part[i / F32T_KC % 2]);
                ref += (double)a * b;
                mag += std::fabs((double)a * b);
            }
            const float s = part[0] + part[1];
            const float got = y[(size_t)col * n + r];
            const double rel = std::fabs(got - ref) / (mag + 1e-30);
            worst = std::max(worst, rel);
            if (got != s || rel > 1e-6) {
                if (bad++ < 3)
                    std::printf("  %s: row %d column %d: %.9g, kernel's order %.9g, f64 %.9g\n", c.name, r, col, got, s,
                                ref);
            }
        }
    for (int i = 0; i < 64; ++i)
        if (y[(size_t)m * n + i] != -7.0f) {
            std::printf("  %s: wrote past the output at %d\n", c.name, i);
            ++bad;
            break;
        }
    std::printf("%s %s: k %d, %d x %d, worst relative %.2e\n", bad ? "FAIL" : "ok  ", c.name, k, n, m, worst);
    return bad == 0;
}

int main() {
    const Case cases[] = {
        {"router, 40 rows", 2048, 128, 40, 0},
        {"partial tiles, padded rows", 128, 20, 70, 8},
        {"partial k step", 352, 33, 17, 4},
        {"one column, one step", 64, 16, 1, 0},
        {"three steps", 192, 16, 33, 0},
    };
    bool ok = true;
    for (const Case& c : cases) ok &= run_case(c);
    return ok ? 0 : 1;
}
