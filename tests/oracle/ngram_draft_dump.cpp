// Prints llama.cpp b11434's ngram-simple drafts (common/ngram-map.cpp common_ngram_simple_draft)
// for the cases on stdin, one a line: "SIZE_N SIZE_M SAMPLED T0 T1 ..." (the history, then the
// token just sampled after it); one JSON object a line out: the case and its draft.
// Built and run by tests/oracle/make_ngram_draft_golden.sh.
#include "ngram-map.h"

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        unsigned n = 0, m = 0;
        llama_token sampled = 0;
        in >> n >> m >> sampled;
        llama_tokens history;
        for (llama_token t; in >> t;) {
            history.push_back(t);
        }
        common_ngram_simple_config cfg{(uint16_t) n, (uint16_t) m};
        llama_tokens draft = common_ngram_simple_draft(cfg, history, sampled);
        std::printf("{\"size_n\":%u,\"size_m\":%u,\"sampled\":%d,\"history\":[", n, m, sampled);
        for (size_t i = 0; i < history.size(); ++i) {
            std::printf(i ? ",%d" : "%d", history[i]);
        }
        std::printf("],\"draft\":[");
        for (size_t i = 0; i < draft.size(); ++i) {
            std::printf(i ? ",%d" : "%d", draft[i]);
        }
        std::printf("]}\n");
    }
    return 0;
}
