// Checks DeepSeek-V4's compressor and indexer (cu/compress.cuh: bl_compress_f32 then
// bl_compress_store_f32, and bl_comp_select_f32), and V4.1's index keys (keys_case), on the CPU (sim.h) against transformers 5.24
// (kernels/cpu's fixture tests/fixtures/deepseek4/ops_hf.json). Compress: the sequence in slot 1 of
// two, in the calls the CPU test cuts (one call, and calls ending inside windows), with a raw ring
// of exactly the positions a row reads; the rows within 1e-6 of the largest magnitude (as kernels/
// cpu's test measures it), slot 0 and the rows past the complete ones left alone; the blocks of
// each launch in a shuffled order. CompSelect: the
// keys in slot 1 of two, every list equal to transformers'. Fewer threads than values, so the
// strided loops are exercised. tests/sim.rs writes the file named by argv[1]: records of a kind
// (int32: 0 compress, 1 select), then for compress ratio, overlap, width, rows, n_out, n_cuts, the
// cuts (int32), the rope's n_dims, offset (int32), log2 base, mscale (f64), freq_scale, ext_factor,
// corr0, corr1 (f32), eps, kv, score, ape, norm and the wanted rows (f32); for select n_head,
// head_dim, ratio, top_k, rows, n_out (int32), q, w (scaled), keys (f32) and the wanted lists
// (int32); for V4.1 keys (kind 2) ratio, width, index width, rows, n_out, n_cuts, the cuts, the
// rows' rope and the keys' rope (as above), eps, kv, score, norm, wk [width, index width], k_norm
// and the wanted plain rows and keys (f32). Prints one line per record; exits 1 on a failure.
#include "sim.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/rope.cuh"
#include "../cu/compress.cuh"

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

static bool compress_case() {
    const auto h = take<int>(6);
    const int ratio = h[0], overlap = h[1], w = h[2], rows = h[3], n_out = h[4];
    const auto cuts = take<int>(h[5]);
    const auto ri = take<int>(2);
    const auto rd = take<double>(2);
    const auto rf = take<float>(5);
    const int sw = overlap ? 2 * w : w, len_raw = overlap ? 2 * ratio : ratio, len_comp = n_out + 1;
    const auto kv = take<float>((size_t)sw * rows), score = take<float>((size_t)sw * rows);
    const auto ape = take<float>((size_t)sw * ratio), norm = take<float>(w), want = take<float>((size_t)w * n_out);
    std::vector<float> raw((size_t)2 * sw * len_raw * 2, 3.0f), comp((size_t)w * len_comp * 2, 5.0f);
    // Blocks in a shuffled order, as the card may run them: a call longer than the raw ring must
    // still leave each ring row holding the latest position that maps to it for the next call.
    g_block_shuffle = 11;
    int start = 0, err = 0;
    for (int end : cuts) {
        const int n = end - start;
        std::vector<int> slots(n, 1), pos(n);
        for (int i = 0; i < n; ++i) pos[i] = start + i;
        const float* k = kv.data() + (size_t)start * sw;
        const float* s = score.data() + (size_t)start * sw;
        launch(Dim3{(unsigned)n, 1, 1}, 64, [&] {
            bl_compress_f32(k, s, ape.data(), norm.data(), raw.data(), comp.data(), nullptr, slots.data(), pos.data(), ratio,
                            overlap, w, len_raw, len_comp, 2, rf[4], 0, ri[0], ri[1], rd[0], rf[0], rf[1], rf[2],
                            rf[3], rd[1], &err);
        });
        launch(Dim3{(unsigned)n, 1, 1}, 64,
               [&] { bl_compress_store_f32(k, s, raw.data(), slots.data(), pos.data(), sw, len_raw, 2); });
        start = end;
    }
    g_block_shuffle = 0;
    int bad = err ? 1 : 0;
    double scale = 0.0, worst = 0.0;
    for (float v : want) scale = std::fmax(scale, std::fabs(v));
    for (size_t i = 0; i < comp.size(); ++i) {
        const size_t in1 = i - (size_t)w * len_comp;
        const bool wanted = i >= (size_t)w * len_comp && in1 < want.size();
        if (!wanted) {
            if (comp[i] != 5.0f && bad++ < 4) std::printf("  cache value %zu written\n", i);
            continue;
        }
        const double e = std::fabs(comp[i] - want[in1]) / scale;
        worst = std::fmax(worst, e);
        if (!(e <= 1e-6) && bad++ < 4) std::printf("  row %zu dim %zu: %.9g, want %.9g\n", in1 / w, in1 % w, comp[i], want[in1]);
    }
    std::printf("%s compress ratio %d%s width %d, %d rows in %zu calls: worst %.2g\n", bad ? "FAIL" : "ok  ", ratio,
                overlap ? " overlapped" : "", w, rows, cuts.size(), worst);
    return bad == 0;
}

// `got` within 1e-6 of the largest |want| (a NaN fails); prints the first misses under `what`.
static bool near(const char* what, const std::vector<float>& got, const std::vector<float>& want, double* worst) {
    double scale = 0.0;
    int bad = 0;
    for (float v : want) scale = std::fmax(scale, std::fabs(v));
    for (size_t i = 0; i < want.size(); ++i) {
        const double e = std::fabs(got[i] - want[i]) / scale;
        *worst = std::fmax(*worst, std::isnan(e) ? INFINITY : e);
        if (!(e <= 1e-6) && bad++ < 4) std::printf("  %s %zu: %.9g, want %.9g\n", what, i, got[i], want[i]);
    }
    return bad == 0;
}

// DeepSeek-V4.1's index keys (docs/deepseek41-plan.md): per call the Plain form of bl_compress_f32
// (before the Pool call that stores the call's rows in raw), wk times those rows (f64 sums), then
// bl_comp_store_f32 into a key cache; the plain rows of the completing positions (zeros at the
// others) and slot 1's keys against transformers', slot 0 and the rows past them left alone.
static bool keys_case() {
    const auto h = take<int>(5);
    const int ratio = h[0], w = h[1], di = h[2], rows = h[3], n_out = h[4];
    const auto cuts = take<int>(take<int>(1)[0]);
    const auto ri = take<int>(2);
    const auto rd = take<double>(2);
    const auto rf = take<float>(4);
    const auto ki = take<int>(2);
    const auto kd = take<double>(2);
    const auto kf = take<float>(4);
    const float eps = take<float>(1)[0];
    const auto kv = take<float>((size_t)w * rows), score = take<float>((size_t)w * rows);
    const auto norm = take<float>(w), wk = take<float>((size_t)w * di), k_norm = take<float>(di);
    const auto want_plain = take<float>((size_t)w * n_out), want_keys = take<float>((size_t)di * n_out);
    const int len_comp = n_out + 1;
    std::vector<float> ape((size_t)w * ratio, 0.0f), raw((size_t)2 * w * ratio * 2, 3.0f);
    std::vector<float> comp((size_t)w * len_comp * 2, 5.0f), keys((size_t)di * len_comp * 2, 7.0f), plain_rows;
    int start = 0, err = 0, bad = 0;
    for (int end : cuts) {
        const int n = end - start;
        std::vector<int> slots(n, 1), pos(n);
        for (int i = 0; i < n; ++i) pos[i] = start + i;
        const float* k = kv.data() + (size_t)start * w;
        const float* s = score.data() + (size_t)start * w;
        std::vector<float> u((size_t)w * n, NAN), x((size_t)di * n);
        launch(Dim3{(unsigned)n, 1, 1}, 64, [&] {
            bl_compress_f32(k, s, ape.data(), norm.data(), raw.data(), nullptr, u.data(), slots.data(), pos.data(),
                            ratio, 0, w, ratio, 0, 2, eps, 0, ri[0], ri[1], rd[0], rf[0], rf[1], rf[2], rf[3], rd[1],
                            &err);
        });
        for (int i = 0; i < n; ++i) {
            const bool completes = (pos[i] + 1) % ratio == 0;
            for (int d = 0; d < w; ++d) {
                const float v = u[(size_t)i * w + d];
                if (completes) plain_rows.push_back(v);
                else if (v != 0.0f && bad++ < 4) std::printf("  position %d completes no row: %g\n", pos[i], v);
            }
        }
        launch(Dim3{(unsigned)n, 1, 1}, 64, [&] {
            bl_compress_f32(k, s, ape.data(), norm.data(), raw.data(), comp.data(), nullptr, slots.data(), pos.data(),
                            ratio, 0, w, ratio, len_comp, 2, eps, 0, ri[0], ri[1], rd[0], rf[0], rf[1], rf[2], rf[3],
                            rd[1], &err);
        });
        launch(Dim3{(unsigned)n, 1, 1}, 64,
               [&] { bl_compress_store_f32(k, s, raw.data(), slots.data(), pos.data(), w, ratio, 2); });
        for (int i = 0; i < n; ++i)
            for (int o = 0; o < di; ++o) {
                double acc = 0.0;
                for (int d = 0; d < w; ++d) acc += (double)wk[(size_t)o * w + d] * (double)u[(size_t)i * w + d];
                x[(size_t)i * di + o] = (float)acc;
            }
        launch(Dim3{(unsigned)n, 1, 1}, 64, [&] {
            bl_comp_store_f32(x.data(), k_norm.data(), keys.data(), slots.data(), pos.data(), ratio, di, len_comp, 2,
                              eps, 0, ki[0], ki[1], kd[0], kf[0], kf[1], kf[2], kf[3], kd[1], &err);
        });
        start = end;
    }
    if (err) bad++;
    double worst = 0.0;
    if (plain_rows.size() != want_plain.size()) {
        std::printf("  %zu plain values, want %zu\n", plain_rows.size(), want_plain.size());
        bad++;
    } else if (!near("plain", plain_rows, want_plain, &worst)) {
        bad++;
    }
    const std::vector<float> got(keys.begin() + (size_t)di * len_comp, keys.begin() + (size_t)di * (len_comp + n_out));
    if (!near("key", got, want_keys, &worst)) bad++;
    for (size_t i = 0; i < keys.size(); ++i) {
        const bool wanted = i >= (size_t)di * len_comp && i < (size_t)di * (len_comp + n_out);
        if (!wanted && keys[i] != 7.0f && bad++ < 4) std::printf("  key cache value %zu written\n", i);
    }
    std::printf("%s v4.1 keys ratio %d, width %d -> %d, %d rows in %zu calls: worst %.2g\n", bad ? "FAIL" : "ok  ",
                ratio, w, di, rows, cuts.size(), worst);
    return bad == 0;
}

static bool select_case() {
    const auto h = take<int>(6);
    const int nh = h[0], dh = h[1], ratio = h[2], top_k = h[3], rows = h[4], n_out = h[5];
    const auto q = take<float>((size_t)dh * nh * rows), w = take<float>((size_t)nh * rows);
    const auto keys = take<float>((size_t)dh * n_out * 2);
    const auto want = take<int>((size_t)top_k * rows);
    std::vector<int> slots(rows, 1), pos(rows), out((size_t)top_k * rows + 8, -77);
    for (int i = 0; i < rows; ++i) pos[i] = i;
    int err = 0;
    launch(Dim3{(unsigned)rows, 1, 1}, 64, [&] {
        bl_comp_select_f32(q.data(), w.data(), keys.data(), slots.data(), pos.data(), out.data(), nh, dh, ratio, top_k,
                           n_out, 2, &err);
    });
    int bad = err ? 1 : 0;
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < top_k; ++i) {
            const size_t at = (size_t)r * top_k + i;
            if (out[at] != want[at] && bad++ < 4) std::printf("  row %d entry %d: %d, want %d\n", r, i, out[at], want[at]);
        }
    for (int i = 0; i < 8; ++i)
        if (out[(size_t)top_k * rows + i] != -77 && bad++ < 4) std::printf("  written past the output\n");
    std::printf("%s select top %d of %d heads x %d, %d rows\n", bad ? "FAIL" : "ok  ", top_k, nh, dh, rows);
    return bad == 0;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: compress_test CASES\n");
        return 2;
    }
    f = std::fopen(argv[1], "rb");
    if (!f) {
        std::perror(argv[1]);
        return 2;
    }
    int kind, failures = 0;
    while (std::fread(&kind, 4, 1, f) == 1)
        failures += !(kind == 0 ? compress_case() : kind == 1 ? select_case() : keys_case());
    std::printf("%s\n", failures ? "FAILED" : "all ok");
    return failures ? 1 : 0;
}
