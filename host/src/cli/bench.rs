//! `bloomery bench`: prompt-processing and generation speed like llama-bench (random token ids, a
//! fresh sequence per repetition), printed as a markdown table of mean ± standard deviation.

use std::path::PathBuf;
use std::time::Instant;

use bloomery_plugin_api::DType;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::Cli;
use crate::engine::executor::BatchInputs;
use crate::model::{LoadOptions, LoadedModel};
use crate::plugins::Registry;
use crate::tiering::plan::DEFAULT_BATCH_ROWS;

/// Options of `bloomery bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The GGUF file (the first part of a split model).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model: PathBuf,
    /// Prompt tokens of the pp test, evaluated as one batch (0: skip the test).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: u32,
    /// Generated tokens of the tg test, one decode step each (0: skip the test).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: u32,
    /// Tokens already in the context when each test runs, llama-bench's `-d` (filled once by one
    /// untimed prompt; the tests then run at positions from there).
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub n_depth: u32,
    /// Sequences decoded together in the tg test (`-np`), each in its own slot: every step
    /// evaluates one token of each, and the figure is the total tokens per second.
    #[arg(long = "parallel", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: u32,
    /// CPU threads (0: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: u32,
    /// Layers on the GPU, llama-bench's `-ngl`: 0 runs on the CPU; any other value runs the whole
    /// model on the best GPU kernel plugin (no partial offload yet).
    #[arg(long = "n-gpu-layers", default_value_t = 0)]
    pub n_gpu_layers: u32,
    /// Where routed experts go when the model runs on a GPU (`-cmoe`, `-ncmoe`, `-ot`, budgets).
    #[command(flatten)]
    pub placement: super::placement::PlacementArgs,
    /// Launch every op of every pass from the host instead of replaying captured device graphs
    /// (to measure what the graphs save).
    #[arg(long = "no-graphs")]
    pub no_graphs: bool,
}

/// Mean and sample standard deviation.
fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n.max(1.0);
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// A count with llama-bench's unit (B, M or K).
fn human(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.2} B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else {
        format!("{:.2} K", x / 1e3)
    }
}

fn bytes(n: u64) -> String {
    let x = n as f64;
    if x >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", x / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", x / (1u64 << 20) as f64)
    }
}

/// Where a test runs: the context already there and the sequences decoded together.
#[derive(Clone, Copy)]
struct At {
    depth: u32,
    parallel: u32,
}

/// One timed run of a test: the model, the token count, where it runs, the RNG of the random
/// ids; seconds.
type TestFn = fn(&mut LoadedModel, u32, At, &mut StdRng) -> anyhow::Result<f64>;

/// Seconds for one batch of `n` random tokens of slot 0 from position `depth` (the prompt test).
fn pp_once(model: &mut LoadedModel, n: u32, at: At, rng: &mut StdRng) -> anyhow::Result<f64> {
    prompt(model, n, at.depth, 0, rng)
}

/// Seconds for one batch of `n` random tokens of `slot` from position `from`.
fn prompt(
    model: &mut LoadedModel,
    n: u32,
    from: u32,
    slot: i32,
    rng: &mut StdRng,
) -> anyhow::Result<f64> {
    let vocab = model.spec.hparams.n_vocab as i32;
    let d = from as i32;
    let batch = BatchInputs {
        tokens: (0..n).map(|_| rng.gen_range(0..vocab)).collect(),
        positions: (d..d + n as i32).collect(),
        slots: vec![slot; n as usize],
        output_rows: vec![n as i32 - 1],
        history: vec![],
    };
    let t = Instant::now();
    model.forward(&batch)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds for `n` steps from position `depth`, each one token of every one of the `parallel`
/// sequences (the generation test).
fn tg_once(model: &mut LoadedModel, n: u32, at: At, rng: &mut StdRng) -> anyhow::Result<f64> {
    let vocab = model.spec.hparams.n_vocab as i32;
    let np = at.parallel as usize;
    let mut batch = BatchInputs {
        tokens: (0..np).map(|_| rng.gen_range(0..vocab)).collect(),
        positions: vec![0; np],
        slots: (0..np as i32).collect(),
        output_rows: (0..np as i32).collect(),
        history: vec![],
    };
    let t = Instant::now();
    for pos in at.depth as i32..(at.depth + n) as i32 {
        batch.positions.fill(pos);
        model.forward(&batch)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Runs the command.
pub fn run(cli: &Cli, a: &BenchArgs) -> anyhow::Result<()> {
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    let ctx = a.n_prompt.max(a.n_gen).max(1) + a.n_depth;
    let options = LoadOptions {
        n_slots: a.parallel,
        ctx_per_slot: ctx,
        kv_type: DType::F16,
        threads: a.threads,
        graphs: !a.no_graphs,
        mlock: a.placement.mlock,
    };
    // The pp test is one batch of n_prompt rows, a tg step one row per sequence, and the depth
    // is filled in batches of DEFAULT_BATCH_ROWS.
    let mut request = a.placement.request()?;
    request.batch_rows = a
        .n_prompt
        .max(a.parallel)
        .max(DEFAULT_BATCH_ROWS.min(a.n_depth));
    let mut model =
        LoadedModel::load_offloaded(&reg, &a.model, options, a.n_gpu_layers > 0, &request)?;
    let backend = model.kernel_plugin().to_owned();
    let meta = model.file.metadata();
    let arch = meta.get_str("general.architecture").unwrap_or("?");
    let label = meta
        .get_str("general.size_label")
        .map(|s| format!(" {s}"))
        .unwrap_or_default();
    let name = format!("{arch}{label}");
    let size: u64 = model
        .file
        .tensors()
        .iter()
        .map(|t| t.info.range().end - t.info.range().start)
        .sum();
    let params: u64 = model
        .file
        .tensors()
        .iter()
        .map(|t| t.info.n_elements())
        .sum();
    let threads = if a.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get()) as u32
    } else {
        a.threads
    };
    let mut rng = StdRng::seed_from_u64(0);
    if a.n_depth > 0 {
        // The context the tests start from: positions 0 .. depth of every slot, which no test
        // overwrites.
        for slot in 0..a.parallel as i32 {
            for from in (0..a.n_depth).step_by(DEFAULT_BATCH_ROWS as usize) {
                let n = DEFAULT_BATCH_ROWS.min(a.n_depth - from);
                prompt(&mut model, n, from, slot, &mut rng)?;
            }
        }
    }
    let at = At {
        depth: a.n_depth,
        parallel: a.parallel,
    };
    let depth = if a.n_depth > 0 {
        format!(" @ d{}", a.n_depth)
    } else {
        String::new()
    };
    let mut rows = Vec::new();
    // Each test's name, token count per sequence, run, and tokens a run evaluates in all.
    let seqs = match a.parallel {
        1 => String::new(),
        n => format!(" x{n}"),
    };
    let tests: [(String, u32, TestFn, u32); 2] = [
        (format!("pp{}", a.n_prompt), a.n_prompt, pp_once, a.n_prompt),
        (
            format!("tg{}{seqs}", a.n_gen),
            a.n_gen,
            tg_once,
            a.n_gen * a.parallel,
        ),
    ];
    for (name, n, once, tokens) in tests {
        if n == 0 {
            continue;
        }
        // One warm-up run, as llama-bench does (it also builds the graph of this batch shape).
        once(&mut model, n, at, &mut rng)?;
        let mut rates = Vec::new();
        for _ in 0..a.repetitions.max(1) {
            let secs = once(&mut model, n, at, &mut rng)?;
            rates.push(if secs > 0.0 {
                f64::from(tokens) / secs
            } else {
                0.0
            });
        }
        let (mean, std) = mean_std(&rates);
        rows.push((format!("{name}{depth}"), mean, std));
    }
    if let Some(s) = model.residency_stats() {
        let all = (s.card + s.host).max(1) as f64;
        eprintln!(
            "routed calls of layers with host experts: {:.1}% on the card ({} of {}), {:.1}% read \
             by the card over the bus{}, {} experts moved onto the card",
            100.0 * s.card as f64 / all,
            s.card,
            s.card + s.host,
            100.0 * s.bus as f64 / all,
            s.bus_kept
                .map(|n| format!(" (the card takes {n} of a row's host experts, chosen by timing)"))
                .unwrap_or_default(),
            s.flips
        );
    }
    if let Some(d) = model.disk_stats() {
        eprintln!("{d}");
    }
    println!("| model | size | params | backend | threads | test | t/s |");
    println!("| --- | ---: | ---: | --- | ---: | ---: | ---: |");
    for (test, mean, std) in rows {
        println!(
            "| {name} | {} | {} | {backend} | {threads} | {test} | {mean:.2} ± {std:.2} |",
            bytes(size),
            human(params)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_deviation() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((s - 1.0).abs() < 1e-12);
        assert_eq!(mean_std(&[4.0]), (4.0, 0.0));
    }
}
