//! A slot's state copied out of and back into the model's state buffers (slot save/restore), and
//! the model identity a saved state is tied to.

use bloomery_plugin_api::model::StateKind;

use bloomery_devices::Staging;

use crate::error::ModelError;
use crate::model::LoadedModel;

/// Bytes of page-locked memory slot states are copied out through (a larger state goes through it
/// in turns).
const SNAPSHOT_STAGING: u64 = 32 << 20;

/// FNV-1a, 64-bit: a stable hash for the identity (std's hasher is not stable across releases).
fn fnv1a(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x0100_0000_01b3);
    }
}

/// Windows of a tensor's content the identity hashes.
const SAMPLES: usize = 16;

/// Bytes of each window.
const WINDOW: usize = 4096;

/// The byte ranges of a tensor of `len` bytes that the identity hashes: all of it when it is
/// at most [`SAMPLES`] windows, else [`SAMPLES`] windows evenly spread from its start to its
/// end.
fn content_windows(len: usize) -> Vec<std::ops::Range<usize>> {
    if len <= SAMPLES * WINDOW {
        return std::iter::once(0..len).collect();
    }
    let step = (len - WINDOW) / (SAMPLES - 1);
    (0..SAMPLES)
        .map(|i| {
            let start = i * step;
            start..start + WINDOW
        })
        .collect()
}

/// How far back a model's saved state can be restored, from what its state buffers hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rewind {
    /// Some buffer holds per-sequence state (convolution or recurrent), which cannot be
    /// rewound: a saved state restores only whole, or at one of its checkpoints.
    pub per_sequence: bool,
}

impl Rewind {
    /// The longest prefix of at most `want` positions that a state saved for `saved` positions
    /// restores to without checkpoints: any prefix when every buffer is positional (pooled
    /// keys included: a pooled row is read only once its block is whole, and written whole
    /// again by the pass that completes its block anew; `StateKind::PooledKeys`), and only all
    /// `saved` positions when a buffer holds per-sequence state.
    pub fn prefix(&self, saved: u32, want: u32) -> u32 {
        let want = want.min(saved);
        if want == saved || !self.per_sequence {
            want
        } else {
            0
        }
    }

    /// How many of the `shared` leading positions of a state of `saved` positions with
    /// checkpoints at `checkpoints` can be restored, and from which checkpoint (`None`: the
    /// state itself).
    pub fn reach(
        &self,
        saved: usize,
        checkpoints: impl Iterator<Item = usize>,
        shared: usize,
    ) -> (usize, Option<usize>) {
        let direct = self.prefix(saved as u32, shared as u32) as usize;
        checkpoints
            .enumerate()
            .filter(|&(_, n)| n <= shared && n <= saved && n > direct)
            .max_by_key(|&(_, n)| n)
            .map_or((direct, None), |(i, n)| (n, Some(i)))
    }
}

impl LoadedModel {
    /// What a saved slot state is valid for: the architecture, the tensor table (names, types,
    /// shapes, offsets), the weights' content and the cache type and layout. The content is
    /// sampled: up to [`SAMPLES`] windows of [`WINDOW`] bytes spread over each tensor (all of a
    /// small one). A fine-tune changes nearly every weight, so two files of one shape differ in
    /// every window, while reading each whole file would take minutes for a large model. The
    /// windows are read from the mapping, so the first call touches their pages.
    pub fn identity(&self) -> String {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for t in self.file.tensors() {
            fnv1a(&mut h, t.info.name.as_bytes());
            fnv1a(&mut h, &t.info.dtype.0.to_le_bytes());
            for d in &t.info.shape {
                fnv1a(&mut h, &d.to_le_bytes());
            }
            fnv1a(&mut h, &t.info.offset.to_le_bytes());
            // A tensor outside its part was refused at load.
            if let Ok(data) = self.file.tensor_data(t) {
                for window in content_windows(data.len()) {
                    fnv1a(&mut h, &data[window]);
                }
            }
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
    pub(crate) fn extent(&self, i: usize, slot: u32, n_pos: u32) -> (u64, usize) {
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

    pub(crate) fn check_slot(&self, slot: u32, n_pos: u32) -> Result<(), ModelError> {
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
        let extents: Vec<(u64, u64, usize)> = (0..self.state.len())
            .map(|i| {
                let (offset, len) = self.extent(i, slot, n_pos);
                (self.state[i].buffer, offset, len)
            })
            .collect();
        let staging = self.snapshot_staging()?;
        match staging.as_ref() {
            Some(s) => self.device.read_through(&extents, s),
            None => extents
                .iter()
                .map(|&(handle, offset, len)| {
                    let mut bytes = vec![0u8; len];
                    self.device.read(handle, offset, &mut bytes)?;
                    Ok(bytes)
                })
                .collect(),
        }
        .map_err(crate::error::device_err("reading slot state"))
    }

    /// The page-locked memory slot states are copied out through, made on first use (None
    /// where the device cannot make it: copies then read range by range).
    fn snapshot_staging(&self) -> Result<std::sync::MutexGuard<'_, Option<Staging>>, ModelError> {
        let mut staging = self
            .snapshot_staging
            .lock()
            .map_err(|_| ModelError::Request("the state staging buffer is poisoned".into()))?;
        if staging.is_none() {
            match self.device.alloc_staging(SNAPSHOT_STAGING) {
                Ok(s) => *staging = Some(s),
                Err(e) => tracing::debug!("no page-locked staging for slot states ({e})"),
            }
        }
        Ok(staging)
    }

    /// Makes the staging of [`LoadedModel::read_slot`] now (a page-locked allocation of ≈ 20 ms
    /// on the H200's host), so that the first state copied out does not wait for it; a server
    /// with a prompt cache calls it at start.
    pub fn reserve_snapshot_staging(&self) -> Result<(), ModelError> {
        self.snapshot_staging().map(|_| ())
    }

    /// How far back this model's saved states can be restored.
    pub fn rewind(&self) -> Rewind {
        Rewind {
            per_sequence: self
                .spec
                .state
                .iter()
                .any(|s| matches!(s.kind, StateKind::Conv | StateKind::Recurrent)),
        }
    }

    /// The longest prefix of at most `want` positions that a state saved for `saved` positions
    /// can be restored to ([`Rewind::prefix`]).
    pub fn restorable_prefix(&self, saved: u32, want: u32) -> u32 {
        self.rewind().prefix(saved, want)
    }

    /// Whether state buffer `i` is kept per sequence (convolution or recurrent) rather than per
    /// position.
    pub(crate) fn per_sequence(&self, i: usize) -> bool {
        matches!(
            self.spec.state[i].kind,
            StateKind::Conv | StateKind::Recurrent
        )
    }

    /// Copies out slot `slot`'s per-sequence buffers (convolution and recurrent state), in
    /// declaration order: a checkpoint of where its sequence stands now. Together with the
    /// positional buffers of any later saved state of the same tokens it restores this point.
    pub fn read_checkpoint(&self, slot: u32) -> Result<Vec<Vec<u8>>, ModelError> {
        self.check_slot(slot, 0)?;
        let mut parts = Vec::new();
        for (i, r) in self.state.iter().enumerate() {
            if !self.per_sequence(i) {
                continue;
            }
            let (offset, len) = self.extent(i, slot, 0);
            let mut bytes = vec![0u8; len];
            self.device
                .read(r.buffer, offset, &mut bytes)
                .map_err(crate::error::device_err("reading a checkpoint"))?;
            parts.push(bytes);
        }
        Ok(parts)
    }

    /// Writes a checkpoint from [`LoadedModel::read_checkpoint`] back into slot `slot`'s
    /// per-sequence buffers, leaving its positional buffers as they are.
    pub fn write_checkpoint(&mut self, slot: u32, parts: &[Vec<u8>]) -> Result<(), ModelError> {
        self.check_slot(slot, 0)?;
        let ids: Vec<usize> = (0..self.state.len())
            .filter(|&i| self.per_sequence(i))
            .collect();
        if ids.len() != parts.len() {
            return Err(ModelError::Request(format!(
                "a checkpoint has {} parts; this model keeps {} per-sequence buffers",
                parts.len(),
                ids.len()
            )));
        }
        for (&i, part) in ids.iter().zip(parts) {
            let (offset, len) = self.extent(i, slot, 0);
            if part.len() != len {
                return Err(ModelError::Request(format!(
                    "checkpoint part for state buffer {i} has {} bytes; the layout needs {len}",
                    part.len()
                )));
            }
            self.device
                .write(&self.state_buffers[i], offset, part)
                .map_err(crate::error::device_err("writing a checkpoint"))?;
        }
        Ok(())
    }

    /// Writes back the first `n_pos` positions of what [`LoadedModel::read_slot`] gave for
    /// `saved` positions; each part must have the length this model's layout gives for `saved`.
    /// Without `checkpoint`, `n_pos` must be a prefix [`LoadedModel::restorable_prefix`]
    /// allows; with one (taken at `n_pos` on the way to `saved`), the per-sequence buffers come
    /// from it.
    pub fn write_slot(
        &mut self,
        slot: u32,
        n_pos: u32,
        saved: u32,
        parts: &[Vec<u8>],
        checkpoint: Option<&[Vec<u8>]>,
    ) -> Result<(), ModelError> {
        self.check_slot(slot, saved)?;
        let allowed = match checkpoint {
            None => n_pos == self.restorable_prefix(saved, n_pos),
            Some(_) => n_pos <= saved,
        };
        if !allowed {
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
            if checkpoint.is_some() && self.per_sequence(i) {
                continue;
            }
            let (offset, len) = self.extent(i, slot, n_pos);
            self.device
                .write(&self.state_buffers[i], offset, &part[..len])
                .map_err(crate::error::device_err("writing slot state"))?;
        }
        if let Some(ck) = checkpoint {
            self.write_checkpoint(slot, ck)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_windows_cover_small_tensors_and_spread_over_large_ones() {
        let whole = |len: usize| std::iter::once(0..len).collect::<Vec<_>>();
        assert_eq!(content_windows(0), whole(0));
        assert_eq!(content_windows(SAMPLES * WINDOW), whole(SAMPLES * WINDOW));
        let len = 10 << 20;
        let w = content_windows(len);
        assert_eq!(w.len(), SAMPLES);
        assert_eq!(w[0], 0..WINDOW);
        assert_eq!(w[SAMPLES - 1].end, len - (len - WINDOW) % (SAMPLES - 1));
        assert!(w.windows(2).all(|p| p[0].end <= p[1].start));
    }
}
