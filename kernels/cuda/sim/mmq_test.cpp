// Checks the tiled quantized products of cu/mmq.cuh on the CPU (sim.h, with the tensor-core
// primitives emulated by mma.h): every output bit for bit against the same per-sub-block terms
// summed in k order (the weight sub-blocks unpacked by quant.cuh's unpack_sub, the Q8_1 blocks
// read as stored), for the int8 mma and the dp4a forms:
// - dense products with partial row and column tiles, over 1, 2 and 3 k steps, for Q4_K (a min
//   term), Q8_0, and Q6_K (a scale per 16 values), and with the k steps split in two halves along
//   grid z (each half added onto a zeroed output); rows 16-byte aligned (16-byte loads) and
//   4-byte aligned;
// - three products of one activation batch in one launch (Q, K and V), parts of uneven sizes;
// - routed experts over a route table: gathered activation rows (entry / col_div), outputs
//   written at each entry's row and nowhere else, an expert over two column tiles, one with a
//   few columns, one with none, and unused tiles;
// - the wide tile (bl_mmq2_*, its sums through MMQ_MAGIC): dense products over several partial row and column tiles (warps
//   whose columns all lie past the batch), k not a multiple of 256, Q8_0, Q4_K and Q6_K, the k
//   halves along z, rows 4-byte aligned, and parts of three uneven sizes, Q8_0 and Q4_K.
// Prints one line per case; exits 1 on a failure.
#include "sim.h"
#include "mma.h"

// The wide tile's dynamic shared memory: a static block here (blocks run one after another).
#define MMQ2_DYNAMIC_SMEM(name)                       \
    static Mmq2Smem name##_block;                     \
    Mmq2Smem* name = &name##_block

#include <array>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/quant.cuh"
#include "../cu/mmq.cuh"

static std::mt19937 rng(5);

static float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

static void put_half(uint8_t* p, float v) {
    const __half h = __float2half_rn(v);
    std::memcpy(p, &h, 2);
}

// Bytes of one row of k values, and the offsets of its blocks' f16 scales.
struct Layout {
    int block, values;
    std::vector<int> halves;
};
static Layout layout(int wtype) {
    switch (wtype) {
        case WT_Q4_K: return {144, 256, {0, 2}};
        case WT_Q6_K: return {210, 256, {208}};
        default: return {34, 32, {0}};  // Q8_0
    }
}

// Random weight rows: random bytes, each block's f16 scales set to small finite values.
static std::vector<uint8_t> weights(int wtype, int rows, int k) {
    const Layout l = layout(wtype);
    std::vector<uint8_t> w((size_t)rows * k / l.values * l.block);
    for (auto& b : w) b = (uint8_t)rng();
    for (size_t b = 0; b < w.size(); b += l.block)
        for (int off : l.halves) put_half(&w[b + off], uniform(0.001f, 0.02f));
    return w;
}

// Random Q8_1 activation rows (36-byte blocks: f16 scale, f16 scaled sum, 32 int8).
static std::vector<uint8_t> activations(int rows, int k) {
    std::vector<uint8_t> x((size_t)rows * k / 32 * 36);
    for (auto& b : x) b = (uint8_t)rng();
    for (size_t b = 0; b < x.size(); b += 36) {
        put_half(&x[b], uniform(0.001f, 0.05f));
        put_half(&x[b + 2], uniform(-2.0f, 2.0f));
    }
    return x;
}

// W_row . x_col over sub-blocks sb_lo .. sb_hi, term by term as the tiles round them.
static float reference(const uint8_t* wrow, int wtype, const uint8_t* xrow, int sb_lo, int sb_hi) {
    float acc = 0.0f;
    for (int sb = sb_lo; sb < sb_hi; ++sb) {
        Sub s;
        unpack_sub(wrow, wtype, sb, &s);
        const uint8_t* b = xrow + (size_t)sb * 36;
        const float2 ds = __half22float2(*(const __half2*)b);
        int q[8];
        std::memcpy(q, b + 4, 32);
        if (two_scales(wtype)) {
            for (int h = 0; h < 2; ++h) {
                int ci = 0;
                for (int t = 4 * h; t < 4 * h + 4; ++t) ci = __dp4a(s.q[t], q[t], ci);
                acc += __fmul_rn(s.d[h] * ds.x, (float)ci);
            }
        } else {
            int ci = 0;
            for (int t = 0; t < 8; ++t) ci = __dp4a(s.q[t], q[t], ci);
            if (has_min(wtype))
                acc += s.d[0] * ds.x * (float)ci - s.m * ds.y;
            else
                acc += __fmul_rn(s.d[0] * ds.x, (float)ci);
        }
    }
    return acc;
}

// The whole k range, or its two halves as the tiles split them (grid z = 2) added onto zero.
static float reference_split(const uint8_t* wrow, int wtype, const uint8_t* xrow, int k, int z) {
    const int nsb = k / 32;
    if (z == 1) return reference(wrow, wtype, xrow, 0, nsb);
    const int step = two_scales(wtype) ? 4 : 8, steps = (nsb + step - 1) / step, per = (steps + 1) / 2;
    const int mid = std::min(nsb, per * step);
    return 0.0f + reference(wrow, wtype, xrow, 0, mid) + reference(wrow, wtype, xrow, mid, nsb);
}

static int failures = 0;

static void report(const char* name, long long bad, long long checked, double worst) {
    std::printf("%-52s %s (%lld outputs, %lld differ, worst |d| %.3g)\n", name, bad ? "FAIL" : "ok", checked, bad,
                worst);
    if (bad) ++failures;
}

static void compare(const char* name, const std::vector<float>& got, const std::vector<float>& want) {
    long long bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const bool same = std::memcmp(&got[i], &want[i], 4) == 0;
        if (!same) {
            ++bad;
            worst = std::max(worst, (double)std::fabs(got[i] - want[i]));
        }
    }
    report(name, bad, (long long)got.size(), worst);
}

// An aligned buffer's bytes copied 4 bytes on (the tiles' 4-byte loads, not their 16-byte ones).
static std::vector<uint8_t> shifted(const std::vector<uint8_t>& v) {
    std::vector<uint8_t> s(v.size() + 4);
    std::memcpy(s.data() + 4, v.data(), v.size());
    return s;
}

// The tiles under test: mmq_tile on the tensor cores or dp4a, or the wide tile (mmq_tile2).
enum class Form { Mma, Dp4a, Wide };

static void dense_case(const char* name, Form form, int wtype, int n, int m, int k, int z, bool misaligned = false) {
    const auto w0 = weights(wtype, n, k);
    const auto x0 = activations(m, k);
    const auto ws = shifted(w0), xs = shifted(x0);
    const uint8_t* w = misaligned ? ws.data() + 4 : w0.data();
    const uint8_t* x = misaligned ? xs.data() + 4 : x0.data();
    const long long w_stride = (long long)k / layout(wtype).values * layout(wtype).block, x_row = k / 32 * 36;
    std::vector<float> y((size_t)m * n, z > 1 ? 0.0f : NAN), want(y.size());
    const bool wide = form == Form::Wide;
    const int bm = wide ? MMQ2_BM : MMQ_BM, bn = wide ? MMQ2_BN : MMQ_BN;
    launch(Dim3{(unsigned)((n + bm - 1) / bm), (unsigned)((m + bn - 1) / bn), (unsigned)z},
           wide ? MMQ2_THREADS : MMQ_THREADS, [&] {
               if (wide)
                   bl_mmq2_mma(w, w_stride, wtype, x, x_row, y.data(), k, n, m);
               else if (form == Form::Mma)
                   bl_mmq_mma(w, w_stride, wtype, x, x_row, y.data(), k, n, m);
               else
                   bl_mmq_dp4a(w, w_stride, wtype, x, x_row, y.data(), k, n, m);
           });
    for (int c = 0; c < m; ++c)
        for (int j = 0; j < n; ++j)
            want[(size_t)c * n + j] = reference_split(w + (size_t)j * w_stride, wtype, x + (size_t)c * x_row, k, z);
    compare(name, y, want);
}

static void parts_case(const char* name, Form form, int wtype = WT_Q8_0, int k = 512, int m = 37,
                       std::array<int, 3> ns = {96, 40, 24}) {
    const long long w_stride = (long long)k / layout(wtype).values * layout(wtype).block, x_row = k / 32 * 36;
    const bool wide = form == Form::Wide;
    const int bm = wide ? MMQ2_BM : MMQ_BM, bn = wide ? MMQ2_BN : MMQ_BN;
    const auto x = activations(m, k);
    std::vector<uint8_t> w[3];
    std::vector<float> y[3];
    MatmulPart p[3];
    unsigned tiles = 0;
    for (int i = 0; i < 3; ++i) {
        w[i] = weights(wtype, ns[i], k);
        y[i].assign((size_t)m * ns[i], NAN);
        p[i] = MatmulPart{w[i].data(), w_stride, y[i].data(), ns[i]};
        tiles += (ns[i] + bm - 1) / bm;
    }
    launch(Dim3{tiles, (unsigned)((m + bn - 1) / bn), 1}, wide ? MMQ2_THREADS : MMQ_THREADS, [&] {
        if (wide)
            bl_mmq2_parts_mma(p[0], p[1], p[2], wtype, x.data(), x_row, k, m);
        else if (form == Form::Mma)
            bl_mmq_parts_mma(p[0], p[1], p[2], wtype, x.data(), x_row, k, m);
        else
            bl_mmq_parts_dp4a(p[0], p[1], p[2], wtype, x.data(), x_row, k, m);
    });
    std::vector<float> got, want;
    for (int i = 0; i < 3; ++i)
        for (int c = 0; c < m; ++c)
            for (int j = 0; j < ns[i]; ++j) {
                got.push_back(y[i][(size_t)c * ns[i] + j]);
                want.push_back(reference(&w[i][(size_t)j * w_stride], wtype, &x[(size_t)c * x_row], 0, k / 32));
            }
    compare(name, got, want);
}

// Four stack experts of n rows each; rows of a 61-row batch, each routed to two experts
// (entries r * 2 + j): expert 0 takes 70 entries (two column tiles), expert 1 a few, expert 2
// none, expert 3 the rest.
static void experts_case(const char* name, Form form, int wtype) {
    const int k = 512, n = 72, rows = 61, top = 2, n_exp = 4, entries = rows * top;
    const long long w_stride = (long long)k / layout(wtype).values * layout(wtype).block, x_row = k / 32 * 36;
    const long long w_exp = w_stride * n;
    const auto w = weights(wtype, n * n_exp, k);
    const auto x = activations(rows, k);
    std::vector<int> expert(entries);
    for (int e = 0; e < entries; ++e) expert[e] = e < 70 ? 0 : e % 9 == 0 ? 1 : 3;
    std::shuffle(expert.begin(), expert.end(), rng);
    const long long list_stride = entries;
    std::vector<int> list((size_t)n_exp * list_stride, -1), count(n_exp, 0);
    for (int e = 0; e < entries; ++e) list[expert[e] * list_stride + count[expert[e]]++] = e;
    std::vector<int2> tiles;
    for (int e = 0; e < n_exp; ++e)
        for (int c = 0; c < count[e]; c += MMQ_BN) tiles.push_back(make_int2(e, c));
    tiles.push_back(make_int2(-1, 0));
    tiles.push_back(make_int2(-1, 0));
    const long long y_row = n + 8;
    std::vector<float> y((size_t)entries * y_row, NAN), want(y.size(), NAN);
    launch(Dim3{(unsigned)((n + MMQ_BM - 1) / MMQ_BM), (unsigned)tiles.size(), 1}, MMQ_THREADS, [&] {
        if (form == Form::Mma)
            bl_mmq_experts_mma(w.data(), w_stride, w_exp, wtype, x.data(), x_row, list.data(), list_stride,
                               count.data(), tiles.data(), top, y.data(), y_row, k, n);
        else
            bl_mmq_experts_dp4a(w.data(), w_stride, w_exp, wtype, x.data(), x_row, list.data(), list_stride,
                                count.data(), tiles.data(), top, y.data(), y_row, k, n);
    });
    for (int e = 0; e < entries; ++e)
        for (int j = 0; j < n; ++j)
            want[(size_t)e * y_row + j] = reference(&w[(size_t)(expert[e] * n + j) * w_stride], wtype,
                                                    &x[(size_t)(e / top) * x_row], 0, k / 32);
    // Unwritten outputs stay NaN in both (memcmp compares their bits).
    compare(name, y, want);
}

int main() {
    for (const Form f : {Form::Mma, Form::Dp4a}) {
        const char* form = f == Form::Mma ? "mma" : "dp4a";
        char name[96];
        std::snprintf(name, sizeof name, "dense Q4_K 80 x 70, 3 k steps (%s)", form);
        dense_case(name, f, WT_Q4_K, 80, 70, 768, 1);
        std::snprintf(name, sizeof name, "dense Q4_K 64 x 20, rows 4-byte aligned (%s)", form);
        dense_case(name, f, WT_Q4_K, 64, 20, 512, 1, true);
        std::snprintf(name, sizeof name, "dense Q8_0 64 x 16, 1 k step (%s)", form);
        dense_case(name, f, WT_Q8_0, 64, 16, 256, 1);
        std::snprintf(name, sizeof name, "dense Q6_K 72 x 33, 2 k steps (%s)", form);
        dense_case(name, f, WT_Q6_K, 72, 33, 256, 1);
        std::snprintf(name, sizeof name, "dense Q8_0 64 x 40, k halves along z (%s)", form);
        dense_case(name, f, WT_Q8_0, 64, 40, 1280, 2);
        std::snprintf(name, sizeof name, "parts Q8_0 96 + 40 + 24 x 37 (%s)", form);
        parts_case(name, f);
        std::snprintf(name, sizeof name, "routed experts Q4_K (%s)", form);
        experts_case(name, f, WT_Q4_K);
        std::snprintf(name, sizeof name, "routed experts Q6_K (%s)", form);
        experts_case(name, f, WT_Q6_K);
    }
    const Form w = Form::Wide;
    dense_case("wide: dense Q8_0 200 x 150, k 800", w, WT_Q8_0, 200, 150, 800, 1);
    dense_case("wide: dense Q4_K 136 x 130, 3 k steps", w, WT_Q4_K, 136, 130, 768, 1);
    dense_case("wide: dense Q6_K 72 x 33, 2 k steps", w, WT_Q6_K, 72, 33, 256, 1);
    dense_case("wide: dense Q8_0 130 x 70, k 1312, k halves along z", w, WT_Q8_0, 130, 70, 1312, 2);
    dense_case("wide: dense Q4_K 128 x 64, k halves along z", w, WT_Q4_K, 128, 64, 1280, 2);
    dense_case("wide: dense Q4_K 64 x 20, rows 4-byte aligned", w, WT_Q4_K, 64, 20, 512, 1, true);
    dense_case("wide: dense Q8_0 96 x 40, rows 4-byte aligned", w, WT_Q8_0, 96, 40, 544, 1, true);
    parts_case("wide: parts Q8_0 200 + 72 + 40 x 137, k 544", w, WT_Q8_0, 544, 137, {200, 72, 40});
    parts_case("wide: parts Q4_K 96 + 136 + 24 x 70", w, WT_Q4_K, 512, 70, {96, 136, 24});
    return failures ? 1 : 0;
}
