//! Compiles `cu/kernels.cu` to PTX for each bundle's architecture (compute_86, compute_90,
//! compute_121) with nvcc 13.0 — the pinned PyPI toolchain `cargo xtask cuda-tools` installs into
//! `target/cuda-tools` (or `$BLOOMERY_NVCC`, or `nvcc` on PATH). The driver this project targets
//! (R580, CUDA 13.0) refuses PTX above ISA 9.0, so newer PTX is a build error. Without nvcc the
//! bundles build without kernels and say so at run time, unless `BLOOMERY_REQUIRE_KERNELS` is set
//! (`cargo xtask` sets it), which makes a missing compiler an error. The architectures compile
//! side by side, and their PTX is kept under the target folder (`<profile>/build/ptx-cache`, keyed
//! by the sources' bytes and the compiler) for the script's next run with other fingerprints
//! (clippy's, the tests').

use std::path::{Path, PathBuf};
use std::process::Command;

const ARCHS: [&str; 3] = ["86", "90", "121"];

fn nvcc(manifest: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BLOOMERY_NVCC") {
        return Some(PathBuf::from(p));
    }
    let pinned = manifest
        .join("../../target/cuda-tools/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc");
    if pinned.exists() {
        return Some(pinned);
    }
    Command::new("nvcc")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("nvcc"))
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let src = manifest.join("cu/kernels.cu");
    println!("cargo:rerun-if-changed=cu");
    println!("cargo:rerun-if-env-changed=BLOOMERY_NVCC");
    println!("cargo:rerun-if-env-changed=BLOOMERY_REQUIRE_KERNELS");
    let required = std::env::var_os("BLOOMERY_REQUIRE_KERNELS").is_some();
    let Some(nvcc) = nvcc(&manifest) else {
        if required {
            panic!("nvcc not found: run `cargo xtask cuda-tools` (pinned nvcc 13.0 from PyPI) or set BLOOMERY_NVCC");
        }
        println!("cargo:warning=nvcc not found: the CUDA bundles are built without kernels (run `cargo xtask cuda-tools`)");
        for a in ARCHS {
            std::fs::write(out.join(format!("kernels_{a}.ptx")), "").expect("writing OUT_DIR");
        }
        return;
    };
    // clippy, build and test runs each run this script (their fingerprints differ); the PTX of
    // one source, compiler and architecture is kept once under the target folder's build/, and
    // the three architectures compile side by side: each nvcc run takes minutes.
    let key = source_key(&manifest.join("cu"), &nvcc);
    let cache = out.join("../../ptx-cache");
    std::fs::create_dir_all(&cache).expect("creating the PTX cache");
    let runs: Vec<_> = ARCHS
        .into_iter()
        .map(|a| {
            let (nvcc, src, cache) = (nvcc.clone(), src.clone(), cache.clone());
            let ptx = out.join(format!("kernels_{a}.ptx"));
            std::thread::spawn(move || {
                let kept = cache.join(format!("{key:016x}_{a}.ptx"));
                if std::fs::copy(&kept, &ptx).is_err() {
                    compile(&nvcc, &src, a, &ptx);
                    let part = cache.join(format!("{key:016x}_{a}.ptx.part"));
                    std::fs::copy(&ptx, &part).expect("writing the PTX cache");
                    std::fs::rename(&part, &kept).expect("writing the PTX cache");
                }
            })
        })
        .collect();
    for run in runs {
        if let Err(panic) = run.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// A key for the PTX of the sources under `dir` (every file's name and bytes) built by `nvcc`
/// (its path and `--version`).
fn source_key(dir: &Path, nvcc: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("reading cu/") {
            let p = e.expect("reading cu/").path();
            match p.is_dir() {
                true => dirs.push(p),
                false => files.push(p),
            }
        }
    }
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in &files {
        f.strip_prefix(dir).unwrap_or(f).hash(&mut h);
        std::fs::read(f).expect("reading cu/").hash(&mut h);
    }
    nvcc.hash(&mut h);
    let version = Command::new(nvcc)
        .arg("--version")
        .output()
        .map(|o| o.stdout);
    version.unwrap_or_default().hash(&mut h);
    h.finish()
}

/// Compiles `src` to PTX for `compute_{arch}` into `ptx`, refusing PTX the target driver cannot
/// load.
fn compile(nvcc: &Path, src: &Path, a: &str, ptx: &Path) {
    let status = Command::new(nvcc)
        .args(["-O3", "-ptx", &format!("-arch=compute_{a}"), "-o"])
        .arg(ptx)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
    assert!(
        status.success(),
        "nvcc failed on {} for compute_{a}",
        src.display()
    );
    let text = std::fs::read_to_string(ptx).expect("reading the PTX nvcc wrote");
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix(".version "))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let ok = version
        .split_once('.')
        .and_then(|(maj, min)| Some((maj.parse::<u32>().ok()?, min.parse::<u32>().ok()?)))
        .is_some_and(|v| v <= (9, 0));
    assert!(
        ok,
        "{} wrote PTX ISA {version}; driver 580 (CUDA 13.0) loads at most 9.0: use nvcc 13.0 (`cargo xtask cuda-tools`)",
        nvcc.display()
    );
}
