//! One MoE layer with host experts: its maps, stacks and views on both devices.

use bloomery_plugin_api::tensor::TensorRef;

use crate::host_slice::HostSlice;

/// One MoE layer with host experts, as the executor needs it.
pub struct TierLayer {
    /// Weight index of the layer's first stack (how the executor finds its MoE call).
    pub first_stack: usize,
    /// Experts on the card (0: the card's call is skipped).
    pub n_card: u32,
    /// i32 `[n_expert]` on the card: index in the compacted stacks, or -1.
    pub card_map: TensorRef,
    /// The full stacks in the mapped file, on the host device, in the call's source order.
    pub host_stacks: Vec<TensorRef>,
    /// i32 `[n_expert]` on the host device: the expert's own index when it lives on the host, or
    /// -1.
    pub host_map: TensorRef,
    /// The full stacks in the mapped file, for streaming to the card, with their layouts.
    pub stream: Vec<(HostSlice, TensorRef)>,
    /// The compacted card stacks (residency rewrites their slots, `nb[2]` bytes apart).
    pub card_stacks: Vec<TensorRef>,
    /// The full stacks in the page-locked file as card buffers the card reads in place (the
    /// bus share of a decode step's host experts); empty when the card cannot read them.
    pub bus_stacks: Vec<TensorRef>,
    /// The layer's experts on the second expert device ([`ExpertTier::peer`]), if it holds any.
    pub peer: Option<PeerPart>,
    /// With [`ExpertTier::staging_parts`] over 1: per part, i32 `[n_expert]` on the card, the
    /// expert's own index when it lies in the part (an equal run of experts), else -1.
    pub part_maps: Vec<TensorRef>,
}

/// A layer's experts on the second expert device (a card after the main one): its full stacks
/// there, in the call's source order, and its map.
pub struct PeerPart {
    /// The full stacks, on the second device.
    pub stacks: Vec<TensorRef>,
    /// i32 `[n_expert]` on the second device: the expert's own index when it lives there, or -1.
    pub map: TensorRef,
}
