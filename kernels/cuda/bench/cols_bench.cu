// Times the few-column quantized products (2 .. 8 activation columns: decode passes of several
// streams) on the card, each kernel replayed from a CUDA graph over a pool of weight copies larger
// than L2 (so weights come from DRAM as in a decode step), and checks every form against
// bl_matmul_q_cols. Built here with the pinned nvcc (its static CUDA runtime) and carried in dist/:
//   cu=target/cuda-tools/.venv/lib/python3.11/site-packages/nvidia/cu13
//   "$cu/bin/nvcc" -O3 -arch=sm_90 -L"$cu/lib" -o dist/cols_bench kernels/cuda/bench/cols_bench.cu
// then run on the GPU machine: dist/cols_bench.
// Prints one line per (shape, type, columns, form): microseconds a launch and GB/s of weights,
// then Q, K and V of a layer as three launches against one parts launch;
// exits 1 when a form's outputs differ from bl_matmul_q_cols' by more than 1e-5 of their largest.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "../cu/kernels.cu"
#include "check.cuh"

struct Shape {
    const char* name;
    int n, k;
};

static size_t row_bytes(int wt, int k) { return wt == WT_Q8_0 ? (size_t)k / 32 * 34 : (size_t)k / 256 * 144; }

// Random weight rows with finite, small scales.
static std::vector<uint8_t> random_rows(int wt, int n, int k, std::mt19937& rng) {
    std::vector<uint8_t> b(row_bytes(wt, k) * n);
    for (auto& v : b) v = (uint8_t)rng();
    const size_t blk = wt == WT_Q8_0 ? 34 : 144;
    for (size_t o = 0; o < b.size(); o += blk) {
        const __half d = __float2half(0.002f + 0.001f * (float)(rng() % 8));
        memcpy(&b[o], &d, 2);
        if (wt == WT_Q4_K) {
            const __half m = __float2half(0.001f * (float)(rng() % 8));
            memcpy(&b[o + 2], &m, 2);
        }
    }
    return b;
}

// Launches one form; false where it does not apply.
using Launch = bool (*)(const uint8_t* w, long long stride, const uint8_t* xq, long long x_row, float* y, int k, int n,
                        int m, int wt, cudaStream_t s);

static bool run_cols(const uint8_t* w, long long stride, const uint8_t* xq, long long x_row, float* y, int k, int n,
                     int m, int wt, cudaStream_t s) {
    bl_matmul_q_cols<<<(n + 3) / 4, 128, 0, s>>>(w, stride, xq, x_row, y, k, n, m, wt);
    return true;
}

static bool run_single(const uint8_t* w, long long stride, const uint8_t* xq, long long x_row, float* y, int k, int n,
                       int m, int wt, cudaStream_t s) {
    const int smem = k / 64 * STAGE_PAIR * 2;
    const long long tasks = (long long)n * m;
    if (wt == WT_Q8_0)
        bl_matmul_q_1<<<(tasks + 7) / 8, 256, smem, s>>>(w, stride, xq, x_row, y, k, n, m);
    else
        bl_matmul_q_2<<<(tasks + 7) / 8, 256, smem, s>>>(w, stride, xq, x_row, y, k, n, m);
    return true;
}

// bl_matmul_q_few_<wt>_<M>_<R> as src/ops/matmul.rs launches it (M: columns per pass).
static bool run_few_r(const uint8_t* w, long long stride, const uint8_t* xq, long long x_row, float* y, int k, int n,
                      int m, int wt, int R, cudaStream_t s) {
    const int M = m <= 2 ? 2 : m <= 4 ? 4 : 8;
    const dim3 grid((n + 4 * R - 1) / (4 * R), (m + M - 1) / M);
#define FEW_CASE(T, MM, RR)                                                                   \
    if (wt == T && M == MM && R == RR) {                                                      \
        bl_matmul_q_few_##T##_##MM##_##RR<<<grid, 128, 0, s>>>(w, stride, xq, x_row, y, k, n, m); \
        return true;                                                                          \
    }
#define FEW_CASES(T, RR) FEW_CASE(T, 2, RR) FEW_CASE(T, 4, RR) FEW_CASE(T, 8, RR)
    FEW_CASES(1, 1) FEW_CASES(1, 2) FEW_CASES(1, 4) FEW_CASES(2, 1) FEW_CASES(2, 2)
    return false;
}

// The host's choice of R (src/ops/matmul.rs `few_cols`).
static int host_rows(int wt, int n) { return wt == WT_Q8_0 && n >= 2048 ? 4 : n >= 1024 ? 2 : 1; }

template <int R>
static bool run_few(const uint8_t* w, long long stride, const uint8_t* xq, long long x_row, float* y, int k, int n,
                    int m, int wt, cudaStream_t s) {
    return m > 1 && run_few_r(w, stride, xq, x_row, y, k, n, m, wt, R, s);
}

static bool run_pick(const uint8_t* w, long long stride, const uint8_t* xq, long long x_row, float* y, int k, int n,
                     int m, int wt, cudaStream_t s) {
    return m > 1 && run_few_r(w, stride, xq, x_row, y, k, n, m, wt, host_rows(wt, n), s);
}

struct Form {
    const char* name;
    Launch run;
};

static const Form FORMS[] = {
    {"q_cols (types without pair form)", run_cols},
    {"single-row kernel, warp per (row, col)", run_single},
    {"few, 1 row a warp", run_few<1>},
    {"few, 2 rows a warp", run_few<2>},
    {"few, 4 rows a warp", run_few<4>},
    {"few, the host's pick", run_pick},
};

// Microseconds per call of `body(i)` (i = 0 .. 63), captured once into a CUDA graph and replayed:
// the best of five replays over 64.
static double graph_us(cudaStream_t s, const std::function<void(int)>& body) {
    const int launches = 64;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < launches; ++i) body(i);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(ge, s));
    float best = 1e30f;
    for (int rep = 0; rep < 5; ++rep) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = fminf(best, ms);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return best * 1000.0 / launches;
}

// The n outputs at `dev` against `ref` (bl_matmul_q_cols'): the largest difference and output.
// Same products, sums in another order: they agree to ~1e-6 of the largest output, so more than
// 1e-5 of it is wrong.
struct Agreement {
    double worst = 0.0, scale = 0.0;
    bool bad() const { return !(worst <= 1e-5 * scale); }
};
static Agreement compare(const float* ref_dev, const float* dev, size_t n) {
    std::vector<float> ref(n), got(n);
    CK(cudaMemcpy(ref.data(), ref_dev, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got.data(), dev, n * 4, cudaMemcpyDeviceToHost));
    Agreement a;
    for (size_t i = 0; i < n; ++i) {
        a.scale = fmax(a.scale, fabs(ref[i]));
        const double d = fabs((double)got[i] - ref[i]);
        a.worst = (d == d) ? fmax(a.worst, d) : 1e30;
    }
    return a;
}

int main() {
    const Shape shapes[] = {{"Q 4096x2048", 4096, 2048}, {"K/V 512x2048", 512, 2048}, {"O 2048x4096", 2048, 4096}};
    const int types[] = {WT_Q8_0, WT_Q4_K};
    const int cols[] = {1, 2, 3, 4, 8, 15};
    std::mt19937 rng(7);
    bool failed = false;
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    float *y, *yref, *x;
    uint8_t* xq;
    CK(cudaMalloc(&y, 16 * 4096 * 4));
    CK(cudaMalloc(&yref, 16 * 4096 * 4));
    CK(cudaMalloc(&x, 16 * 4096 * 4));
    CK(cudaMalloc(&xq, 16 * 4096 / 32 * 36));
    for (const Shape& sh : shapes)
        for (int wt : types) {
            const size_t rb = row_bytes(wt, sh.k), mb = rb * sh.n;
            const int copies = (int)((512ull << 20) / mb + 1);
            uint8_t* pool;
            CK(cudaMalloc(&pool, mb * copies));
            const std::vector<uint8_t> host = random_rows(wt, sh.n, sh.k, rng);
            for (int c = 0; c < copies; ++c) CK(cudaMemcpy(pool + mb * c, host.data(), mb, cudaMemcpyHostToDevice));
            for (int m : cols) {
                std::vector<float> hx((size_t)m * sh.k);
                for (auto& v : hx) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
                CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
                const long long x_row = sh.k / 32 * 36;
                const long long nblocks = (long long)m * sh.k / 32;
                bl_quantize_q8_1<<<(nblocks + 7) / 8, 256, 0, s>>>(x, xq, nblocks);
                run_cols(pool, rb, xq, x_row, yref, sh.k, sh.n, m, wt, s);
                for (const Form& f : FORMS) {
                    CK(cudaMemset(y, 0xFF, (size_t)m * sh.n * 4));
                    if (!f.run(pool, rb, xq, x_row, y, sh.k, sh.n, m, wt, s)) continue;
                    const Agreement ag = compare(yref, y, (size_t)m * sh.n);
                    failed |= ag.bad();
                    const double us = graph_us(s, [&](int i) {
                        f.run(pool + mb * (i % copies), rb, xq, x_row, y, sh.k, sh.n, m, wt, s);
                    });
                    printf("%-14s %-5s m=%-2d %-40s %8.2f us %7.0f GB/s  max|diff| %.2e of %.2e%s\n", sh.name,
                           wt == WT_Q8_0 ? "Q8_0" : "Q4_K", m, f.name, us, mb / us / 1e3, ag.worst, ag.scale,
                           ag.bad() ? "  WRONG" : "");
                }
            }
            CK(cudaFree(pool));
        }
    // Q, K and V of one layer (4096, 512 and 512 rows of 2048 values): three few-column launches
    // against one bl_matmul_q_few_parts launch (R by the widest part, as
    // ops/fused/matmul_parts.rs picks it).
    for (int wt : types) {
        const int k = 2048, ns[3] = {4096, 512, 512};
        const size_t rb = row_bytes(wt, k);
        size_t layer = 0;
        for (int n : ns) layer += rb * n;
        const int copies = (int)((512ull << 20) / layer + 1);
        uint8_t* pool;
        CK(cudaMalloc(&pool, layer * copies));
        const std::vector<uint8_t> host = random_rows(wt, 5120, k, rng);
        for (int c = 0; c < copies; ++c) CK(cudaMemcpy(pool + layer * c, host.data(), layer, cudaMemcpyHostToDevice));
        float* out[3];
        for (int i = 0; i < 3; ++i) CK(cudaMalloc(&out[i], 16 * 4096 * 4));
        for (int m : {2, 4, 8}) {
            std::vector<float> hx((size_t)m * k);
            for (auto& v : hx) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
            CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
            const long long x_row = k / 32 * 36, nblocks = (long long)m * k / 32;
            bl_quantize_q8_1<<<(nblocks + 7) / 8, 256, 0, s>>>(x, xq, nblocks);
            const int R = host_rows(wt, ns[0]), M = m <= 2 ? 2 : m <= 4 ? 4 : 8;
            auto parts = [&](const uint8_t* base) {
                MatmulPart p[3];
                size_t off = 0;
                for (int i = 0; i < 3; ++i) {
                    p[i] = MatmulPart{base + off, (long long)rb, out[i], ns[i]};
                    off += rb * ns[i];
                }
                const int warps = (ns[0] + R - 1) / R + 2 * ((ns[1] + R - 1) / R);
                const dim3 grid((warps + 3) / 4, (m + M - 1) / M);
#define PARTS_CASE(T, MM, RR)                                                                                  \
    if (wt == T && M == MM && R == RR)                                                                         \
        bl_matmul_q_few_parts_##T##_##MM##_##RR<<<grid, 128, 0, s>>>(p[0], p[1], p[2], xq, x_row, k, m);
#define PARTS_CASES(T, RR) PARTS_CASE(T, 2, RR) PARTS_CASE(T, 4, RR) PARTS_CASE(T, 8, RR)
                PARTS_CASES(1, 1) PARTS_CASES(1, 2) PARTS_CASES(1, 4) PARTS_CASES(2, 1) PARTS_CASES(2, 2)
            };
            auto three = [&](const uint8_t* base) {
                size_t off = 0;
                for (int i = 0; i < 3; ++i) {
                    run_pick(base + off, rb, xq, x_row, out[i], k, ns[i], m, wt, s);
                    off += rb * ns[i];
                }
            };
            // Check the parts launch against bl_matmul_q_cols part by part.
            for (int i = 0; i < 3; ++i) CK(cudaMemset(out[i], 0xFF, (size_t)m * ns[i] * 4));
            parts(pool);
            size_t off = 0;
            for (int i = 0; i < 3; ++i) {
                run_cols(pool + off, rb, xq, x_row, yref, k, ns[i], m, wt, s);
                off += rb * ns[i];
                const Agreement ag = compare(yref, out[i], (size_t)m * ns[i]);
                if (ag.bad()) {
                    printf("QKV parts %s m=%d part %d: max|diff| %.2e of %.2e  WRONG\n", wt == WT_Q8_0 ? "Q8_0" : "Q4_K", m,
                           i, ag.worst, ag.scale);
                    failed = true;
                }
            }
            for (int form = 0; form < 2; ++form) {
                const double us = graph_us(s, [&](int i) {
                    if (form == 0)
                        three(pool + layer * (i % copies));
                    else
                        parts(pool + layer * (i % copies));
                });
                printf("QKV 5120x2048   %-5s m=%-2d %-40s %8.2f us a layer\n", wt == WT_Q8_0 ? "Q8_0" : "Q4_K", m,
                       form == 0 ? "three few-column launches" : "one parts launch", us);
            }
        }
        for (int i = 0; i < 3; ++i) CK(cudaFree(out[i]));
        CK(cudaFree(pool));
    }
    CK(cudaGetLastError());
    if (failed) fprintf(stderr, "cols_bench: some form disagrees with bl_matmul_q_cols\n");
    return failed ? 1 : 0;
}
