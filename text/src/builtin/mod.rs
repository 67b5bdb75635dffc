//! llama.cpp's built-in chat templates (its C++ `llama_chat_apply_template`, b11434), by name and
//! by detection from a template's text. llama-server renders with them only under `--no-jinja`:
//! each is a fixed layout of `role` and `content` strings, with no tools, no reasoning and no
//! template variables.

mod detect;
mod render;

pub use detect::detect;

/// One of llama.cpp's built-in chat templates (each documented by its llama.cpp name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// `chatml`.
    Chatml,
    /// `llama2`.
    Llama2,
    /// `llama2-sys`.
    Llama2Sys,
    /// `llama2-sys-bos`.
    Llama2SysBos,
    /// `llama2-sys-strip`.
    Llama2SysStrip,
    /// `mistral-v1`.
    MistralV1,
    /// `mistral-v3`.
    MistralV3,
    /// `mistral-v3-tekken`.
    MistralV3Tekken,
    /// `mistral-v7`.
    MistralV7,
    /// `mistral-v7-tekken`.
    MistralV7Tekken,
    /// `phi3`.
    Phi3,
    /// `phi4`.
    Phi4,
    /// `falcon3`.
    Falcon3,
    /// `zephyr`.
    Zephyr,
    /// `monarch`.
    Monarch,
    /// `gemma`.
    Gemma,
    /// `orion`.
    Orion,
    /// `openchat`.
    Openchat,
    /// `vicuna`.
    Vicuna,
    /// `vicuna-orca`.
    VicunaOrca,
    /// `deepseek`.
    Deepseek,
    /// `deepseek2`.
    Deepseek2,
    /// `deepseek3`.
    Deepseek3,
    /// `deepseek-ocr`.
    DeepseekOcr,
    /// `command-r`.
    CommandR,
    /// `llama3`.
    Llama3,
    /// `chatglm3`.
    Chatglm3,
    /// `chatglm4`.
    Chatglm4,
    /// `glmedge`.
    Glmedge,
    /// `minicpm`.
    Minicpm,
    /// `exaone3`.
    Exaone3,
    /// `exaone4`.
    Exaone4,
    /// `exaone-moe`.
    ExaoneMoe,
    /// `rwkv-world`.
    RwkvWorld,
    /// `granite`.
    Granite3,
    /// `granite-4.0`.
    Granite40,
    /// `granite-4.1`.
    Granite41,
    /// `gigachat`.
    Gigachat,
    /// `megrez`.
    Megrez,
    /// `yandex`.
    Yandex,
    /// `bailing`.
    Bailing,
    /// `bailing-think`.
    BailingThink,
    /// `bailing2`.
    Bailing2,
    /// `llama4`.
    Llama4,
    /// `smolvlm`.
    Smolvlm,
    /// dots.llm1: found by detection only (llama.cpp gives it no name).
    Dots1,
    /// `hunyuan-moe`.
    HunyuanMoe,
    /// `gpt-oss`.
    GptOss,
    /// `hunyuan-dense`.
    HunyuanDense,
    /// `hunyuan-vl`.
    HunyuanVl,
    /// `kimi-k2`.
    KimiK2,
    /// `seed_oss`.
    SeedOss,
    /// `grok-2`.
    Grok2,
    /// `pangu-embedded`.
    PanguEmbedded,
    /// `solar-open`.
    SolarOpen,
}

/// Every built-in template name llama.cpp b11434 accepts (`LLM_CHAT_TEMPLATES`), in the order
/// its `--chat-template` help lists them (sorted by name).
pub const NAMES: &[(&str, Builtin)] = &[
    ("bailing", Builtin::Bailing),
    ("bailing-think", Builtin::BailingThink),
    ("bailing2", Builtin::Bailing2),
    ("chatglm3", Builtin::Chatglm3),
    ("chatglm4", Builtin::Chatglm4),
    ("chatml", Builtin::Chatml),
    ("command-r", Builtin::CommandR),
    ("deepseek", Builtin::Deepseek),
    ("deepseek-ocr", Builtin::DeepseekOcr),
    ("deepseek2", Builtin::Deepseek2),
    ("deepseek3", Builtin::Deepseek3),
    ("exaone-moe", Builtin::ExaoneMoe),
    ("exaone3", Builtin::Exaone3),
    ("exaone4", Builtin::Exaone4),
    ("falcon3", Builtin::Falcon3),
    ("gemma", Builtin::Gemma),
    ("gigachat", Builtin::Gigachat),
    ("glmedge", Builtin::Glmedge),
    ("gpt-oss", Builtin::GptOss),
    ("granite", Builtin::Granite3),
    ("granite-4.0", Builtin::Granite40),
    ("granite-4.1", Builtin::Granite41),
    ("grok-2", Builtin::Grok2),
    ("hunyuan-dense", Builtin::HunyuanDense),
    ("hunyuan-moe", Builtin::HunyuanMoe),
    ("hunyuan-vl", Builtin::HunyuanVl),
    ("kimi-k2", Builtin::KimiK2),
    ("llama2", Builtin::Llama2),
    ("llama2-sys", Builtin::Llama2Sys),
    ("llama2-sys-bos", Builtin::Llama2SysBos),
    ("llama2-sys-strip", Builtin::Llama2SysStrip),
    ("llama3", Builtin::Llama3),
    ("llama4", Builtin::Llama4),
    ("megrez", Builtin::Megrez),
    ("minicpm", Builtin::Minicpm),
    ("mistral-v1", Builtin::MistralV1),
    ("mistral-v3", Builtin::MistralV3),
    ("mistral-v3-tekken", Builtin::MistralV3Tekken),
    ("mistral-v7", Builtin::MistralV7),
    ("mistral-v7-tekken", Builtin::MistralV7Tekken),
    ("monarch", Builtin::Monarch),
    ("openchat", Builtin::Openchat),
    ("orion", Builtin::Orion),
    ("pangu-embedded", Builtin::PanguEmbedded),
    ("phi3", Builtin::Phi3),
    ("phi4", Builtin::Phi4),
    ("rwkv-world", Builtin::RwkvWorld),
    ("seed_oss", Builtin::SeedOss),
    ("smolvlm", Builtin::Smolvlm),
    ("solar-open", Builtin::SolarOpen),
    ("vicuna", Builtin::Vicuna),
    ("vicuna-orca", Builtin::VicunaOrca),
    ("yandex", Builtin::Yandex),
    ("zephyr", Builtin::Zephyr),
];

impl Builtin {
    /// The template of llama.cpp name `name`, if it is one.
    pub fn by_name(name: &str) -> Option<Builtin> {
        NAMES.iter().find(|(n, _)| *n == name).map(|&(_, b)| b)
    }

    /// llama.cpp's name of the template (`None` for dots.llm1, which has none).
    pub fn name(self) -> Option<&'static str> {
        NAMES.iter().find(|(_, b)| *b == self).map(|&(n, _)| n)
    }

    /// The prompt of `messages` (role, content), ending with the opening of the assistant's turn
    /// when `add_assistant` and the template writes one (some ignore it, as llama.cpp's do).
    pub fn render<S: AsRef<str>>(self, messages: &[(S, S)], add_assistant: bool) -> String {
        let msgs: Vec<(&str, &str)> = messages
            .iter()
            .map(|(r, c)| (r.as_ref(), c.as_ref()))
            .collect();
        render::render(self, &msgs, add_assistant)
    }
}

/// The built-in names joined with ", " (for help and refusals).
pub fn names_list() -> String {
    NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}
