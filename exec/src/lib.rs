//! Model loading and execution: a model file opened by its architecture plugin, its weights put
//! on the devices the placement plan chose, the state of every sequence slot, and the graph
//! executor that runs one forward pass over a batch of rows.

pub mod arena_plan;
pub mod decision;
mod error;
pub mod executor;
mod file_check;
mod mlock;
pub mod model;
mod ngram_cache;
pub mod ngram_open;
pub mod ngram_table;
mod open;
mod options;
pub mod overrides;
pub mod placement;
pub mod progress;
pub mod readout;
mod row_states;
mod shift;
mod shift_plan;
mod snapshot;
mod spare;
mod state;
pub mod support;
pub mod view;
pub mod weights;

pub use error::ModelError;
pub use executor::{BatchInputs, ExecError};
pub use model::{LoadedModel, PassOutputs, RoutingStats};
pub use open::instantiate;
pub use options::LoadOptions;
pub use readout::Readout;
pub use snapshot::Rewind;
