//! The runtime every front end shares: one scheduler thread owns the loaded model and its
//! sequence slots and batches every request's work into shared forward passes (continuous
//! batching), with llama.cpp's sampler chain, stop strings, the prompt cache in host RAM and slot
//! files. `serve` (HTTP), `run` (one prompt) and `bench` (timed requests) all submit work here,
//! so a sampler, a stop rule or a draft step is written once.
//!
//! Layers point one way: front ends → this crate → `bloomery-exec` (model loading and
//! execution) → `bloomery-tiering` → `bloomery-devices` → `bloomery-plugin-api`.

pub mod draft_gate;
pub mod draft_model;
mod drafter;
pub mod embedding;
pub mod grammar;
mod handle;
pub mod ngram_draft;
pub mod ngram_map;
mod panic;
pub mod prompt_cache;
pub mod reasoning_budget;
pub mod request;
pub mod sampling;
mod scheduler;
pub mod sleep;
pub mod slot_file;
pub mod spec;
pub mod status;
pub mod stop;
mod task;
mod token;

pub use handle::{Runtime, RuntimeError};
pub use panic::panic_message;
pub use scheduler::{
    RuntimeConfig, DEFAULT_CHECKPOINT_EVERY, DEFAULT_MAX_CHECKPOINTS, DEFAULT_SLOT_SIMILARITY,
};
