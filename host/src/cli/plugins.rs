//! `bloomery plugins`: the plugin listing.

use std::fmt::Write as _;

use bloomery_plugin_api::kernel::DeviceClass;
use bloomery_plugin_api::op::describe_support;
use bloomery_plugin_api::ABI_VERSION;

use super::Cli;
use bloomery_devices::{LoadError, Registry};

/// Prints the listing.
pub fn run(cli: &Cli) -> anyhow::Result<()> {
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    print!("{}", render(&reg, cli.verbose));
    Ok(())
}

fn class_name(c: DeviceClass) -> &'static str {
    match c {
        DeviceClass::Cpu => "cpu",
        DeviceClass::Gpu => "gpu",
    }
}

/// The listing as text.
pub fn render(reg: &Registry, verbose: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plugin folder: {}   (host ABI {ABI_VERSION})",
        reg.folders()
    );
    let _ = writeln!(out, "\nmodel plugins:");
    if reg.models.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for m in &reg.models {
        let file = m
            .path
            .file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<14} model   ABI {ABI_VERSION}  runs here: yes  {file}",
            m.name
        );
        let archs: Vec<String> = m
            .architectures
            .iter()
            .map(|a| {
                if reg.serves(m, a) {
                    a.clone()
                } else {
                    format!("{a} (claimed by another plugin)")
                }
            })
            .collect();
        let _ = writeln!(out, "    architectures: {}", archs.join(", "));
    }
    let _ = writeln!(out, "\nkernel plugins:");
    if reg.kernels.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for k in &reg.kernels {
        let file = k
            .path
            .file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default();
        let runs = if k.probe.score > 0 {
            format!("yes (score {})", k.probe.score)
        } else {
            "no".to_owned()
        };
        let _ = writeln!(
            out,
            "  {:<14} kernel  ABI {ABI_VERSION}  runs here: {runs}  {file}",
            k.name
        );
        let _ = writeln!(
            out,
            "    device: {}; {}",
            class_name(k.probe.class),
            k.probe.reason
        );
        for d in &k.probe.devices {
            match d.total_memory {
                0 => writeln!(out, "    - {}", d.name),
                m => writeln!(out, "    - {} ({} MiB)", d.name, m >> 20),
            }
            .ok();
        }
        let n_pairs: usize = k.capabilities.iter().map(|s| s.dtypes.len()).sum();
        let _ = writeln!(
            out,
            "    ops: {} ops, {n_pairs} (op, dtype) pairs",
            k.capabilities.len()
        );
        for line in describe_support(&k.capabilities) {
            let _ = writeln!(out, "      {line}");
        }
    }
    let _ = writeln!(out, "\nchosen:");
    for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
        let choice = match reg.best_kernel(class) {
            Ok(k) => k.name.clone(),
            Err(e) => e.to_string(),
        };
        let _ = writeln!(out, "  {}: {choice}", class_name(class));
    }
    if !reg.errors.is_empty() {
        let _ = writeln!(out, "\nnot loaded:");
        for e in &reg.errors {
            let _ = writeln!(out, "  {e}");
            if let (true, LoadError::Layout { detail, .. }) = (verbose, e) {
                for line in detail.lines() {
                    let _ = writeln!(out, "      {line}");
                }
            }
        }
    }
    out
}
