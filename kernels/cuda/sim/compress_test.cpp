// Checks DeepSeek-V4's compressor and indexer (cu/compress.cuh: bl_compress_f32 then
// bl_compress_store_f32, and bl_comp_select_f32) on the CPU (sim.h) against transformers 5.24
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
// (int32). Prints one line per record; exits 1 on a failure.
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
            bl_compress_f32(k, s, ape.data(), norm.data(), raw.data(), comp.data(), slots.data(), pos.data(), ratio,
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
    while (std::fread(&kind, 4, 1, f) == 1) failures += !(kind == 0 ? compress_case() : select_case());
    std::printf("%s\n", failures ? "FAILED" : "all ok");
    return failures ? 1 : 0;
}
