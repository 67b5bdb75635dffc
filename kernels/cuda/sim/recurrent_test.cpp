// Checks cu/recurrent.cuh on the CPU (sim.h) against a plain f64 reference of ConvCausal (dilation
// 1, and the n-gram table layer's taps 4 at dilation 3: a history of 9 rows, also over a prompt in
// calls of 1 to 13 rows carrying the state, two slots) and DeltaRule: decode batches, several sequences per batch, sequences continuing from their slot's
// state and starting at position 0, the step-wise and the chunked delta rule (and both in one
// batch), odd head dims, and bad slots reported as error 5; and the fused decode step of a GDN
// mixer (bl_conv_causal_step + bl_gdn_step) against an f64 reference of the fifteen calls it
// replaces, with beta and alpha given or formed from their products, its f32 result and its Q8_1
// copy. The launches (grids, scratch areas)
// are those of src/ops/recurrent.rs. Prints one line per case; exits 1 on a failure.
#include "sim.h"

#include <cstdio>
#include <random>

#include "../cu/common.cuh"
#include "../cu/recurrent.cuh"

static std::mt19937 rng(7);
static float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

// `len` consecutive rows of one sequence.
struct Run {
    int slot, pos0, len;
};

static void rows_of(const std::vector<Run>& runs, std::vector<int>& slots, std::vector<int>& pos) {
    for (const Run& s : runs)
        for (int t = 0; t < s.len; ++t) {
            slots.push_back(s.slot);
            pos.push_back(s.pos0 + t);
        }
}

static bool starts(const std::vector<int>& slots, const std::vector<int>& pos, size_t r) {
    return r == 0 || slots[r] != slots[r - 1] || pos[r] != pos[r - 1] + 1;
}

static double rel(const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

// ---- ConvCausal ----

// step: the fused step's conv (bl_conv_causal_step: outputs and state in one launch, dilation 1).
// dil: rows between taps; the state holds the last (taps - 1) * dil inputs, oldest first.
static bool conv_case(const char* name, int ch, int taps, int n_slots, const std::vector<Run>& runs,
                      bool step = false, int dil = 1) {
    std::vector<int> slots, pos;
    rows_of(runs, slots, pos);
    const int rows = slots.size(), hist = (taps - 1) * dil;
    std::vector<float> x((long)rows * ch), w((long)taps * ch), state((long)hist * ch * n_slots);
    for (float& a : x) a = uniform(-1, 1);
    for (float& a : w) a = uniform(-1, 1);
    for (float& a : state) a = uniform(-1, 1);
    std::vector<double> want_state(state.begin(), state.end()), want((long)rows * ch);
    for (int r = 0; r < rows; ++r) {
        double* st = want_state.data() + (long)slots[r] * hist * ch;
        if (starts(slots, pos, r) && pos[r] == 0) std::fill(st, st + (long)hist * ch, 0.0);
        for (int c = 0; c < ch; ++c) {
            // The input k rows before r is st[hist - k].
            double acc = w[(long)c * taps + taps - 1] * x[(long)r * ch + c];
            for (int j = 0; j < taps - 1; ++j) acc += w[(long)c * taps + j] * st[(long)(hist - (taps - 1 - j) * dil) * ch + c];
            want[(long)r * ch + c] = acc;
            for (int j = 0; j + 1 < hist; ++j) st[(long)j * ch + c] = st[(long)(j + 1) * ch + c];
            if (hist > 0) st[(long)(hist - 1) * ch + c] = x[(long)r * ch + c];
        }
    }
    std::vector<float> out((long)rows * ch, NAN);
    int err = 0;
    const unsigned groups = (ch + 255) / 256;
    if (step)
        launch(Dim3{(unsigned)rows, groups, 1}, 256, [&] {
            bl_conv_causal_step(x.data(), w.data(), state.data(), slots.data(), pos.data(), out.data(), nullptr, ch, taps, rows,
                                n_slots, &err);
        });
    else
        launch(Dim3{(unsigned)rows, groups, 1}, 256, [&] {
            bl_conv_causal(x.data(), w.data(), state.data(), slots.data(), pos.data(), out.data(), ch, taps, dil,
                           n_slots, &err);
        });
    if (taps > 1 && !step)
        launch(Dim3{(unsigned)((rows + CONV_STATE_ROWS - 1) / CONV_STATE_ROWS), groups, 1}, 256, [&] {
            bl_conv_causal_state(x.data(), state.data(), slots.data(), pos.data(), ch, rows, hist, n_slots);
        });
    const double eo = rel(out, want), es = rel(state, want_state);
    const bool ok = err == 0 && eo < 1e-6 && es == 0;
    printf("%s ConvCausal%s %s (%d rows, dilation %d): out %.2g, state %.2g\n", ok ? "ok  " : "FAIL",
           step ? " (step)" : "", name, rows, dil, eo, es);
    return ok;
}

// A dilated conv over several calls carrying the state: the PLE's (taps 4, dilation 3) over a
// prompt in calls of `chunks` rows per slot, two slots, against one f64 pass over each whole
// sequence (outputs of every call, the final states).
static bool conv_calls_case(const char* name, int ch, int taps, int dil, const std::vector<int>& chunks) {
    const int n_slots = 2, hist = (taps - 1) * dil;
    int total = 0;
    for (int n : chunks) total += n;
    std::vector<float> x((long)total * n_slots * ch), w((long)taps * ch), state((long)hist * ch * n_slots);
    for (float& a : x) a = uniform(-1, 1);
    for (float& a : w) a = uniform(-1, 1);
    for (float& a : state) a = uniform(-1, 1);  // ignored: both sequences start at position 0
    // x of slot s at position t at (t * n_slots + s) * ch.
    auto xin = [&](int s, int t, int c) -> double { return t < 0 ? 0.0 : x[((long)t * n_slots + s) * ch + c]; };
    double worst = 0.0;
    int err = 0, p0 = 0;
    for (int n : chunks) {
        // One call: slot 1's rows, then slot 0's (interleaved slots, each a segment).
        std::vector<int> slots, pos;
        std::vector<float> xc, out((long)2 * n * ch, NAN);
        for (int s : {1, 0})
            for (int t = p0; t < p0 + n; ++t) {
                slots.push_back(s);
                pos.push_back(t);
                for (int c = 0; c < ch; ++c) xc.push_back(xin(s, t, c));
            }
        const int rows = 2 * n;
        const unsigned groups = (ch + 255) / 256;
        launch(Dim3{(unsigned)rows, groups, 1}, 256, [&] {
            bl_conv_causal(xc.data(), w.data(), state.data(), slots.data(), pos.data(), out.data(), ch, taps, dil,
                           n_slots, &err);
        });
        launch(Dim3{(unsigned)((rows + CONV_STATE_ROWS - 1) / CONV_STATE_ROWS), groups, 1}, 256, [&] {
            bl_conv_causal_state(xc.data(), state.data(), slots.data(), pos.data(), ch, rows, hist, n_slots);
        });
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < ch; ++c) {
                double acc = 0.0;
                for (int j = 0; j < taps; ++j) acc += (double)w[(long)c * taps + j] * xin(slots[r], pos[r] - (taps - 1 - j) * dil, c);
                worst = std::max(worst, std::fabs(out[(long)r * ch + c] - acc));
                if (!std::isfinite(out[(long)r * ch + c])) worst = INFINITY;
            }
        p0 += n;
    }
    double es = 0.0;
    for (int s = 0; s < n_slots; ++s)
        for (int j = 0; j < hist; ++j)
            for (int c = 0; c < ch; ++c)
                es = std::max(es, std::fabs(state[((long)s * hist + j) * ch + c] - xin(s, total - hist + j, c)));
    const bool ok = err == 0 && worst < 1e-5 && es == 0;
    printf("%s ConvCausal %s (taps %d, dilation %d, %zu calls): out %.2g, state %.2g\n", ok ? "ok  " : "FAIL", name,
           taps, dil, chunks.size(), worst, es);
    return ok;
}

// ---- DeltaRule ----

struct Shape {
    int hk, hv, dk, dv, n_slots;
    float scale, beta_scale;
    bool per_dim = false;  // a log decay per (head, key dim) (KDA), else per head (GDN)
};

struct Inputs {
    std::vector<int> slots, pos;
    std::vector<float> q, k, v, gate, beta;
};

static void dr_reference(const Shape& p, const Inputs& in, std::vector<double>& state, std::vector<double>& out) {
    const long rows = in.slots.size(), per = (long)p.dk * p.dv * p.hv;
    out.assign(rows * p.hv * p.dv, 0);
    for (long r = 0; r < rows; ++r) {
        double* st = state.data() + in.slots[r] * per;
        if (starts(in.slots, in.pos, r) && in.pos[r] == 0) std::fill(st, st + per, 0.0);
        for (int h = 0; h < p.hv; ++h) {
            const long kq = (r * p.hk + h % p.hk) * p.dk;
            const double b = p.beta_scale * in.beta[r * p.hv + h];
            auto decay = [&](int i) {
                return std::exp((double)in.gate[p.per_dim ? (r * p.hv + h) * p.dk + i : r * p.hv + h]);
            };
            for (int j = 0; j < p.dv; ++j) {
                double* s = st + ((long)h * p.dv + j) * p.dk;
                double kv = 0, o = 0;
                for (int i = 0; i < p.dk; ++i) kv += (s[i] *= decay(i)) * in.k[kq + i];
                const double d = b * (in.v[(r * p.hv + h) * p.dv + j] - kv);
                for (int i = 0; i < p.dk; ++i) o += (s[i] += in.k[kq + i] * d) * in.q[kq + i];
                out[(r * p.hv + h) * p.dv + j] = p.scale * o;
            }
        }
    }
}

// The launches of Launcher::delta_rule; returns whether the chunked form ran.
static bool dr_launch(const Shape& p, const Inputs& in, std::vector<float>& state, std::vector<float>& out, int* err) {
    const int rows = in.slots.size();
    out.assign((long)rows * p.hv * p.dv, NAN);
    const unsigned cols = (p.dv + DR_STEP_COLS - 1) / DR_STEP_COLS;
    auto step = [&](int* tab, int max_short, int max_long, int max_chunks, unsigned segments) {
        launch(Dim3{segments, cols, (unsigned)p.hv}, 128, [&] {
            bl_delta_rule_step(in.q.data(), in.k.data(), in.v.data(), in.gate.data(), in.beta.data(), state.data(),
                               in.slots.data(), in.pos.data(), out.data(), nullptr, tab, max_short, max_long, max_chunks,
                               p.hk, p.hv, p.dk, p.dv, rows, p.n_slots, p.scale, p.beta_scale, p.per_dim, err);
        });
    };
    if (rows < DR_CHUNK) {
        step(nullptr, 0, 0, 0, rows);
        return false;
    }
    const int max_short = std::min(rows, p.n_slots), max_long = std::min(rows / DR_CHUNK, p.n_slots);
    const int max_chunks = rows / DR_CHUNK + max_long;
    // Uninitialised scratch, as on the card.
    std::vector<int> tab(3 + (rows + 1) + max_short + 3 * max_long + 1 + 2 * max_chunks, 0x5a5a5a5a);
    const long per = (long)max_chunks * p.hv * DR_CHUNK;
    std::vector<float> gs(per, NAN), ps(per * DR_CHUNK, NAN), ws(per * p.dk, NAN), us(per * p.dv, NAN);
    // prep_dim's areas, absent (null) for a per-head decay.
    std::vector<float> qg(p.per_dim ? per * p.dk : 0, NAN), kg(qg.size(), NAN);
    std::vector<float> gl(p.per_dim ? (long)max_chunks * p.hv * p.dk : 0, NAN);
    launch(Dim3{1, 1, 1}, 1024, [&] {
        bl_delta_rule_table(in.slots.data(), in.pos.data(), tab.data(), rows, p.n_slots, max_short, max_long,
                            max_chunks, err);
    });
    step(tab.data(), max_short, max_long, max_chunks, max_short);
    launch(Dim3{(unsigned)max_chunks, (unsigned)p.hv, 1}, 256, [&] {
        if (p.per_dim)
            bl_delta_rule_prep_dim(in.q.data(), in.k.data(), in.v.data(), in.gate.data(), in.beta.data(), tab.data(),
                                   rows, max_short, max_long, max_chunks, p.hk, p.hv, p.dk, p.dv, p.beta_scale,
                                   gs.data(), ps.data(), ws.data(), us.data(), qg.data(), kg.data(), gl.data());
        else
            bl_delta_rule_prep(in.q.data(), in.k.data(), in.v.data(), in.gate.data(), in.beta.data(), tab.data(),
                               rows, max_short, max_long, max_chunks, p.hk, p.hv, p.dk, p.dv, p.beta_scale,
                               gs.data(), ps.data(), ws.data(), us.data());
    });
    launch(Dim3{(unsigned)max_long, (unsigned)((p.dv + DR_COLS - 1) / DR_COLS), (unsigned)p.hv}, 128, [&] {
        bl_delta_rule_chunks(in.q.data(), in.k.data(), state.data(), in.slots.data(), in.pos.data(), tab.data(), rows,
                             max_short, max_long, max_chunks, gs.data(), ps.data(), ws.data(), us.data(),
                             p.per_dim ? qg.data() : nullptr, p.per_dim ? kg.data() : nullptr,
                             p.per_dim ? gl.data() : nullptr, out.data(), p.hk, p.hv, p.dk, p.dv, p.n_slots,
                             p.scale);
    });
    return true;
}

// Unit-norm queries and keys (as after L2Norm), log decays in [gmin, gmax) (per head, or per
// (head, key dim)), beta in [0, 1).
static Inputs dr_inputs(const Shape& p, const std::vector<Run>& runs, float gmin, float gmax) {
    Inputs in;
    rows_of(runs, in.slots, in.pos);
    const long rows = in.slots.size();
    in.q.resize(rows * p.hk * p.dk);
    in.k.resize(in.q.size());
    for (std::vector<float>* t : {&in.q, &in.k})
        for (long h = 0; h < rows * p.hk; ++h) {
            float* x = &(*t)[h * p.dk];
            double ss = 0;
            for (int i = 0; i < p.dk; ++i) {
                x[i] = uniform(-1, 1);
                ss += (double)x[i] * x[i];
            }
            for (int i = 0; i < p.dk; ++i) x[i] /= std::sqrt(ss);
        }
    in.v.resize(rows * p.hv * p.dv);
    for (float& a : in.v) a = uniform(-1, 1);
    in.gate.resize(rows * p.hv * (p.per_dim ? p.dk : 1));
    for (float& a : in.gate) a = uniform(gmin, gmax);
    in.beta.resize(rows * p.hv);
    for (float& a : in.beta) a = uniform(0, 1);
    return in;
}

static bool dr_case(const char* name, const Shape& p, const std::vector<Run>& runs, float gmin, float gmax) {
    const Inputs in = dr_inputs(p, runs, gmin, gmax);
    std::vector<float> state((long)p.dk * p.dv * p.hv * p.n_slots), out;
    for (float& a : state) a = uniform(-1, 1);
    std::vector<double> want_state(state.begin(), state.end()), want;
    dr_reference(p, in, want_state, want);
    int err = 0;
    const bool chunked = dr_launch(p, in, state, out, &err);
    const double eo = rel(out, want), es = rel(state, want_state);
    const bool ok = err == 0 && eo < 2e-6 && es < 2e-6;
    printf("%s DeltaRule%s %s (%s, %zu rows): out %.2g, state %.2g\n", ok ? "ok  " : "FAIL",
           p.per_dim ? " per dim" : "", name, chunked ? "chunked" : "step-wise", in.slots.size(), eo, es);
    return ok;
}

static bool dr_bad_case(const char* name, const Shape& p, const std::vector<Run>& runs) {
    const Inputs in = dr_inputs(p, runs, -1, 0);
    std::vector<float> state((long)p.dk * p.dv * p.hv * p.n_slots, 0.0f), out;
    int err = 0;
    const bool chunked = dr_launch(p, in, state, out, &err);
    printf("%s DeltaRule %s (%s): error %d\n", err == ERR_STATE_SLOT ? "ok  " : "FAIL", name,
           chunked ? "chunked" : "step-wise", err);
    return err == ERR_STATE_SLOT;
}

// A verify pass's row states (bl_delta_rule_step writing each row's state): row r's column is
// bit for bit the state that launches of one row each (decoding without drafts) leave after row
// r, and within the band of the f64 reference's state after row r; the outputs and final states
// equal the launch without row states.
static bool dr_rows_case(const char* name, const Shape& p, const std::vector<Run>& runs) {
    const Inputs in = dr_inputs(p, runs, -1, 0);
    const int rows = in.slots.size();
    const long per = (long)p.dk * p.dv * p.hv;
    std::vector<float> start(per * p.n_slots);
    for (float& a : start) a = uniform(-1, 1);
    std::vector<float> state = start, plain = start, out((long)rows * p.hv * p.dv, NAN), plain_out;
    std::vector<float> row_states(per * rows, NAN);
    int err = 0;
    const unsigned cols = (p.dv + DR_STEP_COLS - 1) / DR_STEP_COLS;
    launch(Dim3{(unsigned)rows, cols, (unsigned)p.hv}, 128, [&] {
        bl_delta_rule_step(in.q.data(), in.k.data(), in.v.data(), in.gate.data(), in.beta.data(), state.data(),
                           in.slots.data(), in.pos.data(), out.data(), row_states.data(), nullptr, 0, 0, 0, p.hk,
                           p.hv, p.dk, p.dv, rows, p.n_slots, p.scale, p.beta_scale, p.per_dim, &err);
    });
    dr_launch(p, in, plain, plain_out, &err);
    bool same = plain == state && plain_out.size() == out.size();
    for (size_t i = 0; i < out.size() && same; ++i) same = out[i] == plain_out[i];
    std::vector<float> one = start;
    std::vector<double> want(start.begin(), start.end()), want_out;
    double worst = 0;
    bool bits = true;
    for (int r = 0; r < rows; ++r) {
        Inputs row;
        row.slots = {in.slots[r]};
        row.pos = {in.pos[r]};
        const int g = p.per_dim ? p.dk : 1;
        row.q.assign(in.q.begin() + (long)r * p.hk * p.dk, in.q.begin() + (long)(r + 1) * p.hk * p.dk);
        row.k.assign(in.k.begin() + (long)r * p.hk * p.dk, in.k.begin() + (long)(r + 1) * p.hk * p.dk);
        row.v.assign(in.v.begin() + (long)r * p.hv * p.dv, in.v.begin() + (long)(r + 1) * p.hv * p.dv);
        row.gate.assign(in.gate.begin() + (long)r * p.hv * g, in.gate.begin() + (long)(r + 1) * p.hv * g);
        row.beta.assign(in.beta.begin() + (long)r * p.hv, in.beta.begin() + (long)(r + 1) * p.hv);
        std::vector<float> o;
        dr_launch(p, row, one, o, &err);
        dr_reference(p, row, want, want_out);
        const float* got = row_states.data() + r * per;
        const long at = (long)in.slots[r] * per;
        for (long i = 0; i < per; ++i) bits &= got[i] == one[at + i];
        std::vector<float> g_row(got, got + per);
        std::vector<double> w_row(want.begin() + at, want.begin() + at + per);
        worst = std::max(worst, rel(g_row, w_row));
    }
    const bool ok = err == 0 && same && bits && worst < 2e-6;
    printf("%s DeltaRule%s row states %s (%d rows): as one-row launches %s, as the plain launch %s, f64 %.2g\n",
           ok ? "ok  " : "FAIL", p.per_dim ? " per dim" : "", name, rows, bits ? "bit for bit" : "NO",
           same ? "yes" : "NO", worst);
    return ok;
}

// A verify pass's conv row states (bl_conv_causal_rows before the state update): row r's column
// is the window that launches of one row each leave after row r.
static bool conv_rows_case(const char* name, int ch, int taps, int dil, int n_slots, const std::vector<Run>& runs) {
    std::vector<int> slots, pos;
    rows_of(runs, slots, pos);
    const int rows = slots.size(), hist = (taps - 1) * dil;
    const long width = (long)hist * ch;
    std::vector<float> x((long)rows * ch), w((long)taps * ch), start(width * n_slots);
    for (float& a : x) a = uniform(-1, 1);
    for (float& a : w) a = uniform(-1, 1);
    for (float& a : start) a = uniform(-1, 1);
    std::vector<float> row_states(width * rows, NAN);
    const unsigned groups = (ch + 255) / 256;
    launch(Dim3{(unsigned)rows, groups, 1}, 256, [&] {
        bl_conv_causal_rows(x.data(), start.data(), slots.data(), pos.data(), row_states.data(), ch, hist, n_slots);
    });
    std::vector<float> one = start;
    int err = 0;
    bool bits = true;
    for (int r = 0; r < rows; ++r) {
        std::vector<float> out(ch);
        launch(Dim3{1, groups, 1}, 256, [&] {
            bl_conv_causal(x.data() + (long)r * ch, w.data(), one.data(), &slots[r], &pos[r], out.data(), ch, taps, dil,
                           n_slots, &err);
        });
        launch(Dim3{1, groups, 1}, 256, [&] {
            bl_conv_causal_state(x.data() + (long)r * ch, one.data(), &slots[r], &pos[r], ch, 1, hist, n_slots);
        });
        for (long i = 0; i < width; ++i) bits &= row_states[r * width + i] == one[(long)slots[r] * width + i];
    }
    const bool ok = err == 0 && bits;
    printf("%s ConvCausal row states %s (%d rows, dilation %d): as one-row launches %s\n", ok ? "ok  " : "FAIL", name,
           rows, dil, bits ? "bit for bit" : "NO");
    return ok;
}

// The fused decode step's conv with row states (bl_conv_causal_step in a verify pass): each row's
// window bit for bit the one of one-row launches, outputs and final state as without them.
static bool conv_step_rows_case(const char* name, int ch, int taps, int n_slots, const std::vector<Run>& runs) {
    std::vector<int> slots, pos;
    rows_of(runs, slots, pos);
    const int rows = slots.size(), hist = taps - 1;
    const long width = (long)hist * ch;
    std::vector<float> x((long)rows * ch), w((long)taps * ch), start(width * n_slots);
    for (float& a : x) a = uniform(-1, 1);
    for (float& a : w) a = uniform(-1, 1);
    for (float& a : start) a = uniform(-1, 1);
    std::vector<float> state = start, plain = start, row_states(width * rows, NAN);
    std::vector<float> out((long)rows * ch, NAN), plain_out = out;
    int err = 0;
    const unsigned groups = (ch + 255) / 256;
    launch(Dim3{(unsigned)rows, groups, 1}, 256, [&] {
        bl_conv_causal_step(x.data(), w.data(), state.data(), slots.data(), pos.data(), out.data(), row_states.data(),
                            ch, taps, rows, n_slots, &err);
    });
    launch(Dim3{(unsigned)rows, groups, 1}, 256, [&] {
        bl_conv_causal_step(x.data(), w.data(), plain.data(), slots.data(), pos.data(), plain_out.data(), nullptr, ch,
                            taps, rows, n_slots, &err);
    });
    bool same = plain == state && plain_out == out, bits = true;
    std::vector<float> one = start;
    for (int r = 0; r < rows; ++r) {
        std::vector<float> o(ch);
        launch(Dim3{1, groups, 1}, 256, [&] {
            bl_conv_causal_step(x.data() + (long)r * ch, w.data(), one.data(), &slots[r], &pos[r], o.data(), nullptr, ch,
                                taps, 1, n_slots, &err);
        });
        for (long i = 0; i < width; ++i) bits &= row_states[r * width + i] == one[(long)slots[r] * width + i];
    }
    const bool ok = err == 0 && same && bits;
    printf("%s ConvCausal (step) row states %s (%d rows): as one-row launches %s, as without %s\n",
           ok ? "ok  " : "FAIL", name, rows, bits ? "bit for bit" : "NO", same ? "yes" : "NO");
    return ok;
}

// ---- The fused GDN decode step ----

// A GDN mixer's decode step: the conv's outputs (before the SiLU) and everything after them.
struct Gdn {
    Shape p;
    int n_embd;  // > 0: beta and alpha formed from x by the kernel
    float l2_eps, rms_eps;
};

struct GdnInputs {
    std::vector<int> slots, pos;
    std::vector<float> conv, beta, alpha, x, wb, wa, dt, a, z, norm_w;
};

static double silu_d(double v) { return v / (1 + std::exp(-v)); }

// The fifteen calls in f64: beta = sigmoid, gate = softplus(alpha + dt) * a, q and k L2-normed
// SiLU of the conv, v its SiLU, the delta rule, then each head RMS-normed, times norm_w and
// silu(z).
static void gdn_reference(const Gdn& g, const GdnInputs& in, std::vector<double>& state, std::vector<double>& out) {
    const Shape& p = g.p;
    const long rows = in.slots.size(), ch = 2L * p.dk * p.hk + (long)p.dv * p.hv;
    Inputs dr;
    dr.slots = in.slots;
    dr.pos = in.pos;
    dr.q.resize(rows * p.hk * p.dk);
    dr.k.resize(dr.q.size());
    dr.v.resize(rows * p.hv * p.dv);
    dr.gate.resize(rows * p.hv);
    dr.beta.resize(rows * p.hv);
    for (long r = 0; r < rows; ++r) {
        for (int h = 0; h < p.hk; ++h)
            for (int part = 0; part < 2; ++part) {
                double ss = 0;
                std::vector<double> t(p.dk);
                for (int i = 0; i < p.dk; ++i) {
                    t[i] = silu_d(in.conv[r * ch + (long)(part * p.hk + h) * p.dk + i]);
                    ss += t[i] * t[i];
                }
                float* dst = (part == 0 ? dr.q : dr.k).data() + (r * p.hk + h) * p.dk;
                for (int i = 0; i < p.dk; ++i) dst[i] = (float)(t[i] / std::sqrt(ss + g.l2_eps));
            }
        for (long c = 0; c < (long)p.hv * p.dv; ++c) dr.v[r * p.hv * p.dv + c] = (float)silu_d(in.conv[r * ch + 2L * p.dk * p.hk + c]);
        for (int h = 0; h < p.hv; ++h) {
            double b = 0, al = 0;
            if (g.n_embd > 0) {
                for (int i = 0; i < g.n_embd; ++i) {
                    b += (double)in.wb[(long)h * g.n_embd + i] * in.x[r * g.n_embd + i];
                    al += (double)in.wa[(long)h * g.n_embd + i] * in.x[r * g.n_embd + i];
                }
            } else {
                b = in.beta[r * p.hv + h];
                al = in.alpha[r * p.hv + h];
            }
            const double sp = al + in.dt[h] > 20 ? al + in.dt[h] : std::log1p(std::exp(al + in.dt[h]));
            dr.gate[r * p.hv + h] = (float)(sp * in.a[h]);
            dr.beta[r * p.hv + h] = (float)(1 / (1 + std::exp(-b)));
        }
    }
    dr_reference(p, dr, state, out);
    for (long r = 0; r < rows; ++r)
        for (int h = 0; h < p.hv; ++h) {
            double* o = out.data() + (r * p.hv + h) * p.dv;
            double ms = 0;
            for (int j = 0; j < p.dv; ++j) ms += o[j] * o[j];
            const double inv = 1 / std::sqrt(ms / p.dv + g.rms_eps);
            for (int j = 0; j < p.dv; ++j) o[j] = o[j] * inv * in.norm_w[j] * silu_d(in.z[(r * p.hv + h) * p.dv + j]);
        }
}

static GdnInputs gdn_inputs(const Gdn& g, const std::vector<Run>& runs) {
    const Shape& p = g.p;
    GdnInputs in;
    rows_of(runs, in.slots, in.pos);
    const long rows = in.slots.size(), ch = 2L * p.dk * p.hk + (long)p.dv * p.hv;
    auto fill = [](std::vector<float>& v, long n, float lo, float hi) {
        v.resize(n);
        for (float& t : v) t = uniform(lo, hi);
    };
    fill(in.conv, rows * ch, -2, 2);
    fill(in.beta, rows * p.hv, -3, 3);
    fill(in.alpha, rows * p.hv, -3, 3);
    if (g.n_embd > 0) {
        fill(in.x, rows * g.n_embd, -1, 1);
        fill(in.wb, (long)p.hv * g.n_embd, -0.1f, 0.1f);
        fill(in.wa, (long)p.hv * g.n_embd, -0.1f, 0.1f);
    }
    fill(in.dt, p.hv, -1, 1);
    fill(in.a, p.hv, -2, -0.1f);
    fill(in.z, rows * p.hv * p.dv, -2, 2);
    fill(in.norm_w, p.dv, 0.5f, 1.5f);
    return in;
}

// The launches of Launcher::gdn_step after the conv (whose outputs the inputs give): the f32
// result, or (q) only its Q8_1 copy.
static void gdn_launch(const Gdn& g, const GdnInputs& in, std::vector<float>& state, std::vector<float>& out,
                       std::vector<uint8_t>* q, int* err, float* row_states = nullptr) {
    const Shape& p = g.p;
    const int rows = in.slots.size();
    out.assign((long)rows * p.hv * p.dv, NAN);
    const bool formed = g.n_embd > 0;
    launch(Dim3{(unsigned)rows, (unsigned)p.hv, 1}, 8 * p.dv, [&] {
        bl_gdn_step(in.conv.data(), formed ? nullptr : in.beta.data(), formed ? nullptr : in.alpha.data(),
                    formed ? in.x.data() : nullptr, formed ? in.wb.data() : nullptr, formed ? in.wa.data() : nullptr,
                    g.n_embd, in.dt.data(), in.a.data(), in.z.data(), in.norm_w.data(), state.data(), in.slots.data(),
                    in.pos.data(), q ? nullptr : out.data(), q ? q->data() : nullptr, row_states, p.hk, p.hv, p.dk, p.dv, rows,
                    p.n_slots, g.l2_eps, g.rms_eps, p.scale, p.beta_scale, err);
    });
}

static bool gdn_case(const char* name, const Gdn& g, const std::vector<Run>& runs) {
    const Shape& p = g.p;
    const GdnInputs in = gdn_inputs(g, runs);
    std::vector<float> state((long)p.dk * p.dv * p.hv * p.n_slots);
    for (float& a : state) a = uniform(-1, 1);
    const std::vector<float> state0 = state;
    std::vector<double> want_state(state.begin(), state.end()), want;
    gdn_reference(g, in, want_state, want);
    int err = 0;
    std::vector<float> out;
    gdn_launch(g, in, state, out, nullptr, &err);
    const double eo = rel(out, want), es = rel(state, want_state);
    bool ok = err == 0 && eo < 1e-5 && es < 1e-5;
    // The Q8_1 copy from the same state: each value within half a step of the f32 result (plus
    // the f16 rounding of the step d: 127 * 2^-11 steps at most), and each block's s = d * sum(q).
    double worst = 0;
    if (p.dv % 32 == 0) {
        std::vector<float> state_q = state0, unused;
        std::vector<uint8_t> q(out.size() / 32 * 36, 0xa5);
        gdn_launch(g, in, state_q, unused, &q, &err);
        ok &= err == 0 && state_q == state;
        for (size_t b = 0; b < out.size() / 32; ++b) {
            const uint8_t* blk = q.data() + b * 36;
            __half2 ds;
            std::memcpy(&ds, blk, 4);
            const float d = __half2float(ds.x), s = __half2float(ds.y);
            long sum = 0;
            for (int i = 0; i < 32; ++i) {
                const int qi = (int8_t)blk[4 + i];
                sum += qi;
                worst = std::max(worst, (double)(std::fabs(d * qi - out[b * 32 + i]) / std::max(d, 1e-30f)));
            }
            ok &= std::fabs(s - d * sum) <= 1e-2 * std::max(1.0f, std::fabs(s));
        }
        ok &= worst <= 0.5 + 127.0 / 2048;
    }
    printf("%s GDN step %s (%zu rows%s): out %.2g, state %.2g, Q8_1 %.2g steps\n", ok ? "ok  " : "FAIL", name,
           in.slots.size(), g.n_embd > 0 ? ", beta and alpha formed" : "", eo, es, worst);
    return ok;
}

// The fused step in a verify pass (row states): each row's state bit for bit the one that
// launches of one row each leave, the outputs and final state as without row states.
static bool gdn_rows_case(const char* name, const Gdn& g, const std::vector<Run>& runs) {
    const Shape& p = g.p;
    const GdnInputs in = gdn_inputs(g, runs);
    const int rows = in.slots.size();
    const long per = (long)p.dk * p.dv * p.hv;
    std::vector<float> start(per * p.n_slots);
    for (float& a : start) a = uniform(-1, 1);
    std::vector<float> state = start, plain = start, out, plain_out, row_states(per * rows, NAN);
    int err = 0;
    gdn_launch(g, in, state, out, nullptr, &err, row_states.data());
    gdn_launch(g, in, plain, plain_out, nullptr, &err);
    bool same = plain == state, bits = true;
    for (size_t i = 0; i < out.size() && same; ++i) same = out[i] == plain_out[i];
    std::vector<float> one = start;
    const long ch = 2L * p.dk * p.hk + (long)p.dv * p.hv;
    for (int r = 0; r < rows; ++r) {
        GdnInputs row = in;
        row.slots = {in.slots[r]};
        row.pos = {in.pos[r]};
        auto cut = [&](std::vector<float>& v, const std::vector<float>& all, long n) {
            v.assign(all.begin() + r * n, all.begin() + (r + 1) * n);
        };
        cut(row.conv, in.conv, ch);
        cut(row.beta, in.beta, p.hv);
        cut(row.alpha, in.alpha, p.hv);
        cut(row.z, in.z, (long)p.hv * p.dv);
        if (g.n_embd > 0) cut(row.x, in.x, g.n_embd);
        std::vector<float> o;
        gdn_launch(g, row, one, o, nullptr, &err);
        for (long i = 0; i < per; ++i) bits &= row_states[r * per + i] == one[(long)in.slots[r] * per + i];
    }
    const bool ok = err == 0 && same && bits;
    printf("%s GDN step row states %s (%d rows): as one-row launches %s, as without %s\n", ok ? "ok  " : "FAIL",
           name, rows, bits ? "bit for bit" : "NO", same ? "yes" : "NO");
    return ok;
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    bool ok = true;
    ok &= conv_case("decode, 3 slots", 300, 4, 3, {{0, 5, 1}, {1, 0, 1}, {2, 1, 1}});
    ok &= conv_case("runs shorter than the window", 300, 4, 4, {{3, 7, 2}, {0, 0, 3}, {1, 2, 1}, {2, 10, 5}});
    ok &= conv_case("prompt + decode", 520, 4, 3, {{1, 9, 1}, {0, 0, 100}, {2, 30, 40}});
    ok &= conv_case("2 taps", 40, 2, 2, {{0, 3, 3}, {1, 0, 2}});
    ok &= conv_case("1 tap", 40, 1, 2, {{0, 3, 3}});
    ok &= conv_case("decode, 3 slots", 300, 4, 3, {{0, 5, 1}, {1, 0, 1}, {2, 1, 1}}, true);
    ok &= conv_case("runs shorter than the window", 300, 4, 4, {{3, 7, 2}, {0, 0, 3}, {1, 2, 1}, {2, 10, 5}}, true);
    ok &= conv_case("1 tap", 40, 1, 2, {{0, 3, 3}}, true);
    // The PLE's dilated conv (taps 4, dilation 3: a history of 9 rows).
    ok &= conv_case("decode, 3 slots", 160, 4, 3, {{0, 5, 1}, {1, 0, 1}, {2, 11, 1}}, false, 3);
    ok &= conv_case("runs shorter than the history", 160, 4, 4, {{3, 7, 2}, {0, 0, 5}, {1, 2, 8}, {2, 10, 12}}, false,
                    3);
    ok &= conv_case("2 taps", 40, 2, 2, {{0, 3, 3}, {1, 0, 9}}, false, 5);
    ok &= conv_calls_case("prompt in calls, 2 slots", 160, 4, 3, {1, 2, 5, 1, 13, 1, 1});
    // Qwen3.5's head dims, fewer heads (value head h reads key head h % 2).
    const Shape qwen{2, 4, 128, 128, 4, 0.088f, 1.0f};
    ok &= dr_case("decode, 3 slots", qwen, {{0, 5, 1}, {1, 0, 1}, {2, 9, 1}}, -1, 0);
    ok &= dr_case("short prompt + decode", Shape{2, 4, 128, 32, 4, 0.088f, 1.0f}, {{0, 5, 1}, {3, 0, 12}, {2, 9, 3}},
                  -1, 0);
    ok &= dr_case("long and short runs", qwen, {{3, 0, 100}, {1, 17, 4}, {0, 130, 71}, {2, 3, 1}}, -0.3f, 0);
    ok &= dr_case("one run of 64", qwen, {{2, 64, 64}}, -0.1f, 0);
    ok &= dr_case("strong decay", qwen, {{3, 0, 100}, {1, 17, 4}}, -5, 0);
    ok &= dr_case("gates in [-1, 1]", qwen, {{3, 0, 130}, {1, 17, 4}}, -1, 1);
    const Shape odd{1, 3, 96, 40, 3, 0.1f, 2.0f};
    ok &= dr_case("dk 96, dv 40", odd, {{0, 5, 1}, {1, 0, 2}}, -1, 0);
    ok &= dr_case("dk 96, dv 40", odd, {{0, 5, 130}, {1, 0, 10}, {2, 0, 65}}, -0.2f, 0);
    ok &= dr_case("dk 256", Shape{2, 2, 256, 32, 2, 0.06f, 1.0f}, {{1, 0, 70}, {0, 4, 2}}, -0.2f, 0);
    ok &= dr_case("dk 16", Shape{2, 2, 16, 16, 2, 0.25f, 1.0f}, {{1, 0, 70}, {0, 4, 2}}, -0.2f, 0);
    // KDA: a decay per (head, key dim), Solar-Open2's head dims and beta x2.
    const Shape kda{3, 3, 128, 128, 4, 0.088f, 2.0f, true};
    ok &= dr_case("decode, 3 slots", kda, {{0, 5, 1}, {1, 0, 1}, {2, 9, 1}}, -1, 0);
    ok &= dr_case("short prompt + decode", kda, {{0, 5, 1}, {3, 0, 12}, {2, 9, 3}}, -1, 0);
    ok &= dr_case("long and short runs", kda, {{3, 0, 100}, {1, 17, 4}, {0, 130, 71}, {2, 3, 1}}, -0.3f, 0);
    ok &= dr_case("one run of 64", kda, {{2, 64, 64}}, -0.1f, 0);
    ok &= dr_case("gates in [-1, 1]", kda, {{3, 0, 130}, {1, 17, 4}}, -1, 1);
    // Decays that reach e^-4000 within a chunk (an unbounded gate forgets a dim at once): the
    // products underflow to exact zeros, never inf or NaN.
    ok &= dr_case("gates down to -60", kda, {{3, 0, 130}, {1, 17, 70}}, -60, 0);
    ok &= dr_case("dk 96, dv 40", Shape{1, 2, 96, 40, 3, 0.1f, 1.0f, true}, {{0, 5, 130}, {1, 0, 10}, {2, 0, 65}},
                  -0.2f, 0);
    ok &= dr_case("dk 16", Shape{2, 2, 16, 16, 2, 0.25f, 1.0f, true}, {{1, 0, 70}, {0, 4, 2}}, -0.5f, 0);
    ok &= gdn_case("decode, 3 slots", Gdn{qwen, 0, 1e-6f, 1e-6f}, {{0, 5, 1}, {1, 0, 1}, {2, 9, 1}});
    ok &= gdn_case("decode, 2 slots", Gdn{qwen, 96, 1e-6f, 1e-6f}, {{3, 5, 1}, {1, 7, 1}});
    ok &= gdn_case("short runs", Gdn{Shape{1, 2, 32, 32, 3, 0.17f, 1.0f}, 64, 1e-6f, 1e-5f},
                   {{0, 0, 3}, {2, 4, 2}, {1, 9, 1}});
    ok &= gdn_case("dk 96, dv 40", Gdn{odd, 0, 1e-6f, 1e-6f}, {{0, 5, 1}, {1, 0, 2}});
    // Verify passes: a slot's last token and its drafts beside other slots' (and a fresh one).
    ok &= dr_rows_case("verify, 3 slots", qwen, {{0, 5, 4}, {1, 0, 3}, {2, 9, 1}});
    ok &= dr_rows_case("verify, 16 rows", Shape{2, 4, 128, 32, 4, 0.088f, 1.0f}, {{3, 7, 4}, {0, 2, 4}, {1, 0, 8}});
    ok &= dr_rows_case("verify, 2 slots", kda, {{0, 5, 4}, {1, 0, 2}});
    ok &= dr_rows_case("dk 96, dv 40", odd, {{0, 5, 4}, {1, 0, 2}});
    ok &= conv_rows_case("verify, 3 slots", 300, 4, 1, 3, {{0, 5, 4}, {1, 0, 3}, {2, 9, 1}});
    ok &= conv_rows_case("runs shorter than the history", 160, 4, 3, 3, {{0, 5, 4}, {1, 0, 3}, {2, 2, 1}});
    ok &= conv_step_rows_case("verify, 3 slots", 300, 4, 3, {{0, 5, 4}, {1, 0, 3}, {2, 9, 1}});
    ok &= gdn_rows_case("verify, 3 slots", Gdn{qwen, 0, 1e-6f, 1e-6f}, {{0, 5, 4}, {1, 0, 3}, {2, 9, 1}});
    ok &= gdn_rows_case("verify, beta and alpha formed", Gdn{qwen, 96, 1e-6f, 1e-6f}, {{3, 5, 4}, {1, 7, 2}});
    ok &= dr_bad_case("slot outside the state", qwen, {{0, 3, 2}, {4, 0, 3}});
    ok &= dr_bad_case("slot outside the state", qwen, {{0, 3, 2}, {4, 0, 70}, {-1, 0, 1}});
    ok &= dr_bad_case("negative position", qwen, {{0, -3, 70}});
    ok &= dr_bad_case("one slot twice", qwen, {{0, 0, 70}, {1, 0, 70}, {0, 100, 70}, {2, 0, 1}, {3, 0, 1}});
    printf(ok ? "all passed\n" : "some failed\n");
    return ok ? 0 : 1;
}
