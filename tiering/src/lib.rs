//! Routed experts across the card, host RAM and disk. [`plan`] decides where each expert lives;
//! the model loader puts the weights there, and [`ExpertTier`] is what the executor then uses: dense weights and the card's experts (each MoE stack
//! compacted to its on-card experts) in card memory, the host's experts read in place from the
//! mapped file by the best CPU kernel plugin. Each MoE call of a layer with host experts then runs
//! twice with complementary expert maps (`MoeParams::expert_map`): the card's part on the card,
//! the host's part on the CPU at the same time, and the host's output is added on the card.
//! Batches of [`STREAM_MIN_ROWS`] rows or more instead copy the layer's whole stacks from the
//! mapped file into card staging buffers and run the unsplit call there: a prompt uses nearly
//! every expert, and PCIe moves a layer's experts faster than the CPU multiplies them by hundreds
//! of rows.

pub mod arena;
pub mod bus_balance;
pub mod cards;
pub mod disk;
mod error;
mod graph_scan;
mod host_slice;
mod layer;
pub mod lending;
mod moe_layer;
pub mod plan;
pub mod residency;
mod tier;

pub use disk::DiskTier;
pub use error::TierError;
pub use graph_scan::{gathered_tables, moe_layers};
pub use host_slice::HostSlice;
pub use layer::{PeerPart, TierLayer};
pub use plan::stream_set;
pub use tier::{ExpertTier, STREAM_MIN_ROWS};
