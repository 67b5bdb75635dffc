// Renders fixed conversations through libllama b11434's own C API `llama_chat_apply_template`
// (its built-in, non-Jinja templates), for tests/oracle/make_builtin_templates_golden.sh:
// - every built-in name (llama_chat_builtin_templates) on every conversation, with and without
//   the generation prompt;
// - marker texts that llama.cpp's detection maps to a template (one or more per family, and
//   texts it maps to none), on conversation 2;
// - the text of each template file named on the command line, on conversation 2.
// Prints one JSON object; a render llama.cpp refuses (-1) is null.
#include "llama.h"
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using nlohmann::ordered_json;
using conversation = std::vector<std::pair<std::string, std::string>>;

static ordered_json render(const std::string & tmpl, const conversation & conv, bool add_ass) {
    std::vector<llama_chat_message> msgs;
    for (const auto & m : conv) {
        msgs.push_back({ m.first.c_str(), m.second.c_str() });
    }
    int32_t n = llama_chat_apply_template(tmpl.c_str(), msgs.data(), msgs.size(), add_ass, nullptr, 0);
    if (n < 0) {
        return nullptr;
    }
    std::vector<char> buf(n + 1);
    n = llama_chat_apply_template(tmpl.c_str(), msgs.data(), msgs.size(), add_ass, buf.data(), buf.size());
    return std::string(buf.data(), n);
}

int main(int argc, char ** argv) {
    const std::vector<conversation> convs = {
        { { "user", "Hello" } },
        { { "system", "You are a test." }, { "user", "Hi there" } },
        { { "system", "Be brief." }, { "user", "What is 2+2?" }, { "assistant", "4" },
          { "user", "And 3+3?" } },
        { { "user", "Tell me a joke." }, { "assistant", "Why did the chicken cross the road?" },
          { "user", "Why?" }, { "assistant", "To get to the other side." } },
        { { "system", "  Réponds en français. \n" }, { "user", " 日本語で答えて 🙂\t" },
          { "assistant", "\n  はい、わかりました。 " }, { "user", "Ünïcödé — ¿qué?\u00a0" } },
        { { "system", "" }, { "user", "" }, { "assistant", "" }, { "user", "" } },
        { { "system", "First." }, { "system", "Second." }, { "user", "Go" } },
        { { "system", "Use tools." }, { "user", "Weather?" },
          { "assistant_tool_call", "[{\"name\": \"weather\"}]" }, { "tool", "{\"temp\": 20}" },
          { "function", "f()" }, { "assistant", "It is 20." }, { "user", "Thanks" } },
        { { "assistant", "I start." }, { "user", "ok" } },
        { { "user", "Line one\nLine two\n\n" }, { "user", "Again" } },
    };
    // Texts that are not names: llama.cpp detects a template from markers in them.
    const std::vector<std::string> probes = {
        "<|im_start|>", "<|im_start|><|im_sep|>", "<|im_start|><end_of_utterance>",
        "mistral-anything", "[INST][SYSTEM_PROMPT]", "' [INST] ' + system_message",
        "[INST][AVAILABLE_TOOLS]\"[INST]\"", "[INST][AVAILABLE_TOOLS]", "[INST] content.strip()",
        "[INST] bos_token + '[INST]", "[INST]<<SYS>>", "[INST]",
        "<|assistant|><|end|>", "[gMASK]<sop>", "<|assistant|><|user|><|tool_declare|>",
        "<|assistant|><|user|></s>", "<|assistant|><|user|>",
        "<|{{ item['role'] }}|><|begin_of_image|>", "<|user|><|endoftext|>",
        "bos_token + message['role']", "<start_of_turn>", "'\\n\\nAssistant: ' + eos_token",
        "GPT4 Correct ", "USER: ASSISTANT: SYSTEM: ", "USER: ASSISTANT: ",
        "### Instruction:<|EOT|>", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
        "<|start_header_id|><|end_header_id|>", "[gMASK]sop", "<用户>",
        "'Assistant: ' + message['content'] + eos_token",
        "<｜Assistant｜><｜User｜><｜end▁of▁sentence｜>", "[|system|][|assistant|][|endofturn|][|tool|]",
        "[|system|][|assistant|][|endofturn|]", "rwkv-world",
        "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",
        "<|start_of_role|><tools>g4_default_system_message", "<|start_of_role|><tool_call>",
        "<|start_of_role|>",
        "message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]",
        "<|role_start|>", " Ассистент:", "<role>ASSISTANT</role>'HUMAN'",
        "<role>ASSISTANT</role>\"HUMAN\"<think>", "<role>ASSISTANT</role><role>HUMAN</role><|role_end|>",
        "<|header_start|><|header_end|>", "<|endofuserprompt|>", "<|extra_0|><|extra_4|>",
        "<|start|><|channel|>", "<｜hy_Assistant｜><｜hy_begin▁of▁sentence｜>",
        "<｜hy_Assistant｜><｜hy_place▁holder▁no▁3｜>", "<|im_assistant|>assistant<|im_middle|>",
        "<seed:bos>", "'Assistant: '  + message['content'] + '<|separator|>", "[unused9]系统：[unused10]",
        "<|begin|><|end|><|content|>",
        // Texts no family matches.
        "", "{{ messages }}", "Llama3", "chatml ", "<|begin|><|content|>", "<|assistant|>",
    };

    ordered_json out;
    int32_t n_names = llama_chat_builtin_templates(nullptr, 0);
    std::vector<const char *> names(n_names);
    llama_chat_builtin_templates(names.data(), names.size());
    out["names"] = ordered_json::array();
    for (const char * n : names) {
        out["names"].push_back(n);
    }
    out["conversations"] = ordered_json::array();
    for (const auto & c : convs) {
        ordered_json msgs = ordered_json::array();
        for (const auto & m : c) {
            msgs.push_back({ { "role", m.first }, { "content", m.second } });
        }
        out["conversations"].push_back(msgs);
    }
    out["renders"] = ordered_json::array();
    for (const char * n : names) {
        for (size_t i = 0; i < convs.size(); i++) {
            for (bool add_ass : { true, false }) {
                out["renders"].push_back({ { "name", n }, { "conversation", i }, { "add_generation_prompt", add_ass },
                                           { "prompt", render(n, convs[i], add_ass) } });
            }
        }
    }
    out["detect"] = ordered_json::array();
    for (const auto & p : probes) {
        out["detect"].push_back({ { "text", p }, { "conversation", 2 }, { "prompt", render(p, convs[2], true) } });
    }
    out["files"] = ordered_json::array();
    for (int i = 1; i < argc; i++) {
        std::ifstream f(argv[i]);
        std::stringstream src;
        src << f.rdbuf();
        std::string path(argv[i]);
        out["files"].push_back({ { "file", path.substr(path.find_last_of('/') + 1) }, { "conversation", 2 },
                                 { "prompt", render(src.str(), convs[2], true) } });
    }
    std::cout << out.dump(1) << "\n";
    return 0;
}
