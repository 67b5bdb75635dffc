//! `bloomery bench`: prompt-processing and generation speed as llama-bench measures them, with
//! llama-bench's flags (comma lists and ranges for the test parameters, `-r`, `--delay`,
//! `--no-warmup`, `--progress`) and outputs (`-o md|csv|json|jsonl|sql`). Every test is a
//! request to the runtime's scheduler, as `serve` and `run` make them: the tokens a test
//! generates are llama-bench's random ids, fed as forced tokens. Beyond llama-bench: `-np`
//! sequences decoded together, a grammar test, `--plot`, and draft decoding: each
//! `--spec-type` value (`none,draft-mtp`) and `--spec-synth-len` value a test of its own, the
//! table saying each test's drafting, its mean accepted drafts per verify step and its mean
//! acceptance length (one more: `--spec-synth-len`'s measure). On a file
//! with MTP layers the generation tests generate greedily instead of forcing random ids (drafts
//! need the model's own tokens), with drafting on and off alike.

mod lists;
mod model_desc;
mod plot;
mod report;
mod session;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use bloomery_devices::Registry;
use bloomery_plugin_api::kernel::DeviceClass;
use bloomery_plugin_api::DType;
use clap::Args;

use self::report::{Columns, Format, Printer, Record, RunInfo};
use self::session::{Session, Test};
use super::Cli;
use crate::flags::cache_type::{cache_name, cache_type};
use crate::flags::spec::BenchSpec;
use crate::progress::{Progress, Unit};

/// Options of `bloomery bench`. Test parameters take comma-separated values and ranges
/// (`first-last`, `first-last+step`, `first-last*factor`) and may be repeated; every
/// combination is run, as llama-bench runs them.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The GGUF file (the first part of a split model); or `-hf`/`-mu` fetch one.
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model_arg: Option<PathBuf>,
    /// The model file loaded: `-m`'s, or the one `-hf`/`-mu` fetched.
    #[arg(skip)]
    pub model: PathBuf,
    /// Where the model comes from besides `-m` (`-hf`, `-hff`, `-hft`, `--offline`, `-mu`).
    #[command(flatten)]
    pub hub: crate::flags::hub::HubArgs,
    /// Prompt tokens of the pp tests (0: none) [default: 512].
    #[arg(short = 'p', long = "n-prompt", value_name = "N")]
    pub n_prompt: Vec<String>,
    /// Generated tokens of the tg tests, one decode step each (0: none) [default: 128].
    #[arg(short = 'n', long = "n-gen", value_name = "N")]
    pub n_gen: Vec<String>,
    /// A test of a prompt then generation, timed together (`-pg 512,128`; repeatable).
    #[arg(long = "pg", value_name = "PP,TG")]
    pub pg: Vec<String>,
    /// Tokens already in the context when each test runs (filled by untimed prompts)
    /// [default: 0].
    #[arg(short = 'd', long = "n-depth", value_name = "N")]
    pub n_depth: Vec<String>,
    /// Logical batch: most prompt tokens submitted at once [default: 2048].
    #[arg(short = 'b', long = "batch-size", value_name = "N")]
    pub batch_size: Vec<String>,
    /// Physical batch: most rows in one forward pass (the smaller of -b and -ub is used)
    /// [default: 512].
    #[arg(long = "ubatch-size", value_name = "N")]
    pub ubatch_size: Vec<String>,
    /// K cache type: f32, f16, q8_0, q4_0, q4_1, iq4_nl, q5_0 or q5_1 [default: f16].
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    pub cache_type_k: Vec<String>,
    /// V cache type, independent of the K type: the same set [default: f16].
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    pub cache_type_v: Vec<String>,
    /// CPU threads (0: one per core) [default: 0].
    #[arg(short = 't', long = "threads", value_name = "N")]
    pub threads: Vec<String>,
    /// Layers on the GPU, read as `serve` reads `-ngl`: -1 (auto) or at least the model's
    /// layers put it on the best GPU kernel plugin (the CPU, with a warning, when none can run
    /// it), 0 keeps it on the CPU, a count between is refused [default: -1].
    #[arg(long = "n-gpu-layers", value_name = "N", allow_hyphen_values = true)]
    pub n_gpu_layers: Vec<String>,
    /// Keep the routed experts of the first N layers in host RAM [default: 0].
    #[arg(long = "n-cpu-moe", value_name = "N")]
    pub n_cpu_moe: Vec<String>,
    /// Flash attention: on or auto (the card's attention is always the flash form, the CPU's
    /// exact either way; off is refused) [default: auto].
    #[arg(long = "flash-attn", value_name = "on|auto")]
    pub flash_attn: Vec<String>,
    /// Sequences decoded together in the tg tests (`-np`), each in its own slot: every step
    /// evaluates one token of each, and the figure is the total tokens per second.
    #[arg(long = "parallel", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub repetitions: u32,
    /// Seconds to wait before each test (to let the machine cool).
    #[arg(long = "delay", value_name = "SECONDS", default_value_t = 0)]
    pub delay: u64,
    /// Skip the warm-up run before each test's repetitions.
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Output format on stdout.
    #[arg(short = 'o', long = "output", value_enum, default_value = "md")]
    pub output: Format,
    /// Show each test's progress on stderr (a bar on a terminal, one line per step otherwise).
    #[arg(long = "progress")]
    pub progress: bool,
    /// Also draw tok/s against depth (one line per test, from the `-d` list) and, for runs with
    /// host experts, the card's share of routed calls over the run, into this PNG.
    #[arg(long = "plot", value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Where routed experts go when the model runs on a GPU (`-cmoe`, `-ot`, budgets).
    #[command(flatten)]
    pub placement: crate::flags::placement::ExpertFlags,
    /// A grammar or JSON schema: adds the test `js<n>` (each sequence generates greedily within
    /// the grammar, up to `-n` tokens; the rate counts every generated token, and stderr gives
    /// the answer time and the fraction schemajump forced or drafted and saw accepted).
    #[command(flatten)]
    pub grammar: crate::flags::grammar::GrammarArgs,
    /// Draft decoding (`--spec-*`; on by default for a file with MTP layers). Each value of
    /// `--spec-type` and of `--spec-synth-len` (comma-separated) is a test of its own.
    #[command(flatten)]
    pub spec: crate::flags::spec::SpecArgs,
    /// Launch every op of every pass from the host instead of replaying captured device graphs
    /// (to measure what the graphs save).
    #[arg(long = "no-graphs")]
    pub no_graphs: bool,
}

/// How a model is loaded and run: tests with the same setup share one load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    /// `-ngl` as given.
    pub ngl: i64,
    /// Whether that puts the model on the card.
    pub gpu: bool,
    /// `-ncmoe`.
    pub n_cpu_moe: u32,
    /// `-b`.
    pub n_batch: u32,
    /// `-ub`.
    pub n_ubatch: u32,
    /// The K cache type.
    pub kv_type_k: DType,
    /// The V cache type.
    pub kv_type_v: DType,
    /// `-t` (0: one per core).
    pub threads: u32,
}

/// One test of the run: its setup, context and kind.
#[derive(Clone, Debug)]
struct Instance {
    setup: Setup,
    flash_attn: i64,
    spec: BenchSpec,
    depth: u32,
    test: Test,
}

/// `-fa` values as llama.cpp numbers them (-1 auto, 1 on); off is refused.
fn flash_attn(v: &str) -> anyhow::Result<i64> {
    match v {
        "on" | "enabled" | "1" | "true" => Ok(1),
        "auto" | "-1" => Ok(-1),
        "off" | "disabled" | "0" | "false" => bail!(
            "-fa {v}: not supported: the card's attention is always the flash form (the CPU's \
             is exact either way); use on or auto"
        ),
        _ => bail!("-fa {v:?}: expected on, off or auto"),
    }
}

/// A list flag's values as counts of at least `min` (`default` when not given).
fn counts(flag: &str, given: &[String], default: i64, min: i64) -> anyhow::Result<Vec<u32>> {
    lists::ints(flag, given, &[default], false, min)?
        .into_iter()
        .map(|v| u32::try_from(v).map_err(|_| anyhow::anyhow!("{flag} {v}: too large")))
        .collect()
}

/// The (K, V) cache types `-ctk` × `-ctv` ask for, each on its own.
fn cache_types(a: &BenchArgs) -> anyhow::Result<Vec<(DType, DType)>> {
    let mut out = Vec::new();
    for k in lists::words(&a.cache_type_k, "f16") {
        for v in lists::words(&a.cache_type_v, "f16") {
            out.push((cache_type("-ctk", &k)?, cache_type("-ctv", &v)?));
        }
    }
    Ok(out)
}

/// Every setup and `-fa` value, in llama-bench's order (`-ngl` outermost, `-t` innermost).
fn setups(a: &BenchArgs, n_layer: u64) -> anyhow::Result<Vec<(Setup, i64)>> {
    let ngls = lists::ints("-ngl", &a.n_gpu_layers, &[-1], true, i64::MIN)?;
    let ncmoe = counts("-ncmoe", &a.n_cpu_moe, 0, 0)?;
    let batches = counts("-b", &a.batch_size, 2048, 1)?;
    let ubatches = counts("-ub", &a.ubatch_size, 512, 1)?;
    let kv_types = cache_types(a)?;
    let fas = lists::words(&a.flash_attn, "auto")
        .iter()
        .map(|v| flash_attn(v))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = counts("-t", &a.threads, 0, 0)?;
    let (batches, ubatches, kv_types) = (&batches, &ubatches, &kv_types);
    let mut out = Vec::new();
    for &ngl in &ngls {
        let gpu = crate::flags::serve::gpu_layers(Some(&ngl.to_string()), n_layer)?;
        let product = ncmoe.iter().flat_map(|&m| {
            batches.iter().flat_map(move |&b| {
                ubatches
                    .iter()
                    .flat_map(move |&ub| kv_types.iter().map(move |&kv| (m, b, ub, kv)))
            })
        });
        for (n_cpu_moe, n_batch, n_ubatch, kv_type) in product {
            for &fa in &fas {
                for &t in &threads {
                    let setup = Setup {
                        ngl,
                        gpu,
                        n_cpu_moe,
                        n_batch,
                        n_ubatch,
                        kv_type_k: kv_type.0,
                        kv_type_v: kv_type.1,
                        threads: t,
                    };
                    out.push((setup, fa));
                }
            }
        }
    }
    Ok(out)
}

/// Every test of the run in llama-bench's order (setups outermost, then drafting, depth, and
/// the pp, tg, grammar and pg tests), checked before any runs.
fn instances(a: &BenchArgs, n_layer: u64, grammar: bool) -> anyhow::Result<Vec<Instance>> {
    let n_prompt = counts("-p", &a.n_prompt, 512, 0)?;
    let n_gen = counts("-n", &a.n_gen, 128, 0)?;
    let pg = lists::prompt_gen_pairs(&a.pg)?;
    let depths = counts("-d", &a.n_depth, 0, 0)?;
    a.spec.refuse_draft_model("bench")?;
    let specs = a.spec.bench_specs()?;
    if grammar && a.spec.synth_rates.is_some() {
        bail!("--spec-synth-rates with a grammar: as --spec-synth-len, bench the grammar test without it");
    }
    if grammar && specs.iter().any(|b| b.synth_len.is_some()) {
        bail!(
            "--spec-synth-len with a grammar: kept drafts do not advance the grammar (as \
             llama-server's), so the grammar test would not generate within it; bench the grammar \
             test without it"
        );
    }
    let mut tests = Vec::new();
    tests.extend(
        n_prompt
            .iter()
            .filter(|&&p| p > 0)
            .map(|&p| Test::Prompt(p)),
    );
    for &n in n_gen.iter().filter(|&&n| n > 0) {
        tests.push(Test::Generate(n));
        if grammar {
            tests.push(Test::Grammar(n));
        }
    }
    tests.extend(
        pg.iter()
            .filter(|&&(p, n)| p + n > 0)
            .map(|&(p, n)| Test::PromptGenerate(p, n)),
    );
    let mut out = Vec::new();
    for (setup, flash_attn) in setups(a, n_layer)? {
        for spec in &specs {
            for &depth in &depths {
                out.extend(tests.iter().map(|&test| Instance {
                    setup: setup.clone(),
                    flash_attn,
                    spec: spec.clone(),
                    depth,
                    test,
                }));
            }
        }
    }
    Ok(out)
}

/// Positions one slot needs for `test` after `depth` tokens of context (room for a prompt's
/// tokens, or for a generation's first token, its steps and the token sampled after the last).
fn positions(test: &Test, depth: u32) -> u32 {
    depth
        + match *test {
            Test::Prompt(p) => p + 1,
            Test::Generate(n) | Test::Grammar(n) => n + 2,
            Test::PromptGenerate(p, n) => p + n + 2,
        }
}

/// The CPU's model name (`/proc/cpuinfo`), llama-bench's `cpu_info`.
fn cpu_info(reg: &Registry) -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .or_else(|| {
            let k = reg.best_kernel(DeviceClass::Cpu).ok()?;
            k.probe.devices.first().map(|d| d.name.to_string())
        })
        .unwrap_or_default()
}

/// What the whole run shares: the build, the CPU and the model's names and sizes.
fn run_info(reg: &Registry, a: &BenchArgs, file: &bloomery_gguf::GgufModel) -> RunInfo {
    let tensors: Vec<(String, DType)> = file
        .tensors()
        .iter()
        .map(|t| (t.info.name.clone(), t.info.dtype))
        .collect();
    RunInfo {
        build_commit: env!("BLOOMERY_BUILD_COMMIT").into(),
        build_number: env!("BLOOMERY_BUILD_NUMBER").parse().unwrap_or(0),
        cpu_info: cpu_info(reg),
        model_filename: a.model.display().to_string(),
        model_type: model_desc::model_type(file.metadata(), &tensors),
        model_size: file.tensors().iter().map(|t| t.info.size).sum(),
        model_n_params: file.tensors().iter().map(|t| t.info.n_elements()).sum(),
    }
}

/// Writes `text` to stdout at once (results appear as each test ends).
fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Runs the command.
pub fn run(cli: &Cli, a: &BenchArgs) -> anyhow::Result<()> {
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    let file = bloomery_gguf::GgufModel::open(&a.model)?;
    let n_layer = crate::server::block_count(&file)?;
    let grammar = a.grammar.given();
    let all = instances(a, n_layer, grammar)?;
    if all.is_empty() {
        bail!("no test to run: every -p, -n and -pg value is 0");
    }
    let ctx = all
        .iter()
        .map(|i| positions(&i.test, i.depth))
        .max()
        .unwrap_or(2);
    let info = run_info(&reg, a, &file);
    drop(file);
    // The card flags as the report writes them (each session's load refuses a bad value too).
    let cards = a
        .placement
        .request(None, crate::flags::cards::Syntax::Bench)?
        .cards;
    let columns = Columns {
        gpu: reg.best_kernel(DeviceClass::Gpu).is_ok() || all.iter().any(|i| i.setup.ngl != -1),
        n_cpu_moe: !a.n_cpu_moe.is_empty(),
        threads: !a.threads.is_empty(),
        n_batch: !a.batch_size.is_empty(),
        n_ubatch: !a.ubatch_size.is_empty(),
        type_k: !a.cache_type_k.is_empty(),
        type_v: !a.cache_type_v.is_empty(),
        flash_attn: !a.flash_attn.is_empty(),
        overrides: a.placement.override_tensor.is_some(),
        spec: a.spec.spec_type.is_some()
            || a.spec.synth_len.is_some()
            || a.spec.synth_rates.is_some(),
    };
    let mut printer = Printer::new(a.output, &columns);
    emit(&printer.header())?;
    let mut progress = a.progress.then(|| {
        let steps = all.len() as u64 * u64::from(a.repetitions + u32::from(!a.no_warmup));
        let bar = crate::progress::on_terminal();
        Progress::new("bench", steps, Unit::Steps, bar, bar)
    });
    let mut plot = plot::Plot::default();
    let started = Instant::now();
    let mut session: Option<Session> = None;
    for (idx, inst) in all.iter().enumerate() {
        let tag = format!("benchmark {}/{}", idx + 1, all.len());
        // A step starts (a line says it), or one more ends (the bar moves).
        let mut step = |what: Option<String>| {
            if let Some(p) = progress.as_mut() {
                match what {
                    Some(w) => p.step(format!("{tag}: {w}")),
                    None => p.inc(1),
                }
            }
        };
        step(Some("starting".into()));
        if session.as_ref().is_none_or(|s| s.setup != inst.setup) {
            if let Some(s) = session.take() {
                s.finish()?;
            }
            session = Some(Session::start(
                &reg,
                a,
                &inst.setup,
                &inst.spec,
                ctx,
                grammar.then_some(&a.grammar),
            )?);
        }
        let Some(s) = session.as_mut() else {
            bail!("the benchmark's model is not loaded");
        };
        s.set_spec(a, &inst.spec)?;
        if !s.output_head {
            if let Some(t) = all.iter().find(|i| !matches!(i.test, Test::Prompt(_))) {
                bail!(
                    "this model has no output head (a decision model), so its {} tests cannot \
                     run: bench its prompts alone with -n 0",
                    t.test.kind()
                );
            }
        }
        if s.depth != Some(inst.depth) {
            if inst.depth > 0 {
                step(Some("depth run".into()));
            }
            s.fill_context(inst.depth)?;
        }
        if a.delay > 0 {
            std::thread::sleep(Duration::from_secs(a.delay));
        }
        if !a.no_warmup {
            step(Some("warmup run".into()));
            s.once(&inst.test)?;
            step(None);
        }
        let mut record = Record {
            cards: self::report::CardColumns::of(a.placement.split_mode.as_deref(), &cards),
            gpu_info: s.gpu_info.clone(),
            backend: s.backend.clone(),
            n_batch: inst.setup.n_batch,
            n_ubatch: inst.setup.n_ubatch,
            n_threads: s.threads,
            type_k: cache_name(inst.setup.kv_type_k).into(),
            type_v: cache_name(inst.setup.kv_type_v).into(),
            n_gpu_layers: inst.setup.ngl,
            n_cpu_moe: inst.setup.n_cpu_moe,
            flash_attn: inst.flash_attn,
            tensor_buft_overrides: a
                .placement
                .override_tensor
                .clone()
                .unwrap_or_else(|| "none".into()),
            n_depth: inst.depth,
            n_seq: a.parallel,
            test_time: report::utc_now(),
            spec: inst.spec.name(),
            ..Record::default()
        };
        (record.n_prompt, record.n_gen, record.grammar) = match inst.test {
            Test::Prompt(p) => (p, 0, false),
            Test::Generate(n) => (0, n, false),
            Test::Grammar(n) => (0, n, true),
            Test::PromptGenerate(p, n) => (p, n, false),
        };
        let before = s.spec_counts();
        for rep in 0..a.repetitions {
            step(Some(format!(
                "{} run {}/{}",
                inst.test.kind(),
                rep + 1,
                a.repetitions
            )));
            let (secs, tokens) = s.once(&inst.test)?;
            record.samples_ns.push((secs * 1e9) as u64);
            record.samples_tokens.push(tokens);
            step(None);
            if let Some((card, host)) = s.routed_calls() {
                plot.routed(started.elapsed().as_secs_f64(), card, host);
            }
        }
        let after = s.spec_counts();
        let steps = after.steps - before.steps;
        if steps > 0 {
            let accepted = after.accepted - before.accepted;
            record.accepted_per_step = Some(accepted as f64 / steps as f64);
            let per_step = accepted as f64 / steps as f64;
            let tokens: u64 = record.samples_tokens.iter().sum();
            eprintln!(
                "{} ({}): {accepted} drafts accepted in {steps} verify steps, {per_step:.3} a \
                 step, mean acceptance length {:.3}; {} pass shapes prepared in the runs; {} \
                 re-run passes after refused drafts; {:.2} MTP block passes a verify step; \
                 {:.1} KiB read back a token",
                record.test_name(),
                record.spec,
                1.0 + per_step,
                after.prepared - before.prepared,
                after.rollbacks - before.rollbacks,
                (after.mtp_passes - before.mtp_passes) as f64 / steps as f64,
                (after.read_bytes - before.read_bytes) as f64 / 1024.0 / tokens.max(1) as f64
            );
        }
        plot.rate(&record);
        emit(&printer.test(&info, &record))?;
    }
    if let Some(s) = session.take() {
        s.finish()?;
    }
    if let Some(p) = progress {
        p.finish();
    }
    emit(&printer.footer(&info))?;
    if let Some(path) = &a.plot {
        plot.draw(path, &info.model_type)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
