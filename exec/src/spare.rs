//! A device-side copy of a slot's per-sequence state (convolution and recurrent), taken before
//! a pass that evaluates drafted tokens and copied back when a draft is refused: the bytes never
//! leave the device, where [`LoadedModel::read_checkpoint`] brings them to the host.

use crate::error::{device_err, ModelError};
use crate::model::LoadedModel;

impl LoadedModel {
    /// Allocates the spare buffers [`LoadedModel::save_sequence`] copies into, unless made
    /// already: the size of the per-sequence state buffers, every slot's. A runtime that drafts
    /// calls it at start, so that a device without room for them is known there.
    pub fn reserve_sequence_spare(&mut self) -> Result<(), ModelError> {
        if !self.spare.saved.is_empty() {
            return Ok(());
        }
        let mut buffers = Vec::new();
        for (i, b) in self.state_buffers.iter().enumerate() {
            if self.per_sequence(i) {
                let spare = self.device.alloc(b.bytes).map_err(device_err(&format!(
                    "allocating the spare of state buffer {i} ({} bytes)",
                    b.bytes
                )))?;
                buffers.push((i, spare));
            }
        }
        self.spare.buffers = buffers;
        self.spare.saved = vec![false; self.options.n_slots as usize];
        Ok(())
    }

    /// Bytes of the spare buffers [`LoadedModel::reserve_sequence_spare`] made (0 before).
    pub fn sequence_spare_bytes(&self) -> u64 {
        self.spare.buffers.iter().map(|(_, b)| b.bytes).sum()
    }

    /// Copies slot `slot`'s per-sequence state into its spare on the device, ordered after the
    /// calls submitted so far (the spare made first if [`LoadedModel::reserve_sequence_spare`]
    /// has not made it).
    pub fn save_sequence(&mut self, slot: u32) -> Result<(), ModelError> {
        self.check_slot(slot, 0)?;
        self.reserve_sequence_spare()?;
        for (i, spare) in &self.spare.buffers {
            let (offset, len) = self.extent(*i, slot, 0);
            self.device
                .copy(
                    (self.state[*i].buffer, offset),
                    (spare.handle, offset),
                    len as u64,
                )
                .map_err(device_err("saving a slot's state on the device"))?;
        }
        self.spare.saved[slot as usize] = true;
        Ok(())
    }

    /// Copies back what [`LoadedModel::save_sequence`] saved of slot `slot`, ordered after the
    /// calls submitted so far; its positional buffers are left as they are. A slot with no save
    /// since its last restore is refused.
    pub fn restore_sequence(&mut self, slot: u32) -> Result<(), ModelError> {
        self.check_slot(slot, 0)?;
        if !self.spare.saved.get(slot as usize).is_some_and(|&s| s) {
            return Err(ModelError::Request(format!(
                "slot {slot} has no state saved on the device to restore"
            )));
        }
        for (i, spare) in &self.spare.buffers {
            let (offset, len) = self.extent(*i, slot, 0);
            self.device
                .copy(
                    (spare.handle, offset),
                    (self.state[*i].buffer, offset),
                    len as u64,
                )
                .map_err(device_err("restoring a slot's state on the device"))?;
        }
        self.spare.saved[slot as usize] = false;
        Ok(())
    }
}
