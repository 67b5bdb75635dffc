// The grammar oracle's converter: llama.cpp's json_schema_to_grammar (common/, compiled from
// the pinned sdist beside this file) on the schema read from stdin; prints the GBNF, or the
// error and exits 2. The three string helpers it links against live in common.cpp, which pulls
// in most of llama.cpp, so they are given here.
#include "json-schema-to-grammar.h"

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

std::string string_join(const std::vector<std::string> & parts, const std::string & sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); i++) {
        out += (i ? sep : "") + parts[i];
    }
    return out;
}

std::vector<std::string> string_split(const std::string & s, const std::string & sep) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t at; (at = s.find(sep, start)) != std::string::npos; start = at + sep.size()) {
        out.push_back(s.substr(start, at - start));
    }
    out.push_back(s.substr(start));
    return out;
}

std::string string_repeat(const std::string & s, size_t n) {
    std::string out;
    for (size_t i = 0; i < n; i++) {
        out += s;
    }
    return out;
}

int main() {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    try {
        std::cout << json_schema_to_grammar(common_json::parse(ss.str()), true);
    } catch (const std::exception & e) {
        std::cerr << e.what() << "\n";
        return 2;
    }
    return 0;
}
