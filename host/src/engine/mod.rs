//! The engine: load-time checks and the graph executor.

pub mod check;
pub mod plan;
