// Checks the ops over whole graph tensors of cu/dense.cuh on the CPU (sim.h) against f64
// references written here from the ops' definitions (plugin-api's Op docs): LayerNorm with and
// without its weight and bias (and in place), Softmax with a scale and a mask shared by several
// rows (a fully masked row gives zeros), Concat along ne0, span means (a bad span reports its
// error and writes nothing), and dense attention between tensors: several key chunks under the
// running maximum, grouped key heads, causal rows, values wider than a block (several values a
// thread), with large scores (the online softmax's rescaling). Blocks run in a shuffled order.
// Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/dense.cuh"

static std::mt19937 rng(11);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
static std::vector<float> randoms(size_t n, float a) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(-a, a);
    return v;
}

// Reports a case: the worst |got - want| / (|want| + floor) against tol.
static bool report_case(const std::string& name, const std::vector<float>& got, const std::vector<double>& want,
                        double tol, double floor = 1.0) {
    double worst = 0.0;
    size_t at = 0;
    bool finite = true;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) finite = false;
        const double e = std::fabs(got[i] - want[i]) / (std::fabs(want[i]) + floor);
        if (!(e <= worst)) worst = e, at = i;
    }
    const bool ok = finite && worst <= tol;
    std::printf("%s %s: worst %.2e at %zu (%.9g, want %.9g)\n", ok ? "ok  " : "FAIL", name.c_str(), worst, at,
                got.empty() ? 0.0 : got[at], want.empty() ? 0.0 : want[at]);
    return ok;
}

static bool layer_norm_case(int ncols, int rows, bool affine, bool in_place) {
    std::vector<float> x = randoms((size_t)ncols * rows, 3.0f), w = randoms(ncols, 1.5f), b = randoms(ncols, 0.5f);
    for (int r = 0; r < rows; ++r) x[(size_t)r * ncols] += 40.0f;  // an offset row mean
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; ++r) {
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < ncols; ++i) mean += x[(size_t)r * ncols + i];
        mean /= ncols;
        for (int i = 0; i < ncols; ++i) var += (x[(size_t)r * ncols + i] - mean) * (x[(size_t)r * ncols + i] - mean);
        const double inv = 1.0 / std::sqrt(var / ncols + 1e-5);
        for (int i = 0; i < ncols; ++i) {
            const double y = (x[(size_t)r * ncols + i] - mean) * inv;
            want[(size_t)r * ncols + i] = affine ? y * w[i] + b[i] : y;
        }
    }
    std::vector<float> out = in_place ? x : std::vector<float>(x.size(), NAN);
    float* dst = out.data();
    const float* src = in_place ? out.data() : x.data();
    const unsigned threads = std::min(1024u, std::max(32u, (unsigned)((ncols + 63) / 64 * 32)));
    launch(Dim3{(unsigned)rows, 1, 1}, threads, [&] {
        bl_layer_norm_f32(src, affine ? w.data() : nullptr, affine ? b.data() : nullptr, dst, ncols, 1e-5f);
    });
    return report_case("layer norm " + std::to_string(ncols) + " x " + std::to_string(rows) +
                           (affine ? ", weight and bias" : ", plain") + (in_place ? ", in place" : ""),
                       out, want, 1e-6);
}

static bool softmax_case(int ncols, int rows, int mask_rows, float scale) {
    std::vector<float> x = randoms((size_t)ncols * rows, 20.0f);
    std::vector<float> mask(mask_rows > 0 ? (size_t)ncols * mask_rows : 0);
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 7 % 5 == 0) ? -INFINITY : uniform(-2.0f, 2.0f);
    if (mask_rows > 1)
        for (int i = 0; i < ncols; ++i) mask[ncols + i] = -INFINITY;  // mask row 1 hides everything
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; ++r) {
        std::vector<double> z(ncols);
        double mx = -INFINITY;
        for (int i = 0; i < ncols; ++i) {
            // scale · x + mask rounded to f32, as the op defines it for f32 tensors.
            z[i] = x[(size_t)r * ncols + i] * scale + (mask_rows ? mask[(size_t)(r % mask_rows) * ncols + i] : 0.0f);
            mx = std::max(mx, z[i]);
        }
        double s = 0.0;
        for (int i = 0; i < ncols; ++i) s += z[i] = mx == -INFINITY ? 0.0 : std::exp(z[i] - mx);
        for (int i = 0; i < ncols; ++i) want[(size_t)r * ncols + i] = mx == -INFINITY ? 0.0 : z[i] / s;
    }
    std::vector<float> out(x.size(), NAN);
    const unsigned threads = std::min(1024u, std::max(32u, (unsigned)((ncols + 63) / 64 * 32)));
    launch(Dim3{(unsigned)rows, 1, 1}, threads, [&] {
        bl_softmax_f32(x.data(), mask_rows ? mask.data() : nullptr, out.data(), ncols, std::max(mask_rows, 1), scale);
    });
    return report_case("softmax " + std::to_string(ncols) + " x " + std::to_string(rows) + ", mask rows " +
                           std::to_string(mask_rows),
                       out, want, 1e-6, 1e-3);
}

static bool concat_case(int na, int nb, int rows) {
    std::vector<float> a = randoms((size_t)na * rows, 1.0f), b = randoms((size_t)nb * rows, 1.0f);
    std::vector<double> want;
    for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < na; ++i) want.push_back(a[(size_t)r * na + i]);
        for (int i = 0; i < nb; ++i) want.push_back(b[(size_t)r * nb + i]);
    }
    std::vector<float> out(want.size(), NAN);
    launch(Dim3{3, 1, 1}, 64, [&] { bl_concat_f32(a.data(), b.data(), out.data(), na, nb, rows); });
    return report_case("concat " + std::to_string(na) + " + " + std::to_string(nb) + " x " + std::to_string(rows), out,
                       want, 0.0);
}

static bool span_mean_case(int n, int rows, std::vector<int> spans, int want_err) {
    std::vector<float> x = randoms((size_t)n * rows, 2.0f);
    const int ns = (int)spans.size() / 2;
    std::vector<float> out((size_t)n * ns, -7.0f);
    int err = 0;
    launch(Dim3{(unsigned)ns, (unsigned)((n + 127) / 128), 1}, 128,
           [&] { bl_span_mean_f32(x.data(), spans.data(), out.data(), n, rows, &err); });
    const std::string name = "span means of " + std::to_string(n) + " x " + std::to_string(rows);
    if (err != want_err) {
        std::printf("FAIL %s: error %d, want %d\n", name.c_str(), err, want_err);
        return false;
    }
    std::vector<double> want(out.size(), -7.0);
    for (int s = 0; s < ns; ++s) {
        const int a = spans[2 * s], e = spans[2 * s + 1];
        if (a < 0 || e <= a || e > rows) continue;  // a bad span writes nothing
        for (int c = 0; c < n; ++c) {
            double sum = 0.0;
            for (int r = a; r < e; ++r) sum += x[(size_t)r * n + c];
            want[(size_t)s * n + c] = sum / (e - a);
        }
    }
    return report_case(name + (want_err ? ", a bad span" : ""), out, want, 1e-7);
}

struct AttnCase {
    int dk, dv, n_head, n_kv, n_q, n_k;
    bool causal;
    float amp;  // scale of q and k (large: scores in the hundreds)
};

static bool attention_case(const AttnCase& c) {
    std::vector<float> q = randoms((size_t)c.dk * c.n_head * c.n_q, c.amp);
    std::vector<float> k = randoms((size_t)c.dk * c.n_kv * c.n_k, c.amp);
    std::vector<float> v = randoms((size_t)c.dv * c.n_kv * c.n_k, 1.0f);
    const float scale = 1.0f / std::sqrt((float)c.dk);
    std::vector<double> want((size_t)c.dv * c.n_head * c.n_q);
    const int group = c.n_head / c.n_kv;
    for (int i = 0; i < c.n_q; ++i)
        for (int h = 0; h < c.n_head; ++h) {
            const int g = h / group, seen = c.causal ? std::min(i + 1, c.n_k) : c.n_k;
            std::vector<double> sc(seen);
            double mx = -INFINITY, l = 0.0;
            for (int j = 0; j < seen; ++j) {
                double d = 0.0;
                for (int e = 0; e < c.dk; ++e)
                    d += (double)q[((size_t)i * c.n_head + h) * c.dk + e] * k[((size_t)j * c.n_kv + g) * c.dk + e];
                mx = std::max(mx, sc[j] = d * scale);
            }
            for (int j = 0; j < seen; ++j) l += sc[j] = std::exp(sc[j] - mx);
            for (int d = 0; d < c.dv; ++d) {
                double a = 0.0;
                for (int j = 0; j < seen; ++j) a += sc[j] * v[((size_t)j * c.n_kv + g) * c.dv + d];
                want[((size_t)i * c.n_head + h) * c.dv + d] = a / l;
            }
        }
    std::vector<float> out(want.size(), NAN);
    launch(Dim3{(unsigned)c.n_head, (unsigned)c.n_q, 1}, DENSE_THREADS, [&] {
        bl_attention_dense_f32(q.data(), k.data(), v.data(), out.data(), c.dk, c.dv, c.n_head, c.n_kv, c.n_q, c.n_k,
                               scale, c.causal);
    });
    char name[160];
    std::snprintf(name, sizeof name, "dense attention dk %d dv %d, %d/%d heads, %d queries over %d keys%s%s", c.dk,
                  c.dv, c.n_head, c.n_kv, c.n_q, c.n_k, c.causal ? ", causal" : "", c.amp > 2.0f ? ", large scores" : "");
    return report_case(name, out, want, 1e-6);
}

int main() {
    g_block_shuffle = 7;
    bool ok = true;
    ok &= layer_norm_case(1024, 5, true, false);
    ok &= layer_norm_case(64, 9, true, true);
    ok &= layer_norm_case(100, 3, false, false);
    ok &= softmax_case(12, 6, 0, 1.0f);
    ok &= softmax_case(600, 4, 2, 0.125f);
    ok &= softmax_case(33, 9, 3, 0.7f);
    ok &= concat_case(64, 64, 12);
    ok &= concat_case(7, 129, 5);
    ok &= span_mean_case(300, 40, {0, 40, 3, 4, 10, 25}, 0);
    ok &= span_mean_case(64, 10, {0, 5, 6, 6, 2, 3}, ERR_SPAN);
    ok &= span_mean_case(64, 10, {0, 11}, ERR_SPAN);
    ok &= attention_case({16, 16, 4, 4, 6, 300, false, 1.0f});
    ok &= attention_case({64, 64, 8, 2, 3, 129, false, 1.0f});
    ok &= attention_case({16, 16, 2, 1, 5, 5, true, 1.0f});
    ok &= attention_case({32, 300, 2, 2, 2, 140, false, 1.0f});
    ok &= attention_case({64, 64, 1, 1, 2, 400, false, 6.0f});
    return ok ? 0 : 1;
}
