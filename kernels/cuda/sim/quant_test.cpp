// Checks the weight readers of cu/quant.cuh on the CPU (sim.h): every value of every sub-block that
// unpack_sub gives (through sub_value, rounded as the kernels use it) against the CPU reference's
// dequantizer (kernels/cpu, itself checked against the `gguf` package's), bit for bit. tests/sim.rs
// writes the cases to the file named by argv[1]: per weight type, its code, block count, block
// bytes and values per block (four int32), the blocks (random bytes), then the CPU's f32 values.
// Where the CPU's value is not finite (a random scale can be NaN or infinite), the kernel's must
// not be finite either. Prints one line per type, with how many values were finite; exits 1 on a
// failure.
#include "sim.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../cu/common.cuh"
#include "../cu/quant.cuh"

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: quant_test CASES\n");
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
        const int wtype = head[0], blocks = head[1], bytes = head[2], per = head[3];
        std::vector<uint8_t> row((size_t)blocks * bytes);
        std::vector<float> want((size_t)blocks * per);
        if (std::fread(row.data(), 1, row.size(), f) != row.size() ||
            std::fread(want.data(), 4, want.size(), f) != want.size()) {
            std::fprintf(stderr, "truncated cases file\n");
            return 2;
        }
        long long bad = 0, finite = 0;
        for (int sb = 0; sb < blocks * per / 32; ++sb) {
            Sub s;
            unpack_sub(row.data(), wtype, sb, &s);
            for (int i = 0; i < 32; ++i) {
                const float v = sub_value(&s, i), w = want[(size_t)sb * 32 + i];
                finite += std::isfinite(w);
                const bool same = std::isfinite(w) ? std::memcmp(&v, &w, 4) == 0 : !std::isfinite(v);
                if (!same) {
                    if (bad < 3) std::printf("  wtype %d value %d: %g, the CPU %g\n", wtype, sb * 32 + i, v, w);
                    ++bad;
                }
            }
        }
        // Mostly finite values, or the comparison above says little.
        if (finite * 2 < (long long)want.size()) ++bad;
        std::printf("wtype %2d: %s (%zu values, %lld finite, %lld differ)\n", wtype, bad ? "FAIL" : "ok", want.size(),
                    finite, bad);
        failures += bad != 0;
        ++types;
    }
    std::fclose(f);
    if (types == 0) {
        std::printf("no cases\n");
        return 1;
    }
    return failures ? 1 : 0;
}
