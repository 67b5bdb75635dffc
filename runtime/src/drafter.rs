//! What drafts in a scheduler: the model's MTP block, a separate draft model, or a source of
//! drafts (token history, tests).

use crate::draft_model::ModelDrafter;
use crate::spec::{DraftSource, MtpDrafter};

/// What drafts in a scheduler.
pub(crate) enum Drafter {
    /// The model's MTP block.
    Mtp(MtpDrafter),
    /// A source from outside.
    Source(Box<dyn DraftSource>),
    /// A separate draft model.
    Model(ModelDrafter),
}

impl Drafter {
    /// Whether target passes read their rows' final-norm rows for the MTP block (a slot whose
    /// gate has drafting off only before its probes).
    pub(crate) fn reads_rows(&self) -> bool {
        matches!(self, Drafter::Mtp(_))
    }
}
