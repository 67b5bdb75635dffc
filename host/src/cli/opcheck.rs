//! `bloomery opcheck`: every op a kernel plugin claims, against the cpu-scalar reference, on fresh
//! random inputs; prints one line per case and fails when any case does.

use std::sync::Arc;

use anyhow::{bail, Context};
use bloomery_plugin_api::kernel::{DeviceClass, DeviceConfig};
use clap::Args;

use super::Cli;
use crate::opcheck;
use bloomery_devices::Device;
use bloomery_devices::Registry;

/// Options of `bloomery opcheck`.
#[derive(Args, Debug)]
pub struct OpcheckArgs {
    /// The kernel plugin to check (default: the best GPU plugin here).
    #[arg(long)]
    pub plugin: Option<String>,
    /// The reference plugin.
    #[arg(long, default_value = "cpu-scalar")]
    pub reference: String,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also run these model files end to end on the plugin against the CPU (logits of a prompt,
    /// mixed batches and decode steps).
    #[arg(long = "model", value_name = "FILE")]
    pub models: Vec<std::path::PathBuf>,
    /// Largest ‖Δ‖/‖ref‖ of end-to-end logits with an f32 K/V cache (an f16 cache is allowed 9e-5
    /// more).
    #[arg(long, default_value_t = 1e-5)]
    pub model_tol: f64,
}

/// Runs the command.
pub fn run(cli: &Cli, a: &OpcheckArgs) -> anyhow::Result<()> {
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    let plugin = match &a.plugin {
        Some(name) => reg
            .kernels
            .iter()
            .find(|k| &k.name == name)
            .with_context(|| format!("no kernel plugin named {name}"))?,
        None => reg.best_kernel(DeviceClass::Gpu)?,
    };
    let reference = reg
        .kernels
        .iter()
        .find(|k| k.name == a.reference)
        .with_context(|| format!("no reference plugin named {}", a.reference))?;
    let config = DeviceConfig {
        index: 0,
        threads: 0,
        pin_threads: false,
    };
    let dev: Arc<Device> =
        Device::open(plugin, config).with_context(|| format!("opening {}", plugin.name))?;
    let refdev =
        Device::open(reference, config).with_context(|| format!("opening {}", reference.name))?;
    let mut outcomes = opcheck::check(&dev, &refdev, a.seed);
    outcomes.extend(opcheck::check_host_memory(&dev));
    for m in &a.models {
        outcomes.extend(opcheck::check_model(&reg, m, plugin, a.model_tol));
    }
    let mut failed = 0;
    println!(
        "{} against {} (seed {}):",
        plugin.name, reference.name, a.seed
    );
    for o in &outcomes {
        let verdict = if o.ok() { "ok  " } else { "FAIL" };
        match &o.error {
            Some(e) => println!("{verdict} {:<44} {e}", o.what),
            None => {
                print!(
                    "{verdict} {:<44} rel {:.2e} (tol {:.0e})",
                    o.what, o.rel, o.tol
                );
                match o.worst.filter(|_| !o.ok()) {
                    Some((i, got, want)) => println!("; worst [{i}] {got} vs {want}"),
                    None => println!(),
                }
            }
        }
        failed += usize::from(!o.ok());
    }
    if outcomes.is_empty() {
        bail!("{} claims no ops", plugin.name);
    }
    if failed > 0 {
        bail!("{failed} of {} cases failed", outcomes.len());
    }
    println!("all {} cases passed", outcomes.len());
    Ok(())
}
