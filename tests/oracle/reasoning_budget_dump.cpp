// Prints llama.cpp's reasoning budget sampler (common/reasoning-budget.cpp of b11434) on fixed
// and pseudo-random token sequences, as JSON lines: for each case, the token the sampler forces
// before each token of the sequence is taken in (-1: none). Then common_utf8_is_complete on a
// list of byte strings. The vocabulary is null, so every token counts as a whole character
// (the UTF-8 rule is dumped on its own). Built and run by tests/oracle/make_reasoning_budget_golden.sh.
#include "reasoning-budget.h"
#include "unicode.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

static void list(const std::vector<llama_token> & v) {
    printf("[");
    for (size_t i = 0; i < v.size(); i++) printf(i ? ",%d" : "%d", v[i]);
    printf("]");
}

// `end_at`: the steps before whose row the span's end is asked for at run time
// (common_reasoning_budget_force, what reasoning_control's `reasoning_end` calls).
static void run_case(const char * name, const llama_tokens & start, const std::vector<llama_tokens> & ends,
                     const llama_tokens & forced, int32_t budget, const llama_tokens & prefill,
                     const llama_tokens & seq, const std::vector<int> & end_at = {}) {
    llama_sampler * s = common_reasoning_budget_init(nullptr, {start}, ends, forced, budget);
    for (auto t : prefill) llama_sampler_accept(s, t);
    const int n_vocab = 16;
    std::vector<int> out;
    for (size_t step = 0; step < seq.size(); step++) {
        const llama_token t = seq[step];
        for (int e : end_at) {
            if (e == (int) step) common_reasoning_budget_force(s);
        }
        std::vector<llama_token_data> cur;
        for (int i = 0; i < n_vocab; i++) cur.push_back({i, 1.0f, 0.0f});
        llama_token_data_array arr = {cur.data(), cur.size(), -1, false};
        llama_sampler_apply(s, &arr);
        int alive = -1, n_alive = 0;
        for (auto & d : cur) if (d.logit != -INFINITY) { alive = d.id; n_alive++; }
        out.push_back(n_alive == n_vocab ? -1 : (n_alive == 1 ? alive : -2));
        llama_sampler_accept(s, t);
    }
    printf("{\"name\":\"%s\",\"budget\":%d,\"start\":", name, budget);
    list(start);
    printf(",\"ends\":[");
    for (size_t i = 0; i < ends.size(); i++) { if (i) printf(","); list(ends[i]); }
    printf("],\"forced\":");
    list(forced);
    printf(",\"prefill\":");
    list(prefill);
    printf(",\"seq\":");
    list(seq);
    printf(",\"end_at\":");
    list(end_at);
    printf(",\"forcing\":");
    list(out);
    printf("}\n");
    llama_sampler_free(s);
}

int main() {
    // Fixed cases: a two-token start, ends of one and two tokens, a two-token forced end.
    const llama_tokens start = {1, 2};
    const std::vector<llama_tokens> ends = {{3}, {4, 5}};
    const llama_tokens forced = {6, 3};
    run_case("natural_end", start, ends, forced, 5, {}, {0, 1, 2, 7, 7, 3, 7, 7, 7});
    run_case("budget_runs_out", start, ends, forced, 2, {}, {1, 2, 7, 7, 6, 3, 7, 7});
    run_case("budget_zero", start, ends, forced, 0, {}, {1, 2, 6, 3, 7});
    run_case("prefill_opens", start, ends, forced, 3, {0, 1, 2}, {7, 7, 7, 6, 3, 7});
    run_case("rearm", start, ends, forced, 1, {}, {1, 2, 7, 6, 3, 1, 2, 7, 6, 3, 7});
    run_case("two_token_end", start, ends, forced, 4, {}, {1, 2, 4, 5, 7, 7});
    run_case("split_start", start, ends, forced, 2, {}, {1, 7, 2, 1, 1, 2, 7, 7, 7});
    run_case("unlimited", start, ends, forced, 2147483647, {}, {1, 2, 7, 7, 7, 7, 3, 7});
    // A start of one repeated token: a match starts the next one afresh (no overlap).
    run_case("no_overlap", {1, 1}, {{3}}, forced, 1, {}, {1, 1, 3, 1, 7, 7, 7, 1, 1, 7, 7, 7});
    // Pseudo-random cases over tokens 0..7 (a fixed linear congruential generator).
    uint32_t x = 12345;
    auto next = [&](uint32_t n) { x = x * 1103515245u + 12345u; return (x >> 16) % n; };
    for (int c = 0; c < 300; c++) {
        int budget = (int) next(5);
        llama_tokens prefill, seq;
        int np = (int) next(4);
        for (int i = 0; i < np; i++) prefill.push_back((llama_token) next(8));
        int ns = 8 + (int) next(24);
        for (int i = 0; i < ns; i++) {
            // Starts and ends often enough to matter.
            uint32_t r = next(10);
            if (r < 2) { seq.push_back(1); seq.push_back(2); }
            else if (r < 3) seq.push_back(3);
            else if (r < 4) { seq.push_back(4); seq.push_back(5); }
            else seq.push_back((llama_token) next(8));
        }
        std::string name = "random_" + std::to_string(c);
        run_case(name.c_str(), start, ends, forced, budget, prefill, seq);
    }
    // The span's end asked for at run time: while counting (forced then), before the span
    // opens, while forcing, after it ended, twice, with an unlimited budget.
    const int32_t unlimited = 2147483647;
    run_case("end_counting", start, ends, forced, unlimited, {}, {1, 2, 7, 7, 6, 3, 7}, {4});
    run_case("end_idle", start, ends, forced, unlimited, {}, {7, 1, 2, 7, 7, 3, 7}, {0});
    run_case("end_forcing", start, ends, forced, 1, {}, {1, 2, 7, 6, 3, 7}, {4});
    run_case("end_done", start, ends, forced, unlimited, {}, {1, 2, 7, 3, 7, 7}, {5});
    run_case("end_twice", start, ends, forced, unlimited, {}, {1, 2, 7, 6, 3, 1, 2, 7, 6, 3, 7}, {3, 8});
    run_case("end_prefill", start, ends, forced, unlimited, {0, 1, 2}, {6, 3, 7}, {0});
    for (int c = 0; c < 100; c++) {
        int budget = next(3) == 0 ? (int) next(5) : unlimited;
        llama_tokens seq;
        int ns = 8 + (int) next(24);
        for (int i = 0; i < ns; i++) {
            uint32_t r = next(10);
            if (r < 2) { seq.push_back(1); seq.push_back(2); }
            else if (r < 3) seq.push_back(3);
            else seq.push_back((llama_token) next(8));
        }
        std::vector<int> end_at;
        int ne = 1 + (int) next(3);
        for (int i = 0; i < ne; i++) end_at.push_back((int) next((uint32_t) seq.size()));
        std::string name = "random_end_" + std::to_string(c);
        run_case(name.c_str(), start, ends, forced, budget, {}, seq, end_at);
    }
    // The UTF-8 rule.
    const std::vector<std::string> pieces = {
        "", "a", "ab", "\xc3", "\xc3\xa9", "a\xc3", "\xe2\x82", "\xe2\x82\xac", "\xf0\x9f\x98",
        "\xf0\x9f\x98\x80", "\x80", "\x80\x80", "\x80\x80\x80\x80", "\x80\x80\x80\x80\x80",
        "x\xf0\x9f", "\xc3\xa9\xe2", "\xf0\x9f\x98\x80\xc3\xa9"};
    for (const auto & p : pieces) {
        printf("{\"utf8\":[");
        for (size_t i = 0; i < p.size(); i++) printf(i ? ",%u" : "%u", (unsigned) (unsigned char) p[i]);
        printf("],\"complete\":%s}\n", common_utf8_is_complete(p) ? "true" : "false");
    }
    return 0;
}
