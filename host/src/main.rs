//! The `bloomery` command.
fn main() {}
