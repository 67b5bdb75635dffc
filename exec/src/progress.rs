//! How far a model's load has got, for a front end that shows it (a progress bar on a terminal,
//! periodic lines otherwise): the bytes of the file mapped as device buffers, copied to the
//! card, and page-locked for the card's reads. A front end installs one observer for the
//! process ([`observe_loads`]); without one, reporting costs a load nothing but a check.

use std::sync::OnceLock;

/// A step of a load whose bytes are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadStage {
    /// The file's parts mapped as buffers of a device (no bytes are read).
    Mapped,
    /// Weights and experts copied to the card.
    CopiedToCard,
    /// Host ranges page-locked for the card's copies and in-place reads.
    Pinned,
}

impl LoadStage {
    /// What the stage does, as a progress line says it (`copied to the card`).
    pub fn verb(self) -> &'static str {
        match self {
            LoadStage::Mapped => "mapped",
            LoadStage::CopiedToCard => "copied to the card",
            LoadStage::Pinned => "pinned",
        }
    }
}

/// Receives a load's progress; called from the loading thread.
pub trait LoadObserver: Send + Sync {
    /// A stage starts with `total` bytes to do.
    fn begin(&self, stage: LoadStage, total: u64);
    /// `bytes` more of the stage are done.
    fn advance(&self, stage: LoadStage, bytes: u64);
    /// The stage is over (done, or the load failed).
    fn end(&self, stage: LoadStage);
}

static OBSERVER: OnceLock<Box<dyn LoadObserver>> = OnceLock::new();

/// Sends every later load's progress to `observer`; false (and `observer` dropped) when one is
/// already installed.
pub fn observe_loads(observer: Box<dyn LoadObserver>) -> bool {
    OBSERVER.set(observer).is_ok()
}

/// A stage in progress; ends when dropped.
pub(crate) struct Stage(LoadStage);

impl Stage {
    /// Starts `stage` with `total` bytes to do.
    pub(crate) fn begin(stage: LoadStage, total: u64) -> Stage {
        if let Some(o) = OBSERVER.get() {
            o.begin(stage, total);
        }
        Stage(stage)
    }

    /// Counts `bytes` more as done.
    pub(crate) fn advance(&self, bytes: u64) {
        if let Some(o) = OBSERVER.get() {
            o.advance(self.0, bytes);
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Some(o) = OBSERVER.get() {
            o.end(self.0);
        }
    }
}
