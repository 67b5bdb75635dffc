//! `bloomery synth`: writes a random-weight model of an architecture's preset shape.

use std::path::PathBuf;

use bloomery_plugin_api::DType;
use clap::Args;

use super::Cli;
use crate::progress::{Progress, Unit};
use crate::synth::{self, ClassTypes, TensorTypes};
use bloomery_devices::Registry;

/// Options of `bloomery synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Architecture (`general.architecture`), e.g. qwen3moe.
    #[arg(long, default_value = "qwen3moe")]
    pub arch: String,
    /// Preset shape of the architecture's plugin (`--list` shows them).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Output file.
    #[arg(
        short = 'o',
        long,
        value_name = "FILE",
        required_unless_present = "list"
    )]
    pub output: Option<PathBuf>,
    /// Type of routed experts.
    #[arg(long, default_value = "F32", value_parser = parse_dtype)]
    pub experts: DType,
    /// Type of the routed experts' down projections (default: --experts).
    #[arg(long, value_parser = parse_dtype, value_name = "TYPE")]
    pub experts_down: Option<DType>,
    /// Type of the hashed n-gram tables (Qwen3.8's PLE table, IQ4_NL in the published file;
    /// DeepSeek-V4.1's Engram tables; default F32).
    #[arg(long, value_parser = parse_dtype, value_name = "TYPE")]
    pub ngram: Option<DType>,
    /// Type of attention projections.
    #[arg(long, default_value = "F32", value_parser = parse_dtype)]
    pub attn: DType,
    /// Type of the token embedding.
    #[arg(long, default_value = "F32", value_parser = parse_dtype)]
    pub embd: DType,
    /// Type of the output head.
    #[arg(long, default_value = "F32", value_parser = parse_dtype)]
    pub output_type: DType,
    /// Type of dense and shared-expert FFNs.
    #[arg(long, default_value = "F32", value_parser = parse_dtype)]
    pub dense: DType,
    /// Write only the preset's first N layers (its real widths at a smaller depth); per-layer
    /// keys keep those layers' entries.
    #[arg(long, value_name = "N")]
    pub layers: Option<u64>,
    /// Random seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// List the presets of every model plugin and exit.
    #[arg(long)]
    pub list: bool,
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::from_name(s).ok_or_else(|| format!("unknown type `{s}`"))
}

/// Runs the command.
pub fn run(cli: &Cli, a: &SynthArgs) -> anyhow::Result<()> {
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    if a.list {
        for m in &reg.models {
            for p in m.module.synth_presets()().iter() {
                let arch = preset_arch(p).unwrap_or(m.name.as_str());
                println!("{arch:<12} {:<12} {}", p.name, p.description);
            }
        }
        return Ok(());
    }
    let plugin = reg.model_for(&a.arch)?;
    let presets: Vec<_> = plugin.module.synth_presets()()
        .into_iter()
        .filter(|p| preset_arch(p).is_none_or(|arch| arch == a.arch))
        .collect();
    let preset = presets
        .iter()
        .find(|p| p.name.as_str() == a.preset)
        .ok_or_else(|| {
            let names: Vec<&str> = presets.iter().map(|p| p.name.as_str()).collect();
            anyhow::anyhow!(
                "`{}` has no preset `{}` (presets: {})",
                a.arch,
                a.preset,
                names.join(", ")
            )
        })?;
    let cut;
    let preset = match a.layers {
        Some(n) => {
            cut = synth::depth::first_layers(preset, n).map_err(anyhow::Error::msg)?;
            &cut
        }
        None => preset,
    };
    let types = TensorTypes {
        classes: ClassTypes {
            experts: a.experts,
            attention: a.attn,
            embedding: a.embd,
            output: a.output_type,
            dense: a.dense,
        },
        experts_down: a.experts_down,
        ngram: a.ngram,
    };
    let out = a
        .output
        .clone()
        .ok_or_else(|| anyhow::anyhow!("-o FILE is required"))?;
    let started = std::time::Instant::now();
    let bar = crate::progress::on_terminal();
    let mut progress: Option<Progress> = None;
    let r = synth::write_reporting(preset, types, a.seed, &out, &mut |done, total| {
        let p = progress
            .get_or_insert_with(|| Progress::new("synth: written", total, Unit::Bytes, bar, bar));
        p.inc(done.saturating_sub(p.done()));
    })?;
    if let Some(p) = progress {
        p.finish();
    }
    println!(
        "wrote {} ({} tensors, {:.2} GB) in {:.1} s",
        out.display(),
        r.tensors,
        r.bytes as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The architecture a preset writes (its `general.architecture`), so that a plugin serving
/// several architectures can give each its own presets under the same names.
fn preset_arch(p: &bloomery_plugin_api::model::SynthPreset) -> Option<&str> {
    p.metadata
        .iter()
        .find(|e| e.key.as_str() == "general.architecture")
        .and_then(|e| e.value.as_str())
}
