// Runs llama.cpp b11434's n-gram speculative drafters (common/speculative.cpp's ngram-simple and
// ngram-mod, through its public common_speculative_* API, as llama-server drives them) over
// scripted sessions and prints every draft. A case a line on stdin:
//   "TYPE A B C ; PROMPT0 | TRUTH0 ; PROMPT1 | TRUTH1 ..."
// TYPE simple (A B: size_n size_m) or mod (A B C: n_match n_max n_min); each sequence's prompt
// and the tokens the target "samples" after it. Each sequence begins with its prompt, then the
// sequences take turns: the next truth token is sampled, a draft is asked for (at most the truth
// tokens left after it), its tokens matching the truth are accepted (reported to the drafter
// when it drafted), and the sequence moves past the sampled and accepted tokens.
// One JSON line out per case. Built and run by tests/oracle/make_ngram_draft_golden.sh.
#include "common.h"
#include "speculative.h"

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static void list(const llama_tokens & v) {
    printf("[");
    for (size_t i = 0; i < v.size(); i++) printf(i ? ",%d" : "%d", v[i]);
    printf("]");
}

static llama_tokens ints(const std::string & s) {
    std::istringstream in(s);
    llama_tokens out;
    for (llama_token t; in >> t;) out.push_back(t);
    return out;
}

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        std::vector<std::string> parts;
        {
            std::stringstream ss(line);
            std::string p;
            while (std::getline(ss, p, ';')) parts.push_back(p);
        }
        std::istringstream head(parts[0]);
        std::string type;
        int a = 0, b = 0, c = 0;
        head >> type >> a >> b >> c;
        std::vector<llama_tokens> prompts, truths;
        for (size_t i = 1; i < parts.size(); i++) {
            const size_t bar = parts[i].find('|');
            prompts.push_back(ints(parts[i].substr(0, bar)));
            truths.push_back(ints(parts[i].substr(bar + 1)));
        }
        const uint32_t n_seq = (uint32_t) prompts.size();
        common_params_speculative params;
        if (type == "simple") {
            params.types = {COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE};
            params.ngram_simple.size_n = (uint16_t) a;
            params.ngram_simple.size_m = (uint16_t) b;
        } else {
            params.types = {COMMON_SPECULATIVE_TYPE_NGRAM_MOD};
            params.ngram_mod.n_match = a;
            params.ngram_mod.n_max = b;
            params.ngram_mod.n_min = c;
        }
        common_speculative * spec = common_speculative_init(params, n_seq);
        std::vector<size_t> gen(n_seq, 0);
        for (uint32_t s = 0; s < n_seq; s++) common_speculative_begin(spec, (llama_seq_id) s, prompts[s]);
        printf("{\"type\":\"%s\",\"a\":%d,\"b\":%d,\"c\":%d,\"seqs\":[", type.c_str(), a, b, c);
        for (uint32_t s = 0; s < n_seq; s++) {
            printf(s ? ",{\"prompt\":" : "{\"prompt\":");
            list(prompts[s]);
            printf(",\"truth\":");
            list(truths[s]);
            printf("}");
        }
        printf("],\"drafts\":[");
        bool first = true, busy = true;
        while (busy) {
            busy = false;
            for (uint32_t s = 0; s < n_seq; s++) {
                const llama_tokens & truth = truths[s];
                if (gen[s] >= truth.size()) continue;
                busy = true;
                llama_tokens history = prompts[s];
                history.insert(history.end(), truth.begin(), truth.begin() + gen[s]);
                const llama_token sampled = truth[gen[s]];
                const int room = (int) (truth.size() - gen[s] - 1);
                llama_tokens draft;
                if (room > 0) {
                    common_speculative_draft_params & dp = common_speculative_get_draft_params(spec, (llama_seq_id) s);
                    dp.drafting = true;
                    dp.n_max = room;
                    dp.pos0 = (llama_pos) history.size();
                    dp.id_last = sampled;
                    dp.prompt = &history;
                    dp.result = &draft;
                    dp.result_q = nullptr;
                    common_speculative_draft(spec);
                }
                size_t accepted = 0;
                while (accepted < draft.size() && draft[accepted] == truth[gen[s] + 1 + accepted]) accepted++;
                if (!draft.empty()) common_speculative_accept(spec, (llama_seq_id) s, (uint16_t) accepted);
                printf(first ? "[%u,%zu," : ",[%u,%zu,", s, gen[s]);
                first = false;
                list(draft);
                printf("]");
                gen[s] += 1 + accepted;
            }
        }
        printf("]}\n");
        common_speculative_free(spec);
    }
    return 0;
}
