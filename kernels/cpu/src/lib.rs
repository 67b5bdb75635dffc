//! Portable CPU kernels: quant formats and reference ops.
