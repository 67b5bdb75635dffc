//! What the plan places and reports with: a MoE layer's routed-expert stacks, why no plan fits,
//! and byte counts as the plan shows them.

/// The routed-expert stacks of one MoE layer.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeLayer {
    /// Block index (from the `blk.N.` tensor names; the MoE layer's ordinal otherwise).
    pub block: u32,
    /// Weight indices of the stacks (gate, up when separate, down).
    pub stacks: Vec<usize>,
    /// Tensor names of the stacks.
    pub names: Vec<String>,
    /// Experts per stack.
    pub n_expert: u32,
    /// Bytes of one expert across all its stacks.
    pub expert_bytes: u64,
}

/// Why no plan fits.
#[derive(Debug, thiserror::Error)]
#[error("the model does not fit: {0}")]
pub struct PlanError(pub String);

/// `b` bytes as the plan shows them: MiB below 1 GiB, GiB above, `unlimited` for `u64::MAX`.
pub(crate) fn gib(b: u64) -> String {
    if b == u64::MAX {
        "unlimited".into()
    } else if b < 1 << 30 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    }
}
