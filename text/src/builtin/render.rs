//! The layouts of the built-in templates, as llama.cpp b11434's `llm_chat_apply_template`
//! writes them (the facts: markers, spacing, which messages are trimmed or dropped, and whether
//! the assistant's opening is added).

use super::Builtin;

/// C's `isspace` in the "C" locale: space, \t, \n, \v, \f, \r.
fn c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// `s` without C whitespace at either end (llama.cpp trims bytes, never Unicode spaces).
fn trim(s: &str) -> &str {
    s.trim_matches(c_space)
}

/// `role` with its first byte upper-cased when it is an ASCII letter (C's `toupper`).
fn capitalized(role: &str) -> String {
    let mut out = role.to_owned();
    if let Some(first) = out.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    out
}

/// Each message laid out by `line`, then `ass` when `add_ass`.
fn each(
    chat: &[(&str, &str)],
    add_ass: bool,
    line: impl Fn(&str, &str) -> String,
    ass: &str,
) -> String {
    let mut out: String = chat.iter().map(|(r, c)| line(r, c)).collect();
    if add_ass {
        out.push_str(ass);
    }
    out
}

/// The prompt of `chat` in template `t`.
pub fn render(t: Builtin, chat: &[(&str, &str)], add_ass: bool) -> String {
    use Builtin as B;
    match t {
        B::Chatml => each(
            chat,
            add_ass,
            |r, c| format!("<|im_start|>{r}\n{c}<|im_end|>\n"),
            "<|im_start|>assistant\n",
        ),
        B::MistralV7 | B::MistralV7Tekken => mistral_v7(t, chat),
        B::MistralV1 | B::MistralV3 | B::MistralV3Tekken => mistral_v1_v3(t, chat),
        B::Llama2 | B::Llama2Sys | B::Llama2SysBos | B::Llama2SysStrip => llama2(t, chat),
        B::Phi3 => each(
            chat,
            add_ass,
            |r, c| format!("<|{r}|>\n{c}<|end|>\n"),
            "<|assistant|>\n",
        ),
        B::Phi4 => each(
            chat,
            add_ass,
            |r, c| format!("<|im_start|>{r}<|im_sep|>{c}<|im_end|>"),
            "<|im_start|>assistant<|im_sep|>",
        ),
        B::Falcon3 => each(
            chat,
            add_ass,
            |r, c| format!("<|{r}|>\n{c}\n"),
            "<|assistant|>\n",
        ),
        B::Zephyr => each(
            chat,
            add_ass,
            |r, c| format!("<|{r}|>\n{c}<|endoftext|>\n"),
            "<|assistant|>\n",
        ),
        B::Monarch => monarch(chat, add_ass),
        B::Gemma => gemma(chat, add_ass),
        B::Orion => orion(chat),
        B::Openchat => each(
            chat,
            add_ass,
            |r, c| match r {
                "system" => format!("{c}<|end_of_turn|>"),
                _ => format!("GPT4 Correct {}: {c}<|end_of_turn|>", capitalized(r)),
            },
            "GPT4 Correct Assistant:",
        ),
        B::Vicuna | B::VicunaOrca => {
            let orca = t == B::VicunaOrca;
            each(
                chat,
                add_ass,
                |r, c| match r {
                    "system" if orca => format!("SYSTEM: {c}\n"),
                    "system" => format!("{c}\n\n"),
                    "user" => format!("USER: {c}\n"),
                    "assistant" => format!("ASSISTANT: {c}</s>\n"),
                    _ => String::new(),
                },
                "ASSISTANT:",
            )
        }
        B::Deepseek => each(
            chat,
            add_ass,
            |r, c| match r {
                "system" => c.to_owned(),
                "user" => format!("### Instruction:\n{c}\n"),
                "assistant" => format!("### Response:\n{c}\n<|EOT|>\n"),
                _ => String::new(),
            },
            "### Response:\n",
        ),
        B::CommandR => each(
            chat,
            add_ass,
            |r, c| {
                let tag = match r {
                    "system" => "SYSTEM",
                    "user" => "USER",
                    "assistant" => "CHATBOT",
                    _ => return String::new(),
                };
                format!(
                    "<|START_OF_TURN_TOKEN|><|{tag}_TOKEN|>{}<|END_OF_TURN_TOKEN|>",
                    trim(c)
                )
            },
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        ),
        B::Llama3 => each(
            chat,
            add_ass,
            |r, c| {
                format!(
                    "<|start_header_id|>{r}<|end_header_id|>\n\n{}<|eot_id|>",
                    trim(c)
                )
            },
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        B::Chatglm3 => {
            "[gMASK]sop".to_owned()
                + &each(
                    chat,
                    add_ass,
                    |r, c| format!("<|{r}|>\n {c}"),
                    "<|assistant|>",
                )
        }
        B::Chatglm4 => {
            "[gMASK]<sop>".to_owned()
                + &each(
                    chat,
                    add_ass,
                    |r, c| format!("<|{r}|>\n{c}"),
                    "<|assistant|>\n",
                )
        }
        B::Glmedge => each(
            chat,
            add_ass,
            |r, c| format!("<|{r}|>\n{c}"),
            "<|assistant|>",
        ),
        B::Minicpm => chat
            .iter()
            .map(|(r, c)| match *r {
                "user" => format!("<用户>{}<AI>", trim(c)),
                _ => trim(c).to_owned(),
            })
            .collect(),
        B::Deepseek2 => each(
            chat,
            add_ass,
            |r, c| match r {
                "system" => format!("{c}\n\n"),
                "user" => format!("User: {c}\n\n"),
                "assistant" => format!("Assistant: {c}<｜end▁of▁sentence｜>"),
                _ => String::new(),
            },
            "Assistant:",
        ),
        B::Deepseek3 => each(
            chat,
            add_ass,
            |r, c| match r {
                "system" => format!("{c}\n\n"),
                "user" => format!("<｜User｜>{c}"),
                "assistant" => format!("<｜Assistant｜>{c}<｜end▁of▁sentence｜>"),
                _ => String::new(),
            },
            "<｜Assistant｜>",
        ),
        B::DeepseekOcr => chat.iter().map(|(_, c)| *c).collect(),
        B::Exaone3 | B::Exaone4 => {
            let tool = t == B::Exaone4;
            each(
                chat,
                add_ass,
                |r, c| {
                    let c = trim(c);
                    match r {
                        "system" => format!("[|system|]{c}[|endofturn|]\n"),
                        "user" => format!("[|user|]{c}\n"),
                        "assistant" => format!("[|assistant|]{c}[|endofturn|]\n"),
                        "tool" if tool => format!("[|tool|]{c}[|endofturn|]\n"),
                        _ => String::new(),
                    }
                },
                "[|assistant|]",
            )
        }
        B::ExaoneMoe => each(
            chat,
            add_ass,
            |r, c| match r {
                "system" | "user" | "assistant" | "tool" => {
                    format!("<|{r}|>\n{}<|endofturn|>\n", trim(c))
                }
                _ => String::new(),
            },
            "<|assistant|>\n",
        ),
        B::RwkvWorld => rwkv_world(chat),
        B::Granite3 => each(
            chat,
            add_ass,
            |r, c| {
                let call = if r == "assistant_tool_call" {
                    "<|tool_call|>"
                } else {
                    ""
                };
                format!("<|start_of_role|>{r}<|end_of_role|>{call}{c}<|end_of_text|>\n")
            },
            "<|start_of_role|>assistant<|end_of_role|>",
        ),
        B::Granite40 | B::Granite41 => each(
            chat,
            add_ass,
            |r, c| {
                let head = match r {
                    "assistant_tool_call" => {
                        "<|start_of_role|>assistant<|end_of_role|><|tool_call|>".to_owned()
                    }
                    _ => format!("<|start_of_role|>{r}<|end_of_role|>"),
                };
                format!("{head}{c}<|end_of_text|>\n")
            },
            "<|start_of_role|>assistant<|end_of_role|>",
        ),
        B::Gigachat => gigachat(chat, add_ass),
        B::Megrez => each(
            chat,
            add_ass,
            |r, c| format!("<|role_start|>{r}<|role_end|>{c}<|turn_end|>"),
            "<|role_start|>assistant<|role_end|>",
        ),
        B::Yandex => each(
            chat,
            add_ass,
            |r, c| match r {
                "user" => format!(" Пользователь: {c}\n\n"),
                "assistant" => format!(" Ассистент: {c}\n\n"),
                _ => String::new(),
            },
            " Ассистент:[SEP]",
        ),
        B::Bailing | B::BailingThink => {
            let ass = if t == B::BailingThink {
                "<role>ASSISTANT</role><think>"
            } else {
                "<role>ASSISTANT</role>"
            };
            each(
                chat,
                add_ass,
                |r, c| format!("<role>{}</role>{c}", bailing_role(r)),
                ass,
            )
        }
        B::Bailing2 => {
            let head = match chat.first() {
                Some(("system", _)) => "",
                _ => "<role>SYSTEM</role>detailed thinking off<|role_end|>",
            };
            head.to_owned()
                + &each(
                    chat,
                    add_ass,
                    |r, c| format!("<role>{}</role>{c}<|role_end|>", bailing_role(r)),
                    "<role>ASSISTANT</role>",
                )
        }
        B::Llama4 => each(
            chat,
            add_ass,
            |r, c| format!("<|header_start|>{r}<|header_end|>\n\n{}<|eot|>", trim(c)),
            "<|header_start|>assistant<|header_end|>\n\n",
        ),
        B::Smolvlm => {
            "<|im_start|>".to_owned()
                + &each(
                    chat,
                    add_ass,
                    |r, c| match r {
                        "system" => format!("{c}\n\n"),
                        "user" => format!("User: {c}<end_of_utterance>\n"),
                        _ => format!("Assistant: {c}<end_of_utterance>\n"),
                    },
                    "Assistant:",
                )
        }
        B::Dots1 => each(
            chat,
            add_ass,
            |r, c| match r {
                "system" => format!("<|system|>{c}<|endofsystem|>"),
                "user" => format!("<|userprompt|>{c}<|endofuserprompt|>"),
                _ => format!("<|response|>{c}<|endofresponse|>"),
            },
            "<|response|>",
        ),
        B::HunyuanMoe => chat
            .iter()
            .map(|(r, c)| match *r {
                "system" => format!("<|startoftext|>{c}<|extra_4|>"),
                "assistant" => format!("{c}<|eos|>"),
                _ => format!("<|startoftext|>{c}<|extra_0|>"),
            })
            .collect(),
        B::GptOss => each(
            chat,
            add_ass,
            |r, c| {
                let end = if r == "assistant" {
                    "<|return|>"
                } else {
                    "<|end|>"
                };
                format!("<|start|>{r}<|message|>{c}{end}")
            },
            "<|start|>assistant",
        ),
        B::HunyuanDense => hunyuan_dense(chat),
        B::HunyuanVl => hunyuan_vl(chat),
        B::KimiK2 => each(
            chat,
            add_ass,
            |r, c| {
                let head = match r {
                    "system" => "<|im_system|>system<|im_middle|>",
                    "user" => "<|im_user|>user<|im_middle|>",
                    "assistant" => "<|im_assistant|>assistant<|im_middle|>",
                    "tool" => "<|im_system|>tool<|im_middle|>",
                    _ => "",
                };
                format!("{head}{c}<|im_end|>")
            },
            "<|im_assistant|>assistant<|im_middle|>",
        ),
        B::SeedOss => each(
            chat,
            add_ass,
            |r, c| {
                let c = if r == "assistant" { trim(c) } else { c };
                format!("<seed:bos>{r}\n{c}<seed:eos>")
            },
            "<seed:bos>assistant\n",
        ),
        B::Grok2 => each(
            chat,
            add_ass,
            |r, c| match r {
                "system" => format!("System: {}<|separator|>\n\n", trim(c)),
                "user" => format!("Human: {}<|separator|>\n\n", trim(c)),
                "assistant" => format!("Assistant: {c}<|separator|>\n\n"),
                _ => String::new(),
            },
            "Assistant:",
        ),
        B::PanguEmbedded => pangu(chat, add_ass),
        B::SolarOpen => each(
            chat,
            add_ass,
            |r, c| format!("<|begin|>{r}<|content|>{c}<|end|>"),
            "<|begin|>assistant",
        ),
    }
}

/// Bailing's role tag: `user` is HUMAN, any other role upper-cased (ASCII).
fn bailing_role(role: &str) -> String {
    match role {
        "user" => "HUMAN".to_owned(),
        _ => role.to_ascii_uppercase(),
    }
}

/// Mistral v7 (and its Tekken twin, without the spaces): no generation prompt of its own.
fn mistral_v7(t: Builtin, chat: &[(&str, &str)]) -> String {
    let sp = if t == Builtin::MistralV7 { " " } else { "" };
    chat.iter()
        .map(|(r, c)| match *r {
            "system" => format!("[SYSTEM_PROMPT]{sp}{c}[/SYSTEM_PROMPT]"),
            "user" => format!("[INST]{sp}{c}[/INST]"),
            _ => format!("{sp}{c}</s>"),
        })
        .collect()
}

/// Mistral v1, v3 and v3-tekken: `[INST]` opens a turn that an assistant message closes; the
/// system text goes inside the turn.
fn mistral_v1_v3(t: Builtin, chat: &[(&str, &str)]) -> String {
    let lead = if t == Builtin::MistralV1 { " " } else { "" };
    let trail = if t == Builtin::MistralV3Tekken {
        ""
    } else {
        " "
    };
    let mut out = String::new();
    let mut in_turn = false;
    for (role, content) in chat {
        if !in_turn {
            out.push_str(&format!("{lead}[INST]{trail}"));
            in_turn = true;
        }
        match *role {
            "system" => out.push_str(&format!("{content}\n\n")),
            "user" => out.push_str(&format!("{content}{lead}[/INST]")),
            _ => {
                let c = if t == Builtin::MistralV3 {
                    trim(content)
                } else {
                    content
                };
                out.push_str(&format!("{trail}{c}</s>"));
                in_turn = false;
            }
        }
    }
    out
}

/// Llama 2 and its variants (system in `<<SYS>>`, BOS inside the history, stripped content).
fn llama2(t: Builtin, chat: &[(&str, &str)]) -> String {
    let sys_tags = t != Builtin::Llama2;
    let reopen = if t == Builtin::Llama2SysBos {
        "<s>[INST] "
    } else {
        "[INST] "
    };
    let mut out = "[INST] ".to_owned();
    let mut in_turn = true;
    for (role, content) in chat {
        let c = if t == Builtin::Llama2SysStrip {
            trim(content)
        } else {
            content
        };
        if !in_turn {
            in_turn = true;
            out.push_str(reopen);
        }
        match *role {
            "system" if sys_tags => out.push_str(&format!("<<SYS>>\n{c}\n<</SYS>>\n\n")),
            "system" => out.push_str(&format!("{c}\n")),
            "user" => out.push_str(&format!("{c} [/INST]")),
            _ => {
                out.push_str(&format!("{c}</s>"));
                in_turn = false;
            }
        }
    }
    out
}

/// AlphaMonarch: `<s>` before every message but the first.
fn monarch(chat: &[(&str, &str)], add_ass: bool) -> String {
    let mut out = String::new();
    for (i, (role, content)) in chat.iter().enumerate() {
        let bos = if i == 0 { "" } else { "<s>" };
        out.push_str(&format!("{bos}{role}\n{content}</s>\n"));
    }
    if add_ass {
        out.push_str("<s>assistant\n");
    }
    out
}

/// Gemma: no system role (its trimmed text opens the next non-model turn), `assistant` is
/// `model`, content trimmed.
fn gemma(chat: &[(&str, &str)], add_ass: bool) -> String {
    let mut out = String::new();
    let mut system = String::new();
    for (role, content) in chat {
        if *role == "system" {
            system.push_str(trim(content));
            continue;
        }
        let role = if *role == "assistant" { "model" } else { role };
        out.push_str(&format!("<start_of_turn>{role}\n"));
        if !system.is_empty() && role != "model" {
            out.push_str(&format!("{system}\n\n"));
            system.clear();
        }
        out.push_str(&format!("{}<end_of_turn>\n", trim(content)));
    }
    if add_ass {
        out.push_str("<start_of_turn>model\n");
    }
    out
}

/// Orion: the system text opens the next user turn; every user turn ends with the assistant's
/// opening (no separate generation prompt).
fn orion(chat: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut system = String::new();
    for (role, content) in chat {
        match *role {
            "system" => system.push_str(content),
            "user" => {
                out.push_str("Human: ");
                if !system.is_empty() {
                    out.push_str(&format!("{system}\n\n"));
                    system.clear();
                }
                out.push_str(&format!("{content}\n\nAssistant: </s>"));
            }
            _ => out.push_str(&format!("{content}</s>")),
        }
    }
    out
}

/// RWKV World: the assistant's opening follows a final user message, whatever `add_ass` says.
fn rwkv_world(chat: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (role, content)) in chat.iter().enumerate() {
        let c = trim(content);
        match *role {
            "system" => out.push_str(&format!("System: {c}\n\n")),
            "user" => {
                out.push_str(&format!("User: {c}\n\n"));
                if i + 1 == chat.len() {
                    out.push_str("Assistant:");
                }
            }
            "assistant" => out.push_str(&format!("Assistant: {c}\n\n")),
            _ => {}
        }
    }
    out
}

/// GigaChat: `<s>`, a leading system message right after it, and an empty function list after
/// every user turn.
fn gigachat(chat: &[(&str, &str)], add_ass: bool) -> String {
    let mut out = "<s>".to_owned();
    let rest = match chat.first() {
        Some(("system", c)) => {
            out.push_str(&format!("{c}<|message_sep|>"));
            &chat[1..]
        }
        _ => chat,
    };
    for (role, content) in rest {
        match *role {
            "user" => out.push_str(&format!(
                "user<|role_sep|>{content}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
            )),
            "assistant" => out.push_str(&format!("assistant<|role_sep|>{content}<|message_sep|>")),
            _ => {}
        }
    }
    if add_ass {
        out.push_str("assistant<|role_sep|>");
    }
    out
}

/// Hunyuan dense: a first system message, then user turns that end with the assistant's opening.
fn hunyuan_dense(chat: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (role, content)) in chat.iter().enumerate() {
        if i == 0 && *role == "system" {
            out.push_str(&format!("{content}<｜hy_place▁holder▁no▁3｜>"));
        }
        match *role {
            "assistant" => out.push_str(&format!(
                "<｜hy_Assistant｜>{content}<｜hy_place▁holder▁no▁2｜>"
            )),
            "user" => out.push_str(&format!("<｜hy_User｜>{content}<｜hy_Assistant｜>")),
            _ => {}
        }
    }
    out
}

/// Hunyuan VL/OCR: the marker follows each message's text.
fn hunyuan_vl(chat: &[(&str, &str)]) -> String {
    let mut out = "<｜hy_begin▁of▁sentence｜>".to_owned();
    for (i, (role, content)) in chat.iter().enumerate() {
        match *role {
            "system" if i == 0 => out.push_str(&format!("{content}<｜hy_place▁holder▁no▁3｜>")),
            "user" => out.push_str(&format!("{content}<｜hy_User｜>")),
            "assistant" => out.push_str(&format!("{content}<｜hy_Assistant｜>")),
            _ => {}
        }
    }
    out
}

/// openPangu embedded: an empty system turn when the chat does not open with one.
fn pangu(chat: &[(&str, &str)], add_ass: bool) -> String {
    let mut out = String::new();
    for (i, (role, content)) in chat.iter().enumerate() {
        if i == 0 && *role != "system" {
            out.push_str("[unused9]系统：[unused10]");
        }
        let who = match *role {
            "system" => "系统",
            "user" => "用户",
            "assistant" => "助手",
            "tool" => "工具",
            "function" => "方法",
            _ => continue,
        };
        out.push_str(&format!("[unused9]{who}：{content}[unused10]"));
    }
    if add_ass {
        out.push_str("[unused9]助手：");
    }
    out
}
