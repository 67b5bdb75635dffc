//! How llama-bench names a model in its `model_type` column: the architecture, the size class
//! llama.cpp gives that architecture's layer count, and the file type (`general.file_type`, or
//! the most common tensor type, marked "(guessed)"), e.g. `qwen3moe 30B.A3B Q4_K - Medium`.
//! The names are llama.cpp b11434's (`src/models/<arch>.cpp`, `llama_ftype_name`); this table
//! is data for the report, never a branch of the engine.

use std::collections::BTreeMap;

use bloomery_gguf::Metadata;
use bloomery_plugin_api::DType;

/// llama.cpp's size classes of the architectures bloomery serves: (architecture, layers,
/// hidden width when it decides, name).
const SIZE_NAMES: &[(&str, u64, Option<u64>, &str)] = &[
    ("qwen3moe", 48, None, "30B.A3B"),
    ("qwen3moe", 94, None, "235B.A22B"),
    ("qwen35moe", 40, None, "35B.A3B"),
    ("qwen35moe", 48, None, "122B.A10B"),
    ("qwen35moe", 60, None, "397B.A17B"),
    ("qwen35", 24, Some(1024), "0.8B"),
    ("qwen35", 24, None, "2B"),
    ("qwen35", 32, Some(2560), "4B"),
    ("qwen35", 32, None, "9B"),
    ("qwen35", 64, None, "27B"),
    ("qwen3", 28, Some(1024), "0.6B"),
    ("qwen3", 28, None, "1.7B"),
    ("qwen3", 36, Some(2560), "4B"),
    ("qwen3", 36, None, "8B"),
    ("qwen3", 40, None, "14B"),
    ("qwen3", 64, None, "32B"),
    ("gemma3", 18, None, "270M"),
    ("gemma3", 26, None, "1B"),
    ("gemma3", 32, None, "8B"),
    ("gemma3", 34, None, "4B"),
    ("gemma3", 48, None, "12B"),
    ("gemma3", 62, None, "27B"),
    ("glm4moe", 46, None, "106B.A12B"),
    ("glm4moe", 48, None, "102B.A12B"),
    ("glm4moe", 92, None, "355B.A32B"),
    ("kimi-linear", 27, None, "48B.A3B"),
    ("glm5-next", 45, None, "320B.A18B"),
];

/// llama.cpp's size class of a model (`?B` where it has none).
pub fn size_name(arch: &str, n_layer: u64, n_embd: u64) -> &'static str {
    SIZE_NAMES
        .iter()
        .find(|(a, l, e, _)| *a == arch && *l == n_layer && e.is_none_or(|e| e == n_embd))
        .map_or("?B", |(_, _, _, name)| name)
}

/// `llama_ftype` values and their names.
const FILE_TYPES: &[(u32, &str)] = &[
    (0, "all F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K - Medium"),
    (11, "Q3_K - Small"),
    (12, "Q3_K - Medium"),
    (13, "Q3_K - Large"),
    (14, "Q4_K - Small"),
    (15, "Q4_K - Medium"),
    (16, "Q5_K - Small"),
    (17, "Q5_K - Medium"),
    (18, "Q6_K"),
    (19, "IQ2_XXS - 2.0625 bpw"),
    (20, "IQ2_XS - 2.3125 bpw"),
    (21, "Q2_K - Small"),
    (22, "IQ3_XS - 3.3 bpw"),
    (23, "IQ3_XXS - 3.0625 bpw"),
    (24, "IQ1_S - 1.5625 bpw"),
    (25, "IQ4_NL - 4.5 bpw"),
    (26, "IQ3_S - 3.4375 bpw"),
    (27, "IQ3_S mix - 3.66 bpw"),
    (28, "IQ2_S - 2.5 bpw"),
    (29, "IQ2_M - 2.7 bpw"),
    (30, "IQ4_XS - 4.25 bpw"),
    (31, "IQ1_M - 1.75 bpw"),
    (32, "BF16"),
    (36, "TQ1_0 - 1.69 bpw ternary"),
    (37, "TQ2_0 - 2.06 bpw ternary"),
    (38, "MXFP4 MoE"),
    (39, "NVFP4"),
    (40, "Q1_0"),
    (41, "Q2_0"),
];

/// The file type's name as llama.cpp prints it: `general.file_type` when the file has it, else
/// guessed from the tensor type most tensors have (ties go to the type that reached the count
/// first in name order) with llama.cpp's "(guessed) " mark.
pub fn file_type_name(meta: &Metadata, tensors: &[(String, DType)]) -> String {
    let name = |ft: u32| {
        FILE_TYPES
            .iter()
            .find(|(v, _)| *v == ft)
            .map_or("unknown, may not work", |(_, n)| n)
    };
    if let Ok(ft) = meta.get_uint("general.file_type") {
        return name(u32::try_from(ft).unwrap_or(u32::MAX)).to_owned();
    }
    let mut by_name: Vec<&(String, DType)> = tensors.iter().collect();
    by_name.sort_by(|a, b| a.0.cmp(&b.0));
    let (mut counts, mut best, mut most) = (BTreeMap::new(), DType::F32, 0u32);
    for (_, t) in by_name {
        let c = counts.entry(t.0).or_insert(0u32);
        *c += 1;
        if *c > most {
            (most, best) = (*c, *t);
        }
    }
    format!("(guessed) {}", name(best.llama_file_type()))
}

/// llama-bench's `model_type`: `{arch} {size class} {file type}`.
pub fn model_type(meta: &Metadata, tensors: &[(String, DType)]) -> String {
    let arch = meta.get_str("general.architecture").unwrap_or("?");
    let key = |k: &str| meta.get_uint(&format!("{arch}.{k}")).unwrap_or(0);
    // llama.cpp counts layers without the MTP ones (`n_layer_all - n_layer_nextn`).
    let n_layer = key("block_count").saturating_sub(key("nextn_predict_layers"));
    format!(
        "{arch} {} {}",
        size_name(arch, n_layer, key("embedding_length")),
        file_type_name(meta, tensors)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dt(n: &str) -> DType {
        DType::from_name(n).unwrap()
    }

    #[test]
    fn size_classes_follow_llama_cpp() {
        assert_eq!(size_name("qwen3moe", 48, 2048), "30B.A3B");
        assert_eq!(size_name("qwen3moe", 2, 64), "?B");
        assert_eq!(size_name("gemma3", 18, 640), "270M");
        assert_eq!(size_name("qwen35", 24, 1024), "0.8B");
        assert_eq!(size_name("qwen35", 24, 2048), "2B");
        assert_eq!(size_name("llama", 32, 4096), "?B");
        assert_eq!(size_name("glm4moe", 48, 4096), "102B.A12B");
        assert_eq!(size_name("glm4moe", 46, 4096), "106B.A12B");
    }

    #[test]
    fn file_type_is_read_or_guessed_as_llama_cpp_does() {
        let mut meta = Metadata::default();
        let tensors = vec![
            ("a".to_owned(), dt("Q4_K")),
            ("b".to_owned(), dt("F32")),
            ("c".to_owned(), dt("Q4_K")),
            ("d".to_owned(), dt("F32")),
        ];
        // A tie: Q4_K reached two first in name order.
        assert_eq!(file_type_name(&meta, &tensors), "(guessed) Q4_K - Medium");
        let f32s = vec![("x".to_owned(), dt("F32"))];
        assert_eq!(file_type_name(&meta, &f32s), "(guessed) all F32");
        let mut set = |key: &str, value| {
            meta.push(bloomery_gguf::Entry {
                key: key.to_owned(),
                value,
                offset: 0,
            })
            .unwrap()
        };
        set("general.file_type", bloomery_gguf::Value::U32(15));
        set(
            "general.architecture",
            bloomery_gguf::Value::String("qwen3moe".into()),
        );
        set("qwen3moe.block_count", bloomery_gguf::Value::U32(48));
        assert_eq!(file_type_name(&meta, &f32s), "Q4_K - Medium");
        assert_eq!(model_type(&meta, &f32s), "qwen3moe 30B.A3B Q4_K - Medium");
    }
}
