//! `bloomery plan`: where the weights of a model would live under given budgets, without
//! loading it.

use std::path::PathBuf;

use anyhow::Context;
use bloomery_plugin_api::kernel::DeviceClass;
use clap::Args;

use super::Cli;
use crate::flags::placement::{pass_rows, PlacementArgs};
use bloomery_devices::Registry;
use bloomery_exec::placement::plan_only;
use bloomery_exec::LoadOptions;

/// Options of `bloomery plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The GGUF file (the first part of a split model).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model: PathBuf,
    /// Context positions in total, shared by the slots as `serve -c` shares them.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: u32,
    /// Sequence slots.
    #[arg(long = "parallel", default_value_t = 1)]
    pub parallel: u32,
    /// Most tokens in one forward pass (logical batch), as `serve -b`.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: u32,
    /// Most tokens in one forward pass (physical batch), as `serve -ub`: the card's scratch is
    /// planned for the smaller of the two.
    #[arg(long = "ubatch-size", default_value_t = bloomery_tiering::plan::DEFAULT_BATCH_ROWS)]
    pub ubatch_size: u32,
    /// Where routed experts go.
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Draft decoding as `serve` would run it (on by default for a file with MTP layers; its
    /// state is planned on the card, taking room from experts; `--spec-type none` plans none).
    #[command(flatten)]
    pub spec: crate::flags::spec::SpecArgs,
}

/// Prints the plan for the best GPU kernel plugin here (the best CPU one when there is none).
pub fn run(cli: &Cli, a: &PlanArgs) -> anyhow::Result<()> {
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    let kernel = reg
        .best_kernel(DeviceClass::Gpu)
        .or_else(|_| reg.best_kernel(DeviceClass::Cpu))?;
    let n_slots = a.parallel.max(1);
    let options = LoadOptions {
        n_slots,
        ctx_per_slot: (a.ctx_size / n_slots).max(1),
        draft_n_max: a.spec.planned_n_max()?,
        draft_history: a.spec.planned_history()?,
        ..LoadOptions::default()
    };
    let mut request = a.placement.request()?;
    request.batch_rows = pass_rows(a.batch_size, a.ubatch_size);
    let plan = plan_only(&reg, &a.model, options, kernel, &request)
        .with_context(|| format!("planning {} on {}", a.model.display(), kernel.name))?;
    println!("{}: plan on {}", a.model.display(), kernel.name);
    print!("{plan}");
    Ok(())
}
