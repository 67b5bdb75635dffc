// Checks attention's selection form (cu/attn_select.cuh: the list kernel bl_attn_sel_list, the
// shared-read kernels bl_attention_sel_<f32|f16> and the merge bl_attn_sel_merge) on the CPU
// (sim.h) against an f64 reference written here from the definition (AttentionParams in
// plugin-api/src/op.rs): for each row and head, the scores scale * q.k over the positions the row
// sees (each decided on its own: listed and not after the row, or inside its window; without a
// selection, its window or everything up to it), softcapped, a softmax that counts the head's
// sink, and the weighted sum of the values (the key head's first dv values with v_from_k). Every
// case runs in one run per row (S = 1, the output written by the attention blocks) and in split
// runs of uneven length merged (S = 3, 5 or 7; and 64, the most, which leaves runs empty, where
// the emulation's time allows).
// Cases: GLM-5.3's latent rows (dk = dv = 512, one KV head, values from the keys, 64 heads: four
// chunks of 16) dense and sparse at several depths, lists with unused, repeated and later
// entries, with and without a window, a list of 2,100 entries (top 2,048 and a tail), a wide head
// over a ring cache, separate V caches with GQA (a group of 24: chunks of 16 and 8), dims that
// are no multiple of 8, sinks and softcap, and bad rows (error codes, output left unwritten). The
// output's Q8_1 copy is checked to dequantize to the output (within 0.6 of a step). Prints one
// line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// The kernel's dynamic shared memory: one buffer, as blocks run one after another.
inline std::vector<double> g_dynamic_smem(1 << 16);
#define SEL_DYNAMIC_SMEM(name) uint8_t* name = reinterpret_cast<uint8_t*>(g_dynamic_smem.data())

#include "../cu/common.cuh"
#include "../cu/attn_split.cuh"
#include "../cu/attn_select.cuh"

static std::mt19937 rng(7);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

struct Case {
    const char* name;
    bool f16;
    int n_head, n_kv, dk, dv, len, n_slots, window;
    bool v_from_k, sinks;
    float softcap;
    std::vector<int> slots, pos;
    int n_sel;                // 0: no selection
    std::vector<int> sel;     // [n_sel, rows]; empty with n_sel > 0: drawn at random
    std::vector<int> bad;     // per row: 0, or the error the kernel must report
    std::vector<int> runs = {1, 3, 7, 64};  // the runs S each row is cut into, one launch each
};

// Row r sees position t.
static bool sees(const Case& c, int r, int t) {
    const int p = c.pos[r];
    if (t > p) return false;
    const bool in_window = c.window > 0 ? t > p - c.window : c.n_sel == 0;
    if (in_window) return true;
    for (int i = 0; i < c.n_sel; ++i)
        if (c.sel[(size_t)r * c.n_sel + i] == t) return true;
    return false;
}

template <typename T>
static double at(const std::vector<T>& v, size_t i) {
    if constexpr (sizeof(T) == 2)
        return __half2float(v[i]);
    else
        return v[i];
}

template <typename T>
static bool run(Case c, int S) {
    const int rows = (int)c.pos.size(), nh = c.n_head, dk = c.dk, dv = c.dv;
    const float scale = 1.0f / 16.0f;
    if (c.n_sel > 0 && c.sel.empty())
        for (int r = 0; r < rows; ++r)
            for (int i = 0; i < c.n_sel; ++i) {
                // Mostly positions up to the row's, some later, some unused, some repeated.
                const int u = (int)(uniform(0.0f, 1.0f) * 100);
                const int p = c.pos[r];
                c.sel.push_back(u < 10 ? -1 : u < 15 ? p + 1 + u : u < 20 && i > 0 ? c.sel.back()
                                                                                  : (int)uniform(0.0f, (float)p + 1));
            }
    const size_t kw = (size_t)dk * c.n_kv, vw = (size_t)dv * c.n_kv, cache_rows = (size_t)c.len * c.n_slots;
    std::vector<T> kc(kw * cache_rows), vc(c.v_from_k ? 0 : vw * cache_rows);
    for (auto& v : kc) v = from_f32<T>(uniform(-1.0f, 1.0f));
    for (auto& v : vc) v = from_f32<T>(uniform(-1.0f, 1.0f));
    std::vector<float> q((size_t)rows * nh * dk), sinks(nh), out((size_t)rows * nh * dv, NAN);
    for (auto& v : q) v = uniform(-1.0f, 1.0f);
    for (auto& v : sinks) v = uniform(-2.0f, 2.0f);
    std::vector<uint8_t> oq(dv % 32 == 0 ? out.size() / 32 * 36 : 0, 0xAB);
    int err = 0;
    const T* vp = c.v_from_k ? kc.data() : vc.data();
    // Scratch: each row's list and count, and the split runs' partials (o, then maximum and sum).
    std::vector<int> list((size_t)rows * std::max(c.n_sel, 1), -7), count(rows, -7);
    std::vector<float> part((size_t)S * rows * nh * (dv + 2), NAN);
    const int* sp = c.n_sel ? c.sel.data() : nullptr;
    const int* lp = c.n_sel ? list.data() : nullptr;
    const int* cp = c.n_sel ? count.data() : nullptr;
    const float* sk = c.sinks ? sinks.data() : nullptr;
    uint8_t* oqp = oq.empty() ? nullptr : oq.data();
    for (auto& v : g_dynamic_smem) v = NAN;
    if (c.n_sel) {
        launch(Dim3{(unsigned)rows, 1, 1}, SEL_THREADS, [&] {
            bl_attn_sel_list(c.slots.data(), c.pos.data(), sp, c.n_sel, c.len, c.n_slots, c.window, list.data(),
                             count.data(), &err);
        });
    }
    const int g = nh / c.n_kv, chunks = c.n_kv * ((g + SEL_HEADS - 1) / SEL_HEADS);
    launch(Dim3{(unsigned)S, (unsigned)chunks, (unsigned)rows}, SEL_THREADS, [&] {
        if constexpr (sizeof(T) == 2)
            bl_attention_sel_f16(q.data(), kc.data(), vp, c.slots.data(), c.pos.data(), lp, cp, c.n_sel, out.data(),
                                 oqp, part.data(), nh, c.n_kv, dk, dv, c.len, c.n_slots, scale, c.softcap, c.window,
                                 sk, c.v_from_k, &err);
        else
            bl_attention_sel_f32(q.data(), kc.data(), vp, c.slots.data(), c.pos.data(), lp, cp, c.n_sel, out.data(),
                                 oqp, part.data(), nh, c.n_kv, dk, dv, c.len, c.n_slots, scale, c.softcap, c.window,
                                 sk, c.v_from_k, &err);
    });
    if (S > 1)
        launch(Dim3{(unsigned)(rows * nh), 1, 1}, SEL_THREADS, [&] {
            bl_attn_sel_merge(part.data(), S, c.slots.data(), c.pos.data(), cp, nh, dv, c.len, c.n_slots, c.window,
                              sk, nullptr, out.data(), oqp);
        });
    int want_err = 0;
    for (int b : c.bad) want_err = want_err ? want_err : b;
    bool ok = err == want_err;
    if (!ok) std::printf("FAIL %s: error %d, expected %d\n", c.name, err, want_err);
    double worst = 0.0, qworst = 0.0;
    for (int r = 0; r < rows; ++r) {
        const float* o = out.data() + (size_t)r * nh * dv;
        if (c.bad[r]) {
            for (int i = 0; i < nh * dv; ++i)
                if (!std::isnan(o[i])) {
                    std::printf("FAIL %s: bad row %d written\n", c.name, r);
                    return false;
                }
            continue;
        }
        const int s = c.slots[r], p = c.pos[r];
        for (int h = 0; h < nh; ++h) {
            const int kvh = h / (nh / c.n_kv);
            std::vector<double> sc;
            std::vector<size_t> vrow;
            for (int t = 0; t <= p; ++t) {
                if (!sees(c, r, t)) continue;
                const size_t row = (size_t)s * c.len + t % c.len;
                double d = 0.0;
                for (int i = 0; i < dk; ++i) d += (double)q[((size_t)r * nh + h) * dk + i] * at(kc, row * kw + kvh * dk + i);
                d *= scale;
                if (c.softcap > 0.0f) d = c.softcap * std::tanh(d / c.softcap);
                sc.push_back(d);
                vrow.push_back(c.v_from_k ? row * kw + kvh * dk : row * vw + kvh * dv);
            }
            double m = c.sinks ? sinks[h] : -INFINITY;
            for (double v : sc) m = std::max(m, v);
            double l = c.sinks ? std::exp(sinks[h] - m) : 0.0;
            for (double& v : sc) l += v = std::exp(v - m);
            double amax = 0.0, e = 0.0;
            std::vector<double> ref(dv, 0.0);
            for (int i = 0; i < dv; ++i) {
                for (size_t j = 0; j < sc.size(); ++j)
                    ref[i] += sc[j] / l * (c.v_from_k ? at(kc, vrow[j] + i) : at(vc, vrow[j] + i));
                amax = std::max(amax, std::fabs(ref[i]));
            }
            for (int i = 0; i < dv; ++i) {
                const double diff = std::fabs(o[h * dv + i] - ref[i]);
                e = std::isnan(diff) ? INFINITY : std::max(e, diff);
            }
            worst = std::max(worst, e / std::max(amax, 1e-30));
        }
        if (!oq.empty())
            for (int b = 0; b < nh * dv / 32; ++b) {
                const uint8_t* blk = oq.data() + ((size_t)r * nh * dv / 32 + b) * 36;
                __half dh;
                std::memcpy(&dh, blk, 2);
                const double step = __half2float(dh);
                for (int i = 0; i < 32; ++i) {
                    const double diff = std::fabs(step * (int8_t)blk[4 + i] - o[b * 32 + i]) / std::max(step, 1e-30);
                    qworst = std::isnan(diff) ? INFINITY : std::max(qworst, diff);
                }
            }
    }
    const bool good = ok && worst <= 1e-5 && qworst <= 0.6;
    std::printf("%s %s, %s caches, %d runs: rel error %.2e, Q8_1 copy within %.2f steps\n", good ? "ok  " : "FAIL",
                c.name, sizeof(T) == 2 ? "f16" : "f32", S, worst, qworst);
    return good;
}

int main() {
    const std::vector<Case> cases = {
        // GLM-5.3's dense latent rows: 2 of the 64 heads, a prompt's rows and a decode row.
        {"latent d 512, 2/1 heads, dense", false, 2, 1, 512, 512, 300, 2, 0, true, false, 0.0f, {1, 0, 1}, {299, 0, 37},
         0, {}, {0, 0, 0}},
        // Sparse latent rows: a list of 40 with unused, later and repeated entries; then a window.
        {"latent d 512, sparse 40", false, 4, 1, 512, 512, 300, 2, 0, true, false, 0.0f, {1, 0}, {299, 120}, 40, {},
         {0, 0}},
        {"latent d 512, sparse 40 + window 8", false, 4, 1, 512, 512, 300, 2, 8, true, false, 0.0f, {0, 1}, {250, 3},
         40, {}, {0, 0}},
        // The k-pool indexer's longest list (top 2,048 and a tail of up to 52) over 8,192 positions.
        {"latent d 512, sparse 2100 over 8192", false, 1, 1, 512, 512, 8192, 1, 0, true, false, 0.0f, {0}, {8191},
         2100, {}, {0}},
        // All 64 heads of a latent row (four chunks of 16 sharing each row read): decode at depth 513
        // (dense, as the indexer lists it below its threshold) and sparse decode at 8,192; prompt
        // rows of two slots, dense and sparse.
        {"latent d 512, 64/1 heads, dense decode at 512", false, 64, 1, 512, 512, 600, 1, 0, true, false, 0.0f, {0},
         {512}, 0, {}, {0}, {1, 7}},
        {"latent d 512, 64/1 heads, sparse 300 at 8191", false, 64, 1, 512, 512, 8192, 1, 0, true, false, 0.0f, {0},
         {8191}, 300, {}, {0}, {1, 7}},
        {"latent d 512, 64/1 heads, sparse 48, 6 prompt rows", false, 64, 1, 512, 512, 200, 2, 0, true, false, 0.0f,
         {1, 1, 1, 0, 0, 0}, {150, 151, 152, 60, 61, 62}, 48, {}, {0, 0, 0, 0, 0, 0}, {1, 5}},
        // A group of 24 heads (chunks of 16 and 8) over separate V, dims no multiple of 8, sinks,
        // softcap, a window beside the list.
        {"dk 100 dv 36, separate V, gqa 48/2, sinks, softcap, sparse 20 + window 5", false, 48, 2, 100, 36, 90, 2, 5,
         false, true, 0.5f, {1, 0, 1}, {89, 7, 40}, 20, {}, {0, 0, 0}},
        {"dk 100 dv 36, separate V, gqa 48/2, dense", false, 48, 2, 100, 36, 90, 2, 0, false, false, 0.0f, {1, 0},
         {89, 7}, 0, {}, {0, 0}},
        // A listed row that lists nothing it may see: zeros (no sink).
        {"sparse, nothing visible", false, 2, 1, 64, 64, 16, 1, 0, true, false, 0.0f, {0}, {5}, 3, {-1, 9, -1}, {0}},
        // Values from keys wider than them, GQA, sinks and softcap, sparse and dense.
        {"dk 96 dv 64 from the keys, gqa 6/2, sinks, softcap", false, 6, 2, 96, 64, 64, 1, 0, true, true, 0.8f,
         {0, 0}, {63, 10}, 12, {}, {0, 0}},
        {"dk 64 dv 48, separate V, gqa 4/2, sinks, sparse", false, 4, 2, 64, 48, 50, 2, 0, false, true, 0.0f,
         {1, 0}, {49, 20}, 16, {}, {0, 0}},
        // A wide head (above the other forms' 256) over a ring cache with a window.
        {"d 320, window 90 over a ring of 100", false, 4, 2, 320, 320, 100, 1, 90, false, false, 0.0f, {0}, {250}, 0,
         {}, {0}},
        // Bad rows: a negative entry other than -1, a position the ring no longer holds, a bad slot.
        {"listed -2 (error 2)", false, 2, 1, 64, 64, 16, 1, 0, true, false, 0.0f, {0, 0}, {5, 6}, 2, {3, 4, -2, 0},
         {0, 2}},
        {"listed position overwritten (error 3)", false, 2, 1, 64, 64, 16, 1, 0, true, false, 0.0f, {0}, {40}, 2,
         {39, 3}, {3}},
        {"bad slot (error 2)", false, 2, 1, 64, 64, 16, 1, 0, true, false, 0.0f, {2}, {4}, 1, {0}, {2}},
    };
    bool ok = true;
    for (const Case& c : cases)
        for (const int S : c.runs) {
            ok = run<float>(c, S) && ok;
            ok = run<__half>(c, S) && ok;
        }
    std::printf(ok ? "all selection attention cases passed\n" : "selection attention cases FAILED\n");
    return ok ? 0 : 1;
}
