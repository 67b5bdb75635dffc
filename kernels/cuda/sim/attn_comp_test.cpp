// Checks DeepSeek-V4's two-source attention (cu/attn_comp.cuh: bl_attn_comp_list, then
// bl_attention_comp_<f32|f16> and, with split runs, bl_attn_sel_merge) on the CPU (sim.h):
// 1. against transformers 5.24 (kernels/cpu's fixture tests/fixtures/deepseek4/ops_hf.json, which
//    tests/sim.rs writes into the file named by argv[1]): both layer kinds (the ratio-4 layer's
//    rows restricted to the indexer's picks, the ratio-128 layer's every visible row), the kept
//    rows in one call over a cache holding every position (one run and 3 merged runs) and each row
//    alone over a ring of `window` rows holding only its window; within 1e-5 of the largest
//    output magnitude. The file holds per case (int32) 1, n_head, head_dim, window, rows, n_comp,
//    n_kept, top_k, selected, (f32) scale, q, kv, compressed, sinks, out, (int32) kept and, when
//    selected, the lists.
// 2. against an f64 attention written here from the definition (AttentionParams::comp in
//    plugin-api/src/op.rs): a row at position p sees its window of the ring (or, with a selection,
//    its listed positions) and the compressed rows j < (p + 1) / ratio (with a list, only the listed
//    ones: negative, not yet visible and repeated entries skipped), all in one softmax with the
//    head's sink; values the first dv dims of each key row. f32 and f16 rings, decode and prompt
//    rows of two slots, all 64 heads of 512, lists of 512 at depth 8,191, rows before the first
//    compressed row is complete, GQA with softcap, a ring selection beside the compressed rows, and
//    bad rows (more visible rows than the cache holds: error 12; a bad slot: error 2; left
//    unwritten). One run a row and split runs merged.
// Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

// The kernels' dynamic shared memory: one buffer, as blocks run one after another.
inline std::vector<double> g_dynamic_smem(1 << 16);
#define SEL_DYNAMIC_SMEM(name) uint8_t* name = reinterpret_cast<uint8_t*>(g_dynamic_smem.data())

#include "../cu/common.cuh"
#include "../cu/attn_split.cuh"
#include "../cu/attn_select.cuh"
#include "../cu/attn_comp.cuh"

static std::mt19937 rng(11);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

// One call's inputs (the ring of element type T).
template <typename T>
struct Call {
    int n_head, n_kv, dk, dv, len, n_slots, window, ratio, comp_len;
    float scale, softcap;
    std::vector<T> ring;
    std::vector<float> comp, q, sinks;  // sinks empty: none
    std::vector<int> slots, pos;
    int n_ids = 0;  // 0: every visible compressed row
    std::vector<int> ids;
    int n_sel = 0;  // 0: the ring's window (or everything up to the row)
    std::vector<int> sel;
};

// Runs the launches of one call in S runs a row; returns the error word.
template <typename T>
static int run_kernels(const Call<T>& c, int S, std::vector<float>& out, std::vector<uint8_t>& oq) {
    const int rows = (int)c.pos.size(), nh = c.n_head;
    std::vector<int> list((size_t)rows * std::max(c.n_sel, 1), -7), count(rows, -7);
    std::vector<int> clist((size_t)rows * std::max(c.n_ids, 1), -7), ccount(rows, -7);
    std::vector<float> part((size_t)S * rows * nh * (c.dv + 2), NAN);
    const float* sk = c.sinks.empty() ? nullptr : c.sinks.data();
    const int* lp = c.n_sel ? list.data() : nullptr;
    const int* cp = c.n_sel ? count.data() : nullptr;
    const int* clp = c.n_ids ? clist.data() : nullptr;
    uint8_t* oqp = oq.empty() ? nullptr : oq.data();
    int err = 0;
    for (auto& v : g_dynamic_smem) v = NAN;
    if (c.n_sel)
        launch(Dim3{(unsigned)rows, 1, 1}, SEL_THREADS, [&] {
            bl_attn_sel_list(c.slots.data(), c.pos.data(), c.sel.data(), c.n_sel, c.len, c.n_slots, c.window,
                             list.data(), count.data(), &err);
        });
    launch(Dim3{(unsigned)rows, 1, 1}, SEL_THREADS, [&] {
        bl_attn_comp_list(c.slots.data(), c.pos.data(), c.n_ids ? c.ids.data() : nullptr, c.n_ids, c.ratio,
                          c.comp_len, c.n_slots, clist.data(), ccount.data(), &err);
    });
    const int g = nh / c.n_kv, chunks = c.n_kv * ((g + SEL_HEADS - 1) / SEL_HEADS);
    launch(Dim3{(unsigned)S, (unsigned)chunks, (unsigned)rows}, SEL_THREADS, [&] {
        if constexpr (sizeof(T) == 2)
            bl_attention_comp_f16(c.q.data(), c.ring.data(), c.slots.data(), c.pos.data(), lp, cp, c.n_sel,
                                  c.comp.data(), clp, ccount.data(), c.n_ids, c.comp_len, out.data(), oqp, part.data(),
                                  nh, c.n_kv, c.dk, c.dv, c.len, c.n_slots, c.scale, c.softcap, c.window, sk, &err);
        else
            bl_attention_comp_f32(c.q.data(), c.ring.data(), c.slots.data(), c.pos.data(), lp, cp, c.n_sel,
                                  c.comp.data(), clp, ccount.data(), c.n_ids, c.comp_len, out.data(), oqp, part.data(),
                                  nh, c.n_kv, c.dk, c.dv, c.len, c.n_slots, c.scale, c.softcap, c.window, sk, &err);
    });
    if (S > 1)
        launch(Dim3{(unsigned)(rows * nh), 1, 1}, SEL_THREADS, [&] {
            bl_attn_sel_merge(part.data(), S, c.slots.data(), c.pos.data(), cp, nh, c.dv, c.len, c.n_slots, c.window,
                              sk, ccount.data(), out.data(), oqp);
        });
    return err;
}

// ---- 1. the transformers fixture ----------------------------------------------------------------

static FILE* f;
template <typename T>
static std::vector<T> take(size_t n) {
    std::vector<T> v(n);
    if (std::fread(v.data(), sizeof(T), n, f) != n) {
        std::fprintf(stderr, "truncated cases file\n");
        std::exit(2);
    }
    return v;
}

// max |got - want| / max |want| (infinite for a value that is not finite).
static double rel_error(const float* got, const float* want, size_t n) {
    double scale = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; ++i) scale = std::fmax(scale, std::fabs(want[i]));
    for (size_t i = 0; i < n; ++i) {
        const double e = std::isfinite(got[i]) ? std::fabs((double)got[i] - want[i]) : INFINITY;
        worst = std::fmax(worst, e);
    }
    return worst / std::fmax(scale, 1e-30);
}

static bool fixture_case() {
    const auto h = take<int>(8);
    const int nh = h[0], d = h[1], window = h[2], rows = h[3], n_comp = h[4], n = h[5], top_k = h[6];
    const bool selected = h[7];
    const float scale = take<float>(1)[0];
    const auto q = take<float>((size_t)n * nh * d), kv = take<float>((size_t)rows * d);
    const auto compressed = take<float>((size_t)n_comp * d), sinks = take<float>(nh);
    const auto want = take<float>((size_t)n * nh * d);
    const auto kept = take<int>(n);
    const auto lists = selected ? take<int>((size_t)n * top_k) : std::vector<int>();
    // The sequence in slot 1 of two; slot 0 and unwritten ring rows NaN, slot 0's compressed rows 7.
    const auto call = [&](int len, int lo, int hi, int r0, int r1) {
        Call<float> c{nh, 1, d, d, len, 2, window, selected ? 4 : 128, n_comp, scale, 0.0f};
        c.ring.assign((size_t)2 * len * d, NAN);
        for (int t = lo; t <= hi; ++t) std::memcpy(&c.ring[((size_t)len + t % len) * d], &kv[(size_t)t * d], d * 4);
        c.comp.assign((size_t)n_comp * d, 7.0f);
        c.comp.insert(c.comp.end(), compressed.begin(), compressed.end());
        c.q.assign(q.begin() + (size_t)r0 * nh * d, q.begin() + (size_t)r1 * nh * d);
        c.sinks = sinks;
        c.slots.assign(r1 - r0, 1);
        c.pos.assign(kept.begin() + r0, kept.begin() + r1);
        if (selected) {
            c.n_ids = top_k;
            c.ids.assign(lists.begin() + (size_t)r0 * top_k, lists.begin() + (size_t)r1 * top_k);
        }
        return c;
    };
    bool ok = true;
    const auto check = [&](const Call<float>& c, int S, const float* w, const std::string& what) {
        std::vector<float> out(c.q.size(), NAN);
        std::vector<uint8_t> oq;
        const int err = run_kernels(c, S, out, oq);
        const double e = rel_error(out.data(), w, out.size());
        const bool good = err == 0 && e <= 1e-5;
        std::printf("%s %s %s: rel error %.2e\n", good ? "ok  " : "FAIL", selected ? "ratio 4 (picked rows)" : "ratio 128",
                    what.c_str(), e);
        ok = ok && good;
    };
    for (int S : {1, 3}) check(call(rows, 0, rows - 1, 0, n), S, want.data(), "all kept rows, " + std::to_string(S) + " runs");
    double worst = 0.0;
    for (int i = 0; i < n; ++i) {
        const int p = kept[i];
        const auto c = call(window, std::max(0, p + 1 - window), p, i, i + 1);
        std::vector<float> out(c.q.size(), NAN);
        std::vector<uint8_t> oq;
        const int err = run_kernels(c, 1, out, oq);
        const double e = err ? INFINITY : rel_error(out.data(), want.data() + (size_t)i * nh * d, out.size());
        worst = std::fmax(worst, e);
    }
    const bool good = worst <= 1e-5;
    std::printf("%s %s each row over a ring of %d: rel error %.2e\n", good ? "ok  " : "FAIL",
                selected ? "ratio 4 (picked rows)" : "ratio 128", window, worst);
    return ok && good;
}

// ---- 2. the f64 reference -----------------------------------------------------------------------

struct Case {
    const char* name;
    int n_head, n_kv, dk, dv, len, n_slots, window, ratio, comp_len;
    bool sinks;
    float softcap;
    std::vector<int> slots, pos;
    int n_ids;             // 0: every visible compressed row; else lists drawn at random
    int n_sel;             // 0: no ring selection; else lists drawn at random
    std::vector<int> bad;  // per row: 0, or the error the kernels must report
    std::vector<int> runs;
};

static double value(float v) { return v; }
static double value(__half v) { return __half2float(v); }

template <typename T>
static Call<T> draw(const Case& k) {
    const int rows = (int)k.pos.size();
    Call<T> c{k.n_head, k.n_kv, k.dk, k.dv, k.len, k.n_slots, k.window, k.ratio, k.comp_len,
              1.0f / std::sqrt((float)k.dk), k.softcap};
    const size_t kw = (size_t)k.dk * k.n_kv;
    c.ring.resize(kw * k.len * k.n_slots);
    for (auto& v : c.ring) v = from_f32<T>(uniform(-1.0f, 1.0f));
    c.comp.resize(kw * k.comp_len * k.n_slots);
    for (auto& v : c.comp) v = uniform(-1.0f, 1.0f);
    c.q.resize((size_t)rows * k.n_head * k.dk);
    for (auto& v : c.q) v = uniform(-1.0f, 1.0f);
    if (k.sinks) {
        c.sinks.resize(k.n_head);
        for (auto& v : c.sinks) v = uniform(-2.0f, 2.0f);
    }
    c.slots = k.slots;
    c.pos = k.pos;
    c.n_ids = k.n_ids;
    c.n_sel = k.n_sel;
    for (int r = 0; r < rows; ++r) {
        const int p = std::max(k.pos[r], 0), visible = (p + 1) / k.ratio;
        for (int i = 0; i < k.n_ids; ++i) {
            // Mostly visible rows, some unused, some not yet visible, some repeated.
            const int u = (int)uniform(0.0f, 100.0f);
            c.ids.push_back(u < 10 ? -1 : u < 15 ? visible + u : u < 22 && i > 0 ? c.ids.back()
                                                                         : (int)uniform(0.0f, (float)visible));
        }
        for (int i = 0; i < k.n_sel; ++i) {
            const int u = (int)uniform(0.0f, 100.0f);
            const int lo = std::max(0, p - k.len + 1);
            c.sel.push_back(u < 10 ? -1 : u < 15 ? p + 1 + u : (int)uniform((float)lo, (float)p + 1));
        }
    }
    return c;
}

template <typename T>
static bool run(const Case& k, int S) {
    rng.seed(std::hash<std::string>{}(k.name));
    const Call<T> c = draw<T>(k);
    const int rows = (int)k.pos.size(), nh = k.n_head, dk = k.dk, dv = k.dv;
    std::vector<float> out((size_t)rows * nh * dv, NAN);
    std::vector<uint8_t> oq(dv % 32 == 0 ? out.size() / 32 * 36 : 0, 0xAB);
    const int err = run_kernels(c, S, out, oq);
    int want_err = 0;
    for (int b : k.bad) want_err = want_err ? want_err : b;
    bool ok = err == want_err;
    if (!ok) std::printf("FAIL %s: error %d, expected %d\n", k.name, err, want_err);
    const size_t kw = (size_t)dk * k.n_kv;
    double worst = 0.0, qworst = 0.0;
    for (int r = 0; r < rows; ++r) {
        const float* o = out.data() + (size_t)r * nh * dv;
        if (k.bad[r]) {
            for (int i = 0; i < nh * dv; ++i)
                if (!std::isnan(o[i])) {
                    std::printf("FAIL %s: bad row %d written\n", k.name, r);
                    return false;
                }
            continue;
        }
        const int s = k.slots[r], p = k.pos[r], visible = (p + 1) / k.ratio;
        // The ring positions and compressed rows the row sees, each decided on its own.
        std::vector<const T*> ring_rows;
        for (int t = 0; t <= p; ++t) {
            bool seen = k.window > 0 ? t > p - k.window : k.n_sel == 0;
            for (int i = 0; i < k.n_sel; ++i) seen = seen || c.sel[(size_t)r * k.n_sel + i] == t;
            if (seen) ring_rows.push_back(c.ring.data() + ((size_t)s * k.len + t % k.len) * kw);
        }
        std::set<int> comp_rows;
        for (int j = 0; j < visible; ++j) {
            bool seen = k.n_ids == 0;
            for (int i = 0; i < k.n_ids; ++i) seen = seen || c.ids[(size_t)r * k.n_ids + i] == j;
            if (seen) comp_rows.insert(j);
        }
        for (int h = 0; h < nh; ++h) {
            const int kvh = h / (nh / k.n_kv);
            const float* qh = c.q.data() + ((size_t)r * nh + h) * dk;
            std::vector<double> sc;
            std::vector<std::vector<double>> keys;
            for (const T* row : ring_rows) {
                std::vector<double> key(dk);
                for (int i = 0; i < dk; ++i) key[i] = value(row[kvh * dk + i]);
                keys.push_back(key);
            }
            for (int j : comp_rows) {
                const float* row = c.comp.data() + ((size_t)s * k.comp_len + j) * kw + kvh * dk;
                keys.emplace_back(row, row + dk);
            }
            for (const auto& key : keys) {
                double d = 0.0;
                for (int i = 0; i < dk; ++i) d += (double)qh[i] * key[i];
                d *= c.scale;
                if (k.softcap > 0.0f) d = k.softcap * std::tanh(d / k.softcap);
                sc.push_back(d);
            }
            double m = k.sinks ? c.sinks[h] : -INFINITY;
            for (double v : sc) m = std::max(m, v);
            double l = k.sinks ? std::exp(c.sinks[h] - m) : 0.0;
            for (double& v : sc) l += v = std::exp(v - m);
            std::vector<double> ref(dv, 0.0);
            double amax = 0.0, e = 0.0;
            for (int i = 0; i < dv; ++i) {
                for (size_t j = 0; j < sc.size(); ++j) ref[i] += sc[j] / l * keys[j][i];
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
    std::printf("%s %s, %s ring, %d runs: rel error %.2e, Q8_1 copy within %.2f steps\n", good ? "ok  " : "FAIL",
                k.name, sizeof(T) == 2 ? "f16" : "f32", S, worst, qworst);
    return good;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: attn_comp_test FIXTURE_CASES\n");
        return 2;
    }
    f = std::fopen(argv[1], "rb");
    if (!f) {
        std::perror(argv[1]);
        return 2;
    }
    bool ok = true;
    int kind;
    while (std::fread(&kind, 4, 1, f) == 1) ok = fixture_case() && ok;
    const std::vector<Case> cases = {
        // V4's shapes: 64 heads of 512 over one latent row, window 128 over a ring of 128, sinks.
        {"ratio 128, 64/1 heads d 512, decode in two slots", 64, 1, 512, 512, 128, 2, 128, 128, 9, true, 0.0f,
         {1, 0}, {1000, 300}, 0, 0, {0, 0}, {1, 5}},
        {"ratio 4, top 16 lists, 8/1 heads d 512, 6 prompt rows of two slots", 8, 1, 512, 512, 128, 2, 128, 4, 80,
         true, 0.0f, {0, 0, 0, 1, 1, 1}, {250, 251, 252, 40, 41, 42}, 16, 0, {0, 0, 0, 0, 0, 0}, {1, 3}},
        {"ratio 4, top 512 of 2,048, 8/1 heads d 512, decode at 8191", 8, 1, 512, 512, 128, 1, 128, 4, 2048, true,
         0.0f, {0}, {8191}, 512, 0, {0}, {1, 7}},
        // A prompt from 0: no compressed row is complete before position 127 (ratio 128), 3 (ratio 4).
        {"ratio 128, prompt rows 0..130, none visible before 127", 4, 1, 64, 64, 256, 1, 128, 128, 2, true, 0.0f,
         {0, 0, 0, 0, 0, 0}, {0, 5, 126, 127, 128, 130}, 0, 0, {0, 0, 0, 0, 0, 0}, {1, 3}},
        {"ratio 4 lists at the first rows", 4, 1, 64, 64, 64, 1, 0, 4, 4, true, 0.0f, {0, 0, 0, 0}, {0, 2, 3, 9}, 4,
         0, {0, 0, 0, 0}, {1}},
        // Beyond V4: GQA with values narrower than the keys, softcap, no sinks, a full-causal ring.
        {"dk 96 dv 64, gqa 4/2, softcap, every visible row", 4, 2, 96, 64, 50, 2, 0, 4, 12, false, 0.8f, {1, 0},
         {47, 20}, 0, 0, {0, 0}, {1, 3}},
        // A ring selection beside the compressed rows' lists.
        {"ring selection 10 + window 4 beside lists of 6", 4, 1, 64, 64, 60, 2, 4, 4, 15, false, 0.0f, {1, 0},
         {59, 30}, 6, 10, {0, 0}, {1, 3}},
        // Bad rows: more visible rows than the cache holds, a bad slot.
        {"more visible compressed rows than the cache holds (error 12)", 2, 1, 64, 64, 128, 1, 128, 128, 4, true, 0.0f,
         {0, 0}, {600, 700}, 0, 0, {0, 12}, {1, 3}},
        {"bad slot (error 2)", 2, 1, 64, 64, 128, 1, 128, 4, 40, true, 0.0f, {0, 3}, {60, 61}, 8, 0, {0, 2}, {1, 3}},
    };
    for (const Case& k : cases)
        for (const int S : k.runs) {
            ok = run<float>(k, S) && ok;
            ok = run<__half>(k, S) && ok;
        }
    std::printf(ok ? "all two-source attention cases passed\n" : "two-source attention cases FAILED\n");
    return ok ? 0 : 1;
}
