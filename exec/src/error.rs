//! Why a model could not be loaded or run.

use bloomery_devices::SelectError;
use bloomery_gguf::GgufError;
use bloomery_plugin_api::PluginError;
use bloomery_tiering::plan::PlanError;
use bloomery_tiering::TierError;

use crate::executor::ExecError;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file is not a valid GGUF.
    #[error(transparent)]
    File(#[from] GgufError),
    /// No plugin serves it.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// A hyperparameter the file's own tensors contradict, refused before the model plugin
    /// sizes anything by it.
    #[error("{path}: `{key}` is {value}, but {why}")]
    Hyperparameter {
        /// The file.
        path: String,
        /// The metadata key.
        key: String,
        /// Its value.
        value: u64,
        /// What the tensors hold instead.
        why: String,
    },
    /// A tensor whose data fails `--check-tensors`.
    #[error("{path}: tensor `{tensor}` has invalid data: {what} at {at}")]
    TensorData {
        /// The file.
        path: String,
        /// The tensor.
        tensor: String,
        /// What was found (`NaN`, `infinity`, …).
        what: &'static str,
        /// Where: the element or block.
        at: String,
    },
    /// A metadata override (`--override-kv`, a rope flag) that cannot go over the file's value.
    #[error("{path}: {why}")]
    Override {
        /// The file.
        path: String,
        /// Which override, and why.
        why: String,
    },
    /// The file lacks `general.architecture`.
    #[error("{path}: no `general.architecture` key")]
    NoArchitecture {
        /// The file.
        path: String,
    },
    /// The model plugin refused the file. (The plugin's error is part of the message, not a
    /// `source`, so that `{:#}` does not print it twice.)
    #[error("{path}: the `{plugin}` plugin cannot load it: {error}")]
    Plugin {
        /// The file.
        path: String,
        /// The model plugin.
        plugin: String,
        /// Its error.
        error: PluginError,
    },
    /// A device operation failed.
    #[error("{context}: {error}")]
    Device {
        /// What was being done.
        context: String,
        /// The plugin's error.
        error: PluginError,
    },
    /// Preparing or running a graph failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A request the model cannot serve (a position past the context, a bad slot).
    #[error("{0}")]
    Request(String),
    /// The model's graph gives no final-norm rows, so it serves no embeddings.
    #[error("the `{plugin}` plugin's model serves no embeddings: {why}")]
    NoEmbeddings {
        /// The model plugin.
        plugin: String,
        /// What its graph lacks.
        why: String,
    },
    /// No placement of the weights fits the budgets.
    #[error(transparent)]
    Plan(#[from] PlanError),
}

impl From<TierError> for ModelError {
    fn from(e: TierError) -> Self {
        match e {
            TierError::Plan(p) => ModelError::Plan(p),
            TierError::Device { context, source } => ModelError::Device {
                context,
                error: source,
            },
            other => ModelError::Request(other.to_string()),
        }
    }
}

/// Maps a device error to [`ModelError::Device`] with what was being done.
pub(crate) fn device_err(context: &str) -> impl FnOnce(PluginError) -> ModelError + '_ {
    move |error| ModelError::Device {
        context: context.to_owned(),
        error,
    }
}
