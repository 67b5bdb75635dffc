//! Rewrites `gguf/tests/fixtures/ours_v3_align64.gguf`, the file our writer produced and gguf-py
//! checked (then rerun `gguf/tests/fixtures/check_ours.py`):
//! `cargo run -p bloomery-gguf --example regenerate_writer_fixture`.

#[path = "../tests/common/mod.rs"]
mod common;

fn main() -> std::io::Result<()> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ours_v3_align64.gguf");
    std::fs::write(
        &path,
        common::sample_bytes(&common::sample_writer(3, Some(64))),
    )?;
    println!("wrote {}", path.display());
    Ok(())
}
