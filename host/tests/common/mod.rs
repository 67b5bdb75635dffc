//! What every integration test of the host shares.

use std::path::PathBuf;

/// The plugin folder the tests load: `BLOOMERY_TEST_PLUGIN_DIR`, else the workspace's debug build
/// (`cargo xtask plugins`).
pub fn plugin_dir() -> PathBuf {
    std::env::var_os("BLOOMERY_TEST_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/plugins")
        })
}
