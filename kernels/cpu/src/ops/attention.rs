//! Causal GQA attention over an f32/f16 KV cache (in progress).
