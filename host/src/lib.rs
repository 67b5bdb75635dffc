//! The bloomery host: command line, plugin loader, model files, engine.

pub mod cli;
pub mod engine;
pub mod model;
pub mod opcheck;
pub mod plugins;
pub mod sampling;
pub mod server;
pub mod synth;
pub mod text;
pub mod tiering;
