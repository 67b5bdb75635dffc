//! The cpu-avx2 kernel plugin: row dot-product kernels for x86-64-v3 CPUs (AVX2, FMA, F16C).

pub mod dot;
