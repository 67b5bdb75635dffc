//! Element types of tensors: every GGML/GGUF type id, with its block layout.
//!
//! A [`DType`] is the GGUF type id itself (`ggml_type`), kept as a plain integer so that a file or a
//! plugin may name a type this build does not know: such a type has no [`BlockLayout`] and is refused
//! by name wherever it is used, never guessed at.

use abi_stable::StableAbi;
use std::fmt;

/// A tensor element type: the GGUF/GGML type id (`ggml_type`).
///
/// Quantized types pack `block` elements into `bytes` bytes ([`DType::layout`]); plain types have a
/// block of one element.
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DType(pub u32);

/// How a type packs elements: `block` elements in `bytes` bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    /// Elements per block.
    pub block: u32,
    /// Bytes per block.
    pub bytes: u32,
}

macro_rules! dtypes {
    ($( $(#[$doc:meta])* $name:ident = $id:literal, $block:literal, $bytes:literal;)*) => {
        impl DType {
            $( $(#[$doc])* pub const $name: DType = DType($id); )*

            /// Every type this build knows, in id order.
            pub const ALL: &'static [DType] = &[$(DType::$name),*];

            /// The GGML name of the type (`"Q4_K"`), or `None` for an id this build does not know.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($id => Some(stringify!($name)),)*
                    _ => None,
                }
            }

            /// The block layout, or `None` for an id this build does not know.
            pub fn layout(self) -> Option<BlockLayout> {
                match self.0 {
                    $($id => Some(BlockLayout { block: $block, bytes: $bytes }),)*
                    _ => None,
                }
            }
        }
    };
}

dtypes! {
    /// 32-bit IEEE float.
    F32 = 0, 1, 4;
    /// 16-bit IEEE float.
    F16 = 1, 1, 2;
    /// 4-bit, one f16 scale per 32.
    Q4_0 = 2, 32, 18;
    /// 4-bit, f16 scale and minimum per 32.
    Q4_1 = 3, 32, 20;
    /// 5-bit, one f16 scale per 32.
    Q5_0 = 6, 32, 22;
    /// 5-bit, f16 scale and minimum per 32.
    Q5_1 = 7, 32, 24;
    /// 8-bit, one f16 scale per 32.
    Q8_0 = 8, 32, 34;
    /// 8-bit, f16 scale and f16 scaled sum per 32 (activation format; ggml's 36-byte block, which
    /// gguf-py 0.19 still lists as 40 bytes: the type never appears in files).
    Q8_1 = 9, 32, 36;
    /// 2-bit k-quant, 256 per super-block.
    Q2_K = 10, 256, 84;
    /// 3-bit k-quant.
    Q3_K = 11, 256, 110;
    /// 4-bit k-quant.
    Q4_K = 12, 256, 144;
    /// 5-bit k-quant.
    Q5_K = 13, 256, 176;
    /// 6-bit k-quant.
    Q6_K = 14, 256, 210;
    /// 8-bit k-quant with f32 scale and 16 partial sums (activation format).
    Q8_K = 15, 256, 292;
    /// 2.06-bit i-quant (E8 lattice grid).
    IQ2_XXS = 16, 256, 66;
    /// 2.31-bit i-quant.
    IQ2_XS = 17, 256, 74;
    /// 3.06-bit i-quant.
    IQ3_XXS = 18, 256, 98;
    /// 1.56-bit i-quant.
    IQ1_S = 19, 256, 50;
    /// 4-bit non-linear, 32 per block.
    IQ4_NL = 20, 32, 18;
    /// 3.44-bit i-quant.
    IQ3_S = 21, 256, 110;
    /// 2.5-bit i-quant.
    IQ2_S = 22, 256, 82;
    /// 4.25-bit non-linear, 256 per super-block.
    IQ4_XS = 23, 256, 136;
    /// 8-bit signed integer.
    I8 = 24, 1, 1;
    /// 16-bit signed integer.
    I16 = 25, 1, 2;
    /// 32-bit signed integer.
    I32 = 26, 1, 4;
    /// 64-bit signed integer.
    I64 = 27, 1, 8;
    /// 64-bit IEEE float.
    F64 = 28, 1, 8;
    /// 1.75-bit i-quant.
    IQ1_M = 29, 256, 56;
    /// bfloat16.
    BF16 = 30, 1, 2;
    /// Ternary, 1.69 bits.
    TQ1_0 = 34, 256, 54;
    /// Ternary, 2.06 bits.
    TQ2_0 = 35, 256, 66;
    /// OCP microscaling FP4 (E2M1 values, E8M0 scale per 32).
    MXFP4 = 39, 32, 17;
    /// NVIDIA FP4 (E2M1 values, E4M3 scale per 16, 64 per block).
    NVFP4 = 40, 64, 36;
    /// 1-bit, one f16 scale per 128.
    Q1_0 = 41, 128, 18;
}

impl DType {
    /// Looks a type up by its GGML name (`"q4_k"` and `"Q4_K"` both match).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|t| t.name().is_some_and(|n| n.eq_ignore_ascii_case(name)))
    }

    /// llama.cpp's `general.file_type` for a file made mostly of this type (`LLAMA_FTYPE_*`:
    /// 0 "all F32", K-quants as their medium mix), the value llama.cpp also guesses from the
    /// type most tensors have when a file lacks the key.
    pub fn llama_file_type(self) -> u32 {
        match self.name().unwrap_or("") {
            "F16" => 1,
            "BF16" => 32,
            "Q4_0" => 2,
            "Q4_1" => 3,
            "Q5_0" => 8,
            "Q5_1" => 9,
            "Q8_0" => 7,
            "Q2_K" => 10,
            "Q3_K" => 12,
            "Q4_K" => 15,
            "Q5_K" => 17,
            "Q6_K" => 18,
            "TQ1_0" => 36,
            "TQ2_0" => 37,
            "IQ2_XXS" => 19,
            "IQ2_XS" => 20,
            "IQ2_S" => 28,
            "IQ3_XXS" => 23,
            "IQ1_S" => 24,
            "IQ1_M" => 31,
            "IQ4_NL" => 25,
            "IQ4_XS" => 30,
            "IQ3_S" => 26,
            "NVFP4" => 39,
            "Q1_0" => 40,
            "Q2_0" => 41,
            _ => 0,
        }
    }

    /// True for the block-quantized types (block larger than one element).
    pub fn is_quantized(self) -> bool {
        self.layout().is_some_and(|l| l.block > 1)
    }

    /// Bytes taken by a row of `n` elements, or `None` when the type is unknown, `n` is not a whole
    /// number of blocks, or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let l = self.layout()?;
        if !n.is_multiple_of(u64::from(l.block)) {
            return None;
        }
        (n / u64::from(l.block)).checked_mul(u64::from(l.bytes))
    }
}

impl fmt::Debug for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "type#{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ids_are_named_by_number() {
        for &t in DType::ALL {
            assert_eq!(DType::from_name(t.name().unwrap()), Some(t));
        }
        assert_eq!(DType::from_name("q4_k"), Some(DType::Q4_K));
        assert_eq!(DType(4).to_string(), "type#4");
        assert!(DType(4).layout().is_none());
    }

    #[test]
    fn row_bytes_checks_whole_blocks_and_overflow() {
        assert_eq!(DType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(DType::Q4_K.row_bytes(100), None);
        assert_eq!(DType::F32.row_bytes(3), Some(12));
        assert_eq!(DType::Q8_0.row_bytes(u64::MAX - 31), None);
    }
}
