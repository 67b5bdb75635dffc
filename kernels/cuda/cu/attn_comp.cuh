// DeepSeek-V4's two-source attention (Op::Attention with `comp`): the selection form of
// attn_select.cuh over the window cache (f32 or f16, values from the keys) and, in the same
// softmax with the head's sink, a second source of f32 compressed rows [dk * n_head_kv, comp_len,
// n_slots], row j of a slot pooling positions j * ratio .. (j + 1) * ratio - 1 (Op::Compress
// writes them). Included by attention.cuh after attn_select.cuh (and by kernels/cuda/sim's
// attn_comp_test.cpp, which runs it on the CPU).
//
// Row r (slot s, position p) sees the compressed rows j < (p + 1) / ratio, or with a list
// (i32 [n_ids, rows], as Op::CompSelect writes it) only the listed ones among them (negative
// entries skipped, a row listed twice counted once). More visible rows than the cache holds
// (comp_len) is error 12, a bad slot or position error 2; such rows are left unwritten.
//
// Two launches besides attn_select.cuh's: bl_attn_comp_list (a block per row) writes each row's
// count of compressed rows (-1 for a bad row) and, with a list, its rows sorted and deduplicated
// into `list` [n_ids, rows]; then bl_attention_comp_<f32|f16> runs attend_select with the
// compressed rows after the row's window (and merges as bl_attn_sel_merge does with S > 1).

#pragma once

// Dynamic shared memory with a list: the list padded to the power of two >= n_ids ints.
extern "C" __global__ void __launch_bounds__(SEL_THREADS)
    bl_attn_comp_list(const int* slots, const int* pos, const int* ids, int n_ids, int ratio, int comp_len,
                      int n_slots, int* list, int* count, int* err) {
    KERNEL_ENTRY();
    SEL_DYNAMIC_SMEM(list_smem);
    const int tid = threadIdx.x, r = blockIdx.x;
    const int s = slots[r], p = pos[r];
    const int visible = p < 0 ? 0 : (p + 1) / ratio;
    const int bad = s < 0 || s >= n_slots || p < 0 ? 2 : visible > comp_len ? 12 : 0;
    if (bad) {
        if (tid == 0) {
            report(err, bad);
            count[r] = -1;
        }
        return;
    }
    if (!ids) {
        if (tid == 0) count[r] = visible;
        return;
    }
    int* cand = (int*)list_smem;
    const int npad = sel_pow2(n_ids);
    const int* in = ids + (long long)r * n_ids;
    for (int i = tid; i < npad; i += blockDim.x) {
        const int j = i < n_ids ? in[i] : -1;
        cand[i] = j < 0 || j >= visible ? SEL_NONE : j;
    }
    __syncthreads();
    sel_sort_unique(cand, npad, list + (long long)r * n_ids, count + r);
}

#define ATTEND_COMP(name, T)                                                                                       \
    extern "C" __global__ void __launch_bounds__(SEL_THREADS)                                                      \
        name(const float* q, const T* kc, const int* slots, const int* pos, const int* list, const int* count,     \
             int n_sel, const float* comp, const int* clist, const int* ccount, int n_clist, int comp_len,         \
             float* out, uint8_t* oq, float* part, int n_head, int n_head_kv, int dk, int dv, int len, int n_slots, \
             float scale, float softcap, int window, const float* sinks, int* err) {                               \
        KERNEL_ENTRY();                                                                                            \
        attend_select(q, kc, kc, slots, pos, list, count, n_sel, out, oq, part, n_head, n_head_kv, dk, dv, len,    \
                      n_slots, scale, softcap, window, sinks, 1, SelComp{comp, clist, ccount, n_clist, comp_len},  \
                      err);                                                                                        \
    }
ATTEND_COMP(bl_attention_comp_f32, float)
ATTEND_COMP(bl_attention_comp_f16, __half)
