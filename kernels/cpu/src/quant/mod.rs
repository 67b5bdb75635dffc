//! Every GGUF quant format: block layouts, dequantization, quantization, dot products.
