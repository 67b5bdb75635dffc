// The grammar oracle's judge: llama.cpp's own grammar engine (libllama's grammar functions, the
// ones tests/test-gbnf-validator.cpp calls) decides whether each input string is a sentence of
// a GBNF grammar. Usage: llama_judge GRAMMAR.gbnf < lines, each line a string in hex (UTF-8
// bytes); prints 1 or 0 per line, or "E" and exits 2 when llama.cpp refuses the grammar.
#include "llama-grammar.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static std::vector<uint32_t> code_points(const std::string & bytes) {
    std::vector<uint32_t> out;
    size_t i = 0;
    while (i < bytes.size()) {
        unsigned char b = bytes[i];
        int extra = b < 0x80 ? 0 : b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
        uint32_t v = extra == 0 ? b : b & (0x3F >> extra);
        for (int k = 1; k <= extra && i + k < bytes.size(); k++) {
            v = (v << 6) | (static_cast<unsigned char>(bytes[i + k]) & 0x3F);
        }
        out.push_back(v);
        i += extra + 1;
    }
    return out;
}

static std::string unhex(const std::string & h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
        out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
    }
    return out;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s GRAMMAR.gbnf < hex lines\n", argv[0]);
        return 1;
    }
    std::ifstream f(argv[1]);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    llama_grammar * probe = llama_grammar_init_impl(nullptr, text.c_str(), "root", false, nullptr, 0, nullptr, 0);
    if (!probe) {
        std::printf("E\n");
        return 2;
    }
    std::string line;
    while (std::getline(std::cin, line)) {
        llama_grammar * g = llama_grammar_clone_impl(*probe);
        bool ok = true;
        for (uint32_t c : code_points(unhex(line))) {
            llama_grammar_accept(g, c);
            if (llama_grammar_get_stacks(g).empty()) {
                ok = false;
                break;
            }
        }
        if (ok) {
            ok = false;
            for (const auto & stack : llama_grammar_get_stacks(g)) {
                ok = ok || stack.empty();
            }
        }
        std::printf("%d\n", ok ? 1 : 0);
        llama_grammar_free_impl(g);
    }
    llama_grammar_free_impl(probe);
    return 0;
}
