// Checks the prompt batches' routing kernels of cu/moe_batch.cuh on the CPU (sim.h):
// - bl_moe_route: each stack expert's list is exactly the entries whose (mapped) id is it, in
//   entry order, and its count their number; bad ids (error 4) and unmapped experts are listed
//   nowhere; nothing past a list's count is written. One chunk, two chunks with a partial word,
//   a few entries; blocks in index and in shuffled order.
// - bl_moe_tiles: the tiles of every expert in expert order, then (-1, 0) up to max_tiles.
// - bl_moe_glu_q8_1: bit for bit the Q8_1 blocks that the f32 GLU quantized a warp per block
//   (quantize_lane, as bl_quantize_q8_1) gives, for SwiGLU, SwiGLU with a limit and GEGLU, with
//   a grid smaller than the work and a last warp past the end.
// - bl_moe_combine: bit for bit the weighted sum, output by output in slot order, of the entries
//   whose expert is valid and mapped, with a grid smaller than the work.
// Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/quant.cuh"
#define PER_WTYPE(DEF) DEF(1)
#include "../cu/moe.cuh"
#define MMQ_BN 64
#include "../cu/moe_batch.cuh"

static std::mt19937 rng(11);

struct RouteCase {
    const char* name;
    int entries, n_expert;
    bool mapped, bad_ids;
    unsigned shuffle;
};

static bool route_case(const RouteCase& c) {
    std::vector<int> ids(c.entries), map(c.n_expert);
    int n_stack = c.n_expert;
    if (c.mapped) {
        // Every third expert unmapped, the rest onto a stack in reverse order.
        n_stack = 0;
        for (int x = 0; x < c.n_expert; ++x) map[x] = x % 3 == 2 ? -1 : n_stack++;
        for (int x = 0; x < c.n_expert; ++x)
            if (map[x] >= 0) map[x] = n_stack - 1 - map[x];
    }
    // Skewed ids: a few hot experts, as routing gives.
    for (auto& x : ids) x = (int)(rng() % 4 == 0 ? rng() % 3 : rng() % c.n_expert);
    if (c.bad_ids) {
        ids[5] = -1;
        ids[c.entries - 1] = c.n_expert;
        ids[c.entries / 2] = c.n_expert + 40;
    }
    const long long stride = c.entries;
    std::vector<int> list((size_t)n_stack * stride, -7), count(n_stack, -7);
    int err = 0;
    g_block_shuffle = c.shuffle;
    launch(Dim3{(unsigned)n_stack, 1, 1}, ROUTE_THREADS, [&] {
        bl_moe_route(ids.data(), c.mapped ? map.data() : nullptr, c.entries, c.n_expert, list.data(), stride,
                     count.data(), &err);
    });
    g_block_shuffle = 0;
    int bad = 0, listed = 0;
    for (int e = 0; e < n_stack; ++e) {
        std::vector<int> want;
        for (int i = 0; i < c.entries; ++i) {
            int x = ids[i];
            if (x < 0 || x >= c.n_expert) continue;
            if (c.mapped) x = map[x];
            if (x == e) want.push_back(i);
        }
        listed += (int)want.size();
        if (count[e] != (int)want.size()) {
            if (bad++ < 4) printf("  expert %d: count %d, want %zu\n", e, count[e], want.size());
            continue;
        }
        for (size_t j = 0; j < want.size(); ++j)
            if (list[e * stride + j] != want[j] && bad++ < 4)
                printf("  expert %d entry %zu: %d, want %d\n", e, j, list[e * stride + j], want[j]);
        for (long long j = (long long)want.size(); j < stride; ++j)
            if (list[e * stride + j] != -7 && bad++ < 4) printf("  expert %d: written past its count at %lld\n", e, j);
    }
    const int want_err = c.bad_ids ? 4 : 0;
    if (err != want_err) {
        printf("  error word %d, want %d\n", err, want_err);
        ++bad;
    }
    printf("%s route %s: %d entries, %d listed over %d experts\n", bad ? "FAIL" : "ok  ", c.name, c.entries, listed,
           n_stack);
    return bad == 0;
}

static bool tiles_case(int n_expert) {
    std::vector<int> count(n_expert);
    int want_total = 0;
    for (auto& c : count) {
        c = (int)(rng() % 5 == 0 ? 0 : rng() % 300);
        want_total += (c + MMQ_BN - 1) / MMQ_BN;
    }
    const int max_tiles = want_total + 9;
    std::vector<int2> tiles(max_tiles + 4, make_int2(-9, -9));
    launch(Dim3{1, 1, 1}, TILES_THREADS, [&] { bl_moe_tiles(count.data(), n_expert, tiles.data(), max_tiles); });
    std::vector<int2> want;
    for (int e = 0; e < n_expert; ++e)
        for (int c = 0; c < count[e]; c += MMQ_BN) want.push_back(make_int2(e, c));
    while ((int)want.size() < max_tiles) want.push_back(make_int2(-1, 0));
    for (int i = 0; i < 4; ++i) want.push_back(make_int2(-9, -9));
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i)
        if ((tiles[i].x != want[i].x || tiles[i].y != want[i].y) && bad++ < 4)
            printf("  tile %zu: (%d, %d), want (%d, %d)\n", i, tiles[i].x, tiles[i].y, want[i].x, want[i].y);
    printf("%s tiles of %d experts: %d tiles\n", bad ? "FAIL" : "ok  ", n_expert, want_total);
    return bad == 0;
}

// bl_quantize_q8_1's body: a warp per 32-value block.
static void quantize_rows(const float* x, uint8_t* out, long long nblocks) {
    const long long b = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= nblocks) return;
    quantize_lane(x[b * 32 + (threadIdx.x & (WARP - 1))], out + b * 36);
}

static bool glu_case(const char* name, int entries, int n_ff, int kind, float limit, unsigned grid) {
    const long long gs = 2LL * n_ff, nblocks = (long long)entries * (n_ff / 32);
    std::vector<float> gu((size_t)entries * gs), h((size_t)entries * n_ff);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (auto& v : gu) v = nd(rng);
    for (long long i = 0; i < entries; ++i)
        for (int f = 0; f < n_ff; ++f) h[i * n_ff + f] = glu_one(gu[i * gs + f], gu[i * gs + n_ff + f], kind, limit);
    std::vector<uint8_t> want(nblocks * 36 + 64, 0xAB), got(nblocks * 36 + 64, 0xAB);
    launch(Dim3{(unsigned)((nblocks + 7) / 8), 1, 1}, 256, [&] { quantize_rows(h.data(), want.data(), nblocks); });
    launch(Dim3{grid, 1, 1}, 256, [&] {
        bl_moe_glu_q8_1(gu.data(), got.data(), entries, n_ff, kind, limit);
    });
    long long bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i] && bad++ < 4) printf("  byte %zu (block %zu): %d, want %d\n", i, i / 36, got[i], want[i]);
    printf("%s glu %s: %d entries x %d, grid %u\n", bad ? "FAIL" : "ok  ", name, entries, n_ff, grid);
    return bad == 0;
}

static bool combine_case(const char* name, int rows, int k, int n_embd, int n_expert, bool mapped, unsigned grid) {
    const int entries = rows * k;
    std::vector<int> ids(entries), map(n_expert);
    std::vector<float> w(entries), d((size_t)entries * n_embd), want((size_t)rows * n_embd);
    std::vector<float> got((size_t)rows * n_embd + 4, -7.0f);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int x = 0; x < n_expert; ++x) map[x] = x % 4 == 1 ? -1 : n_expert - 1 - x;
    for (int i = 0; i < entries; ++i) {
        // Every eleventh id out of range; an entry whose expert is skipped has rows of NaN.
        ids[i] = i % 11 == 5 ? n_expert + i % 3 : (int)(rng() % n_expert);
        w[i] = nd(rng);
        const bool used = ids[i] < n_expert && (!mapped || map[ids[i]] >= 0);
        for (int o = 0; o < n_embd; ++o) d[(size_t)i * n_embd + o] = used ? nd(rng) : NAN;
    }
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < n_embd; ++o) {
            float acc = 0.0f;
            for (int j = 0; j < k; ++j) {
                const int i = r * k + j, e = ids[i];
                if (e >= n_expert || (mapped && map[e] < 0)) continue;
                acc += w[i] * d[(size_t)i * n_embd + o];
            }
            want[(size_t)r * n_embd + o] = acc;
        }
    launch(Dim3{grid, 1, 1}, 256, [&] {
        bl_moe_combine(d.data(), ids.data(), mapped ? map.data() : nullptr, w.data(), got.data(), n_embd, k, rows,
                       n_expert);
    });
    long long bad = 0;
    for (size_t i = 0; i < want.size(); ++i)
        if (std::memcmp(&got[i], &want[i], 4) != 0 && bad++ < 4) printf("  out %zu: %g, want %g\n", i, got[i], want[i]);
    for (size_t i = want.size(); i < got.size(); ++i)
        if (got[i] != -7.0f && bad++ < 4) printf("  written past the end at %zu\n", i);
    printf("%s combine %s: %d rows x %d of %d\n", bad ? "FAIL" : "ok  ", name, rows, k, n_embd);
    return bad == 0;
}

int main() {
    bool ok = true;
    const RouteCase routes[] = {
        {"a 512-row prompt, top-8 of 128", 4096, 128, false, false, 0},
        {"one full chunk", 32768, 16, false, false, 0},
        {"two chunks, a partial word, mapped, bad ids", 32768 + 1000 + 5, 40, true, true, 0},
        {"two chunks, blocks shuffled", 32768 + 33, 24, false, false, 7},
        {"a few entries", 7, 5, true, false, 0},
    };
    for (const auto& c : routes) ok &= route_case(c);
    ok &= tiles_case(37);
    ok &= tiles_case(1024);
    ok &= glu_case("swiglu", 37, 96, 0, 0.0f, 2);
    ok &= glu_case("swiglu with a limit", 64, 768, 0, 3.0f, 40);
    ok &= glu_case("geglu", 9, 64, 1, 0.0f, 1);
    ok &= combine_case("top-8, mapped", 37, 8, 96, 24, true, 3);
    ok &= combine_case("top-2, unmapped", 5, 2, 2048, 7, false, 1);
    printf("%s\n", ok ? "all ok" : "FAILED");
    return ok ? 0 : 1;
}
