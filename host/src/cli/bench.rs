//! `bloomery bench`: prompt-processing and generation speed like llama-bench (random token ids, a
//! fresh sequence per repetition), printed as a markdown table of mean ± standard deviation.
//! Every test is a request to the runtime's scheduler, as `serve` and `run` make them: the tokens
//! a test generates are llama-bench's random ids, fed as forced tokens.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_runtime::request::GrammarSpec;
use bloomery_runtime::request::{Event, Finish, GenParams};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::{Runtime, RuntimeConfig};
use bloomery_tiering::plan::DEFAULT_BATCH_ROWS;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::UnboundedReceiver;

use super::Cli;

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
    /// K and V cache types (`-ctk`, `-ctv`).
    #[command(flatten)]
    pub cache: crate::flags::cache_type::CacheTypeArgs,
    /// Layers on the GPU, llama-bench's `-ngl`: 0 runs on the CPU; any other value runs the whole
    /// model on the best GPU kernel plugin (no partial offload yet).
    #[arg(long = "n-gpu-layers", default_value_t = 0)]
    pub n_gpu_layers: u32,
    /// Where routed experts go when the model runs on a GPU (`-cmoe`, `-ncmoe`, `-ot`, budgets).
    #[command(flatten)]
    pub placement: crate::flags::placement::PlacementArgs,
    /// A grammar or JSON schema: adds the test `js<n>` (each sequence generates greedily within
    /// the grammar, up to `-n` tokens; the rate counts every generated token, and stderr gives
    /// the answer time and the fraction schemajump forced or drafted and saw accepted).
    #[command(flatten)]
    pub grammar: crate::flags::grammar::GrammarArgs,
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

/// The tests' requests to the runtime: random ids, every slot's context of `depth` tokens kept
/// between tests.
struct Tests {
    runtime: Runtime,
    rng: StdRng,
    vocab: u32,
    /// Each slot's context (empty at depth 0).
    context: Vec<Vec<u32>>,
}

/// A request's settings: greedy (no test samples: every token is forced), reusing the slot's
/// context only when there is one to reuse (a fresh sequence per repetition otherwise).
fn params(reuse: bool, forced: Vec<u32>, prompt_only: bool) -> GenParams {
    GenParams {
        sampler: SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        n_predict: Some(forced.len()),
        stop: Vec::new(),
        n_probs: 0,
        ignore_eos: true,
        cache_prompt: reuse,
        forced,
        prompt_only,
        grammar: None,
        t_max_predict_ms: None,
        preserved: Vec::new(),
    }
}

/// Waits for a request's end.
fn finish(rx: &mut UnboundedReceiver<Event>) -> anyhow::Result<Finish> {
    loop {
        match rx.blocking_recv() {
            Some(Event::Done(f)) => return Ok(f),
            Some(Event::Failed(msg)) => bail!("a benchmark request failed: {msg}"),
            Some(_) => {}
            None => bail!("the scheduler stopped before a benchmark request ended"),
        }
    }
}

impl Tests {
    fn random(&mut self, n: u32) -> Vec<u32> {
        (0..n).map(|_| self.rng.gen_range(0..self.vocab)).collect()
    }

    /// Fills every slot's context with `depth` random tokens (untimed).
    fn fill_context(&mut self, depth: u32) -> anyhow::Result<()> {
        let mut requests = Vec::new();
        for slot in 0..self.context.len() {
            self.context[slot] = self.random(depth);
            requests.push((
                self.context[slot].clone(),
                params(true, Vec::new(), true),
                Some(slot),
            ));
        }
        for mut rx in self.runtime.submit_together_blocking(requests)? {
            finish(&mut rx)?;
        }
        Ok(())
    }

    /// Seconds for one batch of `n` random tokens after slot 0's context (the prompt test).
    fn pp_once(&mut self, n: u32) -> anyhow::Result<f64> {
        let mut prompt = self.context[0].clone();
        prompt.extend(self.random(n));
        let reuse = !self.context[0].is_empty();
        let mut rx =
            self.runtime
                .submit_blocking(prompt, params(reuse, Vec::new(), true), Some(0))?;
        Ok(finish(&mut rx)?.prompt_ms / 1e3)
    }

    /// Seconds for `n` steps after every slot's context, each one token of every sequence (the
    /// generation test): one random token evaluated as the prompt, then `n` passes, each
    /// evaluating the random token forced after the last.
    fn tg_once(&mut self, n: u32) -> anyhow::Result<f64> {
        let mut requests = Vec::new();
        for slot in 0..self.context.len() {
            let mut prompt = self.context[slot].clone();
            prompt.extend(self.random(1));
            let reuse = !self.context[slot].is_empty();
            let forced = self.random(n + 1);
            requests.push((prompt, params(reuse, forced, false), Some(slot)));
        }
        let mut secs: f64 = 0.0;
        for mut rx in self.runtime.submit_together_blocking(requests)? {
            let f = finish(&mut rx)?;
            if f.n_predicted != n as usize + 1 {
                bail!(
                    "a generation test ended after {} of {} tokens ({:?})",
                    f.n_predicted,
                    n + 1,
                    f.stop_type
                );
            }
            secs = secs.max(f.predicted_ms / 1e3);
        }
        Ok(secs)
    }

    /// (seconds, tokens, forced tokens, drafted tokens, accepted drafted tokens) of every
    /// sequence generating within `grammar` after its context, greedily, up to `n` tokens each
    /// (the grammar test).
    fn grammar_once(
        &mut self,
        n: u32,
        grammar: &GrammarSpec,
    ) -> anyhow::Result<(f64, u32, usize, usize, usize)> {
        let mut requests = Vec::new();
        for slot in 0..self.context.len() {
            let mut prompt = self.context[slot].clone();
            prompt.extend(self.random(1));
            let reuse = !self.context[slot].is_empty();
            let mut p = params(reuse, Vec::new(), false);
            p.n_predict = Some(n as usize);
            p.ignore_eos = false;
            p.grammar = Some(grammar.clone());
            requests.push((prompt, p, Some(slot)));
        }
        let (mut secs, mut tokens, mut forced, mut drafted, mut accepted) = (0f64, 0, 0, 0, 0);
        for mut rx in self.runtime.submit_together_blocking(requests)? {
            let f = finish(&mut rx)?;
            secs = secs.max(f.predicted_ms / 1e3);
            tokens += f.n_predicted as u32;
            forced += f.n_forced;
            drafted += f.n_drafted;
            accepted += f.n_accepted;
        }
        Ok((secs, tokens, forced, drafted, accepted))
    }
}

/// Runs the command.
pub fn run(cli: &Cli, a: &BenchArgs) -> anyhow::Result<()> {
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    // Room for the pp test's prompt and for the tg test's first token, its n steps and the
    // token sampled after the last.
    let ctx = (a.n_prompt + 1).max(a.n_gen + 2) + a.n_depth;
    let (kv_type_k, kv_type_v) = a.cache.types()?;
    let options = LoadOptions {
        n_slots: a.parallel,
        ctx_per_slot: ctx,
        kv_type_k,
        kv_type_v,
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
    let model = LoadedModel::load_offloaded(&reg, &a.model, options, a.n_gpu_layers > 0, &request)?;
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
    let vocab = model.spec.hparams.n_vocab;
    let tok = Arc::new(crate::text::tokenizer(&model.file)?);
    let grammar = a.grammar.spec(&tok)?;
    let runtime = Runtime::start(
        model,
        tok,
        RuntimeConfig {
            n_ctx_slot: ctx as usize,
            n_batch: request.batch_rows as usize,
            cache_ram: None,
            queue_depth: 1,
            max_checkpoints: bloomery_runtime::DEFAULT_MAX_CHECKPOINTS,
            checkpoint_every: bloomery_runtime::DEFAULT_CHECKPOINT_EVERY,
            schemajump: !a.grammar.no_schemajump,
        },
    )?;
    let mut tests = Tests {
        runtime,
        rng: StdRng::seed_from_u64(0),
        vocab,
        context: vec![Vec::new(); a.parallel as usize],
    };
    if a.n_depth > 0 {
        tests.fill_context(a.n_depth)?;
    }
    let depth = if a.n_depth > 0 {
        format!(" @ d{}", a.n_depth)
    } else {
        String::new()
    };
    let mut rows = Vec::new();
    let seqs = match a.parallel {
        1 => String::new(),
        n => format!(" x{n}"),
    };
    // Each test's name, token count per sequence, and tokens a run evaluates in all.
    let mut tests_run: Vec<(String, u32, u32)> = vec![
        (format!("pp{}", a.n_prompt), a.n_prompt, a.n_prompt),
        (
            format!("tg{}{seqs}", a.n_gen),
            a.n_gen,
            a.n_gen * a.parallel,
        ),
    ];
    if grammar.is_some() {
        tests_run.push((format!("js{}{seqs}", a.n_gen), a.n_gen, 0));
    }
    for (i, (name, n, tokens)) in tests_run.into_iter().enumerate() {
        if n == 0 {
            continue;
        }
        let once = |t: &mut Tests| -> anyhow::Result<(f64, u32)> {
            Ok(match (i, &grammar) {
                (0, _) => (t.pp_once(n)?, tokens),
                (1, _) | (_, None) => (t.tg_once(n)?, tokens),
                (_, Some(g)) => {
                    let (secs, made, forced, drafted, accepted) = t.grammar_once(n, g)?;
                    eprintln!(
                        "{name}: {made} tokens in {:.1} ms, {forced} forced and {accepted} of \
                         {drafted} drafted accepted ({:.1}% without a pass of their own)",
                        secs * 1e3,
                        100.0 * (forced + accepted) as f64 / f64::from(made.max(1))
                    );
                    (secs, made)
                }
            })
        };
        // One warm-up run, as llama-bench does (it also builds the graph of this batch shape).
        once(&mut tests)?;
        let mut rates = Vec::new();
        for _ in 0..a.repetitions.max(1) {
            let (secs, tokens) = once(&mut tests)?;
            rates.push(if secs > 0.0 {
                f64::from(tokens) / secs
            } else {
                0.0
            });
        }
        let (mean, std) = mean_std(&rates);
        rows.push((format!("{name}{depth}"), mean, std));
    }
    let model = tests.runtime.shutdown()?;
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
    // llama-bench's type_k and type_v columns, shown when either cache is not f16.
    let (types_head, types_rule, types) = if a.cache.non_default() {
        (
            " type_k | type_v |",
            " ---: | ---: |",
            format!(" {} | {} |", a.cache.cache_type_k, a.cache.cache_type_v),
        )
    } else {
        ("", "", String::new())
    };
    println!("| model | size | params | backend | threads |{types_head} test | t/s |");
    println!("| --- | ---: | ---: | --- | ---: |{types_rule} ---: | ---: |");
    for (test, mean, std) in rows {
        println!(
            "| {name} | {} | {} | {backend} | {threads} |{types} {test} | {mean:.2} ± {std:.2} |",
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
