//! The sequence-state kernels (`cu/recurrent.cuh`) checked without a GPU: `sim/recurrent_test.cpp`
//! runs their source under a small CPU emulation of CUDA (`sim/sim.h`) against an f64 reference of
//! ConvCausal and DeltaRule (step-wise and chunked, several sequences per batch, bad slots). Built
//! with the host C++ compiler (`$CXX`, else `c++`); skipped, saying so, when there is none.

use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn recurrent_kernels_match_the_reference_under_emulation() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("sim/recurrent_test.cpp");
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("recurrent_sim");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let flags = [
        "-std=c++20",
        "-O2",
        "-pthread",
        "-Wall",
        "-Wno-unknown-pragmas",
    ];
    match Command::new(&cxx)
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
    {
        Ok(s) => assert!(s.success(), "{cxx} failed on {}", src.display()),
        Err(e) => {
            eprintln!("skipped: no C++ compiler ({cxx}: {e})");
            return;
        }
    }
    let run = Command::new(&exe).output().expect("running the emulation");
    let report = String::from_utf8_lossy(&run.stdout);
    eprintln!("{report}");
    assert!(
        run.status.success(),
        "the emulated kernels failed:\n{report}"
    );
}
