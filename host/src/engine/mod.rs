//! The engine: load-time checks and the graph executor.

pub mod check;
pub mod device;
pub mod executor;
pub mod plan;
