// Checks the quantized K/V cache store of cu/cache_store.cuh (bl_cache_store_quant, with the block
// quantizers of cu/kv_quant.cuh) on the CPU (sim.h) against the CPU reference's quantizers
// (kernels/cpu: ggml's reference rules, bit-identical to the `gguf` package's for Q8_0, Q4_0,
// Q4_1, Q5_0 and Q5_1; IQ4_NL written from ggml's reference). tests/sim.rs writes the cases to the
// file named by argv[1]: per type, its kv_quant.cuh code, the row width, the row count and the
// bytes of a row (four int32), the rows (f32), then the CPU's quantized rows. The kernel stores
// the rows at shuffled positions of two slots of a cache; each stored row must equal the CPU's
// bytes, except that an IQ4_NL scale may differ in its last f16 bit (the card sums the scale's
// terms in another order, as llama.cpp's CUDA store does) and an IQ4_NL block of scale zero may
// hold any indices. Cache rows not stored must keep their
// bytes, and a bad slot must be reported (error 2) with nothing written. Prints one line per type;
// exits 1 on a failure.
#include "sim.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/cache_store.cuh"

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: cache_store_test CASES\n");
        return 2;
    }
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) {
        std::perror(argv[1]);
        return 2;
    }
    int failures = 0, types = 0;
    int head[4];
    while (std::fread(head, sizeof head, 1, f) == 1) {
        const int t = head[0], width = head[1], rows = head[2], rb = head[3];
        std::vector<float> x((size_t)rows * width);
        std::vector<uint8_t> want((size_t)rows * rb);
        if (std::fread(x.data(), 4, x.size(), f) != x.size() || std::fread(want.data(), 1, want.size(), f) != want.size()) {
            std::fprintf(stderr, "truncated cases file\n");
            return 2;
        }
        // Row r goes to slot r % 2 at position (7 * r + 3) % len of a cache of len = rows positions
        // per slot (distinct cells), the cache filled with 0xA5 first.
        const int len = rows, n_slots = 2;
        std::vector<int> slots(rows), pos(rows);
        for (int r = 0; r < rows; ++r) {
            slots[r] = r % 2;
            pos[r] = (7 * r + 3) % len;
        }
        std::vector<uint8_t> cache((size_t)n_slots * len * rb, 0xA5);
        int err = 0;
        // The launcher's geometry (ops/cache_store.rs: a block of 128 threads per row).
        launch(Dim3{(unsigned)rows, 1, 1}, 128, [&] {
            bl_cache_store_quant(x.data(), cache.data(), slots.data(), pos.data(), width, len, n_slots, t, &err);
        });
        long long bad = 0;
        std::vector<bool> stored((size_t)n_slots * len, false);
        for (int r = 0; r < rows; ++r) {
            const size_t cell = (size_t)slots[r] * len + pos[r];
            stored[cell] = true;
            const uint8_t* got = cache.data() + cell * rb;
            const uint8_t* w = want.data() + (size_t)r * rb;
            const int bb = kv_block_bytes(t);
            for (int b = 0; b < rb; ++b) {
                if (got[b] == w[b]) continue;
                // IQ4_NL: a block of scale zero (either sign) on both sides holds zeros whatever its indices.
                if (t == KV_IQ4_NL) {
                    const int o = b - b % bb;
                    if (!(got[o] | (got[o + 1] & 0x7f) | w[o] | (w[o + 1] & 0x7f))) continue;
                }
                // IQ4_NL: the scale (bytes 0..1 of a block) one f16 unit apart.
                if (t == KV_IQ4_NL && b % bb < 2) {
                    const int o = b - b % bb;
                    const int g = got[o] | got[o + 1] << 8, c = w[o] | w[o + 1] << 8;
                    if (std::abs(g - c) <= 1) continue;
                }
                if (bad < 3) std::printf("  type %d row %d byte %d: %d, the CPU %d\n", t, r, b, got[b], w[b]);
                ++bad;
            }
        }
        for (size_t cell = 0; cell < stored.size(); ++cell)
            if (!stored[cell])
                for (int b = 0; b < rb; ++b)
                    if (cache[cell * rb + b] != 0xA5) {
                        if (bad < 3) std::printf("  type %d: cell %zu not stored but written\n", t, cell);
                        ++bad;
                        break;
                    }
        // A bad slot: error 2, its row not written.
        std::vector<uint8_t> before = cache;
        int bad_slot[1] = {2}, zero_pos[1] = {0}, err2 = 0;
        launch(Dim3{1, 1, 1}, 32, [&] {
            bl_cache_store_quant(x.data(), cache.data(), bad_slot, zero_pos, width, len, n_slots, t, &err2);
        });
        const bool slot_ok = err == 0 && err2 == 2 && cache == before;
        std::printf("%s type %d: %d rows of %d, %lld bytes differ%s\n", bad || !slot_ok ? "FAIL" : "ok  ", t, rows,
                    width, bad, slot_ok ? "" : ", bad slot not refused as error 2");
        failures += bad > 0 || !slot_ok;
        ++types;
    }
    std::printf(failures ? "cache store cases FAILED\n" : "all %d cache store types passed\n", types);
    return failures ? 1 : 0;
}
