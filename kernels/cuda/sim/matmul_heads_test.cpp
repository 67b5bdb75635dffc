// Checks MatMul over per-head weight stacks (cu/matmul_heads.cuh, bl_matmul_heads) on the CPU
// (sim.h) against an f64 reference written here from the definition (Op::MatMul in
// plugin-api/src/op.rs): y[:, h, c] = W_h . x[:, h, c] for w [k, n, H], x [k, H, m]. F32 weights
// read f32 activations; Q8_0 weights read the activations' Q8_1 copy, which this test writes
// itself (d = max|x| / 127, q = round(x / d)) and the reference multiplies as stored. Cases: GLM-5.3's
// absorbed shapes in small (k 256 -> n 16, k 64 -> n 24), one and three columns, a grid with
// fewer warps than tasks (the kernel strides). Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/quant.cuh"
#include "../cu/matmul_heads.cuh"

static std::mt19937 rng(11);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

static float f16_at(const uint8_t* p) {
    __half h;
    std::memcpy(&h, p, 2);
    return __half2float(h);
}
static void put_half(uint8_t* p, float v) {
    const __half h = __float2half_rn(v);
    std::memcpy(p, &h, 2);
}

static bool run(const char* name, int wt, int k, int n, int heads, int m, unsigned blocks) {
    const int cols = heads * m;
    const size_t w_row = wt == WT_F32 ? (size_t)k * 4 : (size_t)k / 32 * 34;
    const size_t x_row = wt == WT_F32 ? (size_t)k * 4 : (size_t)k / 32 * 36;
    std::vector<uint8_t> w(w_row * n * heads), x(x_row * cols);
    std::vector<double> wv((size_t)k * n * heads), xv((size_t)k * cols);
    for (size_t r = 0; r < (size_t)n * heads; ++r)
        for (int b = 0; b < k / 32; ++b) {
            const float d = uniform(0.002f, 0.01f);
            uint8_t* blk = w.data() + r * w_row + (wt == WT_F32 ? b * 128 : b * 34);
            if (wt != WT_F32) put_half(blk, d);
            for (int i = 0; i < 32; ++i) {
                double v;
                if (wt == WT_F32) {
                    const float f = uniform(-1.0f, 1.0f);
                    std::memcpy(blk + 4 * i, &f, 4);
                    v = f;
                } else {
                    const int8_t q = (int8_t)(rng() % 255 - 127);
                    blk[2 + i] = (uint8_t)q;
                    v = (double)f16_at(blk) * q;
                }
                wv[r * k + b * 32 + i] = v;
            }
        }
    for (int c = 0; c < cols; ++c)
        for (int b = 0; b < k / 32; ++b) {
            float v[32], amax = 0.0f;
            for (float& f : v) amax = std::max(amax, std::fabs(f = uniform(-1.0f, 1.0f)));
            if (wt == WT_F32) {
                std::memcpy(x.data() + c * x_row + b * 128, v, 128);
                for (int i = 0; i < 32; ++i) xv[(size_t)c * k + b * 32 + i] = v[i];
                continue;
            }
            uint8_t* blk = x.data() + c * x_row + b * 36;
            const float d = amax / 127.0f;
            int sum = 0;
            for (int i = 0; i < 32; ++i) {
                const int q = (int)std::nearbyint(v[i] * (127.0f / amax));
                blk[4 + i] = (uint8_t)(int8_t)q;
                sum += q;
            }
            put_half(blk, d);
            put_half(blk + 2, sum * d);
            for (int i = 0; i < 32; ++i) xv[(size_t)c * k + b * 32 + i] = (double)f16_at(blk) * (int8_t)blk[4 + i];
        }
    std::vector<float> y((size_t)n * cols, NAN);
    launch(Dim3{blocks, 1, 1}, 64, [&] {
        bl_matmul_heads(w.data(), (long long)w_row, (long long)w_row * n, x.data(), (long long)x_row, y.data(), k, n,
                        heads, m, wt);
    });
    double worst = 0.0;
    for (int c = 0; c < cols; ++c) {
        const int h = c % heads;
        for (int j = 0; j < n; ++j) {
            double ref = 0.0, mag = 0.0;
            for (int i = 0; i < k; ++i) {
                const double t = wv[((size_t)h * n + j) * k + i] * xv[(size_t)c * k + i];
                ref += t;
                mag += std::fabs(t);
            }
            const double e = std::fabs(y[(size_t)c * n + j] - ref) / std::max(mag, 1e-30);
            worst = std::isnan(e) ? INFINITY : std::max(worst, e);
        }
    }
    const bool ok = worst <= 1e-5;
    std::printf("%s %s: rel error %.2e\n", ok ? "ok  " : "FAIL", name, worst);
    return ok;
}

int main() {
    bool ok = true;
    ok = run("f32, k 256 -> n 16, 3 heads, 1 column", WT_F32, 256, 16, 3, 1, 24) && ok;
    ok = run("f32, k 64 -> n 24, 4 heads, 3 columns, 5 blocks (striding)", WT_F32, 64, 24, 4, 3, 5) && ok;
    ok = run("q8_0, k 256 -> n 16, 3 heads, 3 columns", WT_Q8_0, 256, 16, 3, 3, 72) && ok;
    ok = run("q8_0, k 64 -> n 24, 4 heads, 1 column, 7 blocks (striding)", WT_Q8_0, 64, 24, 4, 1, 7) && ok;
    std::printf(ok ? "all per-head product cases passed\n" : "per-head product cases FAILED\n");
    return ok ? 0 : 1;
}
