//! MoE routing (in progress).
