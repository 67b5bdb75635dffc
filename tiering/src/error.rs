//! Why a tier could not be set up.

use bloomery_plugin_api::PluginError;

use crate::plan::PlanError;

/// Why the tier's parts (the disk tier, its arena and thread) could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// No placement fits the budgets.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A device operation failed.
    #[error("{context}: {source}")]
    Device {
        /// What was being done.
        context: String,
        /// The plugin's error.
        source: PluginError,
    },
    /// The system refused a resource (the file for direct reads, a thread).
    #[error("{context}: {source}")]
    System {
        /// What was being done.
        context: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// An expert stack has no contiguous layout in the arena.
    #[error("an expert stack has no layout")]
    Layout,
}

/// Maps a device error to [`TierError::Device`] with what was being done.
pub fn dev_err(context: &str) -> impl FnOnce(PluginError) -> TierError + '_ {
    move |source| TierError::Device {
        context: context.to_owned(),
        source,
    }
}
