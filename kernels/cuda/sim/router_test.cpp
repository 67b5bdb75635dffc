// Checks the routing kernels of cu/router.cuh on the CPU (sim.h): bl_router_logits_topk (the
// router's logits and its choice in one kernel, the last block of each row choosing) against the
// two kernels it replaces (bl_matmul_f32_split, then bl_router_topk_weights) bit for bit, and both
// against an f64 reference (logits, the top k, their weights). Each case launches the fused kernel
// twice on fresh inputs, so a row counter left set fails the second. Also bl_gated_add_f32 (a
// sigmoid-gated shared expert's sum) against bl_matmul_f32_split's gate logit and an f64 sum, one
// block per row and several, and in place over its inputs. Also bl_top_k (the k largest of rows as
// long as a vocabulary, as a draft step's choice reads them) against a full stable sort in Rust's
// f32::total_cmp order, ties across the k-th place, infinities, signed zeros and NaNs included, and
// bl_router_weights' softmax over the chosen of more than 512 logits against f64. Prints one line
// per case; exits 1 on a failure.
#include "sim.h"

#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>

#include "../cu/common.cuh"
#include "../cu/router.cuh"

static std::mt19937 rng(11);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

struct Case {
    const char* name;
    int n_expert, k, rows, n_embd, gating;
    bool bias, norm;
    float scale;
};

// The reference choice of one row from its f32 logits: keys (gating score + bias) ranked in f64,
// ties to the lower id; weights as RouterWeights computes them.
static void reference(const std::vector<float>& l, const std::vector<float>& bias, const Case& c, std::vector<int>& ids,
                      std::vector<double>& w) {
    const int n = c.n_expert;
    std::vector<double> score(n), key(n);
    double mx = -INFINITY, sum = 0.0;
    for (float v : l) mx = std::max(mx, (double)v);
    for (float v : l) sum += std::exp((double)v - mx);
    for (int e = 0; e < n; ++e) {
        score[e] = c.gating == 0 ? std::exp((double)l[e] - mx) / sum : 1.0 / (1.0 + std::exp(-(double)l[e]));
        key[e] = score[e] + (c.bias ? bias[e] : 0.0);
    }
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
    ids.assign(order.begin(), order.begin() + c.k);
    w.resize(c.k);
    double s = 0.0;
    for (int j = 0; j < c.k; ++j) s += w[j] = score[ids[j]];
    for (int j = 0; j < c.k; ++j) w[j] = (c.norm ? w[j] / std::max(s, 6.103515625e-5) : w[j]) * c.scale;
}

static bool run_case(const Case& c, std::vector<int>& counters) {
    const int n = c.n_expert, k = c.k, rows = c.rows, d = c.n_embd;
    std::vector<float> wt((size_t)n * d), bias(n);
    for (auto& v : wt) v = uniform(-0.1f, 0.1f);
    for (auto& v : bias) v = uniform(-0.05f, 0.05f);
    const unsigned threads = std::max(SPLIT_THREADS, (n + WARP - 1) / WARP * WARP);
    bool ok = true;
    for (int launch_no = 0; launch_no < 2; ++launch_no) {
        std::vector<float> x((size_t)rows * d);
        for (auto& v : x) v = uniform(-1.0f, 1.0f);
        std::vector<float> logits(n * rows, NAN), w(k * rows, NAN), split(n * rows, NAN), w2(k * rows, NAN);
        std::vector<int> ids(k * rows, -1), ids2(k * rows, -1);
        int err = 0, err2 = 0;
        const uint8_t* wb = (const uint8_t*)wt.data();
        const long long stride = (long long)d * 4;
        const float* b = c.bias ? bias.data() : nullptr;
        launch(Dim3{(unsigned)(n * rows), 1, 1}, threads, [&] {
            bl_router_logits_topk(wb, stride, x.data(), d, logits.data(), b, ids.data(), w.data(), n, k, c.gating,
                                  c.norm, 6.103515625e-5f, c.scale, &err, counters.data());
        });
        launch(Dim3{(unsigned)(n * rows), 1, 1}, SPLIT_THREADS,
               [&] { bl_matmul_f32_split(wb, stride, x.data(), split.data(), d, n, rows); });
        launch(Dim3{(unsigned)rows, 1, 1}, (n + WARP - 1) / WARP * WARP, [&] {
            bl_router_topk_weights(split.data(), b, ids2.data(), w2.data(), n, k, rows, c.gating, c.norm,
                                   6.103515625e-5f, c.scale, &err2);
        });
        const bool same = std::memcmp(logits.data(), split.data(), logits.size() * 4) == 0 && ids == ids2 &&
                          std::memcmp(w.data(), w2.data(), w.size() * 4) == 0;
        double worst_logit = 0.0, worst_w = 0.0;
        bool ids_ok = true;
        for (int r = 0; r < rows; ++r) {
            std::vector<float> row(logits.begin() + r * n, logits.begin() + (r + 1) * n);
            for (int e = 0; e < n; ++e) {
                double ref = 0.0;
                for (int i = 0; i < d; ++i) ref += (double)wt[(size_t)e * d + i] * x[(size_t)r * d + i];
                worst_logit = std::max(worst_logit, std::fabs(row[e] - ref));
            }
            std::vector<int> rid;
            std::vector<double> rw;
            reference(row, bias, c, rid, rw);
            for (int j = 0; j < k; ++j) {
                ids_ok &= ids[r * k + j] == rid[j];
                worst_w = std::max(worst_w, std::fabs(w[r * k + j] - rw[j]));
            }
        }
        const bool zeroed = std::all_of(counters.begin(), counters.end(), [](int v) { return v == 0; });
        const bool pass = same && ids_ok && worst_logit < 1e-5 && worst_w < 1e-6 && err == 0 && zeroed;
        printf("%s %s, launch %d: fused = two kernels %s, ids %s, |logit - f64| %.1e, |weight - f64| %.1e, "
               "counters %s\n",
               pass ? "ok  " : "FAIL", c.name, launch_no + 1, same ? "yes" : "NO", ids_ok ? "as f64" : "DIFFER",
               worst_logit, worst_w, zeroed ? "zero" : "LEFT SET");
        ok &= pass;
    }
    return ok;
}

// bl_gated_add_f32: out = moe + sh * sigmoid(w . x) per row. The gate's logit is bl_matmul_f32_split's
// bit for bit, the sum as the Mul and the Add form it, and against f64; `slices` blocks per row;
// and in place over moe and over sh.
static bool gated_add_case(int k, int rows, int slices) {
    std::vector<float> w(k), x((long)k * rows), sh(x.size()), moe(x.size());
    for (std::vector<float>* v : {&w, &x, &sh, &moe})
        for (float& a : *v) a = uniform(-1, 1);
    std::vector<float> logit(rows, NAN);
    launch(Dim3{(unsigned)rows, 1, 1}, SPLIT_THREADS, [&] {
        bl_matmul_f32_split((const uint8_t*)w.data(), 4L * k, x.data(), logit.data(), k, 1, rows);
    });
    std::vector<float> out(x.size(), NAN);
    launch(Dim3{(unsigned)rows, (unsigned)slices, 1}, 256,
           [&] { bl_gated_add_f32(w.data(), x.data(), sh.data(), moe.data(), out.data(), k); });
    // In place: out is moe's memory and then sh's (one slice, as the launcher allows).
    std::vector<float> over_moe = moe, over_sh = sh;
    launch(Dim3{(unsigned)rows, 1, 1}, 256,
           [&] { bl_gated_add_f32(w.data(), x.data(), sh.data(), over_moe.data(), over_moe.data(), k); });
    launch(Dim3{(unsigned)rows, 1, 1}, 256,
           [&] { bl_gated_add_f32(w.data(), x.data(), over_sh.data(), moe.data(), over_sh.data(), k); });
    double worst = 0;
    bool same = over_moe == out && over_sh == out;
    for (int r = 0; r < rows; ++r) {
        const float s = sigmoid_f(logit[r]);
        for (int i = 0; i < k; ++i) {
            const long at = (long)r * k + i;
            same &= out[at] == moe[at] + sh[at] * s;
        }
        double dot = 0;
        for (int j = 0; j < k; ++j) dot += (double)w[j] * x[(long)r * k + j];
        const double sd = 1 / (1 + std::exp(-dot));
        for (int i = 0; i < k; ++i) {
            const long at = (long)r * k + i;
            worst = std::max(worst, std::fabs(out[at] - (moe[at] + sh[at] * sd)));
        }
    }
    const bool ok = same && worst < 1e-5;
    printf("%s gated add, k %d, %d rows, %d slices: %s the separate kernels, f64 %.2g\n", ok ? "ok  " : "FAIL", k,
           rows, slices, same ? "equals" : "DIFFERS FROM", worst);
    return ok;
}

// Rank classes of Rust's f32::total_cmp: -NaN, numbers (zeros by sign), +NaN.
static bool total_greater(float a, float b) {
    auto cls = [](float v) { return std::isnan(v) ? (std::signbit(v) ? 0 : 2) : 1; };
    if (cls(a) != cls(b)) return cls(a) > cls(b);
    if (cls(a) != 1 || a != b) return cls(a) == 1 && a > b;
    return !std::signbit(a) && std::signbit(b);
}

// bl_top_k over `rows` rows of n against a stable sort of each row; then bl_router_weights with the
// softmax over those chosen (gating 2) against f64.
static bool top_k_case(const char* name, int n, int k, const std::vector<float>& x) {
    const int rows = (int)(x.size() / n);
    std::vector<int> ids(k * rows, -1);
    launch(Dim3{(unsigned)rows, 1, 1}, TOPK_THREADS, [&] { bl_top_k(x.data(), ids.data(), n, k); });
    bool same = true;
    for (int r = 0; r < rows; ++r) {
        std::vector<int> order(n);
        std::iota(order.begin(), order.end(), 0);
        const float* row = x.data() + (size_t)r * n;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return total_greater(row[a], row[b]); });
        for (int j = 0; j < k; ++j) same &= ids[r * k + j] == order[j];
    }
    // Weights of the chosen: finite rows only.
    double worst = 0.0;
    int err = 0;
    bool finite = std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
    if (finite && k <= 32) {
        std::vector<float> w(k * rows, NAN);
        launch(Dim3{(unsigned)rows, 1, 1}, WARP,
               [&] { bl_router_weights(x.data(), ids.data(), w.data(), n, k, rows, 2, 0, 0.0f, 1.0f, &err); });
        for (int r = 0; r < rows; ++r) {
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < k; ++j) mx = std::max(mx, (double)x[(size_t)r * n + ids[r * k + j]]);
            for (int j = 0; j < k; ++j) sum += std::exp((double)x[(size_t)r * n + ids[r * k + j]] - mx);
            for (int j = 0; j < k; ++j) {
                const double ref = std::exp((double)x[(size_t)r * n + ids[r * k + j]] - mx) / sum;
                worst = std::max(worst, std::fabs(w[r * k + j] - ref));
            }
        }
    }
    const bool pass = same && worst < 1e-6 && err == 0;
    printf("%s top %d of %d, %d rows, %s: ids %s a stable sort, softmax over them |w - f64| %.1e\n",
           pass ? "ok  " : "FAIL", k, n, rows, name, same ? "equal" : "DIFFER FROM", worst);
    return pass;
}

static bool top_k_cases() {
    bool ok = true;
    // Few distinct values: ties across the k-th place, in several threads' shares.
    std::vector<float> few(2 * 3000);
    for (auto& v : few) v = std::round(uniform(-4.0f, 4.0f));
    ok &= top_k_case("few distinct values", 3000, 10, few);
    std::vector<float> many(5000);
    for (auto& v : many) v = uniform(-30.0f, 30.0f);
    ok &= top_k_case("many values", 5000, 16, many);
    std::vector<float> equal(700, 0.5f);
    ok &= top_k_case("all equal", 700, 10, equal);
    std::vector<float> odd = {1.0f, -0.0f, 0.0f, INFINITY, -INFINITY, NAN, -NAN, 7.0f, -0.0f, 0.0f, 2.0f, 2.0f};
    ok &= top_k_case("infinities, signed zeros and NaNs", (int)odd.size(), 12, odd);
    // Fewer entries than threads, each kept.
    ok &= top_k_case("a short row", 5, 5, std::vector<float>{1.0f, -2.0f, 3.0f, 3.0f, 0.0f});
    return ok;
}

int main() {
    // Small shapes keep the emulation quick (a fiber per CUDA thread); they still take
    // several rows (a counter each), blocks wider than SPLIT_THREADS and a partial warp.
    const Case cases[] = {
        {"128 experts, top 8, softmax, renormalised, 1 row", 128, 8, 1, 256, 0, false, true, 1.0f},
        {"64 experts, top 8, softmax, renormalised, 3 rows", 64, 8, 3, 128, 0, false, true, 1.0f},
        {"160 experts, top 6, sigmoid + bias, scaled, 1 row", 160, 6, 1, 96, 1, true, true, 2.5f},
        {"60 experts, top 4, softmax, 2 rows (a partial warp)", 60, 4, 2, 64, 0, false, false, 1.0f},
    };
    std::vector<int> counters(256, 0);
    bool ok = true;
    for (const Case& c : cases) ok &= run_case(c, counters);
    ok &= gated_add_case(600, 2, 1);
    ok &= gated_add_case(600, 3, 3);
    ok &= gated_add_case(100, 1, 1);
    ok &= top_k_cases();
    return ok ? 0 : 1;
}
