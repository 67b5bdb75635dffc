// Warp-level tensor-core and shared-memory primitives of the tiled products (mmq.cuh), as inline
// PTX for the card. The CPU emulation (sim/mma.h) defines the same functions with the same
// register layouts, so that mmq.cuh's tiles can be checked without a GPU.

// The shared-memory address of a generic pointer into shared memory.
static __device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// Four 8 x 8 b16 matrices from shared memory (lane i gives the address of row i % 8 of matrix
// i / 8): an mma operand (int8: 16 (A) or 2 x 8 (B) rows of 32 bytes) in one instruction.
static __device__ __forceinline__ void ldsm_x4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a . b for one 16 x 8 tile over 32 values of k (int8 operands in the m16n8k32 fragment layout,
// int32 accumulators).
static __device__ __forceinline__ void mma_s8(int* c, const int* a, const int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
