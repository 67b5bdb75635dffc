// Whether the host's memory serves the CPU's reads and host-to-card copies at once: the question
// behind streaming a share of each layer's host experts to the card during decode while the CPU
// computes the rest (issue 6). Measures, for 1 second each: the CPU threads streaming reads of a
// 4 GiB buffer alone; page-locked host-to-card copies alone; both at once; and a card kernel
// reading page-locked memory in place (mapped, no copy: as a routed-expert kernel could read a
// streamed expert) 8 MiB a launch (about three Q4_K experts of the 30B-A3B shape), alone and with
// the CPU threads. Built here as cols_bench is (`$cu` as there) and run on the GPU machine:
//   "$cu/bin/nvcc" -O3 -arch=sm_90 -Xcompiler -O3,-mavx2 -L"$cu/lib" -o dist/host_share_bench \
//     kernels/cuda/bench/host_share_bench.cu
// Prints GB/s for each side in each phase.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "check.cuh"

using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// Each of `threads` threads sums its slice of `buf` (n words) over and over until `stop`; returns
// the bytes read per second. The sums go to `sink` so the reads are not dropped.
static double cpu_reads(const uint64_t* buf, size_t n, int threads, const std::atomic<bool>& stop,
                        std::atomic<uint64_t>& sink) {
    std::atomic<uint64_t> bytes{0};
    std::vector<std::thread> pool;
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
            uint64_t s = 0, done = 0;
            while (!stop.load(std::memory_order_relaxed)) {
                for (size_t i = lo; i < hi; i += 4096) {
                    const size_t end = i + 4096 < hi ? i + 4096 : hi;
                    for (size_t j = i; j < end; ++j) s += buf[j];
                    done += (end - i) * 8;
                    if (stop.load(std::memory_order_relaxed)) break;
                }
            }
            bytes += done;
            sink += s;
        });
    for (auto& th : pool) th.join();
    return bytes / seconds_since(t0);
}

// Host-to-card copies of `chunk` bytes from page-locked `src` until `stop`; bytes per second.
static double copies(const uint8_t* src, uint8_t* dst, size_t chunk, cudaStream_t s, const std::atomic<bool>& stop) {
    size_t done = 0;
    const auto t0 = Clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
        CK(cudaMemcpyAsync(dst, src, chunk, cudaMemcpyHostToDevice, s));
        CK(cudaStreamSynchronize(s));
        done += chunk;
    }
    return done / seconds_since(t0);
}

// Reads n 16-byte words of mapped host memory across the grid; a word equal to `never` (no word
// is) is counted, so the loads are kept.
__global__ void read_mapped(const uint4* p, size_t n, unsigned never, unsigned* hits) {
    unsigned x = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == never) atomicAdd(hits, 1u);
}

// Launches of read_mapped over `bytes` of mapped `src` until `stop`, each waited for; bytes per
// second (launch and completion latency included, as a decode step would see them).
static double mapped_reads(const uint8_t* src, size_t bytes, unsigned* hits, cudaStream_t s,
                           const std::atomic<bool>& stop) {
    size_t done = 0;
    const auto t0 = Clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
        read_mapped<<<264, 512, 0, s>>>((const uint4*)src, bytes / 16, 0xFFFFFFFFu, hits);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        done += bytes;
    }
    return done / seconds_since(t0);
}

int main() {
    const size_t words = (4ull << 30) / 8, chunk = 64ull << 20;
    std::vector<uint64_t> buf(words);
    for (size_t i = 0; i < words; ++i) buf[i] = i * 2654435761u;
    // Without a card only the CPU phases run (so the program can be tried anywhere).
    int cards = 0;
    const bool card = cudaGetDeviceCount(&cards) == cudaSuccess && cards > 0;
    if (!card) printf("no CUDA device: the copy phases are skipped\n");
    uint8_t *pinned = nullptr, *dev = nullptr;
    cudaStream_t s = nullptr;
    if (card) {
        CK(cudaHostAlloc((void**)&pinned, 1ull << 30, cudaHostAllocMapped));
        memset(pinned, 1, 1ull << 30);
        CK(cudaMalloc(&dev, 1ull << 30));
        CK(cudaStreamCreate(&s));
    }
    std::atomic<uint64_t> sink{0};
    const int hw = (int)std::thread::hardware_concurrency();
    unsigned* hits = nullptr;
    if (card) CK(cudaMalloc(&hits, sizeof(unsigned)));
    // What the card does during a phase beside the CPU threads.
    enum class Card { idle, copies, in_place };
    auto phase = [&](const char* name, int threads, Card copy) {
        std::atomic<bool> stop{false};
        double cpu = 0.0, pcie = 0.0;
        std::thread timer([&] {
            std::this_thread::sleep_for(std::chrono::seconds(1));
            stop = true;
        });
        std::thread copier;
        if (copy == Card::copies) copier = std::thread([&] { pcie = copies(pinned, dev, chunk, s, stop); });
        if (copy == Card::in_place)
            copier = std::thread([&] { pcie = mapped_reads(pinned, 8ull << 20, hits, s, stop); });
        if (threads > 0) cpu = cpu_reads(buf.data(), words, threads, stop, sink);
        timer.join();
        if (copier.joinable()) copier.join();
        printf("%-44s CPU reads %6.1f GB/s   %s %5.1f GB/s\n", name, cpu / 1e9,
               copy == Card::in_place ? "card reads in place " : "host-to-card copies", pcie / 1e9);
    };
    char label[64];
    for (int threads : {hw / 2, hw}) {
        snprintf(label, sizeof label, "%d threads reading, alone", threads);
        phase(label, threads, Card::idle);
    }
    if (card) {
        phase("copies alone (64 MiB page-locked chunks)", 0, Card::copies);
        for (int threads : {hw / 2, hw}) {
            snprintf(label, sizeof label, "%d threads reading + copies", threads);
            phase(label, threads, Card::copies);
        }
        phase("card reads mapped memory alone (8 MiB)", 0, Card::in_place);
        snprintf(label, sizeof label, "%d threads reading + card reads in place", hw);
        phase(label, hw, Card::in_place);
    }
    printf("(checksum %llu)\n", (unsigned long long)sink.load());
    return 0;
}
