// A CPU emulation of the few CUDA features the sequence-state kernels (cu/recurrent.cuh), the
// routing kernels (cu/router.cuh), the decode attention (cu/attn_split.cuh), the routed experts'
// decode kernels (cu/moe.cuh, with the weight readers of cu/quant.cuh), the prompt batches' route
// table, tile list, GLU and combine (cu/moe_batch.cuh), the tiled f32 product (cu/gemm_f32.cuh),
// the per-head norm + RoPE (cu/rope.cuh) and the tiled quantized products (cu/mmq.cuh, with the
// tensor-core primitives of sim/mma.h) use, so that their source can be checked without a
// GPU (tests/sim.rs builds and runs the *_test.cpp files here with the host C++ compiler). Blocks
// run one after another; the threads of a block are fibers (ucontext) on the calling thread, each
// running until it waits at a barrier (the block's for __syncthreads, its warp's for shuffles,
// ballots and the mma exchanges), then the next: a barrier costs a context switch a thread, not
// the futex wake-ups of as many OS threads. Every lane of a warp must take part in a shuffle, and
// a block must leave a kernel as a whole before a barrier, as the kernels under test do.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <ucontext.h>
#include <vector>

struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline Dim3 blockIdx, blockDim, gridDim;
// The running fiber's (launch sets it before resuming each).
inline Dim3 threadIdx;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define WARP 32
// No programmatic dependent launch on the host threads (cu/kernels.cu defines it for the card).
#define KERNEL_ENTRY() \
    do {               \
    } while (0)
using std::isnan;
using std::max;
using std::min;

// The emulated threads: one fiber each, resumed in turn by launch's loop. On x86-64 a switch
// saves the callee-saved registers on the fiber's stack and swaps stack pointers (no system
// call); elsewhere it is ucontext's, which also saves the signal mask.
#if defined(__x86_64__)
extern "C" void sim_switch(void** from, void* to);
asm(R"(
.text
.globl sim_switch
.type sim_switch,@function
sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size sim_switch, .-sim_switch
)");
struct FiberContext {
    void* sp = nullptr;
};
inline FiberContext g_sched;
inline FiberContext* g_running;
inline void fiber_switch(FiberContext* from, FiberContext* to) { sim_switch(&from->sp, to->sp); }
// A fiber about to start `entry` on `stack`: its first switch pops six zero registers and
// returns into `entry` with the stack aligned as after a call.
inline void fiber_make(FiberContext* f, char* stack, size_t size, void (*entry)()) {
    auto top = (uintptr_t)(stack + size) & ~(uintptr_t)15;
    auto* slot = (void**)(top - 16);
    slot[0] = (void*)entry;
    slot[1] = nullptr;
    for (int i = 1; i <= 6; ++i) slot[-i] = nullptr;
    f->sp = slot - 6;
}
#else
struct FiberContext {
    ucontext_t uc;
};
inline FiberContext g_sched;
inline FiberContext* g_running;
inline void fiber_switch(FiberContext* from, FiberContext* to) { swapcontext(&from->uc, &to->uc); }
inline void fiber_make(FiberContext* f, char* stack, size_t size, void (*entry)()) {
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = stack;
    f->uc.uc_stack.ss_size = size;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, entry, 0);
}
#endif

// A barrier of `count` fibers: the last to arrive goes on, the others yield until it has.
struct SimBarrier {
    explicit SimBarrier(unsigned n) : count(n) {}
    void arrive_and_wait() {
        const unsigned long my = phase;
        if (++arrived == count) {
            arrived = 0;
            ++phase;
            return;
        }
        while (phase == my) fiber_switch(g_running, &g_sched);
    }
    unsigned count, arrived = 0;
    unsigned long phase = 0;
};

struct WarpExchange {
    SimBarrier bar{WARP};
    alignas(8) unsigned char v[WARP][8];
    bool b[WARP];
};
inline SimBarrier* g_block_barrier;
inline std::vector<std::unique_ptr<WarpExchange>> g_warps;

inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
// The block's OR of `pred` (nonzero when any thread's is), after a barrier.
inline int g_sync_or = 0;
inline int __syncthreads_or(int pred) {
    if (pred) g_sync_or = 1;
    g_block_barrier->arrive_and_wait();
    const int any = g_sync_or;
    g_block_barrier->arrive_and_wait();
    if (threadIdx.x == 0) g_sync_or = 0;
    g_block_barrier->arrive_and_wait();
    return any;
}
// A barrier of the calling thread's warp (every lane must reach it, as the kernels under test do).
inline void __syncwarp(unsigned = 0xffffffffu) { g_warps[threadIdx.x / WARP]->bar.arrive_and_wait(); }

// Lane `src(lane)`'s v, for values of up to 8 bytes (float, int, double).
template <typename T, typename Src>
inline T shuffle(T v, Src src) {
    static_assert(sizeof(T) <= 8);
    const unsigned lane = threadIdx.x % WARP;
    WarpExchange& w = *g_warps[threadIdx.x / WARP];
    std::memcpy(w.v[lane], &v, sizeof(T));
    w.bar.arrive_and_wait();
    T r;
    std::memcpy(&r, w.v[src(lane) % WARP], sizeof(T));
    w.bar.arrive_and_wait();
    return r;
}

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    return shuffle(v, [&](unsigned lane) { return lane ^ (unsigned)lane_mask; });
}

template <typename T>
inline T __shfl_sync(unsigned, T v, int src_lane) {
    return shuffle(v, [&](unsigned) { return (unsigned)src_lane; });
}

// Lane - delta's v (lanes below delta keep their own).
template <typename T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
    return shuffle(v, [&](unsigned lane) { return lane >= delta ? lane - delta : lane; });
}

inline unsigned __ballot_sync(unsigned, bool p) {
    const unsigned lane = threadIdx.x % WARP;
    WarpExchange& w = *g_warps[threadIdx.x / WARP];
    w.b[lane] = p;
    w.bar.arrive_and_wait();
    unsigned r = 0;
    for (unsigned i = 0; i < WARP; ++i) r |= (w.b[i] ? 1u : 0u) << i;
    w.bar.arrive_and_wait();
    return r;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }

inline bool __any_sync(unsigned mask, bool p) { return __ballot_sync(mask, p) != 0; }

inline int atomicCAS(int* a, int expected, int desired) {
    std::atomic_ref<int>(*a).compare_exchange_strong(expected, desired);
    return expected;
}

inline int atomicAdd(int* a, int v) { return std::atomic_ref<int>(*a).fetch_add(v); }
inline float atomicAdd(float* a, float v) { return std::atomic_ref<float>(*a).fetch_add(v); }

// Blocks run one after another on shared host memory: fences and cache hints have nothing to do.
inline void __threadfence() {}
template <typename T>
inline T __ldcg(const T* p) {
    return *p;
}

// Vector types (the 16-byte ones 16-byte aligned, as on the card: a misaligned load faults here
// too) and f16 storage: GCC's _Float16 rounds to nearest even as __float2half_rn does.
struct float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct int2 {
    int x, y;
};
inline int2 make_int2(int x, int y) { return {x, y}; }
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct __half {
    _Float16 v;
};
struct __half2 {
    __half x, y;
};
inline __half __float2half_rn(float f) { return {(_Float16)f}; }
inline float __half2float(__half h) { return (float)h.v; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline float2 __half22float2(__half2 h) { return {(float)h.x.v, (float)h.y.v}; }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }

// The integer and bit intrinsics of the quantized weight readers (cu/quant.cuh).
struct alignas(16) int4 {
    int x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline __half __ushort_as_half(unsigned short b) {
    __half h;
    std::memcpy(&h, &b, 2);
    return h;
}
inline unsigned short __half_as_ushort(__half h) {
    unsigned short b;
    std::memcpy(&b, &h, 2);
    return b;
}
inline unsigned __float_as_uint(float f) {
    unsigned b;
    std::memcpy(&b, &f, 4);
    return b;
}
inline float __uint_as_float(unsigned b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
// c + the sum of the four signed byte products of a and b.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
// Bytewise a - b, each byte modulo 256.
inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((((a >> (8 * i)) & 0xFFu) - ((b >> (8 * i)) & 0xFFu)) & 0xFFu) << (8 * i);
    return r;
}
// Byte i of the result is byte (s >> 4i) & 7 of the eight bytes y:x (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
    return r;
}
// The low 32 bits of hi:lo shifted right by s & 31.
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (s & 31));
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }

// Nonzero: the next launches run their blocks in an order shuffled with this seed (a launch's
// blocks may run in any order on the card), not in index order.
inline unsigned g_block_shuffle = 0;

// The body the fibers of the running launch run, and the index of the fiber starting now.
inline const std::function<void(unsigned)>* g_fiber_body;
inline unsigned g_fiber_index;
// A fiber's start: its body, then back to launch's loop for good (launch sees it done).
inline void fiber_main() {
    (*g_fiber_body)(g_fiber_index);
    for (;;) fiber_switch(g_running, &g_sched);
}

// Bytes of stack a fiber has (kernels keep small arrays in "registers").
constexpr size_t FIBER_STACK = 256 << 10;

// Runs `kernel` on every block of `grid` with `threads` threads (a multiple of WARP).
inline void launch(Dim3 grid, unsigned threads, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = Dim3{threads, 1, 1};
    SimBarrier bar(threads);
    g_block_barrier = &bar;
    g_warps.clear();
    for (unsigned w = 0; w < threads / WARP; ++w) g_warps.push_back(std::make_unique<WarpExchange>());
    const unsigned long blocks = (unsigned long)grid.x * grid.y * grid.z;
    std::vector<unsigned long> order(blocks);
    for (unsigned long b = 0; b < blocks; ++b) order[b] = b;
    if (g_block_shuffle) std::shuffle(order.begin(), order.end(), std::mt19937(g_block_shuffle));
    std::vector<char> done(threads, 0);
    const std::function<void(unsigned)> body = [&](unsigned t) {
        for (const unsigned long b : order) {
            if (t == 0)
                blockIdx = Dim3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                                (unsigned)(b / ((unsigned long)grid.x * grid.y))};
            bar.arrive_and_wait();
            kernel();
            bar.arrive_and_wait();
        }
        done[t] = 1;
    };
    g_fiber_body = &body;
    std::vector<FiberContext> fibers(threads);
    std::vector<std::unique_ptr<char[]>> stacks(threads);
    for (unsigned t = 0; t < threads; ++t) {
        stacks[t].reset(new char[FIBER_STACK]);
        fiber_make(&fibers[t], stacks[t].get(), FIBER_STACK, fiber_main);
    }
    for (unsigned left = threads; left > 0;) {
        left = 0;
        for (unsigned t = 0; t < threads; ++t) {
            if (done[t]) continue;
            threadIdx = Dim3{t, 0, 0};
            g_fiber_index = t;
            g_running = &fibers[t];
            fiber_switch(&g_sched, &fibers[t]);
            left += !done[t];
        }
    }
}
