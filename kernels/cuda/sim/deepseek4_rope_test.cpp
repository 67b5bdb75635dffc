// Checks DeepSeek-V4's tail rope and its inverse (bl_rope_f32 of cu/rope.cuh with a dimension
// offset) on the CPU (sim.h) against transformers 5.24 (kernels/cpu's fixture
// tests/fixtures/deepseek4/ops_hf.json): the rotated dims within 5e-6 of the case's largest
// magnitude (as kernels/cpu's test measures it: the reference forms its angles in f32, the kernel in
// f64), the dims before the offset copied bit for bit. A grid smaller than the work, so the grid-stride loop is exercised too. tests/sim.rs writes
// the file named by argv[1]: the case count, then per case rows, head_dim, n_head, n_dims, offset
// (int32), log2 of the base, mscale (f64), freq_scale, ext_factor, corr0, corr1 (f32), the
// positions (int32), x, the forward rope and the inverse rope (f32). Prints one line per case and
// direction; exits 1 on a failure.
#include "sim.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/rope.cuh"

template <typename T>
static bool read(FILE* f, T* p, size_t n) {
    return std::fread(p, sizeof(T), n, f) == n;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: deepseek4_rope_test CASES\n");
        return 2;
    }
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) {
        std::perror(argv[1]);
        return 2;
    }
    int n_cases = 0, failures = 0;
    if (!read(f, &n_cases, 1)) return 2;
    for (int c = 0; c < n_cases; ++c) {
        int head[5];
        double dterms[2];
        float fterms[4];
        if (!read(f, head, 5) || !read(f, dterms, 2) || !read(f, fterms, 4)) return 2;
        const int rows = head[0], hd = head[1], nh = head[2], n_dims = head[3], offset = head[4];
        const size_t n = (size_t)rows * nh * hd;
        std::vector<int> pos(rows);
        std::vector<float> x(n), want[2] = {std::vector<float>(n), std::vector<float>(n)};
        if (!read(f, pos.data(), rows) || !read(f, x.data(), n) || !read(f, want[0].data(), n) ||
            !read(f, want[1].data(), n)) {
            std::fprintf(stderr, "truncated cases file\n");
            return 2;
        }
        for (int inverse = 0; inverse < 2; ++inverse) {
            std::vector<float> out(n + 8, -77.0f);
            launch(Dim3{3, 1, 1}, 64, [&] {
                bl_rope_f32(x.data(), out.data(), pos.data(), hd, nh, rows, 0, n_dims, dterms[0], fterms[0],
                            fterms[1], fterms[2], fterms[3], dterms[1], offset, inverse);
            });
            int bad = 0;
            double worst = 0.0, scale = 0.0;
            for (size_t i = 0; i < n; ++i) scale = std::fmax(scale, std::fabs(want[inverse][i]));
            for (size_t i = 0; i < n; ++i) {
                const int d = (int)(i % hd);
                const double w = want[inverse][i];
                const bool rotated = d >= offset && d < offset + n_dims;
                const double e = std::fabs(out[i] - w) / scale;
                if (rotated) worst = std::fmax(worst, e);
                const bool ok = rotated ? e <= 5e-6 : out[i] == x[i];
                if (!ok && bad++ < 4) std::printf("  element %zu (dim %d): %.9g, want %.9g\n", i, d, out[i], w);
            }
            for (int i = 0; i < 8; ++i)
                if (out[n + i] != -77.0f && bad++ < 4) std::printf("  written past the output\n");
            std::printf("%s case %d %s, head %d, dims %d from %d: worst %.2g\n", bad ? "FAIL" : "ok  ", c,
                        inverse ? "inverse" : "forward", hd, n_dims, offset, worst);
            failures += bad != 0;
        }
    }
    std::printf("%s\n", failures ? "FAILED" : "all ok");
    return failures ? 1 : 0;
}
