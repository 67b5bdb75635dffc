//! The host side of a tiered model as the executor uses it: the layers with host experts, the
//! staging sets, and the shared state that moves experts (residency, lending, the bus share,
//! the disk tier).

use std::sync::{Arc, Mutex};

use bloomery_devices::bytes::i32_bytes;
use bloomery_devices::{Buffer, Device};

use crate::bus_balance::BusBalance;
use crate::disk::DiskTier;
use crate::layer::TierLayer;
use crate::lending::Lending;
use crate::plan::stream_set;
use crate::residency::Residency;

/// Rows from which a batch streams a tiered layer's experts to the card instead of computing
/// the host's share on the CPU. At 16 rows and k = 8 a layer's 128 experts are nearly all
/// used, so the CPU reads them all anyway, and its multiply cost grows with the rows while the
/// copy does not.
pub const STREAM_MIN_ROWS: u32 = 32;

/// Most experts moved onto the card per step (each move copies one expert's stacks).
const MAX_FLIPS_PER_STEP: usize = 4;

/// The host side of a tiered model. Field order is drop order: buffers before the device.
pub struct ExpertTier {
    /// Layers with host experts.
    pub layers: Vec<TierLayer>,
    /// Card buffers a streamed layer's stacks are copied into: one or two sets (streamed layers
    /// take turns), each one buffer per stack position.
    pub staging: Vec<Vec<Buffer>>,
    /// Parts a streamed layer's experts are copied and computed in (1, or 2 with one set).
    pub staging_parts: usize,
    /// The staging sets' layers between prompts (shared with the executors).
    pub lending: Arc<Lending>,
    /// Routing counts and the placement they move (shared with the executors, which count).
    pub residency: Arc<Mutex<Residency>>,
    /// The disk tier, when host RAM cannot hold the host experts.
    pub disk: Option<Arc<DiskTier>>,
    /// The bus share's size, asked for or chosen by the first decode passes (shared with the
    /// executors, which time their passes).
    pub bus: Arc<Mutex<BusBalance>>,
    /// The card's views of the page-locked stacks behind [`TierLayer::bus_stacks`] and of the
    /// token tables it reads in place.
    pub bus_views: Vec<Buffer>,
    /// The address ranges `(start, end)` of the file mapping the host reads during a run: the
    /// layers' stacks (not when the disk tier reads them into its arena) and the token tables
    /// the card reads in place. Page-locked at load; `--mlock` locks them too.
    pub host_read: Vec<(usize, usize)>,
    /// The second expert device's buffers: the mapped file parts and its expert maps.
    pub peer_buffers: Vec<Buffer>,
    /// The second expert device, which computes the experts a card after the main one holds
    /// (a CPU device stands in for that card where there is none), when the plan puts any there.
    pub peer: Option<Arc<Device>>,
    /// The CPU device's buffers: the mapped file parts and the host expert maps (kept alive).
    pub host_buffers: Vec<Buffer>,
    /// The CPU device that computes host experts.
    pub host: Arc<Device>,
}

impl ExpertTier {
    /// The staging set a prompt streams tier layer `layer` into (see [`stream_set`]).
    pub fn stream_set(&self, layer: usize) -> usize {
        stream_set(layer, self.staging.len())
    }

    /// The layer whose first stack is weight `index`, with its position in [`ExpertTier::layers`].
    pub fn layer(&self, index: usize) -> Option<(usize, &TierLayer)> {
        self.layers
            .iter()
            .enumerate()
            .find(|(_, l)| l.first_stack == index)
    }

    /// Between steps: moves the experts the counts call for onto `card` (their stacks from the
    /// file into the slots they take) and rewrites both expert maps of each layer touched.
    /// Returns the moves made.
    pub fn rebalance(&self, card: &Device) -> Result<usize, bloomery_plugin_api::PluginError> {
        let mut r = self
            .residency
            .lock()
            .map_err(|_| bloomery_plugin_api::PluginError::device("residency state poisoned"))?;
        let flips = r.step(MAX_FLIPS_PER_STEP);
        for f in &flips {
            let layer = &self.layers[f.layer];
            for ((slice, _), stack) in layer.stream.iter().zip(&layer.card_stacks) {
                let stride = stack.nb[2];
                let from = f.incoming as usize * stride as usize;
                card.write_handle(
                    stack.buffer,
                    stack.offset + u64::from(f.slot) * stride,
                    &slice.bytes()[from..from + stride as usize],
                )?;
            }
            let state = &r.layers[f.layer];
            card.write_handle(layer.card_map.buffer, 0, i32_bytes(&state.slot_of))?;
            self.host
                .write_handle(layer.host_map.buffer, 0, i32_bytes(&state.host_map()))?;
        }
        Ok(flips.len())
    }
}
