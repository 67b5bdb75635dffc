// Checks the k-pool indexer's kernels (cu/kpool.cuh) on the CPU (sim.h), first against the f64
// numpy golden (host/tests/fixtures/kpool_select.json, tests/oracle/numpy_kpool.py; tests/sim.rs
// regenerates its inputs and passes them in the file named by argv[1]): each case in one call and
// in calls of 5 rows, lists equal to the golden's outside score ties (1e-6 of its f64 scores),
// the pooled keys the calls write within 1e-6 of its. Then against an f64 reference written here
// from Op::KPoolSelect's doc (plugin-api/src/op.rs): pooled keys (a softmax over the pool's
// positions per dimension) within 1e-6 of f64 (f16 caches: within f16's rounding), and each row's
// list equal to the reference's outside score ties (1e-6): pools by descending score, each
// ascending, -1, the ascending tail, -1. Cases: several slots with interleaved rows, positions
// below and above the dense threshold, kpool 4, top_k 8 and 16, tail on and off, 32 and 8 heads
// of 128; a prompt in calls of 1, 3 and 7 rows equal to one call (pools completed across calls);
// an f16 cache; 600 pools, more than the shared-memory sort holds (the in-place sort of the
// scratch, which this test reaches with 256 keys), 2 heads of 16; equal scores (the lower pools
// first, exactly); a slot or a position outside the cache, each in a call of its own (ERR_KPOOL,
// the row's list all -1, the other row's as ever). Then Qwen3.8-Flash-Next's QSA pooling
// (MeanNormRope: rows [raw key | pooled]) against an f64 reference of Op::KPoolSelect's doc (mean,
// RMS norm times k_norm, NEOX rope at the pool's first position), 4 heads of 128 weighing 1/sqrt(dh),
// budget 16 with the tail, two slots: prompts in calls of 7 and 9 rows per slot (each completing
// several pools; every pooled half NaN until pooled), decode rows past the budget; f32 and f16
// caches. Outputs are poisoned with 7777 and the scratch
// with keys that rank first and name no pool; blocks run in a shuffled order. Prints one line per
// case; exits 1 on a failure.
#include "sim.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

// Rows of more than 256 pools sort in place in the scratch here (4,096 on the card), so that a
// few hundred pools reach that path.
#define KPOOL_SORT_SHARED 256
#include "../cu/common.cuh"
#include "../cu/rope.cuh"
#include "../cu/kpool.cuh"

static std::mt19937 rng(5);
static std::vector<float> randoms(size_t n, float a) {
    std::uniform_real_distribution<float> u(-a, a);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

struct Shape {
    int n_head, dh, kpool, n_top;
    bool tail;
    int len, n_slots;
    int n_sel() const { return kpool * n_top + (tail ? kpool - 1 : 0); }
};

static float to_float(float v) { return v; }
static float to_float(__half v) { return __half2float(v); }

// The f64 pooled key of pool g of a slot: per d, softmax_t(gate[t, d] + ape[d, t]) . key[t, d].
template <typename T>
static std::vector<double> ref_pool(const std::vector<T>& cache, const std::vector<float>& ape, const Shape& s,
                                    int slot, int g) {
    const long long w = 3LL * s.dh;
    std::vector<double> out(s.dh);
    for (int d = 0; d < s.dh; ++d) {
        std::vector<double> l(s.kpool);
        double m = -INFINITY, den = 0.0, num = 0.0;
        for (int t = 0; t < s.kpool; ++t) {
            const long long row = ((long long)slot * s.len + (long long)g * s.kpool + t) * w;
            l[t] = (double)to_float(cache[row + s.dh + d]) + ape[t * s.dh + d];
            m = std::max(m, l[t]);
        }
        for (int t = 0; t < s.kpool; ++t) {
            const long long row = ((long long)slot * s.len + (long long)g * s.kpool + t) * w;
            const double e = std::exp(l[t] - m);
            den += e;
            num += e * to_float(cache[row + d]);
        }
        out[d] = num / den;
    }
    return out;
}

// Runs the three kernels over rows r0..r1 as one call, as ops/kpool.rs launches them.
template <typename T>
static int run_call(const std::vector<float>& q, const std::vector<float>& w, std::vector<T>& cache,
                    const std::vector<float>& ape, const std::vector<int>& slots, const std::vector<int>& pos,
                    const Shape& s, int r0, int r1, std::vector<int>& out, void (*pool_k)(T*, const float*, const int*,
                    const int*, int, int, int, int, int*), void (*scores_k)(const float*, const float*, float, const T*,
                    const int*, const int*, unsigned long long*, int, int, int, int, int, int, long long)) {
    const int rows = r1 - r0, max_pools = s.len / s.kpool;
    long long stride = 1;
    while (stride < max_pools) stride <<= 1;
    // Poisoned scratch: a key read before it is written ranks first and names pool -1.
    std::vector<unsigned long long> keys((size_t)stride * rows, 0xFFFFFFFF00000000ull);
    const float* qc = q.data() + (size_t)r0 * s.n_head * s.dh;
    const float* wc = w.data() + (size_t)r0 * s.n_head;
    const int *sc = slots.data() + r0, *pc = pos.data() + r0;
    int* oc = out.data() + (size_t)r0 * s.n_sel();
    int err = 0;
    launch(Dim3{(unsigned)rows, 1, 1}, 128,
           [&] { pool_k(cache.data(), ape.data(), sc, pc, s.dh, s.kpool, s.len, s.n_slots, &err); });
    const unsigned chunks = (unsigned)((max_pools + KPOOL_BLOCK_POOLS - 1) / KPOOL_BLOCK_POOLS);
    launch(Dim3{std::max(chunks, 1u), (unsigned)rows, 1}, KPOOL_THREADS, [&] {
        scores_k(qc, wc, 0.0f, cache.data(), sc, pc, keys.data(), s.n_head, s.dh, 3, s.kpool, s.len, s.n_slots, stride);
    });
    launch(Dim3{(unsigned)rows, 1, 1}, KPOOL_SELECT_THREADS, [&] {
        bl_kpool_select(keys.data(), sc, pc, oc, s.kpool, s.n_top, s.tail ? 1 : 0, s.n_sel(), s.len, s.n_slots,
                        stride);
    });
    return err;
}

// Rows of each slot from position 0, interleaved slot by slot.
static void interleave(const std::vector<int>& lengths, std::vector<int>& slots, std::vector<int>& pos) {
    int top = 0;
    for (int n : lengths) top = std::max(top, n);
    for (int p = 0; p < top; ++p)
        for (size_t s = 0; s < lengths.size(); ++s)
            if (p < lengths[s]) slots.push_back((int)s), pos.push_back(p);
}

// Each row's list against the f64 scores `score(r, g)` of its complete pools: pools by descending
// score (another pool only where the two score the same to 1e-6), each ascending, -1 up to
// kpool·n_top, then the ascending tail, -1. Counts the bad rows (printing the first) and the tie
// swaps.
template <typename F>
static void check_lists(const std::vector<int>& out, const std::vector<int>& slots, const std::vector<int>& pos,
                        const Shape& s, F score, int& bad_rows, int& ties) {
    for (size_t r = 0; r < slots.size(); ++r) {
        const int p = pos[r], complete = (p + 1) / s.kpool;
        std::vector<double> sc(complete);
        for (int g = 0; g < complete; ++g) sc[g] = score((int)r, g);
        std::vector<int> order(complete);
        for (int g = 0; g < complete; ++g) order[g] = g;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sc[a] > sc[b]; });
        const int kept = std::min(s.n_top, complete);
        const int* o = out.data() + r * s.n_sel();
        bool ok = true;
        for (int j = 0; j < s.n_top; ++j) {
            const int got = o[j * s.kpool] < 0 ? -1 : o[j * s.kpool] / s.kpool;
            const int want = j < kept ? order[j] : -1;
            if (got != want) {
                if (got < 0 || want < 0 || got >= complete ||
                    std::fabs(sc[got] - sc[want]) > 1e-6 * std::max(1.0, std::fabs(sc[want])))
                    ok = false;
                else
                    ++ties;
            }
            for (int t = 0; t < s.kpool; ++t)
                if (o[j * s.kpool + t] != (got < 0 ? -1 : got * s.kpool + t)) ok = false;
        }
        if (s.tail) {
            const int n_tail = (p + 1) % s.kpool;
            for (int t = 0; t < s.kpool - 1; ++t)
                if (o[s.kpool * s.n_top + t] != (t < n_tail ? p + 1 - n_tail + t : -1)) ok = false;
        }
        if (!ok) {
            if (bad_rows == 0) {
                std::printf("  row %zu (slot %d, position %d):", r, slots[r], p);
                for (int j = 0; j < s.n_sel(); ++j) std::printf(" %d", o[j]);
                std::printf("\n");
            }
            ++bad_rows;
        }
    }
}

template <typename T>
static bool kpool_case(const std::string& name, const Shape& s, const std::vector<int>& slots,
                       const std::vector<int>& pos, int chunk,
                       void (*pool_k)(T*, const float*, const int*, const int*, int, int, int, int, int*),
                       void (*scores_k)(const float*, const float*, float, const T*, const int*, const int*,
                                        unsigned long long*, int, int, int, int, int, int, long long)) {
    const int rows = (int)slots.size();
    const std::vector<float> q = randoms((size_t)rows * s.n_head * s.dh, 1.0f), w = randoms((size_t)rows * s.n_head, 1.0f),
                             ape = randoms((size_t)s.dh * s.kpool, 1.0f);
    std::vector<float> c32 = randoms((size_t)3 * s.dh * s.len * s.n_slots, 2.0f);
    std::vector<T> cache(c32.size());
    for (size_t i = 0; i < c32.size(); ++i) cache[i] = from_f32<T>(c32[i]);
    // The pools the call completes start NaN (a read before the write shows); the others hold
    // their pooled keys, as earlier calls left them.
    std::vector<char> completes((size_t)s.n_slots * (s.len / s.kpool), 0);
    for (int r = 0; r < rows; ++r)
        if ((pos[r] + 1) % s.kpool == 0) completes[(size_t)slots[r] * (s.len / s.kpool) + pos[r] / s.kpool] = 1;
    for (int slot = 0; slot < s.n_slots; ++slot)
        for (int g = 0; g < s.len / s.kpool; ++g) {
            const long long at = ((long long)slot * s.len + (long long)g * s.kpool + s.kpool - 1) * 3 * s.dh + 2 * s.dh;
            const bool mine = completes[(size_t)slot * (s.len / s.kpool) + g];
            const std::vector<double> v = mine ? std::vector<double>() : ref_pool(cache, ape, s, slot, g);
            for (int d = 0; d < s.dh; ++d) cache[at + d] = from_f32<T>(mine ? NAN : (float)v[d]);
        }
    const std::vector<T> before = cache;
    std::vector<int> out((size_t)rows * s.n_sel(), 7777);
    int err = 0;
    for (int r0 = 0; r0 < rows; r0 += chunk)
        err |= run_call(q, w, cache, ape, slots, pos, s, r0, std::min(rows, r0 + chunk), out, pool_k, scores_k);
    // Reference: pooled keys from the unpooled rows, scores in f64.
    double worst_pool = 0.0;
    int bad_rows = 0, ties = 0;
    const double pool_tol = sizeof(T) == 2 ? 1e-3 : 1e-6;
    for (int slot = 0; slot < s.n_slots; ++slot) {
        for (int g = 0; g < s.len / s.kpool; ++g) {
            if (!completes[(size_t)slot * (s.len / s.kpool) + g]) continue;
            const std::vector<double> want = ref_pool(before, ape, s, slot, g);
            const long long at = ((long long)slot * s.len + (long long)g * s.kpool + s.kpool - 1) * 3 * s.dh + 2 * s.dh;
            for (int d = 0; d < s.dh; ++d) {
                const double e = std::fabs(to_float(cache[at + d]) - want[d]) / std::max(std::fabs(want[d]), 1e-3);
                if (!(e <= worst_pool)) worst_pool = e;
            }
        }
    }
    auto score = [&](int r, int g) {
        const long long at = ((long long)slots[r] * s.len + (long long)g * s.kpool + s.kpool - 1) * 3 * s.dh + 2 * s.dh;
        double acc = 0.0;
        for (int h = 0; h < s.n_head; ++h) {
            double dot = 0.0;
            for (int d = 0; d < s.dh; ++d) dot += (double)q[((size_t)r * s.n_head + h) * s.dh + d] * to_float(cache[at + d]);
            acc += (double)w[(size_t)r * s.n_head + h] * std::max(dot, 0.0);
        }
        return acc;
    };
    check_lists(out, slots, pos, s, score, bad_rows, ties);
    const bool ok = err == 0 && bad_rows == 0 && worst_pool <= pool_tol;
    std::printf("%s %s (calls of %d rows): %d rows, %d bad, %d tie swaps, pooled keys worst %.2e, error %d\n",
                ok ? "ok  " : "FAIL", name.c_str(), chunk, rows, bad_rows, ties, worst_pool, err);
    return ok;
}

// ---- QSA (MeanNormRope) ----

// The rope of the QSA cases: NEOX pairs (i, i + n_dims/2) over the first n_dims dims, theta =
// position · base^(-2i / n_dims), no YaRN (IMROPE at one position per row, as ops/rope.rs takes it).
struct QsaRope {
    int n_dims;
    double base;
};

// The f64 QSA pooled key of pool g of a slot (rows [raw key | pooled]), from Op::KPoolSelect's doc:
// the mean of the pool's raw keys, RMS-normed over dh (eps inside the root), times k_norm, roped
// at the pool's first position g·kpool.
template <typename T>
static std::vector<double> ref_qsa_pool(const std::vector<T>& cache, const std::vector<float>& k_norm, float eps,
                                        const QsaRope& rp, const Shape& s, int slot, int g) {
    std::vector<double> m(s.dh), out(s.dh);
    double ss = 0.0;
    for (int d = 0; d < s.dh; ++d) {
        double sum = 0.0;
        for (int t = 0; t < s.kpool; ++t)
            sum += to_float(cache[((long long)slot * s.len + (long long)g * s.kpool + t) * 2 * s.dh + d]);
        m[d] = sum / s.kpool;
        ss += m[d] * m[d];
    }
    const double inv = 1.0 / std::sqrt(ss / s.dh + eps);
    for (int d = 0; d < s.dh; ++d) m[d] *= inv * k_norm[d];
    out = m;
    const int half = rp.n_dims / 2, p0 = g * s.kpool;
    for (int i = 0; i < half; ++i) {
        const double th = p0 * std::pow(rp.base, -2.0 * i / rp.n_dims);
        out[i] = m[i] * std::cos(th) - m[i + half] * std::sin(th);
        out[i + half] = m[i] * std::sin(th) + m[i + half] * std::cos(th);
    }
    return out;
}

// One QSA call over rows r0..r1, as ops/kpool.rs launches it (no head weights: every head weighs
// `scale`).
template <typename T>
static int run_qsa_call(const std::vector<float>& q, const std::vector<float>& k_norm, float eps, const QsaRope& rp,
                        float scale, std::vector<T>& cache, const std::vector<int>& slots,
                        const std::vector<int>& pos, const Shape& s, int r0, int r1, std::vector<int>& out,
                        void (*pool_k)(T*, const float*, const int*, const int*, int, int, int, int, float, int,
                                       double, float, float, float, float, double, int*),
                        void (*scores_k)(const float*, const float*, float, const T*, const int*, const int*,
                                         unsigned long long*, int, int, int, int, int, int, long long)) {
    const int rows = r1 - r0, max_pools = s.len / s.kpool;
    long long stride = 1;
    while (stride < max_pools) stride <<= 1;
    std::vector<unsigned long long> keys((size_t)stride * rows, 0xFFFFFFFF00000000ull);
    const float* qc = q.data() + (size_t)r0 * s.n_head * s.dh;
    const int *sc = slots.data() + r0, *pc = pos.data() + r0;
    int* oc = out.data() + (size_t)r0 * s.n_sel();
    int err = 0;
    launch(Dim3{(unsigned)rows, 1, 1}, 128, [&] {
        pool_k(cache.data(), k_norm.data(), sc, pc, s.dh, s.kpool, s.len, s.n_slots, eps, rp.n_dims,
               std::log2(rp.base), 1.0f, 0.0f, 0.0f, 0.0f, 1.0, &err);
    });
    const unsigned chunks = (unsigned)((max_pools + KPOOL_BLOCK_POOLS - 1) / KPOOL_BLOCK_POOLS);
    launch(Dim3{std::max(chunks, 1u), (unsigned)rows, 1}, KPOOL_THREADS, [&] {
        scores_k(qc, nullptr, scale, cache.data(), sc, pc, keys.data(), s.n_head, s.dh, 2, s.kpool, s.len,
                 s.n_slots, stride);
    });
    launch(Dim3{(unsigned)rows, 1, 1}, KPOOL_SELECT_THREADS, [&] {
        bl_kpool_select(keys.data(), sc, pc, oc, s.kpool, s.n_top, s.tail ? 1 : 0, s.n_sel(), s.len, s.n_slots,
                        stride);
    });
    return err;
}

// Qwen3.8-Flash-Next's QSA selection: two slots from position 0, prompts in calls of `chunk` rows
// per slot (each completing several pools) up to `prompt`, then decode calls of one row per slot
// up to `end` (past the budget of kpool·n_top). Raw keys random, every pooled half NaN until a call
// pools it. The pooled keys against ref_qsa_pool (f32: within 1e-5 of max(|v|, 1); f16: 1e-3);
// the lists against f64 scores scale·Σ_h relu(q_h·pooled) of the kernel's pooled keys.
template <typename T>
static bool qsa_case(const std::string& name, const Shape& s, int chunk, int prompt, int end,
                     void (*pool_k)(T*, const float*, const int*, const int*, int, int, int, int, float, int, double,
                                    float, float, float, float, double, int*),
                     void (*scores_k)(const float*, const float*, float, const T*, const int*, const int*,
                                      unsigned long long*, int, int, int, int, int, int, long long)) {
    const QsaRope rp{64, 1e7};
    const float eps = 1e-6f, scale = 1.0f / std::sqrt((float)s.dh);
    std::vector<int> slots, pos, calls;  // calls: the first row of each call, then the rows
    for (int p0 = 0; p0 < end;) {
        const int n = p0 < prompt ? std::min(chunk, prompt - p0) : 1;
        calls.push_back((int)slots.size());
        for (int sl : {1, 0})
            for (int p = p0; p < p0 + n; ++p) slots.push_back(sl), pos.push_back(p);
        p0 += n;
    }
    calls.push_back((int)slots.size());
    const int rows = (int)slots.size();
    const std::vector<float> q = randoms((size_t)rows * s.n_head * s.dh, 1.0f);
    std::vector<float> k_norm = randoms(s.dh, 0.5f);
    for (float& g : k_norm) g += 1.0f;
    std::vector<float> c32 = randoms((size_t)2 * s.dh * s.len * s.n_slots, 2.0f);
    std::vector<T> cache(c32.size());
    for (size_t i = 0; i < c32.size(); ++i) cache[i] = from_f32<T>(i / s.dh % 2 ? NAN : c32[i]);
    const std::vector<T> before = cache;
    std::vector<int> out((size_t)rows * s.n_sel(), 7777);
    int err = 0;
    for (size_t c = 0; c + 1 < calls.size(); ++c)
        err |= run_qsa_call(q, k_norm, eps, rp, scale, cache, slots, pos, s, calls[c], calls[c + 1], out, pool_k,
                            scores_k);
    double worst = 0.0;
    int pools = 0;
    for (int sl = 0; sl < s.n_slots; ++sl)
        for (int g = 0; g < end / s.kpool; ++g, ++pools) {
            const std::vector<double> want = ref_qsa_pool(before, k_norm, eps, rp, s, sl, g);
            const long long at = ((long long)sl * s.len + (long long)g * s.kpool + s.kpool - 1) * 2 * s.dh + s.dh;
            for (int d = 0; d < s.dh; ++d) {
                const double e = std::fabs(to_float(cache[at + d]) - want[d]) / std::max(std::fabs(want[d]), 1.0);
                if (!(e <= worst)) worst = e;
            }
        }
    auto score = [&](int r, int g) {
        const long long at = ((long long)slots[r] * s.len + (long long)g * s.kpool + s.kpool - 1) * 2 * s.dh + s.dh;
        double acc = 0.0;
        for (int h = 0; h < s.n_head; ++h) {
            double dot = 0.0;
            for (int d = 0; d < s.dh; ++d) dot += (double)q[((size_t)r * s.n_head + h) * s.dh + d] * to_float(cache[at + d]);
            acc += (double)scale * std::max(dot, 0.0);
        }
        return acc;
    };
    int bad_rows = 0, ties = 0;
    check_lists(out, slots, pos, s, score, bad_rows, ties);
    const double tol = sizeof(T) == 2 ? 1e-3 : 1e-5;
    const bool ok = err == 0 && bad_rows == 0 && worst <= tol;
    std::printf("%s QSA %s (%zu calls, %d rows): %d bad, %d tie swaps, %d pooled keys worst %.2e, error %d\n",
                ok ? "ok  " : "FAIL", name.c_str(), calls.size() - 1, rows, bad_rows, ties, pools, worst, err);
    return ok;
}

// A row whose slot or position is outside the cache reports ERR_KPOOL and gets an all -1 list;
// the good row of its call (position 3 of slot 0: pool 0, no tail) is listed as ever. Each bad
// row goes in a call of its own, so that each check is seen to report.
static bool bad_row_case() {
    const Shape s{2, 16, 4, 2, true, 16, 2};
    const std::vector<float> q = randoms(2 * 2 * 16, 1.0f), w = randoms(2 * 2, 1.0f), ape = randoms(16 * 4, 1.0f);
    bool ok = true;
    for (const auto& [slot, p] : std::vector<std::pair<int, int>>{{2, 5}, {-1, 5}, {1, 16}, {1, -1}}) {
        std::vector<float> cache = randoms(3 * 16 * 16 * 2, 1.0f);
        std::vector<int> slots{0, slot}, pos{3, p};
        std::vector<int> out(2 * s.n_sel(), 7777);
        const int err = run_call<float>(q, w, cache, ape, slots, pos, s, 0, 2, out, bl_kpool_pool_f32,
                                        bl_kpool_scores_f32);
        bool mine = err == ERR_KPOOL;
        for (int j = s.n_sel(); j < 2 * s.n_sel(); ++j) mine &= out[j] == -1;
        const std::vector<int> good(out.begin(), out.begin() + s.n_sel());
        mine &= good == std::vector<int>({0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1});
        std::printf("%s slot %d, position %d outside the cache: error %d, its list -1\n", mine ? "ok  " : "FAIL", slot,
                    p, err);
        ok &= mine;
    }
    return ok;
}

// n values of T from f (the golden file is whole: a short read is a failure).
template <typename T>
static std::vector<T> read_n(FILE* f, size_t n) {
    std::vector<T> v(n);
    if (std::fread(v.data(), sizeof(T), n, f) != n) {
        std::printf("FAIL the golden file ends early\n");
        std::exit(1);
    }
    return v;
}

// The numpy golden's cases from `path` (the layout of tests/sim.rs' kpool_golden_file).
static bool golden_cases(const char* path) {
    FILE* f = std::fopen(path, "rb");
    if (!f) {
        std::printf("FAIL cannot open the golden file %s\n", path);
        return false;
    }
    bool all = true;
    int n_cases = 0;
    int head[8];
    while (std::fread(head, sizeof(int), 8, f) == 8) {
        const Shape s{head[0], head[1], head[2], head[3], head[4] != 0, head[5], head[6]};
        const int rows = head[7], n_sel = s.n_sel();
        const std::vector<float> q = read_n<float>(f, (size_t)rows * s.n_head * s.dh),
                                 w = read_n<float>(f, (size_t)rows * s.n_head),
                                 cache0 = read_n<float>(f, (size_t)3 * s.dh * s.len * s.n_slots),
                                 ape = read_n<float>(f, (size_t)s.dh * s.kpool);
        const std::vector<int> slots = read_n<int>(f, rows), pos = read_n<int>(f, rows),
                               want = read_n<int>(f, (size_t)rows * n_sel);
        std::vector<std::vector<double>> scores(rows);
        for (int r = 0; r < rows; ++r) scores[r] = read_n<double>(f, (pos[r] + 1) / s.kpool);
        const int n_pooled = read_n<int>(f, 1)[0];
        std::vector<int> pooled_at(n_pooled);
        std::vector<std::vector<double>> pooled(n_pooled);
        for (int i = 0; i < n_pooled; ++i) {
            const std::vector<int> sg = read_n<int>(f, 2);
            pooled_at[i] = sg[0] * s.len + sg[1] * s.kpool + s.kpool - 1;
            pooled[i] = read_n<double>(f, s.dh);
        }
        ++n_cases;
        for (int chunk : {rows, 5}) {
            std::vector<float> cache = cache0;
            std::vector<int> out((size_t)rows * n_sel, 7777);
            int err = 0;
            for (int r0 = 0; r0 < rows; r0 += chunk)
                err |= run_call<float>(q, w, cache, ape, slots, pos, s, r0, std::min(rows, r0 + chunk), out,
                                       bl_kpool_pool_f32, bl_kpool_scores_f32);
            int bad_rows = 0, ties = 0;
            for (int r = 0; r < rows; ++r) {
                const int* o = out.data() + (size_t)r * n_sel;
                const int* g = want.data() + (size_t)r * n_sel;
                bool ok = true;
                for (int j = 0; j < s.n_top; ++j) {
                    const int a = o[j * s.kpool] < 0 ? -1 : o[j * s.kpool] / s.kpool;
                    const int b = g[j * s.kpool] < 0 ? -1 : g[j * s.kpool] / s.kpool;
                    if (a != b) {
                        const int complete = (int)scores[r].size();
                        // Another pool only where the golden scores the two the same to 1e-6.
                        if (a < 0 || b < 0 || a >= complete ||
                            std::fabs(scores[r][a] - scores[r][b]) > 1e-6 * std::max(1.0, std::fabs(scores[r][b])))
                            ok = false;
                        else
                            ++ties;
                    }
                    for (int t = 0; t < s.kpool; ++t)
                        if (o[j * s.kpool + t] != (a < 0 ? -1 : a * s.kpool + t)) ok = false;
                }
                for (int j = s.kpool * s.n_top; j < n_sel; ++j) ok &= o[j] == g[j];
                if (!ok) {
                    if (bad_rows == 0) {
                        std::printf("  row %d (slot %d, position %d):", r, slots[r], pos[r]);
                        for (int j = 0; j < n_sel; ++j) std::printf(" %d", o[j]);
                        std::printf("\n  golden:");
                        for (int j = 0; j < n_sel; ++j) std::printf(" %d", g[j]);
                        std::printf("\n");
                    }
                    ++bad_rows;
                }
            }
            double worst = 0.0;
            for (int i = 0; i < n_pooled; ++i)
                for (int d = 0; d < s.dh; ++d) {
                    const double got = cache[(size_t)pooled_at[i] * 3 * s.dh + 2 * s.dh + d], v = pooled[i][d];
                    const double e = std::fabs(got - v) / std::max(std::fabs(v), 1e-3);
                    if (!(e <= worst)) worst = e;
                }
            const bool ok = err == 0 && bad_rows == 0 && n_pooled > 0 && worst <= 1e-6;
            std::printf("%s golden case %d (%d heads, top %d, tail %d; calls of %d rows): %d rows, %d bad, %d tie "
                        "swaps, %d pooled keys worst %.2e, error %d\n",
                        ok ? "ok  " : "FAIL", n_cases, s.n_head, s.n_top, (int)s.tail, chunk, rows, bad_rows, ties,
                        n_pooled, worst, err);
            all &= ok;
        }
    }
    std::fclose(f);
    if (n_cases == 0) {
        std::printf("FAIL no golden case read from %s\n", path);
        return false;
    }
    return all;
}

// Equal scores rank the lower pool first: a decode row at position 38 of slot 1 sees 9 complete
// pools, each holding the same pooled key (earlier calls' pools); it keeps 4 of them.
static bool tie_case() {
    const Shape s{2, 16, 4, 4, true, 48, 2};
    std::vector<float> q(2 * 16, 0.5f), w{1.0f, 0.25f}, ape = randoms(16 * 4, 1.0f);
    std::vector<float> cache = randoms(3 * 16 * 48 * 2, 1.0f);
    for (int g = 0; g < 9; ++g)
        for (int d = 0; d < 16; ++d) cache[((48 + g * 4 + 3) * 3 + 2) * 16 + d] = 1.0f;
    std::vector<int> slots{1}, pos{38}, out(s.n_sel(), 7777);
    const int err = run_call<float>(q, w, cache, ape, slots, pos, s, 0, 1, out, bl_kpool_pool_f32, bl_kpool_scores_f32);
    std::vector<int> want;
    for (int v = 0; v < 16; ++v) want.push_back(v);
    for (int v : {36, 37, 38}) want.push_back(v);
    const bool ok = err == 0 && out == want;
    std::printf("%s equal scores: the lower pools first (got pool %d first)\n", ok ? "ok  " : "FAIL", out[0] / 4);
    return ok;
}

// Rows of each slot from position 0, interleaved slot by slot.
struct Rows {
    std::vector<int> slots, pos;
};
static Rows interleaved(const std::vector<int>& lengths) {
    Rows r;
    interleave(lengths, r.slots, r.pos);
    return r;
}

int main(int argc, char** argv) {
    g_block_shuffle = 3;
    if (argc < 2) {
        std::printf("FAIL usage: kpool_test GOLDEN.bin (tests/sim.rs writes it)\n");
        return 1;
    }
    bool ok = golden_cases(argv[1]);
    const auto f32p = bl_kpool_pool_f32;
    const auto f32s = bl_kpool_scores_f32;
    Rows a = interleaved({30, 21}), b = interleaved({50, 37, 9}), c = interleaved({44, 26}), d = interleaved({23, 14});
    ok &= kpool_case<float>("top_k 8, tail, 32 heads, 2 slots", {32, 128, 4, 2, true, 32, 2}, a.slots, a.pos, 1000,
                            f32p, f32s);
    ok &= kpool_case<float>("top_k 16, tail, 32 heads, 3 slots", {32, 128, 4, 4, true, 64, 3}, b.slots, b.pos, 1000,
                            f32p, f32s);
    ok &= kpool_case<float>("top_k 16, no tail, 8 heads, 2 slots", {8, 128, 4, 4, false, 48, 2}, c.slots, c.pos, 1000,
                            f32p, f32s);
    for (int chunk : {1, 3, 7})
        ok &= kpool_case<float>("prompt in chunks, tail, 8 heads", {8, 128, 4, 4, true, 48, 2}, d.slots, d.pos, chunk,
                                f32p, f32s);
    ok &= kpool_case<__half>("f16 cache, top_k 16, tail, 8 heads", {8, 128, 4, 4, true, 48, 2}, c.slots, c.pos, 1000,
                             bl_kpool_pool_f16, bl_kpool_scores_f16);
    // Decode rows over 600 pools of earlier calls (the last one completed by this call): more
    // than the shared sort holds, so the scratch is sorted in place; 100 kept.
    ok &= kpool_case<float>("600 pools, 100 kept, 2 heads of 16", {2, 16, 4, 100, true, 2400, 2}, {1, 1, 0},
                            {2397, 2399, 300}, 1000, f32p, f32s);
    // QSA: 4 heads of 128, pools of 4, budget 16 (4 kept) with the tail, two slots.
    const Shape qsa{4, 128, 4, 4, true, 64, 2};
    ok &= qsa_case<float>("prompt in calls of 7, decode to 60", qsa, 7, 33, 60, bl_kpool_pool_qsa_f32,
                          bl_kpool_scores_f32);
    ok &= qsa_case<__half>("f16 cache, prompt in calls of 9, decode to 48", qsa, 9, 27, 48, bl_kpool_pool_qsa_f16,
                           bl_kpool_scores_f16);
    ok &= tie_case();
    ok &= bad_row_case();
    return ok ? 0 : 1;
}
