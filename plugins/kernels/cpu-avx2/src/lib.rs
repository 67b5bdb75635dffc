//! The cpu-avx2 kernel plugin.
