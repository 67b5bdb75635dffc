// Renders chat prompts through llama.cpp b11434's own template code (common/chat.cpp:
// common_chat_templates_apply), for tests/oracle/make_chat_continue_golden.sh. Each stdin line
// is a JSON object {"template": PATH, "messages": [...], "add_generation_prompt": bool,
// "continue_final_message": true | "content" | "reasoning_content" | null,
// "enable_thinking": bool, "bos": TEXT, "eos": TEXT}; each stdout line is {"prompt": TEXT} or {"error": MESSAGE}, the case
// echoed beside it, with the UTC date it was rendered on (templates print strftime_now).
#include "chat.h"
#include <nlohmann/json.hpp>

#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

using nlohmann::ordered_json;

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) {
            continue;
        }
        ordered_json c = ordered_json::parse(line);
        ordered_json out = c;
        try {
            std::ifstream f(c.at("template").get<std::string>());
            std::stringstream src;
            src << f.rdbuf();
            auto tmpls = common_chat_templates_init(nullptr, src.str(), c.value("bos", ""), c.value("eos", ""));
            common_chat_templates_inputs in;
            in.messages = common_chat_msgs_parse_oaicompat(common_json::parse(c.at("messages").dump()));
            in.add_generation_prompt = c.value("add_generation_prompt", true);
            in.continue_final_message = common_chat_continuation_parse(common_json::parse(c.value("continue_final_message", ordered_json()).dump()));
            in.enable_thinking = c.value("enable_thinking", true);
            in.use_jinja = true;
            in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
            auto p = common_chat_templates_apply(tmpls.get(), in);
            out["prompt"] = p.prompt;
            // strftime_now reads the real clock: the day it rendered, for the replay.
            std::time_t t = std::time(nullptr);
            char day[16];
            std::strftime(day, sizeof day, "%Y-%m-%d", std::gmtime(&t));
            out["date"] = day;
        } catch (const std::exception & e) {
            out["error"] = e.what();
        }
        std::cout << out.dump() << "\n";
    }
    return 0;
}
