//! The cpu-scalar kernel plugin.
