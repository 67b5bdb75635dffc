// Prints ggml's ggml_validate_row_data (llama.cpp b11434, the check behind --check-tensors) on
// two-block buffers of each type: all-zero blocks, then each two-byte word of the second block
// set to an f16 infinity (0x7c00), an f16 NaN (0x7e00) and 0xffff, one at a time; and for the
// float types a single bad value. One JSON line per type: {"type": ID, "block": BYTES,
// "cases": [[OFFSET, WORD, VALID], ...]}. Built and run by tests/oracle/make_data_check_golden.sh.
#include "ggml.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
    // ggml's stderr lines name each fault; only the verdicts matter here.
    freopen("/dev/null", "w", stderr);
    const int types[] = {0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                         22, 23, 24, 25, 26, 27, 28, 29, 30, 34, 35, 39, 40, 41};
    const uint16_t words[] = {0x7c00, 0x7e00, 0xffff, 0x3c00};
    for (int t : types) {
        const ggml_type type = (ggml_type) t;
        const size_t bs = ggml_type_size(type);
        printf("{\"type\":%d,\"block\":%zu,\"cases\":[", t, bs);
        bool first = true;
        for (size_t off = 0; off + 1 < bs || (bs == 1 && off == 0); off += (bs == 1 ? 1 : 2)) {
            for (uint16_t w : words) {
                std::vector<uint8_t> buf(2 * bs + 8, 0);
                // Wide types: the word in the high bytes of one value (f32 0x7f800000 etc).
                const size_t at = bs + off;
                buf[at] = (uint8_t) (w & 0xff);
                if (at + 1 < buf.size()) buf[at + 1] = (uint8_t) (w >> 8);
                if (bs == 4 || bs == 8) {
                    // Put the word in a value's top two bytes.
                    std::memset(&buf[bs], 0, bs);
                    buf[bs + bs - 2] = (uint8_t) (w & 0xff);
                    buf[bs + bs - 1] = (uint8_t) (w >> 8);
                }
                if (bs == 1) {
                    buf[1] = (uint8_t) (w >> 8);
                }
                const bool ok = ggml_validate_row_data(type, buf.data(), 2 * bs);
                printf("%s[%zu,%u,%s]", first ? "" : ",", off, (unsigned) w, ok ? "true" : "false");
                first = false;
            }
            if (bs == 1) break;
        }
        printf("]}\n");
    }
    return 0;
}
