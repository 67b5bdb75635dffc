// Sequence-state kernels of the hybrid linear-attention models (Qwen3.5/3.6 GDN layers): the causal
// depthwise conv and the gated delta rule, each with a per-slot state updated in place, and a GDN
// mixer's decode step as two kernels. Included by kernels.cu after its helpers (common.cuh).
//
// Rows of one sequence are consecutive with increasing positions: row r continues row r - 1 when
// both name the same slot and pos[r] == pos[r - 1] + 1. Every other row starts a segment, which
// starts from the slot's state (from zeros at position 0) and leaves its final state there. Each
// segment must name its own slot (one slot is one sequence). A slot outside the state or a
// negative position is reported as error 5 and its rows are skipped.

#define ERR_STATE_SLOT 5

static __device__ __forceinline__ bool continues(const int* slots, const int* pos, int r) {
    return r > 0 && slots[r] == slots[r - 1] && pos[r] == pos[r - 1] + 1;
}

static __device__ __forceinline__ bool bad_row(const int* slots, const int* pos, int r, int n_slots) {
    return slots[r] < 0 || slots[r] >= n_slots || pos[r] < 0;
}

// ---- ConvCausal ----------------------------------------------------------------------------------
// Two launches: the outputs (reading the old state), then the state update by each segment's last
// row, so no thread reads a state that another one writes. Taps are `dil` rows apart; the state
// holds the last `hist` = (taps - 1) * dil inputs of each sequence, oldest first.

#define CONV_MAX_TAPS 16
// The longest history (taps - 1) * dilation: a thread walks back up to this many rows.
#define CONV_MAX_HIST 64

// The input `k` rows before row r (k >= 0) of channel c: from x while inside r's segment (`m` rows
// of it precede r), else from the state of `hist` inputs (zeros when the segment starts at
// position 0).
static __device__ __forceinline__ float conv_input(const float* x, const float* st, int ch, int hist, int r, int c,
                                                   int k, int m, int p0) {
    if (k <= m) return x[(long long)(r - k) * ch + c];
    if (p0 == 0) return 0.0f;
    return st[(long long)(hist - (k - m)) * ch + c];
}

// Rows of r's segment before r, at most `limit`.
static __device__ __forceinline__ int rows_before(const int* slots, const int* pos, int r, int limit) {
    int m = 0;
    while (m < limit && continues(slots, pos, r - m)) ++m;
    return m;
}

// y[r, c] = sum_j w[j, c] * x[r - (taps - 1 - j) * dil, c]; w is [taps, ch] (ne0 = taps). Grid
// (row, 256-channel group).
extern "C" __global__ void bl_conv_causal(const float* x, const float* w, const float* state, const int* slots,
                                          const int* pos, float* out, int ch, int taps, int dil, int n_slots,
                                          int* err) {
    KERNEL_ENTRY();
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    if (bad_row(slots, pos, r, n_slots)) {
        if (c == 0) report(err, ERR_STATE_SLOT);
        return;
    }
    const int hist = (taps - 1) * dil;
    const int m = rows_before(slots, pos, r, hist);
    const int p0 = pos[r] - m;
    const float* st = state + (long long)slots[r] * hist * ch;
    const float* wc = w + (long long)c * taps;
    float acc = 0.0f;
    for (int j = 0; j < taps - 1; ++j)
        acc += wc[j] * conv_input(x, st, ch, hist, r, c, (taps - 1 - j) * dil, m, p0);
    out[(long long)r * ch + c] = acc + wc[taps - 1] * x[(long long)r * ch + c];
}

// Row r ends its segment: channel c of r's slot's state of `hist` inputs becomes the segment's
// last `hist` inputs (older ones from the old state when the segment is shorter), oldest first.
// Entry j takes the input hist - 1 - j rows before r, which is x or old entry j + 1 + m: written
// in ascending j, every old entry is read before it is overwritten. The caller's thread is the
// only one reading or writing that channel of that slot.
static __device__ __forceinline__ void conv_state_store(const float* x, float* state, const int* slots,
                                                        const int* pos, int ch, int hist, int r, int c) {
    const int m = rows_before(slots, pos, r, hist);
    const int p0 = pos[r] - m;
    float* st = state + (long long)slots[r] * hist * ch;
    for (int j = 0; j < hist; ++j) st[(long long)j * ch + c] = conv_input(x, st, ch, hist, r, c, hist - 1 - j, m, p0);
}

// A verify pass's row states: row r's column of `rows_out` ([hist * ch, rows]) becomes the state
// its sequence has after row r, laid out as the state; read from x and the old state, so it runs
// before bl_conv_causal_state updates the state. Grid (row, 256-channel group).
extern "C" __global__ void bl_conv_causal_rows(const float* x, const float* state, const int* slots, const int* pos,
                                               float* rows_out, int ch, int hist, int n_slots) {
    KERNEL_ENTRY();
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= ch || bad_row(slots, pos, r, n_slots)) return;
    const int m = rows_before(slots, pos, r, hist);
    const int p0 = pos[r] - m;
    const float* st = state + (long long)slots[r] * hist * ch;
    float* out = rows_out + (long long)r * hist * ch;
    for (int j = 0; j < hist; ++j) out[(long long)j * ch + c] = conv_input(x, st, ch, hist, r, c, hist - 1 - j, m, p0);
}

// The last row of each segment writes its slot's new state: the segment's last hist inputs
// (older ones from the old state when the segment is shorter), oldest first. Grid (group of
// CONV_STATE_ROWS rows, 256-channel group): a thread walks its rows for segment ends.
#define CONV_STATE_ROWS 64

extern "C" __global__ void bl_conv_causal_state(const float* x, float* state, const int* slots, const int* pos, int ch,
                                                int rows, int hist, int n_slots) {
    KERNEL_ENTRY();
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    const int first = blockIdx.x * CONV_STATE_ROWS, last = min(rows, first + CONV_STATE_ROWS);
    for (int r = first; r < last; ++r) {
        if (bad_row(slots, pos, r, n_slots) || (r + 1 < rows && continues(slots, pos, r + 1))) continue;
        conv_state_store(x, state, slots, pos, ch, hist, r, c);
    }
}

// ---- DeltaRule -----------------------------------------------------------------------------------
// Per row and value head h (key head h % hk), with S the [dk, dv] state (S[i][j] at
// (h * dv + j) * dk + i): S <- exp(gate) S; d = beta_scale * beta * (v - S^T k); S <- S + k d^T;
// out = scale * S^T q. Column j of S evolves on its own (d_j and out_j read only column j). The
// gate is one log decay per (row, head) (GDN, `per_dim` 0, gate [hv, rows]) or one per (row, head,
// key dim) (KDA, `per_dim` 1, gate [dk, hv, rows]), which scales row i of S.
//
// Batches of fewer than DR_CHUNK rows run the step-wise form on every segment. Larger ones first
// list their segments (`bl_delta_rule_table`); segments of DR_CHUNK rows or more then run the
// chunked form, the others the step-wise one.

#define DR_CHUNK 64
#define DR_MAX_DK 256

// The segment lists of a batch, in one int area of the scratch laid out in this order (the host
// sizes it as the sum of the sizes in the comments). Segments of at least DR_CHUNK rows are long;
// each is cut into chunks of DR_CHUNK rows from its first row (the last one shorter).
struct DrTable {
    int* count;       // [3]: short segments, long segments, chunks
    int* seg;         // [rows + 1]: the first row of every segment, then rows
    int* short_row;   // [max_short]: first rows of the short segments
    int* long_row;    // [max_long]: first rows of the long segments
    int* long_len;    // [max_long]: their rows
    int* long_chunk;  // [max_long + 1]: their first chunks, then the chunk count
    int* chunk_row;   // [max_chunks]: first rows of the chunks
    int* chunk_len;   // [max_chunks]: their rows
};

static __device__ __forceinline__ DrTable dr_table(int* tab, int rows, int max_short, int max_long, int max_chunks) {
    DrTable t;
    t.count = tab;
    t.seg = t.count + 3;
    t.short_row = t.seg + rows + 1;
    t.long_row = t.short_row + max_short;
    t.long_len = t.long_row + max_long;
    t.long_chunk = t.long_len + max_long;
    t.chunk_row = t.long_chunk + max_long + 1;
    t.chunk_len = t.chunk_row + max_chunks;
    return t;
}

// The rank of this thread's set flag among the block's set flags (in thread order), after the
// *base ones of earlier calls; adds the block's count to *base. Every thread of the block calls it.
static __device__ int block_rank(bool flag, int* warp_n, int* base) {
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP;
    const unsigned b = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) warp_n[warp] = __popc(b);
    __syncthreads();
    int rank = *base + __popc(b & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) rank += warp_n[w];
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x / WARP); ++w) *base += warp_n[w];
    __syncthreads();
    return rank;
}

// One block: the segment lists. More segments than slots (two segments naming one slot) is error
// 5, and the lists are then left empty.
extern "C" __global__ void bl_delta_rule_table(const int* slots, const int* pos, int* tab, int rows, int n_slots,
                                               int max_short, int max_long, int max_chunks, int* err) {
    KERNEL_ENTRY();
    __shared__ int warp_n[1024 / WARP];
    __shared__ int n_all, n_short, n_long;
    const DrTable t = dr_table(tab, rows, max_short, max_long, max_chunks);
    if (threadIdx.x == 0) n_all = n_short = n_long = 0;
    __syncthreads();
    for (int r0 = 0; r0 < rows; r0 += blockDim.x) {
        const int r = r0 + threadIdx.x;
        if (r < rows && bad_row(slots, pos, r, n_slots)) report(err, ERR_STATE_SLOT);
        const bool start = r < rows && !continues(slots, pos, r);
        const int at = block_rank(start, warp_n, &n_all);
        if (start) t.seg[at] = r;
    }
    if (threadIdx.x == 0) t.seg[n_all] = rows;
    __syncthreads();
    for (int i0 = 0; i0 < n_all; i0 += blockDim.x) {
        const int i = i0 + threadIdx.x;
        const int len = i < n_all ? t.seg[i + 1] - t.seg[i] : 0;
        const bool is_long = len >= DR_CHUNK, is_short = len > 0 && !is_long;
        const int si = block_rank(is_short, warp_n, &n_short);
        const int li = block_rank(is_long, warp_n, &n_long);
        if (is_short && si < max_short) t.short_row[si] = t.seg[i];
        if (is_long && li < max_long) {
            t.long_row[li] = t.seg[i];
            t.long_len[li] = len;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int nc = 0;
        const bool over = n_all > n_slots || n_short > max_short || n_long > max_long;
        for (int i = 0; i < n_long && !over; ++i) {
            t.long_chunk[i] = nc;
            for (int c0 = 0; c0 < t.long_len[i] && nc < max_chunks; c0 += DR_CHUNK, ++nc) {
                t.chunk_row[nc] = t.long_row[i] + c0;
                t.chunk_len[nc] = min(DR_CHUNK, t.long_len[i] - c0);
            }
        }
        if (over) report(err, ERR_STATE_SLOT);
        t.count[0] = over ? 0 : n_short;
        t.count[1] = over ? 0 : n_long;
        t.count[2] = over ? 0 : nc;
        t.long_chunk[over ? 0 : n_long] = nc;
    }
}

// Step-wise form: grid (segment, group of 16 columns, value head), 128 threads; 8 lanes own a
// column of the state (lane l holds rows l, l + 8, ... of it in registers), which is read once and
// written once while the block walks the segment's rows. Without a table block x is a row and
// only rows that start a segment work; with one it is a short segment of the table.
#define DR_GROUP 8
#define DR_STEP_COLS (128 / DR_GROUP)

static __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = DR_GROUP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int E>
static __device__ void delta_step(const float* q, const float* k, const float* v, const float* gate,
                                  const float* beta, float* state, const int* slots, const int* pos, float* out,
                                  float* row_states, int* tab, int max_short, int max_long, int max_chunks, int hk,
                                  int hv, int dk, int dv, int rows, int n_slots, float scale, float beta_scale,
                                  int per_dim, int* err) {
    const int h = blockIdx.z;
    int r0 = blockIdx.x;
    if (tab) {
        const DrTable t = dr_table(tab, rows, max_short, max_long, max_chunks);
        if (r0 >= t.count[0]) return;
        r0 = t.short_row[r0];
    } else if (continues(slots, pos, r0)) {
        return;
    }
    if (bad_row(slots, pos, r0, n_slots)) {
        if (threadIdx.x == 0 && blockIdx.y == 0 && h == 0) report(err, ERR_STATE_SLOT);
        return;
    }
    int end = r0 + 1;
    while (end < rows && continues(slots, pos, end)) ++end;
    // Every lane takes part in the group sums; lanes of a column past dv compute on zeros.
    const int j = blockIdx.y * DR_STEP_COLS + threadIdx.x / DR_GROUP, l = threadIdx.x % DR_GROUP;
    const bool col = j < dv;
    const int kh = h % hk;
    float* sc = state + (long long)slots[r0] * dk * dv * hv + ((long long)h * dv + (col ? j : 0)) * dk;
    const bool fresh = pos[r0] == 0;
    float s[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = l + DR_GROUP * e;
        s[e] = col && !fresh && i < dk ? sc[i] : 0.0f;
    }
    for (int r = r0; r < end; ++r) {
        const float* kr = k + ((long long)r * hk + kh) * dk;
        const float* qr = q + ((long long)r * hk + kh) * dk;
        const float* gr = gate + ((long long)r * hv + h) * (per_dim ? dk : 1);
        const float g = per_dim ? 0.0f : expf(gr[0]);
        const float b = beta_scale * beta[(long long)r * hv + h];
        const float vj = col ? v[((long long)r * hv + h) * dv + j] : 0.0f;
        float kk[E], qq[E];
        float kv = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int i = l + DR_GROUP * e;
            kk[e] = i < dk ? kr[i] : 0.0f;
            qq[e] = i < dk ? qr[i] : 0.0f;
            s[e] *= per_dim ? (i < dk ? expf(gr[i]) : 0.0f) : g;
            kv += s[e] * kk[e];
        }
        const float d = b * (vj - group_sum(kv));
        float o = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            s[e] += kk[e] * d;
            o += s[e] * qq[e];
        }
        o = group_sum(o);
        if (col && l == 0) out[((long long)r * hv + h) * dv + j] = scale * o;
        if (row_states) {
            // A verify pass: row r's column of the row states gets this column of the state.
            float* rc = row_states + (long long)r * dk * dv * hv + ((long long)h * dv + j) * dk;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const int i = l + DR_GROUP * e;
                if (col && i < dk) rc[i] = s[e];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = l + DR_GROUP * e;
        if (col && i < dk) sc[i] = s[e];
    }
}

extern "C" __global__ void __launch_bounds__(128)
    bl_delta_rule_step(const float* q, const float* k, const float* v, const float* gate, const float* beta,
                       float* state, const int* slots, const int* pos, float* out, float* row_states, int* tab,
                       int max_short, int max_long, int max_chunks, int hk, int hv, int dk, int dv, int rows,
                       int n_slots, float scale, float beta_scale, int per_dim, int* err) {
    KERNEL_ENTRY();
#define DR_STEP(E)                                                                                                \
    delta_step<E>(q, k, v, gate, beta, state, slots, pos, out, row_states, tab, max_short, max_long, max_chunks, hk, \
                  hv, dk, dv, rows, n_slots, scale, beta_scale, per_dim, err)
    if (dk <= 4 * DR_GROUP) DR_STEP(4);
    else if (dk <= 8 * DR_GROUP) DR_STEP(8);
    else if (dk <= 16 * DR_GROUP) DR_STEP(16);
    else DR_STEP(32);
#undef DR_STEP
}

// ---- A GDN mixer's decode step in two kernels -----------------------------------------------------
// For batches whose segments are all shorter than DR_CHUNK, the fifteen calls from beta's sigmoid to
// the gated output (and the F32 products of beta and alpha before them, when the kernel can form
// those) run as two launches (ops/fused/gdn.rs matches them). bl_conv_causal_step: the conv's
// outputs as bl_conv_causal forms them (into the launcher's scratch) and the state update as
// bl_conv_causal_state leaves it, a thread per (segment, channel) walking the segment's rows, so a
// channel's old state is read and rewritten by one thread. bl_gdn_step then takes beta =
// sigmoid(beta_in), gate = softplus(alpha_in + dt) * a, q and k (SiLU of the conv outputs)
// L2-normed per key head, v (SiLU), the delta-rule step as delta_step takes it, and each head's
// output RMS-normed times norm_w and times silu(z), every value formed with the same float
// operations as the separate kernels; it writes the result as f32 to `out`, or (q not null) only
// its Q8_1 copy, for the quantized product that reads it next. In a verify pass each also writes
// every row's state (`rows_out`, `row_states` not null): the conv's window and the delta rule's
// columns after the row, as bl_conv_causal_rows and bl_delta_rule_step write them.

extern "C" __global__ void bl_conv_causal_step(const float* x, const float* w, float* state, const int* slots,
                                               const int* pos, float* out, float* rows_out, int ch, int taps, int rows,
                                               int n_slots, int* err) {
    const int r0 = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= ch || continues(slots, pos, r0)) return;
    if (bad_row(slots, pos, r0, n_slots)) {
        if (c == 0) report(err, ERR_STATE_SLOT);
        return;
    }
    int end = r0 + 1;
    while (end < rows && continues(slots, pos, end)) ++end;
    const float* st = state + (long long)slots[r0] * (taps - 1) * ch;
    const float* wc = w + (long long)c * taps;
    // The taps and the state (no output of the previous kernel, a product writing x) into L2
    // while that kernel finishes.
    prefetch_l2(wc);
    for (int j = 0; j < taps - 1; ++j) prefetch_l2(st + (long long)j * ch + c);
    KERNEL_ENTRY();
    for (int r = r0; r < end; ++r) {
        const int m = min(r - r0, taps - 1);
        const int p0 = pos[r] - m;
        float acc = 0.0f;
        for (int j = 0; j < taps - 1; ++j) acc += wc[j] * conv_input(x, st, ch, taps - 1, r, c, taps - 1 - j, m, p0);
        out[(long long)r * ch + c] = acc + wc[taps - 1] * x[(long long)r * ch + c];
        if (rows_out) {
            const int hist = taps - 1, mh = min(r - r0, hist);
            float* ro = rows_out + (long long)r * hist * ch;
            for (int j = 0; j < hist; ++j)
                ro[(long long)j * ch + c] = conv_input(x, st, ch, hist, r, c, hist - 1 - j, mh, pos[r] - mh);
        }
    }
    if (taps > 1) conv_state_store(x, state, slots, pos, ch, taps - 1, end - 1, c);
}

// block_sum_f64, then a barrier: every thread has read the sum before the next call writes.
static __device__ __forceinline__ double gdn_sum(double s) {
    const double t = block_sum_f64(s);
    __syncthreads();
    return t;
}

#define GDN_MAX_D 128

// Each of the four summed over the warp, every lane getting the sums.
static __device__ __forceinline__ void warp_sums(double& d0, double& d1, float& f0, float& f1) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        d0 += __shfl_xor_sync(0xffffffffu, d0, o);
        d1 += __shfl_xor_sync(0xffffffffu, d1, o);
        f0 += __shfl_xor_sync(0xffffffffu, f0, o);
        f1 += __shfl_xor_sync(0xffffffffu, f1, o);
    }
}

// Sums two doubles and two floats over the block in one pass (each warp's sums, then warp 0 adds
// the warps' in order) and gives every thread the totals; its last barrier lets the next sums
// write after every thread has read these.
static __device__ void gdn_sums(double& d0, double& d1, float& f0, float& f1) {
    __shared__ double dp[1024 / WARP][2];
    __shared__ float fp[1024 / WARP][2];
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP;
    warp_sums(d0, d1, f0, f1);
    if (lane == 0) {
        dp[warp][0] = d0;
        dp[warp][1] = d1;
        fp[warp][0] = f0;
        fp[warp][1] = f1;
    }
    __syncthreads();
    if (warp == 0) {
        const bool in = lane < (int)(blockDim.x / WARP);
        double a = in ? dp[lane][0] : 0.0, b = in ? dp[lane][1] : 0.0;
        float c = in ? fp[lane][0] : 0.0f, e = in ? fp[lane][1] : 0.0f;
        warp_sums(a, b, c, e);
        if (lane == 0) {
            dp[0][0] = a;
            dp[0][1] = b;
            fp[0][0] = c;
            fp[0][1] = e;
        }
    }
    __syncthreads();
    d0 = dp[0][0];
    d1 = dp[0][1];
    f0 = fp[0][0];
    f1 = fp[0][1];
    __syncthreads();
}

// Grid (row, value head), DR_GROUP threads per state column (blockDim = DR_GROUP * dv): block h
// owns head h's state columns.
// beta_in and alpha_in are [hv, rows]; or, with wb given, each block forms its head's two from
// x ([n_embd, rows]) and the F32 weights wb and wa ([n_embd, hv]), every thread a share of each.
template <int E>
static __device__ void gdn_step(const float* conv, const float* beta_in, const float* alpha_in, const float* x,
                                const float* wb, const float* wa, int n_embd, const float* dt, const float* a,
                                const float* z, const float* norm_w, float* state, const int* slots, const int* pos,
                                float* out, uint8_t* q, float* row_states, int hk, int hv, int dk, int dv, int rows,
                                int n_slots, float l2_eps, float rms_eps, float scale, float beta_scale, int* err) {
    __shared__ float qs[GDN_MAX_D], ks[GDN_MAX_D], ys[GDN_MAX_D];
    const int r0 = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (continues(slots, pos, r0)) return;
    if (bad_row(slots, pos, r0, n_slots)) {
        if (tid == 0 && h == 0) report(err, ERR_STATE_SLOT);
        return;
    }
    int end = r0 + 1;
    while (end < rows && continues(slots, pos, end)) ++end;
    const int ch = 2 * dk * hk + dv * hv, kh = h % hk;
    const int j = tid / DR_GROUP, l = tid % DR_GROUP;
    float* sc = state + (long long)slots[r0] * dk * dv * hv + ((long long)h * dv + j) * dk;
    const bool fresh = pos[r0] == 0;
    // The state, and the first row's shares of beta's and alpha's products, are read before
    // waiting on the previous kernel (the conv step, which writes neither them nor x).
    float s[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = l + DR_GROUP * e;
        s[e] = !fresh && i < dk ? sc[i] : 0.0f;
    }
    for (int r = r0; r < end; ++r) {
        // With wb, this thread's shares of both products.
        float pb = 0.0f, pa = 0.0f;
        if (wb) {
            const float* xr = x + (long long)r * n_embd;
            const float *wbr = wb + (long long)h * n_embd, *war = wa + (long long)h * n_embd;
            for (int i = tid; i < n_embd; i += blockDim.x) {
                const float xv = xr[i];
                pb += wbr[i] * xv;
                pa += war[i] * xv;
            }
        }
        if (r == r0) KERNEL_ENTRY();
        const float* cr = conv + (long long)r * ch;
        // q and k (SiLU, squares summed in f64), reduced at once with the products' shares; its
        // barriers also publish qs and ks.
        double sq = 0.0, sk = 0.0;
        for (int i = tid; i < dk; i += blockDim.x) {
            const float qv = silu_f(cr[kh * dk + i]), kv = silu_f(cr[(hk + kh) * dk + i]);
            qs[i] = qv;
            ks[i] = kv;
            sq += (double)qv * (double)qv;
            sk += (double)kv * (double)kv;
        }
        gdn_sums(sq, sk, pb, pa);
        const float qinv = (float)(1.0 / sqrt(sq + (double)l2_eps));
        const float kinv = (float)(1.0 / sqrt(sk + (double)l2_eps));
        const long long hr = (long long)r * hv + h;
        const float braw = wb ? pb : beta_in[hr], araw = wb ? pa : alpha_in[hr];
        const float g = expf(softplus_f(araw + dt[h]) * a[h]);
        const float b = beta_scale * sigmoid_f(braw);
        const float vj = silu_f(cr[2 * dk * hk + h * dv + j]);
        float kv = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int i = l + DR_GROUP * e;
            s[e] *= g;
            if (i < dk) kv += s[e] * (ks[i] * kinv);
        }
        const float d = b * (vj - group_sum(kv));
        float o = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int i = l + DR_GROUP * e;
            if (i < dk) {
                s[e] += (ks[i] * kinv) * d;
                o += s[e] * (qs[i] * qinv);
            }
        }
        o = scale * group_sum(o);
        if (row_states) {
            float* rc = row_states + (long long)r * dk * dv * hv + ((long long)h * dv + j) * dk;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const int i = l + DR_GROUP * e;
                if (i < dk) rc[i] = s[e];
            }
        }
        // The head's RMS norm: lane 0 of each column counts its output once.
        const float mean = (float)(gdn_sum(l == 0 ? (double)(o * o) : 0.0) / dv);
        const float inv = 1.0f / sqrtf(mean + rms_eps);
        const long long at = hr * dv + j;
        const float y = o * inv * norm_w[j] * silu_f(z[at]);
        if (!q) {
            if (l == 0) out[at] = y;
            continue;
        }
        // The Q8_1 copy: a warp per 32 outputs (dv is a multiple of 32 here).
        if (l == 0) ys[j] = y;
        __syncthreads();
        const int lane = tid & (WARP - 1), w32 = tid / WARP;
        if (w32 < dv / WARP) quantize_lane(ys[w32 * WARP + lane], q + (hr * dv + w32 * WARP) / 32 * 36);
        __syncthreads();
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = l + DR_GROUP * e;
        if (i < dk) sc[i] = s[e];
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    bl_gdn_step(const float* conv, const float* beta_in, const float* alpha_in, const float* x, const float* wb,
                const float* wa, int n_embd, const float* dt, const float* a, const float* z, const float* norm_w,
                float* state, const int* slots, const int* pos, float* out, uint8_t* q, float* row_states, int hk,
                int hv, int dk, int dv, int rows, int n_slots, float l2_eps, float rms_eps, float scale,
                float beta_scale, int* err) {
    // gdn_step waits on the previous kernel (KERNEL_ENTRY) once it has read what that kernel
    // does not write.
#define GDN_STEP(E)                                                                                               \
    gdn_step<E>(conv, beta_in, alpha_in, x, wb, wa, n_embd, dt, a, z, norm_w, state, slots, pos, out, q, row_states, \
                hk, hv, dk, dv, rows, n_slots, l2_eps, rms_eps, scale, beta_scale, err)
    if (dk <= 4 * DR_GROUP) GDN_STEP(4);
    else if (dk <= 8 * DR_GROUP) GDN_STEP(8);
    else GDN_STEP(16);
#undef GDN_STEP
}

// Chunked form of the long segments. Within a chunk of L rows (t, s < L; G_t the cumulative sum of
// the gates from the chunk's first row, b_t = beta_scale * beta_t, S0 the state before it) the
// deltas D (rows d_t) solve (I + A) D = diag(b) V - diag(b exp(G)) K S0 with A[t][s] =
// b_t exp(G_t - G_s) k_t.k_s for s < t (the WY/UT form of the gated delta rule). With
// T = (I + A)^-1, W = T diag(b exp(G)) K and U = T diag(b) V:
//   D = U - W S0
//   out_t = scale * (exp(G_t) q_t^T S0 + sum_{s <= t} exp(G_t - G_s) (q_t.k_s) d_s)
//   S = exp(G_{L-1}) S0 + sum_t exp(G_{L-1} - G_t) k_t d_t^T
// `prep` computes G, P[t][s] = exp(G_t - G_s) q_t.k_s (s <= t), W and U of every (chunk, head) at
// once; `chunks` then runs each (long segment, head, 16 state columns) through its chunks in order
// with that slice of the state in shared memory. Plain f32 FMA throughout.
#define DR_COLS 16

// Per (chunk, value head), 256 threads: G (DR_CHUNK), P (DR_CHUNK x DR_CHUNK), W (DR_CHUNK x dk)
// and U (DR_CHUNK x dv) into the scratch areas at index ci * hv + h.
extern "C" __global__ void __launch_bounds__(256)
    bl_delta_rule_prep(const float* q, const float* k, const float* v, const float* gate, const float* beta,
                       int* tab, int rows, int max_short, int max_long, int max_chunks, int hk, int hv, int dk,
                       int dv, float beta_scale, float* gs, float* ps, float* ws, float* us) {
    KERNEL_ENTRY();
    __shared__ float graw[DR_CHUNK], G[DR_CHUNK], B[DR_CHUNK], BG[DR_CHUNK];
    __shared__ float Ks[DR_CHUNK][33], Qs[DR_CHUNK][33];
    __shared__ float As[DR_CHUNK][DR_CHUNK + 1];
    const DrTable tb = dr_table(tab, rows, max_short, max_long, max_chunks);
    const int ci = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (ci >= tb.count[2]) return;
    const int r0 = tb.chunk_row[ci], L = tb.chunk_len[ci];
    const int kh = h % hk;
    const long long idx = (long long)ci * hv + h;
    if (tid < DR_CHUNK) {
        graw[tid] = tid < L ? gate[(long long)(r0 + tid) * hv + h] : 0.0f;
        B[tid] = tid < L ? beta_scale * beta[(long long)(r0 + tid) * hv + h] : 0.0f;
    }
    __syncthreads();
    if (tid < DR_CHUNK) {
        float acc = 0.0f;
        for (int u = 0; u <= tid; ++u) acc += graw[u];
        G[tid] = acc;
        BG[tid] = B[tid] * expf(acc);
        gs[idx * DR_CHUNK + tid] = acc;
    }
    // K K^T and Q K^T over slabs of 32 key dims: thread (a, c) takes rows a + 16u, columns c + 16w.
    const int a = tid / 16, c = tid % 16;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) kk[u][w] = qk[u][w] = 0.0f;
    for (int i0 = 0; i0 < dk; i0 += 32) {
        __syncthreads();
        for (int p = tid; p < DR_CHUNK * 32; p += blockDim.x) {
            const int t = p / 32, i = p % 32;
            const bool in = t < L && i0 + i < dk;
            const long long at = ((long long)(r0 + t) * hk + kh) * dk + i0 + i;
            Ks[t][i] = in ? k[at] : 0.0f;
            Qs[t][i] = in ? q[at] : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int i = 0; i < 32; ++i) {
            float kr[4], qr[4], kc[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                kr[u] = Ks[a + 16 * u][i];
                qr[u] = Qs[a + 16 * u][i];
                kc[u] = Ks[c + 16 * u][i];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    kk[u][w] += kr[u] * kc[w];
                    qk[u][w] += qr[u] * kc[w];
                }
        }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int t = a + 16 * u, s = c + 16 * w;
            // Only s <= t: exp(G_t - G_s) may overflow above the diagonal.
            const float dec = s <= t && t < L ? expf(G[t] - G[s]) : 0.0f;
            As[t][s] = s < t ? B[t] * dec * kk[u][w] : 0.0f;
            ps[(idx * DR_CHUNK + t) * DR_CHUNK + s] = dec * qk[u][w];
        }
    __syncthreads();
    // Forward substitution, a thread per column of [W | U]: x_t = rhs_t - sum_{s<t} A[t][s] x_s
    // (rows past L have rhs 0 and A 0, so they stay 0). A is read through a volatile pointer: the
    // compiler would otherwise hoist all its 2016 reads out of the column loop (and spill them).
    const volatile float* av = &As[0][0];
    for (int col = tid; col < dk + dv; col += blockDim.x) {
        const bool is_w = col < dk;
        const float* src = is_w ? k + (long long)kh * dk + col : v + (long long)h * dv + (col - dk);
        const long long stride = is_w ? (long long)hk * dk : (long long)hv * dv;
        float x[DR_CHUNK];
#pragma unroll
        for (int t = 0; t < DR_CHUNK; ++t) {
            float acc = t < L ? (is_w ? BG[t] : B[t]) * src[(long long)(r0 + t) * stride] : 0.0f;
#pragma unroll
            for (int s = 0; s < t; ++s) acc -= av[t * (DR_CHUNK + 1) + s] * x[s];
            x[t] = acc;
        }
        float* dst = is_w ? ws + idx * DR_CHUNK * dk + col : us + idx * DR_CHUNK * dv + (col - dk);
        const int ld = is_w ? dk : dv;
#pragma unroll
        for (int t = 0; t < DR_CHUNK; ++t)
            if (t < L) dst[(long long)t * ld] = x[t];
    }
}

// The per-dimension form of `prep` (KDA): with Gam_t = exp(G_t) now a vector (G_t the cumulative
// sum of row t's gates per key dim) and R(t, s) = exp(G_t - G_s) the decay from row s to row t,
//   A[t][s] = b_t k_t.(R(t, s) k_s) (s < t),  P[t][s] = q_t.(R(t, s) k_s) (s <= t),
//   W = T diag(b) (Gam K),  and for `chunks`: Qg_t = Gam_t q_t,  Kg_t = R(L-1, t) k_t,  gl = Gam_{L-1},
// so that D = U - W S0, out_t = scale * (Qg_t^T S0 + sum_{s <= t} P[t][s] d_s) and
// S = diag(gl) S0 + sum_t Kg_t d_t^T. G is summed in f64: R(t, s) comes from the difference of two
// sums that an unbounded gate drives to thousands, where f32 would lose the small decays' digits.
// Only R(t, s) with s <= t is ever formed, so with gates <= 0 every factor lies in [0, 1] and one
// that underflows is the exact limit, zero. G (scratch area gs) is written as zeros: `chunks` then
// takes its per-head factors as 1 and reads Qg, Kg and gl instead.
#define DR_SLAB 16

extern "C" __global__ void __launch_bounds__(256)
    bl_delta_rule_prep_dim(const float* q, const float* k, const float* v, const float* gate, const float* beta,
                           int* tab, int rows, int max_short, int max_long, int max_chunks, int hk, int hv, int dk,
                           int dv, float beta_scale, float* gs, float* ps, float* ws, float* us, float* qg, float* kg,
                           float* gl) {
    KERNEL_ENTRY();
    __shared__ float B[DR_CHUNK];
    __shared__ float Ks[DR_CHUNK][DR_SLAB + 1], Qs[DR_CHUNK][DR_SLAB + 1];
    __shared__ double G[DR_CHUNK][DR_SLAB + 1];
    __shared__ float As[DR_CHUNK][DR_CHUNK + 1];
    const DrTable tb = dr_table(tab, rows, max_short, max_long, max_chunks);
    const int ci = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (ci >= tb.count[2]) return;
    const int r0 = tb.chunk_row[ci], L = tb.chunk_len[ci];
    const int kh = h % hk;
    const long long idx = (long long)ci * hv + h;
    if (tid < DR_CHUNK) {
        B[tid] = tid < L ? beta_scale * beta[(long long)(r0 + tid) * hv + h] : 0.0f;
        gs[idx * DR_CHUNK + tid] = 0.0f;
    }
    // Thread (a, c) takes pairs (t, s) = (a + 16u, c + 16w).
    const int a = tid / 16, c = tid % 16;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) kk[u][w] = qk[u][w] = 0.0f;
    for (int i0 = 0; i0 < dk; i0 += DR_SLAB) {
        __syncthreads();
        for (int p = tid; p < DR_CHUNK * DR_SLAB; p += blockDim.x) {
            const int t = p / DR_SLAB, i = p % DR_SLAB;
            const bool in = t < L && i0 + i < dk;
            const long long at = ((long long)(r0 + t) * hk + kh) * dk + i0 + i;
            Ks[t][i] = in ? k[at] : 0.0f;
            Qs[t][i] = in ? q[at] : 0.0f;
            G[t][i] = in ? (double)gate[((long long)(r0 + t) * hv + h) * dk + i0 + i] : 0.0;
        }
        __syncthreads();
        if (tid < DR_SLAB) {
            double acc = 0.0;
            for (int t = 0; t < DR_CHUNK; ++t) G[t][tid] = acc += G[t][tid];
        }
        __syncthreads();
        // The right-hand side of W (solved in place below), Qg, Kg and gl of this slab.
        for (int p = tid; p < DR_CHUNK * DR_SLAB; p += blockDim.x) {
            const int t = p / DR_SLAB, i = p % DR_SLAB;
            if (i0 + i >= dk) continue;
            const bool live = t < L;
            const float e = live ? expf((float)G[t][i]) : 0.0f;
            const long long at = (idx * DR_CHUNK + t) * dk + i0 + i;
            ws[at] = B[t] * e * Ks[t][i];
            qg[at] = e * Qs[t][i];
            kg[at] = live ? expf((float)(G[L - 1][i] - G[t][i])) * Ks[t][i] : 0.0f;
            if (t == 0) gl[idx * dk + i0 + i] = expf((float)G[L - 1][i]);
        }
#pragma unroll 4
        for (int i = 0; i < DR_SLAB; ++i) {
            float kr[4], qr[4], kc[4];
            double gr[4], gc[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                kr[u] = Ks[a + 16 * u][i];
                qr[u] = Qs[a + 16 * u][i];
                kc[u] = Ks[c + 16 * u][i];
                gr[u] = G[a + 16 * u][i];
                gc[u] = G[c + 16 * u][i];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w)
                    if (c + 16 * w <= a + 16 * u) {
                        const float kd = kc[w] * expf((float)(gr[u] - gc[w]));
                        kk[u][w] += kr[u] * kd;
                        qk[u][w] += qr[u] * kd;
                    }
        }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int t = a + 16 * u, s = c + 16 * w;
            As[t][s] = s < t && t < L ? B[t] * kk[u][w] : 0.0f;
            ps[(idx * DR_CHUNK + t) * DR_CHUNK + s] = s <= t && t < L ? qk[u][w] : 0.0f;
        }
    __syncthreads();
    // Forward substitution as in `prep`, a thread per column of [W | U]; W's right-hand side is in
    // place (this thread's column only, written above and read back after the barrier).
    const volatile float* av = &As[0][0];
    for (int col = tid; col < dk + dv; col += blockDim.x) {
        const bool is_w = col < dk;
        float* dst = is_w ? ws + idx * DR_CHUNK * dk + col : us + idx * DR_CHUNK * dv + (col - dk);
        const int ld = is_w ? dk : dv;
        const float* vs = v + (long long)h * dv + (col - dk);
        float x[DR_CHUNK];
#pragma unroll
        for (int t = 0; t < DR_CHUNK; ++t) {
            float acc = t >= L ? 0.0f : is_w ? dst[(long long)t * ld] : B[t] * vs[(long long)(r0 + t) * hv * dv];
#pragma unroll
            for (int s = 0; s < t; ++s) acc -= av[t * (DR_CHUNK + 1) + s] * x[s];
            x[t] = acc;
        }
#pragma unroll
        for (int t = 0; t < DR_CHUNK; ++t)
            if (t < L) dst[(long long)t * ld] = x[t];
    }
}

// Shared memory of one `chunks` block: its slice of the state, the chunk's D, and G, exp(G),
// exp(G_{L-1} - G).
struct DrSmem {
    float S[DR_MAX_DK][DR_COLS + 1];
    float D[DR_CHUNK][DR_COLS + 1];
    float G[DR_CHUNK], Ge[DR_CHUNK], Gd[DR_CHUNK];
};

// Per (long segment, 16 columns of the state, value head), 128 threads: the segment's chunks in
// order. Thread (tt, tj) computes rows tt and tt + 32 of D and of the output at columns
// 4 tj .. 4 tj + 3, then rows tt + 32 m (m < M, dk <= 32 M) of the new state at those columns.
// With a per-dimension gate (PD, `gl` set) the queries and keys are `prep_dim`'s Qg and Kg and
// row i of the state decays by gl[i] (G is zero then, so the per-head factors are 1).
template <int M, bool PD>
static __device__ void delta_chunks(DrSmem* sm, const float* q, const float* k, float* state, const int* slots,
                                    const int* pos, const DrTable& tb, const float* gs, const float* ps,
                                    const float* ws, const float* us, const float* qg, const float* kg,
                                    const float* gl, float* out, int hk, int hv, int dk, int dv, int n_slots,
                                    float scale) {
    const int sg = blockIdx.x, j0 = blockIdx.y * DR_COLS, h = blockIdx.z, tid = threadIdx.x;
    if (sg >= tb.count[1]) return;
    const int first = tb.long_row[sg];
    if (bad_row(slots, pos, first, n_slots)) return;  // reported by the table
    const int kh = h % hk;
    float* st = state + (long long)slots[first] * dk * dv * hv + (long long)h * dv * dk;
    const bool fresh = pos[first] == 0;
    for (int p = tid; p < DR_COLS * dk; p += blockDim.x) {
        const int jj = p / dk, i = p % dk, j = j0 + jj;
        sm->S[i][jj] = !fresh && j < dv ? st[(long long)j * dk + i] : 0.0f;
    }
    const int tt = tid / 4, tj = tid % 4;
    for (int ci = tb.long_chunk[sg]; ci < tb.long_chunk[sg + 1]; ++ci) {
        const int r0 = tb.chunk_row[ci], L = tb.chunk_len[ci];
        const long long idx = (long long)ci * hv + h;
        if (tid < DR_CHUNK) {
            const float g = tid < L ? gs[idx * DR_CHUNK + tid] : 0.0f;
            sm->G[tid] = g;
            sm->Ge[tid] = expf(g);
        }
        __syncthreads();
        if (tid < DR_CHUNK) sm->Gd[tid] = tid < L ? expf(sm->G[L - 1] - sm->G[tid]) : 0.0f;
        // D = U - W S0 and Q S0 for rows tt, tt + 32.
        float d[2][4], o[2][4];
        const float* wr[2];
        const float* qr[2];
        bool live[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int t = tt + 32 * u;
            live[u] = t < L;
            wr[u] = ws + (idx * DR_CHUNK + (live[u] ? t : 0)) * dk;
            qr[u] = PD ? qg + (idx * DR_CHUNK + (live[u] ? t : 0)) * dk
                       : q + ((long long)(r0 + (live[u] ? t : 0)) * hk + kh) * dk;
#pragma unroll
            for (int c = 0; c < 4; ++c) d[u][c] = o[u][c] = 0.0f;
        }
#pragma unroll 4
        for (int i = 0; i < dk; ++i) {
            float sv[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) sv[c] = sm->S[i][4 * tj + c];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const float wv = live[u] ? wr[u][i] : 0.0f, qv = live[u] ? qr[u][i] : 0.0f;
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    d[u][c] += wv * sv[c];
                    o[u][c] += qv * sv[c];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int t = tt + 32 * u;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int j = j0 + 4 * tj + c;
                sm->D[t][4 * tj + c] = live[u] && j < dv ? us[(idx * DR_CHUNK + t) * dv + j] - d[u][c] : 0.0f;
            }
        }
        __syncthreads();
        // Outputs of rows tt, tt + 32. The state update below reads and writes only this thread's
        // entries of S, so the barrier above (after every read of S) is enough.
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int t = tt + 32 * u;
            if (!live[u]) continue;
            float acc[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[c] = sm->Ge[t] * o[u][c];
            const float* pr = ps + (idx * DR_CHUNK + t) * DR_CHUNK;
            for (int s = 0; s <= t; ++s) {
                const float p = pr[s];
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[c] += p * sm->D[s][4 * tj + c];
            }
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int j = j0 + 4 * tj + c;
                if (j < dv) out[((long long)(r0 + t) * hv + h) * dv + j] = scale * acc[c];
            }
        }
        // S = exp(G_{L-1}) S0 + sum_t exp(G_{L-1} - G_t) k_t d_t^T.
        float acc[M][4];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const int i = tt + 32 * m;
            const float decay = i < dk ? sm->Ge[L - 1] * (PD ? gl[idx * dk + i] : 1.0f) : 0.0f;
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[m][c] = i < dk ? decay * sm->S[i][4 * tj + c] : 0.0f;
        }
        for (int t = 0; t < L; ++t) {
            const float* kr = PD ? kg + (idx * DR_CHUNK + t) * dk : k + ((long long)(r0 + t) * hk + kh) * dk;
            float dd[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) dd[c] = sm->Gd[t] * sm->D[t][4 * tj + c];
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const int i = tt + 32 * m;
                const float kv = i < dk ? kr[i] : 0.0f;
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[m][c] += kv * dd[c];
            }
        }
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                if (tt + 32 * m < dk) sm->S[tt + 32 * m][4 * tj + c] = acc[m][c];
        __syncthreads();
    }
    for (int p = tid; p < DR_COLS * dk; p += blockDim.x) {
        const int jj = p / dk, i = p % dk, j = j0 + jj;
        if (j < dv) st[(long long)j * dk + i] = sm->S[i][jj];
    }
}

extern "C" __global__ void __launch_bounds__(128)
    bl_delta_rule_chunks(const float* q, const float* k, float* state, const int* slots, const int* pos, int* tab,
                         int rows, int max_short, int max_long, int max_chunks, const float* gs, const float* ps,
                         const float* ws, const float* us, const float* qg, const float* kg, const float* gl,
                         float* out, int hk, int hv, int dk, int dv, int n_slots, float scale) {
    KERNEL_ENTRY();
    __shared__ DrSmem sm;
    const DrTable tb = dr_table(tab, rows, max_short, max_long, max_chunks);
#define DR_CHUNKS(M)                                                                                              \
    if (gl)                                                                                                       \
        delta_chunks<M, true>(&sm, q, k, state, slots, pos, tb, gs, ps, ws, us, qg, kg, gl, out, hk, hv, dk, dv,  \
                              n_slots, scale);                                                                    \
    else                                                                                                          \
        delta_chunks<M, false>(&sm, q, k, state, slots, pos, tb, gs, ps, ws, us, qg, kg, gl, out, hk, hv, dk, dv, \
                               n_slots, scale)
    if (dk <= 32) {
        DR_CHUNKS(1);
    } else if (dk <= 64) {
        DR_CHUNKS(2);
    } else if (dk <= 128) {
        DR_CHUNKS(4);
    } else {
        DR_CHUNKS(8);
    }
#undef DR_CHUNKS
}
