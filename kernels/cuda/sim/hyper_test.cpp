// Checks the hyper-connection kernels of cu/hyper.cuh on the CPU (sim.h) against f64 references
// written here from the ops' definitions (plugin-api's Op::Sinkhorn, Op::StreamMix,
// Op::StreamUpdate, Op::GroupDotGate): Sinkhorn of GLM-5.3's 4 streams at 20, 3 and 1 iterations,
// of 3, 5 and 8 streams (a block of two warps), with logits of ±80 (the softmax's maximum) and a
// column of -inf (zeros before eps); the streams' weighted sum and update at GLM-5.3's width (4
// streams of 4096) over several rows, a grid smaller than the work (grid-stride) and odd widths,
// each also in Qwen3.8-Flash-Next's form (per-element weights, the identity comb); the group gate
// at its width (4 streams of 2560) and an odd one, with a zero group (gate ½) and groups under the
// floor, over fewer blocks than groups; DeepSeek-V4.1's Engram gate (Op::EngramGate) at its width
// (4 streams of 5120) and an odd one, with a zero stream (gate ½) and distinct norm weights per
// stream, over fewer blocks than groups. Blocks run in a shuffled order. Prints one line per case;
// exits 1 on a failure.
#include "sim.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/hyper.cuh"

static std::mt19937 rng(17);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
static std::vector<float> randoms(size_t n, float a) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(-a, a);
    return v;
}

// Reports a case: max |got - want| / max |want| against tol (a value that is not finite fails).
static bool report_case(const std::string& name, const std::vector<float>& got, const std::vector<double>& want,
                        double tol) {
    double worst = 0.0, scale = 0.0;
    size_t at = 0;
    bool finite = true;
    for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        if (!std::isfinite(got[i])) finite = false;
        const double e = std::fabs(got[i] - want[i]);
        if (!(e <= worst)) worst = e, at = i;
    }
    worst /= scale > 0.0 ? scale : 1.0;
    const bool ok = finite && worst <= tol;
    std::printf("%s %s: worst %.2e at %zu (%.9g, want %.9g)\n", ok ? "ok  " : "FAIL", name.c_str(), worst, at,
                got.empty() ? 0.0 : got[at], want.empty() ? 0.0 : want[at]);
    return ok;
}

// The Sinkhorn of Op::Sinkhorn's doc in f64: element (i, j) of matrix r at i + n*j + n*n*r.
static std::vector<double> sinkhorn_ref(const std::vector<float>& x, int n, int iters, double eps) {
    std::vector<double> m(x.begin(), x.end());
    const int nn = n * n;
    for (size_t base = 0; base < m.size(); base += nn) {
        double* a = &m[base];
        for (int j = 0; j < n; ++j) {
            double mx = -INFINITY, s = 0.0;
            for (int i = 0; i < n; ++i) mx = std::max(mx, a[i + n * j]);
            for (int i = 0; i < n; ++i) s += mx == -INFINITY ? 0.0 : std::exp(a[i + n * j] - mx);
            for (int i = 0; i < n; ++i) a[i + n * j] = (mx == -INFINITY ? 0.0 : std::exp(a[i + n * j] - mx) / s) + eps;
        }
        auto over_j = [&] {
            for (int i = 0; i < n; ++i) {
                double s = eps;
                for (int j = 0; j < n; ++j) s += a[i + n * j];
                for (int j = 0; j < n; ++j) a[i + n * j] /= s;
            }
        };
        over_j();
        for (int it = 1; it < iters; ++it) {
            for (int j = 0; j < n; ++j) {
                double s = eps;
                for (int i = 0; i < n; ++i) s += a[i + n * j];
                for (int i = 0; i < n; ++i) a[i + n * j] /= s;
            }
            over_j();
        }
    }
    return m;
}

static bool sinkhorn_case(int n, int mats, int iters, float scale, bool extremes) {
    std::vector<float> x = randoms((size_t)n * n * mats, scale);
    if (extremes) {
        x[0] = 80.0f, x[1] = -80.0f;                                  // matrix 0, column 0
        for (int i = 0; i < n; ++i) x[(size_t)n * n + i] = -INFINITY;  // matrix 1, column 0
    }
    const std::vector<double> want = sinkhorn_ref(x, n, iters, 1e-6);
    std::vector<float> out(x.size(), NAN);
    const unsigned threads = (unsigned)((n * n + WARP - 1) / WARP * WARP);
    launch(Dim3{(unsigned)mats, 1, 1}, threads, [&] { bl_sinkhorn_f32(x.data(), out.data(), n, iters, 1e-6f); });
    return report_case("sinkhorn of " + std::to_string(mats) + " matrices of " + std::to_string(n) + " streams, " +
                           std::to_string(iters) + " iterations" + (extremes ? ", logits of +-80 and -inf" : ""),
                       out, want, 1e-6);
}

static bool stream_mix_case(int n, int s, int rows, unsigned blocks) {
    const std::vector<float> x = randoms((size_t)n * s * rows, 2.0f), w = randoms((size_t)s * rows, 1.0f);
    std::vector<double> want((size_t)n * rows, 0.0);
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < s; ++j)
            for (int c = 0; c < n; ++c)
                want[(size_t)r * n + c] += (double)w[(size_t)r * s + j] * x[((size_t)r * s + j) * n + c];
    std::vector<float> out(want.size(), NAN);
    launch(Dim3{blocks, 1, 1}, 256, [&] { bl_stream_mix_f32(x.data(), w.data(), out.data(), n, s, rows); });
    return report_case("stream mix of " + std::to_string(s) + " streams of " + std::to_string(n) + ", " +
                           std::to_string(rows) + " rows, " + std::to_string(blocks) + " blocks",
                       out, want, 1e-6);
}

static bool stream_update_case(int n, int s, int rows, unsigned blocks) {
    const std::vector<float> x = randoms((size_t)n * s * rows, 2.0f), y = randoms((size_t)n * rows, 2.0f);
    const std::vector<float> comb = randoms((size_t)s * s * rows, 1.0f), post = randoms((size_t)s * rows, 2.0f);
    std::vector<double> want((size_t)n * s * rows);
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < s; ++i)
            for (int c = 0; c < n; ++c) {
                double o = (double)post[(size_t)r * s + i] * y[(size_t)r * n + c];
                for (int j = 0; j < s; ++j)
                    o += (double)comb[(size_t)r * s * s + i + (size_t)s * j] * x[((size_t)r * s + j) * n + c];
                want[((size_t)r * s + i) * n + c] = o;
            }
    std::vector<float> out(want.size(), NAN);
    launch(Dim3{blocks, 1, 1}, 256, [&] {
        bl_stream_update_f32(x.data(), comb.data(), post.data(), y.data(), out.data(), n, s, rows);
    });
    return report_case("stream update of " + std::to_string(s) + " streams of " + std::to_string(n) + ", " +
                           std::to_string(rows) + " rows, " + std::to_string(blocks) + " blocks",
                       out, want, 1e-6);
}

static bool stream_mix_el_case(int n, int s, int rows, unsigned blocks) {
    const std::vector<float> x = randoms((size_t)n * s * rows, 2.0f), w = randoms(x.size(), 1.0f);
    std::vector<double> want((size_t)n * rows, 0.0);
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < s; ++j)
            for (int c = 0; c < n; ++c) {
                const size_t at = ((size_t)r * s + j) * n + c;
                want[(size_t)r * n + c] += (double)w[at] * x[at];
            }
    std::vector<float> out(want.size(), NAN);
    launch(Dim3{blocks, 1, 1}, 256, [&] { bl_stream_mix_el_f32(x.data(), w.data(), out.data(), n, s, rows); });
    return report_case("stream mix per element of " + std::to_string(s) + " streams of " + std::to_string(n) +
                           ", " + std::to_string(rows) + " rows, " + std::to_string(blocks) + " blocks",
                       out, want, 1e-6);
}

static bool stream_update_id_case(int n, int s, int rows, unsigned blocks) {
    const std::vector<float> x = randoms((size_t)n * s * rows, 2.0f), y = randoms((size_t)n * rows, 2.0f);
    const std::vector<float> post = randoms((size_t)s * rows, 2.0f);
    std::vector<double> want((size_t)n * s * rows);
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < s; ++i)
            for (int c = 0; c < n; ++c) {
                const size_t at = ((size_t)r * s + i) * n + c;
                want[at] = (double)post[(size_t)r * s + i] * y[(size_t)r * n + c] + x[at];
            }
    std::vector<float> out(want.size(), NAN);
    launch(Dim3{blocks, 1, 1}, 256,
           [&] { bl_stream_update_id_f32(x.data(), post.data(), y.data(), out.data(), n, s, rows); });
    return report_case("stream update by the identity of " + std::to_string(s) + " streams of " + std::to_string(n) +
                           ", " + std::to_string(rows) + " rows, " + std::to_string(blocks) + " blocks",
                       out, want, 1e-6);
}

// Op::GroupDotGate in f64: sigmoid(sign(d) sqrt(max(|d|, floor))), d = scale * sum a*b.
static bool group_gate_case(int n, int groups, unsigned blocks) {
    std::vector<float> a = randoms((size_t)n * groups, 1.0f), b = randoms(a.size(), 1.0f);
    for (int i = 0; i < n; ++i) a[i] = 0.0f;                      // group 0: d = 0, gate 1/2
    for (int i = 0; i < n; ++i) a[(size_t)n + i] *= 1e-6f;        // group 1: |d| under the floor
    const float scale = 1.0f / std::sqrt((float)n), floor_ = 1e-6f;
    std::vector<double> want(groups);
    for (int g = 0; g < groups; ++g) {
        double d = 0.0;
        for (int i = 0; i < n; ++i) d += (double)a[(size_t)g * n + i] * b[(size_t)g * n + i];
        d *= scale;
        const double m = d == 0.0 ? 0.0 : std::copysign(std::sqrt(std::max(std::fabs(d), (double)floor_)), d);
        want[g] = 1.0 / (1.0 + std::exp(-m));
    }
    std::vector<float> out(groups, NAN);
    launch(Dim3{blocks, 1, 1}, 128,
           [&] { bl_group_dot_gate_f32(a.data(), b.data(), out.data(), n, groups, scale, floor_); });
    const bool half = out[0] == 0.5f;
    if (!half) std::printf("FAIL group gate: a zero group gives %.9g, not 0.5\n", out[0]);
    return half && report_case("group gate of " + std::to_string(groups) + " groups of " + std::to_string(n) + ", " +
                                   std::to_string(blocks) + " blocks",
                               out, want, 1e-6);
}

// Op::EngramGate in f64: out = h + g * value, g = sigmoid(sign(d) sqrt(max(|d|, floor))),
// d = sum rms(h)_i qn_i kn_i rms(key)_i / sqrt(n), rms(v) = v / sqrt(mean(v^2) + eps).
static bool engram_gate_case(int n, int s, int rows, unsigned blocks) {
    std::vector<float> x = randoms((size_t)n * s * rows, 2.0f), kv = randoms((size_t)n * (s + 1) * rows, 1.0f);
    std::vector<float> qn = randoms((size_t)n * s, 2.0f), kn = randoms(qn.size(), 2.0f);
    for (int i = 0; i < n; ++i) x[(size_t)n + i] = 0.0f;  // row 0, stream 1: d = 0, gate 1/2
    const float eps = 1e-6f, scale = 1.0f / std::sqrt((float)n), floor_ = 1e-6f;
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < s; ++j) {
            const float* h = &x[((size_t)r * s + j) * n];
            const float* key = &kv[((size_t)r * (s + 1) + j) * n];
            const float* value = &kv[((size_t)r * (s + 1) + s) * n];
            double sh = 0.0, sk = 0.0;
            for (int i = 0; i < n; ++i) sh += (double)h[i] * h[i], sk += (double)key[i] * key[i];
            const double ih = 1.0 / std::sqrt(sh / n + eps), ik = 1.0 / std::sqrt(sk / n + eps);
            double d = 0.0;
            for (int i = 0; i < n; ++i)
                d += h[i] * ih * qn[(size_t)j * n + i] * kn[(size_t)j * n + i] * key[i] * ik;
            d *= scale;
            const double m = d == 0.0 ? 0.0 : std::copysign(std::sqrt(std::max(std::fabs(d), (double)floor_)), d);
            const double g = 1.0 / (1.0 + std::exp(-m));
            for (int i = 0; i < n; ++i) want[((size_t)r * s + j) * n + i] = h[i] + g * value[i];
        }
    std::vector<float> out(x.size(), NAN);
    launch(Dim3{blocks, 1, 1}, 128, [&] {
        bl_engram_gate_f32(x.data(), kv.data(), qn.data(), kn.data(), out.data(), n, s, rows, eps, scale, floor_);
    });
    // The zero stream adds half the value exactly.
    const float* v0 = &kv[(size_t)s * n];
    bool half = true;
    for (int i = 0; i < n; ++i) half &= out[(size_t)n + i] == 0.5f * v0[i];
    if (!half) std::printf("FAIL engram gate: a zero stream does not add half the value\n");
    return half && report_case("engram gate of " + std::to_string(s) + " streams of " + std::to_string(n) + ", " +
                                   std::to_string(rows) + " rows, " + std::to_string(blocks) + " blocks",
                               out, want, 1e-6);
}

int main() {
    g_block_shuffle = 5;
    bool ok = true;
    ok &= sinkhorn_case(4, 37, 20, 4.0f, true);
    ok &= sinkhorn_case(4, 9, 3, 4.0f, false);
    ok &= sinkhorn_case(4, 9, 1, 8.0f, false);
    ok &= sinkhorn_case(3, 5, 20, 4.0f, false);
    ok &= sinkhorn_case(5, 5, 7, 4.0f, false);
    ok &= sinkhorn_case(8, 4, 20, 4.0f, true);
    ok &= stream_mix_case(4096, 4, 3, 24);
    ok &= stream_mix_case(100, 3, 7, 2);
    ok &= stream_update_case(4096, 4, 3, 24);
    ok &= stream_update_case(100, 3, 7, 2);
    ok &= stream_mix_el_case(2560, 4, 3, 24);
    ok &= stream_mix_el_case(100, 3, 7, 2);
    ok &= stream_update_id_case(2560, 4, 3, 24);
    ok &= stream_update_id_case(100, 3, 7, 2);
    ok &= group_gate_case(2560, 12, 5);
    ok &= group_gate_case(37, 9, 9);
    ok &= engram_gate_case(5120, 4, 3, 5);
    ok &= engram_gate_case(37, 3, 4, 16);
    std::printf(ok ? "all hyper-connection cases passed\n" : "FAILED\n");
    return ok ? 0 : 1;
}
