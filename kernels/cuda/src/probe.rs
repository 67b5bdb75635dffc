//! Finds the CUDA driver and its devices without linking CUDA (cudarc loads `libcuda` at run time),
//! and scores a kernel bundle for them: no driver, a driver older than CUDA 13 (R580), or no device
//! of a compute capability the bundle serves each give a score of 0 and a one-line reason.

use bloomery_plugin_api::kernel::{DeviceClass, DeviceInfo, ProbeReport};
use cudarc::driver::{result, sys};

/// The oldest driver API version accepted: CUDA 13.0, shipped with driver R580.
pub const MIN_DRIVER_API: i32 = 13000;

/// What the driver reported.
#[derive(Clone, Debug, PartialEq)]
pub struct DriverFacts {
    /// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
    pub api_version: i32,
    /// The kernel module's version line, when `/proc/driver/nvidia/version` is readable.
    pub module_version: Option<String>,
    /// Devices: name, compute capability (major, minor), total memory.
    pub devices: Vec<(String, (i32, i32), u64)>,
}

/// Which compute capabilities a bundle runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bundle {
    /// Bundle name (`cuda-sm90`).
    pub name: &'static str,
    /// The capability its machine code is built for, run natively (score 100).
    pub native: (i32, i32),
    /// With PTX embedded: the lowest capability the driver can JIT it for (score 50); `None`
    /// when the bundle has no PTX.
    pub ptx_from: Option<(i32, i32)>,
    /// The bundle's kernels (PTX text; empty when it was built without nvcc).
    pub ptx: &'static str,
}

/// Why the driver could not be read.
#[derive(Clone, Debug, PartialEq)]
pub enum DriverProblem {
    /// `libcuda.so` is not on this machine.
    NoDriver,
    /// The driver loaded but failed (no device, a broken install).
    Failed(String),
}

/// Reads the driver and devices. Never panics: a missing `libcuda` is [`DriverProblem::NoDriver`].
pub fn read_driver() -> Result<DriverFacts, DriverProblem> {
    // SAFETY: only checks whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(DriverProblem::NoDriver);
    }
    std::panic::catch_unwind(read_driver_inner).unwrap_or_else(|_| {
        Err(DriverProblem::Failed(
            "the CUDA driver lacks a needed entry point".into(),
        ))
    })
}

fn read_driver_inner() -> Result<DriverFacts, DriverProblem> {
    let fail = |e: result::DriverError| DriverProblem::Failed(format!("{e:?}"));
    result::init().map_err(fail)?;
    let mut api_version = 0;
    // SAFETY: cuDriverGetVersion writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut api_version) }
        .result()
        .map_err(fail)?;
    let count = result::device::get_count().map_err(fail)?;
    let mut devices = Vec::new();
    for i in 0..count {
        let dev = result::device::get(i).map_err(fail)?;
        let name = result::device::get_name(dev).map_err(fail)?;
        // SAFETY: `dev` came from `device::get`.
        let (major, minor, mem) = unsafe {
            (
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                ),
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                ),
                result::device::total_mem(dev),
            )
        };
        devices.push((
            name,
            (major.map_err(fail)?, minor.map_err(fail)?),
            mem.map_err(fail)? as u64,
        ));
    }
    let module_version = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|s| s.lines().next().map(str::to_owned));
    Ok(DriverFacts {
        api_version,
        module_version,
        devices,
    })
}

fn api_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// Scores `bundle` for what the driver reported (pure, for tests).
pub fn score(bundle: &Bundle, driver: &Result<DriverFacts, DriverProblem>) -> ProbeReport {
    let report = |score: u32, reason: String, devices: Vec<DeviceInfo>| ProbeReport {
        score,
        reason: reason.into(),
        class: DeviceClass::Gpu,
        devices: devices.into(),
    };
    if bundle.ptx.is_empty() {
        return report(
            0,
            format!(
                "{} was built without kernels (no nvcc at build time)",
                bundle.name
            ),
            vec![],
        );
    }
    let facts = match driver {
        Err(DriverProblem::NoDriver) => {
            return report(0, "no CUDA driver (libcuda.so not found)".into(), vec![])
        }
        Err(DriverProblem::Failed(e)) => {
            return report(0, format!("CUDA driver failed: {e}"), vec![])
        }
        Ok(f) => f,
    };
    let infos: Vec<DeviceInfo> = facts
        .devices
        .iter()
        .map(|(name, (ma, mi), mem)| DeviceInfo {
            name: format!("{name} (sm_{ma}{mi})").into(),
            total_memory: *mem,
            free_memory: 0,
        })
        .collect();
    if facts.api_version < MIN_DRIVER_API {
        let module = facts
            .module_version
            .as_deref()
            .unwrap_or("version line unreadable");
        return report(
            0,
            format!(
                "driver too old: CUDA {} found, CUDA {} (R580) or newer needed ({module})",
                api_string(facts.api_version),
                api_string(MIN_DRIVER_API)
            ),
            infos,
        );
    }
    let Some((_, cc, _)) = facts.devices.first() else {
        return report(
            0,
            "CUDA driver found but no device is visible".into(),
            infos,
        );
    };
    let driver = format!("CUDA {}", api_string(facts.api_version));
    if *cc == bundle.native {
        return report(
            100,
            format!(
                "{driver}; sm_{}{} runs {} natively",
                cc.0, cc.1, bundle.name
            ),
            infos,
        );
    }
    if bundle.ptx_from.is_some_and(|p| *cc >= p) {
        return report(
            50,
            format!(
                "{driver}; sm_{}{} JIT-compiles the PTX of {} at start",
                cc.0, cc.1, bundle.name
            ),
            infos,
        );
    }
    report(
        0,
        format!(
            "{driver}; device is sm_{}{}, {} serves sm_{}{}{}",
            cc.0,
            cc.1,
            bundle.name,
            bundle.native.0,
            bundle.native.1,
            bundle
                .ptx_from
                .map(|p| format!(" (PTX for sm_{}{}+)", p.0, p.1))
                .unwrap_or_default()
        ),
        infos,
    )
}

/// Probes this machine for `bundle`.
pub fn probe(bundle: &Bundle) -> ProbeReport {
    score(bundle, &read_driver())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SM90: Bundle = Bundle {
        name: "cuda-sm90",
        native: (9, 0),
        ptx_from: None,
        ptx: ".version 9.0",
    };
    const SM86: Bundle = Bundle {
        name: "cuda-sm86",
        native: (8, 6),
        ptx_from: Some((8, 6)),
        ptx: ".version 9.0",
    };

    fn facts(api: i32, cc: (i32, i32)) -> Result<DriverFacts, DriverProblem> {
        Ok(DriverFacts {
            api_version: api,
            module_version: Some("NVRM version: 570.1".into()),
            devices: vec![("NVIDIA H200".into(), cc, 141 << 30)],
        })
    }

    #[test]
    fn no_driver_and_old_driver_are_refused_by_name() {
        let r = score(&SM90, &Err(DriverProblem::NoDriver));
        assert_eq!(
            (r.score, r.reason.as_str()),
            (0, "no CUDA driver (libcuda.so not found)")
        );
        let r = score(&SM90, &facts(12080, (9, 0)));
        assert_eq!(r.score, 0);
        assert!(
            r.reason.contains("CUDA 12.8 found") && r.reason.contains("570.1"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn a_bundle_built_without_kernels_is_refused_by_name() {
        let empty = Bundle { ptx: "", ..SM90 };
        let r = score(&empty, &facts(13000, (9, 0)));
        assert_eq!(r.score, 0);
        assert!(r.reason.contains("without kernels"), "{}", r.reason);
    }

    #[test]
    fn compute_capability_picks_the_bundle() {
        let h200 = facts(13000, (9, 0));
        assert_eq!(score(&SM90, &h200).score, 100);
        assert_eq!(score(&SM86, &h200).score, 50);
        let a6000 = facts(13000, (8, 6));
        assert_eq!(score(&SM86, &a6000).score, 100);
        let r = score(&SM90, &a6000);
        assert_eq!(r.score, 0);
        assert!(
            r.reason.contains("sm_86") && r.reason.contains("sm_90"),
            "{}",
            r.reason
        );
        assert_eq!(score(&SM86, &facts(13000, (7, 5))).score, 0);
    }

    #[test]
    fn this_machine_is_probed_without_panicking() {
        let r = probe(&SM90);
        if r.score == 0 {
            assert!(!r.reason.is_empty());
        }
    }
}
