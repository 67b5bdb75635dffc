//! The quantized weight types the kernels read (`cu/quant.cuh`, which unpacks each GGUF block
//! layout once for every quantized kernel): their `wtype` codes, the per-type entry points of the
//! kernels stamped out once per type, and the pair form's conditions (Q8_0 and Q4_K rows read two
//! 32-value sub-blocks per lane, against Q8_1 activations staged `STAGE_PAIR` bytes per 64 values).

use abi_stable::std_types::RVec;
use bloomery_plugin_api::{DType, PluginError};

/// The quantized weight types the kernels read, with their `wtype` codes in `cu/quant.cuh`.
pub const QUANT_TYPES: [(DType, i32); 12] = [
    (DType::Q8_0, 1),
    (DType::Q4_K, 2),
    (DType::Q6_K, 3),
    (DType::Q5_K, 4),
    (DType::Q5_0, 5),
    (DType::Q4_0, 6),
    (DType::Q5_1, 7),
    (DType::IQ4_XS, 8),
    (DType::IQ4_NL, 9),
    (DType::MXFP4, 10),
    (DType::Q3_K, 11),
    (DType::IQ3_XXS, 12),
];

/// The names of a kernel's entry points per weight type, indexed by `wtype` code
/// (`PER_WTYPE` in cu/kernels.cu: `name_0` .. `name_12`).
macro_rules! per_wtype {
    ($base:literal) => {
        [
            concat!($base, "_0"),
            concat!($base, "_1"),
            concat!($base, "_2"),
            concat!($base, "_3"),
            concat!($base, "_4"),
            concat!($base, "_5"),
            concat!($base, "_6"),
            concat!($base, "_7"),
            concat!($base, "_8"),
            concat!($base, "_9"),
            concat!($base, "_10"),
            concat!($base, "_11"),
            concat!($base, "_12"),
        ]
    };
}
pub(super) use per_wtype;

/// `first`, then every type of [`QUANT_TYPES`]: the dtypes of an op that takes any weight type.
pub(super) fn with_quant_types(first: &[DType]) -> RVec<DType> {
    let quant = QUANT_TYPES.iter().map(|(t, _)| *t);
    first.iter().copied().chain(quant).collect()
}

/// The entry point of `names` for weight type `wtype`.
pub(super) fn typed(names: &[&'static str; 13], wtype: i32) -> Result<&'static str, PluginError> {
    usize::try_from(wtype)
        .ok()
        .and_then(|i| names.get(i).copied())
        .ok_or_else(|| PluginError::invalid(format!("weight type code {wtype}")))
}

/// The `wtype` code of a weight type (0 for F32), with its block length in values.
pub(super) fn weight_code(t: DType) -> Option<(i32, u64)> {
    if t == DType::F32 {
        return Some((0, 1));
    }
    let (_, code) = QUANT_TYPES.iter().find(|(q, _)| *q == t)?;
    Some((*code, u64::from(t.layout()?.block)))
}

/// Bytes per 64 values of a Q8_1 row staged in shared memory (`STAGE_PAIR` in cu/quant.cuh).
pub(super) const STAGE_PAIR: u64 = 80;

/// Whether rows of type `wtype` at `base` (row stride `stride`, expert stride `estride`) of
/// `k` values suit the kernels' pair form (`pairs_ok` in cu/quant.cuh: Q8_0 or Q4_K, whole
/// 64-value chunks, 4- or 16-byte aligned).
pub(crate) fn pairs_ok(wtype: i32, base: u64, stride: i64, estride: i64, k: u64) -> bool {
    let a = base | stride as u64 | estride as u64;
    k.is_multiple_of(64)
        && match wtype {
            1 => a.is_multiple_of(4),
            2 => a.is_multiple_of(16),
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    /// The integers of a `#define NAME a, b, ...` line of `cu/quant.cuh`.
    fn table(name: &str) -> Vec<i8> {
        let src = include_str!("../../cu/quant.cuh");
        let line = src
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("no {name} in quant.cuh"));
        line.split(',').map(|v| v.trim().parse().unwrap()).collect()
    }

    #[test]
    fn launch_shapes_match_the_kernels() {
        assert_eq!(
            super::STAGE_PAIR,
            crate::ops::tests::define_in(include_str!("../../cu/quant.cuh"), "STAGE_PAIR")
        );
    }

    #[test]
    fn kernel_lookup_tables_match_the_cpu_reference() {
        use bloomery_kernels_cpu::quant::iq_tables::{KVALUES_E2M1, KVALUES_IQ4NL};
        assert_eq!(table("KVALUES_IQ4NL_LIST"), KVALUES_IQ4NL);
        assert_eq!(table("KVALUES_E2M1_LIST"), KVALUES_E2M1);
        let src = include_str!("../../cu/quant.cuh");
        let grid: Vec<u32> = src
            .lines()
            .find_map(|l| l.strip_prefix("#define IQ3XXS_GRID_LIST "))
            .expect("no IQ3XXS_GRID_LIST in quant.cuh")
            .split(',')
            .map(|v| u32::from_str_radix(v.trim().trim_start_matches("0x"), 16).unwrap())
            .collect();
        assert_eq!(grid, bloomery_kernels_cpu::quant::iq_tables::IQ3XXS_GRID);
    }

    #[test]
    fn weight_codes_match_the_kernel_header_and_cover_every_claimed_type() {
        let src = include_str!("../../cu/quant.cuh");
        for (t, code) in super::QUANT_TYPES {
            let name = format!("#define WT_{} {code}", t.to_string().to_uppercase());
            assert!(src.contains(&name), "quant.cuh lacks `{name}`");
            assert_eq!(super::weight_code(t).map(|c| c.0), Some(code));
        }
    }
}
