//! The bloomery host's front ends: the command line (`run`, `bench`, `serve`, `plan`, `info`,
//! `synth`, `opcheck`, `plugins`), the llama-server-compatible HTTP server, their shared flags,
//! and the tools beside them (op checks against the reference plugin, random-weight files).
//! Everything below the front ends lives in its own crate, and dependencies point one way:
//! `bloomery` → `bloomery-runtime` → `bloomery-exec` → `bloomery-tiering` → `bloomery-devices`
//! → `bloomery-plugin-api` (docs/architecture.md).

pub mod cli;
pub mod flags;
pub mod hub;
pub mod opcheck;
pub mod progress;
pub mod server;
pub mod synth;
pub mod text;
