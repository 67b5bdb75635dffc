//! Records the commit the binary is built from and the commits in its history, for `bench`'s
//! `build:` line and `build_commit`/`build_number` fields (llama-bench's); `unknown` and 0
//! outside a git checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    let commit = git(&["rev-parse", "--short=8", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let number = git(&["rev-list", "--count", "HEAD"]).unwrap_or_else(|| "0".into());
    println!("cargo:rustc-env=BLOOMERY_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=BLOOMERY_BUILD_NUMBER={number}");
    println!("cargo:rerun-if-changed=build.rs");
    // A commit or checkout appends to the work tree's HEAD log.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/logs/HEAD");
    }
}
