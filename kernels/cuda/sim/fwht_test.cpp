// Checks the Walsh-Hadamard rotation of quantized K/V caches (bl_fwht_f32 of cu/cache_store.cuh)
// on the CPU (sim.h) against the CPU reference's (kernels/cpu ops/hadamard.rs), bit for bit, out of
// place and in place, with the launcher's geometry (ops/rotate.rs: a block per chunk of n values,
// min(n / 2, 128) threads). tests/sim.rs writes the cases to the file named by argv[1]: per case
// the chunk n and the value count (two int32), the values, then the reference's rotation (f32).
// Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/cache_store.cuh"

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: fwht_test CASES\n");
        return 2;
    }
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) {
        std::perror(argv[1]);
        return 2;
    }
    int failures = 0, cases = 0, head[2];
    while (std::fread(head, sizeof head, 1, f) == 1) {
        const int n = head[0], count = head[1];
        std::vector<float> x(count), want(count), y(count, -1.0f);
        if (std::fread(x.data(), 4, count, f) != (size_t)count || std::fread(want.data(), 4, count, f) != (size_t)count) {
            std::fprintf(stderr, "truncated cases file\n");
            return 2;
        }
        const unsigned threads = n / 2 < 1 ? 1 : (n / 2 > 128 ? 128 : n / 2);
        launch(Dim3{(unsigned)(count / n), 1, 1}, threads, [&] { bl_fwht_f32(x.data(), y.data(), n); });
        std::vector<float> inplace = x;
        launch(Dim3{(unsigned)(count / n), 1, 1}, threads, [&] { bl_fwht_f32(inplace.data(), inplace.data(), n); });
        const bool ok = std::memcmp(y.data(), want.data(), 4 * (size_t)count) == 0 &&
                        std::memcmp(inplace.data(), want.data(), 4 * (size_t)count) == 0;
        std::printf("%s chunks of %d over %d values\n", ok ? "ok  " : "FAIL", n, count);
        failures += !ok;
        ++cases;
    }
    std::printf(failures ? "rotation cases FAILED\n" : "all %d rotation cases passed\n", cases);
    return failures ? 1 : 0;
}
