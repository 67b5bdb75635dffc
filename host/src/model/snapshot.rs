//! A slot's state copied out of and back into the model's state buffers (slot save/restore), and
//! the model identity a saved state is tied to.

use bloomery_plugin_api::model::StateKind;

use super::{LoadedModel, ModelError};

/// FNV-1a, 64-bit: a stable hash for the identity (std's hasher is not stable across releases).
fn fnv1a(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x0100_0000_01b3);
    }
}

impl LoadedModel {
    /// What a saved slot state is valid for: the architecture, the tensor table (names, types,
    /// shapes, offsets) and the cache type and layout.
    pub fn identity(&self) -> String {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for t in self.file.tensors() {
            fnv1a(&mut h, t.info.name.as_bytes());
            fnv1a(&mut h, &t.info.dtype.0.to_le_bytes());
            for d in &t.info.shape {
                fnv1a(&mut h, &d.to_le_bytes());
            }
            fnv1a(&mut h, &t.info.offset.to_le_bytes());
        }
        for s in &self.state {
            fnv1a(&mut h, &s.dtype.0.to_le_bytes());
            fnv1a(&mut h, &s.nb[1].to_le_bytes());
        }
        format!(
            "{} {} tensors {:016x}",
            self.spec.architecture,
            self.file.tensors().len(),
            h
        )
    }

    /// Byte offset and length of slot `slot`'s first `n_pos` positions in state buffer `i`
    /// (its whole row for per-sequence kinds).
    fn extent(&self, i: usize, slot: u32, n_pos: u32) -> (u64, usize) {
        let r = &self.state[i];
        let rows = match self.spec.state[i].kind {
            StateKind::Keys | StateKind::Values | StateKind::Latent => {
                u64::from(n_pos).min(r.ne[1])
            }
            StateKind::PooledKeys => u64::from(n_pos)
                .div_ceil(u64::from(self.spec.state[i].block.max(1)))
                .min(r.ne[1]),
            StateKind::Conv | StateKind::Recurrent => r.ne[1],
        };
        (u64::from(slot) * r.nb[2], (rows * r.nb[1]) as usize)
    }

    fn check_slot(&self, slot: u32, n_pos: u32) -> Result<(), ModelError> {
        if slot >= self.options.n_slots || n_pos > self.options.ctx_per_slot {
            return Err(ModelError::Request(format!(
                "slot {slot} with {n_pos} positions (the model has {} slots of {})",
                self.options.n_slots, self.options.ctx_per_slot
            )));
        }
        Ok(())
    }

    /// Copies out the state of `slot` for its first `n_pos` positions: one byte string per
    /// state buffer, in declaration order.
    pub fn read_slot(&self, slot: u32, n_pos: u32) -> Result<Vec<Vec<u8>>, ModelError> {
        self.check_slot(slot, n_pos)?;
        let mut parts = Vec::with_capacity(self.state.len());
        for (i, r) in self.state.iter().enumerate() {
            let (offset, len) = self.extent(i, slot, n_pos);
            let mut bytes = vec![0u8; len];
            self.device
                .read(r.buffer, offset, &mut bytes)
                .map_err(super::device_err("reading slot state"))?;
            parts.push(bytes);
        }
        Ok(parts)
    }

    /// The longest prefix of at most `want` positions that a state saved for `saved` positions
    /// can be restored to: any prefix when every buffer is positional, whole pooled blocks when
    /// pooled keys are kept, and only all `saved` positions when a buffer holds per-sequence
    /// state (convolution or recurrent), which cannot be rewound.
    pub fn restorable_prefix(&self, saved: u32, want: u32) -> u32 {
        let want = want.min(saved);
        if want == saved {
            return want;
        }
        let mut n = want;
        for s in self.spec.state.iter() {
            match s.kind {
                StateKind::Keys | StateKind::Values | StateKind::Latent => {}
                StateKind::PooledKeys => n -= n % s.block.max(1),
                StateKind::Conv | StateKind::Recurrent => return 0,
            }
        }
        n
    }

    /// Writes back the first `n_pos` positions of what [`LoadedModel::read_slot`] gave for
    /// `saved` positions; each part must have the length this model's layout gives for `saved`,
    /// and `n_pos` must be a prefix [`LoadedModel::restorable_prefix`] allows.
    pub fn write_slot(
        &mut self,
        slot: u32,
        n_pos: u32,
        saved: u32,
        parts: &[Vec<u8>],
    ) -> Result<(), ModelError> {
        self.check_slot(slot, saved)?;
        if n_pos != self.restorable_prefix(saved, n_pos) {
            return Err(ModelError::Request(format!(
                "a state saved for {saved} positions cannot be restored to its first {n_pos}"
            )));
        }
        if parts.len() != self.state.len() {
            return Err(ModelError::Request(format!(
                "a saved state has {} parts; this model keeps {}",
                parts.len(),
                self.state.len()
            )));
        }
        for (i, part) in parts.iter().enumerate() {
            let (_, saved_len) = self.extent(i, slot, saved);
            if part.len() != saved_len {
                return Err(ModelError::Request(format!(
                    "saved state part {i} has {} bytes; this model's layout needs {saved_len}",
                    part.len()
                )));
            }
            let (offset, len) = self.extent(i, slot, n_pos);
            self.device
                .write(&self.state_buffers[i], offset, &part[..len])
                .map_err(super::device_err("writing slot state"))?;
        }
        Ok(())
    }
}
