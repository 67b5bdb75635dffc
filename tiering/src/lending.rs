//! The prompts' staging sets lent to decode. A prompt streams each layer with host experts into
//! a staging set before its MoE call ([`super::ExpertTier::stream_set`]); between prompts the
//! sets would sit idle, so each instead holds one such layer's whole stacks (the plan's
//! [`super::plan::Plan::lent`]), and passes that stream nothing run those layers' MoE calls on
//! the card from there, with no host experts. The lent layers are the last a prompt streams into
//! their sets, so a prompt leaves them in place; what a set holds is tracked, and a pass that
//! needs a layer the set no longer holds (the first one, or after a failed prompt) copies it
//! back first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bloomery_plugin_api::PluginError;

use crate::host_slice::HostSlice;
use bloomery_devices::Device;

/// A staging set's lent layer: its tier layer index, with its stacks' copies (staging buffer
/// handle, file bytes).
pub type LentLayer = (usize, Vec<(u64, HostSlice)>);

/// The lent layers and what each staging set holds.
pub struct Lending {
    /// Per staging set: the tier layer lent it, with its stacks' copies (staging buffer handle,
    /// file bytes); None where the set is not lent.
    lent: Vec<Option<LentLayer>>,
    /// Per staging set: the tier layer whose whole stacks it holds (None: unknown or partial).
    held: Mutex<Vec<Option<usize>>>,
    /// Whether a copy drops the file's pages from resident memory once made (the disk tier).
    release: bool,
    /// Layers copied back by [`Lending::restore`] so far.
    restored: AtomicU64,
}

impl Lending {
    /// Sets lent as `lent` says (per set, as [`Lending::lent`]), holding nothing yet.
    pub fn new(lent: Vec<Option<LentLayer>>, release: bool) -> Lending {
        let held = Mutex::new(vec![None; lent.len()]);
        Lending {
            lent,
            held,
            release,
            restored: AtomicU64::new(0),
        }
    }

    /// Layers copied back into their sets so far (a prompt leaves them in place, so this grows
    /// only at the first pass that reads them and after a failed prompt).
    pub fn restored(&self) -> u64 {
        self.restored.load(Ordering::Relaxed)
    }

    /// The staging set lent to tier layer `layer`, if any.
    pub fn set_of(&self, layer: usize) -> Option<usize> {
        self.lent
            .iter()
            .position(|l| l.as_ref().is_some_and(|(t, _)| *t == layer))
    }

    /// Copies each lent layer its set does not hold into it (synchronously: call between
    /// passes); returns the layers copied.
    pub fn restore(&self, card: &Device) -> Result<usize, PluginError> {
        let mut held = self.held()?;
        let mut copied = 0;
        for (set, lent) in self.lent.iter().enumerate() {
            let Some((layer, copies)) = lent else {
                continue;
            };
            if held[set] == Some(*layer) {
                continue;
            }
            held[set] = None;
            for (handle, slice) in copies {
                card.write_handle(*handle, 0, slice.bytes())?;
                if self.release {
                    slice.release();
                }
            }
            held[set] = Some(*layer);
            copied += 1;
        }
        self.restored.fetch_add(copied as u64, Ordering::Relaxed);
        Ok(copied)
    }

    /// Records that a pass is about to overwrite every set.
    pub fn overwriting(&self) -> Result<(), PluginError> {
        self.held()?.fill(None);
        Ok(())
    }

    /// Records that set `set` holds tier layer `layer` whole.
    pub fn holds(&self, set: usize, layer: usize) -> Result<(), PluginError> {
        if let Some(h) = self.held()?.get_mut(set) {
            *h = Some(layer);
        }
        Ok(())
    }

    fn held(&self) -> Result<std::sync::MutexGuard<'_, Vec<Option<usize>>>, PluginError> {
        self.held
            .lock()
            .map_err(|_| PluginError::device("staging state poisoned"))
    }
}
