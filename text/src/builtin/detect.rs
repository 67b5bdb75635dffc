//! Which built-in template a template's text is (llama.cpp's `llm_chat_detect_template`): a
//! built-in name is itself; any other text is matched by marker strings, first match wins.

use super::Builtin;

/// The built-in template `text` names or looks like, `None` when it is neither.
pub fn detect(text: &str) -> Option<Builtin> {
    use Builtin as B;
    if let Some(b) = Builtin::by_name(text) {
        return Some(b);
    }
    let has = |s: &str| text.contains(s);
    let found = if has("<|im_start|>") {
        if has("<|im_sep|>") {
            B::Phi4
        } else if has("<end_of_utterance>") {
            B::Smolvlm
        } else {
            B::Chatml
        }
    } else if text.starts_with("mistral") || has("[INST]") {
        mistral_or_llama2(text)
    } else if has("<|assistant|>") && has("<|end|>") {
        B::Phi3
    } else if has("[gMASK]<sop>") {
        B::Chatglm4
    } else if has("<|assistant|>") && has("<|user|>") {
        if has("<|tool_declare|>") {
            B::ExaoneMoe
        } else if has("</s>") {
            B::Falcon3
        } else {
            B::Glmedge
        }
    } else if has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>") {
        B::Glmedge
    } else if has("<|user|>") && has("<|endoftext|>") {
        B::Zephyr
    } else if has("bos_token + message['role']") {
        B::Monarch
    } else if has("<start_of_turn>") {
        B::Gemma
    } else if has("'\\n\\nAssistant: ' + eos_token") {
        B::Orion
    } else if has("GPT4 Correct ") {
        B::Openchat
    } else if has("USER: ") && has("ASSISTANT: ") {
        if has("SYSTEM: ") {
            B::VicunaOrca
        } else {
            B::Vicuna
        }
    } else if has("### Instruction:") && has("<|EOT|>") {
        B::Deepseek
    } else if has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>") {
        B::CommandR
    } else if has("<|start_header_id|>") && has("<|end_header_id|>") {
        B::Llama3
    } else if has("[gMASK]sop") {
        B::Chatglm3
    } else if has("<用户>") {
        B::Minicpm
    } else {
        return later_families(text);
    };
    Some(found)
}

/// The `[INST]` family: Mistral's official layouts, else Llama 2 and its variants.
fn mistral_or_llama2(text: &str) -> Builtin {
    use Builtin as B;
    let has = |s: &str| text.contains(s);
    if has("[SYSTEM_PROMPT]") {
        B::MistralV7
    } else if has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]") {
        if has(" [INST]") {
            B::MistralV1
        } else if has("\"[INST]\"") {
            B::MistralV3Tekken
        } else {
            B::MistralV3
        }
    } else if has("content.strip()") {
        B::Llama2SysStrip
    } else if has("bos_token + '[INST]") {
        B::Llama2SysBos
    } else if has("<<SYS>>") {
        B::Llama2Sys
    } else {
        B::Llama2
    }
}

/// The markers checked after MiniCPM's, in llama.cpp's order.
fn later_families(text: &str) -> Option<Builtin> {
    use Builtin as B;
    let has = |s: &str| text.contains(s);
    let assistant_role = has("<role>ASSISTANT</role>");
    let found = if has("'Assistant: ' + message['content'] + eos_token") {
        B::Deepseek2
    } else if has("<｜Assistant｜>") && has("<｜User｜>") && has("<｜end▁of▁sentence｜>")
    {
        B::Deepseek3
    } else if has("[|system|]") && has("[|assistant|]") && has("[|endofturn|]") {
        if has("[|tool|]") {
            B::Exaone4
        } else {
            B::Exaone3
        }
    } else if has("rwkv-world") || has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}") {
        B::RwkvWorld
    } else if has("<|start_of_role|>") {
        if !(has("<tool_call>") || has("<tools>")) {
            B::Granite3
        } else if has("g4_default_system_message") {
            B::Granite40
        } else {
            B::Granite41
        }
    } else if has(
        "message['role'] + additional_special_tokens[0] + message['content'] + \
         additional_special_tokens[1]",
    ) {
        B::Gigachat
    } else if has("<|role_start|>") {
        B::Megrez
    } else if has(" Ассистент:") {
        B::Yandex
    } else if assistant_role && has("'HUMAN'") {
        B::Bailing
    } else if assistant_role && has("\"HUMAN\"") && has("<think>") {
        B::BailingThink
    } else if assistant_role && has("<role>HUMAN</role>") && has("<|role_end|>") {
        B::Bailing2
    } else if has("<|header_start|>") && has("<|header_end|>") {
        B::Llama4
    } else if has("<|endofuserprompt|>") {
        B::Dots1
    } else if has("<|extra_0|>") && has("<|extra_4|>") {
        B::HunyuanMoe
    } else if has("<|start|>") && has("<|channel|>") {
        B::GptOss
    } else if has("<｜hy_Assistant｜>") && has("<｜hy_begin▁of▁sentence｜>") {
        B::HunyuanVl
    } else if has("<｜hy_Assistant｜>") && has("<｜hy_place▁holder▁no▁3｜>") {
        B::HunyuanDense
    } else if has("<|im_assistant|>assistant<|im_middle|>") {
        B::KimiK2
    } else if has("<seed:bos>") {
        B::SeedOss
    } else if has("'Assistant: '  + message['content'] + '<|separator|>") {
        B::Grok2
    } else if has("[unused9]系统：[unused10]") {
        B::PanguEmbedded
    } else if has("<|begin|>") && has("<|end|>") && has("<|content|>") {
        B::SolarOpen
    } else {
        return None;
    };
    Some(found)
}
