// Copies of rows (ops/copy.rs): strided copies with f32/f16 conversions, a run of small contiguous
// copies in one launch (ops/fused/copy_run.rs), and row gathers (GetRows) of f32, f16 and every
// quantized type of quant.cuh. Included by kernels.cu after common.cuh and quant.cuh.

#pragma once

// ---- Copy: a source with byte strides nb0..nb3 into a contiguous destination, converting ---------
// One block per row (i1, i2, i3), its threads along ne0.
template <typename S, typename D>
static __device__ void copy_rows(const uint8_t* x, D* out, long long ne0, long long ne1, long long ne2, long long rows,
                                 long long nb0, long long nb1, long long nb2, long long nb3) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const long long i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const uint8_t* row = x + i1 * nb1 + i2 * nb2 + i3 * nb3;
        D* y = out + r * ne0;
        for (long long i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = from_f32<D>(to_f32(*(const S*)(row + i * nb0)));
    }
}

#define COPY(name, S, D)                                                                                         \
    extern "C" __global__ void name(const uint8_t* x, D* out, long long ne0, long long ne1, long long ne2,         \
                                    long long rows, long long nb0, long long nb1, long long nb2, long long nb3) { KERNEL_ENTRY(); \
        copy_rows<S, D>(x, out, ne0, ne1, ne2, rows, nb0, nb1, nb2, nb3);                                         \
    }
COPY(bl_copy_f32_f32, float, float)
COPY(bl_copy_f32_f16, float, __half)
COPY(bl_copy_f16_f32, __half, float)
COPY(bl_copy_f16_f16, __half, __half)

// ---- a run of contiguous 4-byte copies in one launch (src/ops/fused/copy_run.rs) ----------------
// One block. Every copy but the last is written first; each thread then fences its writes
// system-wide before the block's barrier, so an observer that sees any of the last copy's words
// (the host polling a signal word in page-locked memory) also sees every earlier copy, as when
// the copies were launched one by one.
#define COPY_RUN_MAX 8
struct CopyWords {
    const unsigned int* src;
    unsigned int* dst;
    long long n;
};
struct CopyRun {
    CopyWords c[COPY_RUN_MAX];
};
extern "C" __global__ void bl_copy_words(CopyRun run, int count) {
    KERNEL_ENTRY();
    for (int j = 0; j + 1 < count; ++j) {
        const CopyWords c = run.c[j];
        for (long long i = threadIdx.x; i < c.n; i += blockDim.x) c.dst[i] = c.src[i];
    }
    __threadfence_system();
    __syncthreads();
    const CopyWords last = run.c[count - 1];
    for (long long i = threadIdx.x; i < last.n; i += blockDim.x) last.dst[i] = last.src[i];
}

// ---- GetRows: one block per id ------------------------------------------------------------------

// Row `id` of a table, element i, as f32: one functor per row type.
struct RowF32 {
    static __device__ float at(const uint8_t* row, int i) { return ((const float*)row)[i]; }
};
struct RowF16 {
    static __device__ float at(const uint8_t* row, int i) { return __half2float(((const __half*)row)[i]); }
};
// One block per id: out row b = table row ids[b] (error 1 for an id outside the table).
template <typename R>
static __device__ void gather_rows(const uint8_t* table, long long stride, const int* ids, float* out, int ncols,
                                   int nrows, int* err) {
    const int id = ids[blockIdx.x];
    float* y = out + (long long)blockIdx.x * ncols;
    if (id < 0 || id >= nrows) {
        report(err, 1);
        return;
    }
    const uint8_t* row = table + (long long)id * stride;
#pragma unroll 4
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) y[i] = R::at(row, i);
}

#define GET_ROWS(name, R)                                                                                       \
    extern "C" __global__ void name(const uint8_t* table, long long stride, const int* ids, float* out, int ncols, \
                                    int nrows, int* err) { KERNEL_ENTRY();                                                      \
        gather_rows<R>(table, stride, ids, out, ncols, nrows, err);                                             \
    }
GET_ROWS(bl_get_rows_f32, RowF32)
GET_ROWS(bl_get_rows_f16, RowF16)

// Quantized rows (any wtype of quant.cuh but F32), a thread per 32-value sub-block; values rounded
// as the CPU reference dequantizes them.
extern "C" __global__ void bl_get_rows_q(const uint8_t* table, long long stride, const int* ids, float* out, int ncols,
                                         int nrows, int* err, int wtype) {
    KERNEL_ENTRY();
    const int id = ids[blockIdx.x];
    float* y = out + (long long)blockIdx.x * ncols;
    if (id < 0 || id >= nrows) {
        report(err, 1);
        return;
    }
    const uint8_t* row = table + (long long)id * stride;
    for (int sb = threadIdx.x; sb < ncols / 32; sb += blockDim.x) {
        Sub s;
        unpack_sub(row, wtype, sb, &s);
#pragma unroll
        for (int i = 0; i < 32; ++i) y[sb * 32 + i] = sub_value(&s, i);
    }
}
