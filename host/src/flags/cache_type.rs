//! `-ctk`/`-ctv` (`--cache-type-k`/`--cache-type-v`): the K and V cache types, each on its own,
//! spelled as llama.cpp spells them (`serve`, `run`, `bench`).

use anyhow::bail;
use bloomery_plugin_api::DType;
use clap::Args;

/// llama.cpp's cache types (`common/arg.cpp`), by name, with the type each is here (`None`:
/// refused by name).
const NAMES: [(&str, Option<DType>); 9] = [
    ("f32", Some(DType::F32)),
    ("f16", Some(DType::F16)),
    ("bf16", None),
    ("q8_0", Some(DType::Q8_0)),
    ("q4_0", Some(DType::Q4_0)),
    ("q4_1", Some(DType::Q4_1)),
    ("iq4_nl", Some(DType::IQ4_NL)),
    ("q5_0", Some(DType::Q5_0)),
    ("q5_1", Some(DType::Q5_1)),
];

/// The K and V cache types.
#[derive(Args, Debug, Clone)]
pub struct CacheTypeArgs {
    /// K cache type: f32, f16, q8_0, q4_0, q4_1, iq4_nl, q5_0 or q5_1 (llama.cpp's `-ctk`;
    /// bf16 is refused).
    #[arg(
        long = "cache-type-k",
        default_value = "f16",
        env = "LLAMA_ARG_CACHE_TYPE_K"
    )]
    pub cache_type_k: String,
    /// V cache type, independent of the K type: the same set (`-ctv`).
    #[arg(
        long = "cache-type-v",
        default_value = "f16",
        env = "LLAMA_ARG_CACHE_TYPE_V"
    )]
    pub cache_type_v: String,
}

impl CacheTypeArgs {
    /// The K and V cache types, or a one-line error naming the flag and its value.
    pub fn types(&self) -> anyhow::Result<(DType, DType)> {
        Ok((
            cache_type("-ctk", &self.cache_type_k)?,
            cache_type("-ctv", &self.cache_type_v)?,
        ))
    }

    /// Whether either cache is not llama.cpp's default f16 (llama-bench then prints both
    /// types).
    pub fn non_default(&self) -> bool {
        self.cache_type_k != "f16" || self.cache_type_v != "f16"
    }
}

/// A cache type's name as llama.cpp writes it (ggml's lower-case type name).
pub fn cache_name(t: DType) -> &'static str {
    NAMES
        .iter()
        .find(|(_, d)| *d == Some(t))
        .map_or("f16", |(n, _)| *n)
}

/// The cache type `name` given to `flag`, as llama.cpp names them (lowercase, exactly).
pub fn cache_type(flag: &str, name: &str) -> anyhow::Result<DType> {
    match NAMES.iter().find(|(n, _)| *n == name) {
        Some((_, Some(t))) => Ok(*t),
        Some((n, None)) => bail!("{flag} {n}: bf16 caches are not implemented"),
        None if name.contains(',') => {
            bail!("{flag} {name}: a list of cache types is not implemented (give one)")
        }
        None => bail!(
            "{flag} {name}: unsupported cache type (expected one of {})",
            NAMES
                .iter()
                .filter(|(_, t)| t.is_some())
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_names_map_to_types_and_the_rest_is_refused_by_name() {
        assert_eq!(cache_type("-ctk", "q8_0").unwrap(), DType::Q8_0);
        assert_eq!(cache_type("-ctv", "iq4_nl").unwrap(), DType::IQ4_NL);
        assert_eq!(cache_type("-ctk", "f32").unwrap(), DType::F32);
        let e = cache_type("-ctv", "bf16").unwrap_err().to_string();
        assert!(e.starts_with("-ctv bf16:"), "{e}");
        let e = cache_type("-ctk", "Q8_0").unwrap_err().to_string();
        assert!(e.contains("q8_0, q4_0"), "{e}");
        let e = cache_type("-ctk", "q8_0,q4_0").unwrap_err().to_string();
        assert!(e.contains("list"), "{e}");
        let a = CacheTypeArgs {
            cache_type_k: "q4_0".into(),
            cache_type_v: "q8_0".into(),
        };
        assert_eq!(a.types().unwrap(), (DType::Q4_0, DType::Q8_0));
        assert!(a.non_default());
    }
}
