//! `bloomery run`: generates text from a prompt, streaming it to stdout, with llama.cpp's flag
//! spellings and its sampler chain; timings go to stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use bloomery_plugin_api::DType;
use bloomery_text::{ChatRequest, StreamDecoder, TemplateValue, Tokenizer};
use clap::Args;

use super::Cli;
use crate::engine::executor::BatchInputs;
use crate::model::{LoadOptions, LoadedModel};
use crate::plugins::Registry;
use crate::sampling::{Sampler, SamplerParams};
use crate::tiering::plan::DEFAULT_BATCH_ROWS;

/// Options of `bloomery run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The GGUF file (the first part of a split model).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model: PathBuf,
    /// The prompt.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
    /// Tokens to generate (-1: until an end-of-generation token or the end of the context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Temperature (0 or less: greedy).
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Top-k (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    /// Locally typical sampling mass (1: off).
    #[arg(long = "typical", default_value_t = 1.0)]
    pub typical: f32,
    /// Top-p (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (0: off, -1: the context size).
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i32,
    /// Presence penalty (0: off).
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty (0: off).
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed of the sampler (default: random; the same seed gives the same output).
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    pub chat: bool,
    /// Context size in tokens (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: u32,
    /// CPU threads (0: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: u32,
    /// Layers on the GPU, llama.cpp's `-ngl`: 0 runs on the CPU; any other value runs the whole
    /// model on the best GPU kernel plugin (CPU fallback with one warning; no partial offload yet).
    #[arg(long = "n-gpu-layers", default_value_t = 0)]
    pub n_gpu_layers: u32,
    /// Where routed experts go when the model runs on a GPU (`-cmoe`, `-ncmoe`, `-ot`, budgets).
    #[command(flatten)]
    pub placement: super::placement::PlacementArgs,
}

/// The prompt as token ids, wrapped in the chat template when asked.
fn prompt_tokens(
    model: &LoadedModel,
    a: &RunArgs,
) -> anyhow::Result<(bloomery_text::Tokenizer, Vec<u32>)> {
    let tok = crate::text::tokenizer(&model.file)?;
    let text = if a.chat {
        let tmpl = crate::text::chat_template(&model.file, &tok)?;
        let messages = TemplateValue::from(&serde_json::json!([
            {"role": "user", "content": a.prompt}
        ]));
        let req = ChatRequest {
            messages,
            add_generation_prompt: true,
            kwargs: vec![(
                "enable_thinking".into(),
                TemplateValue::from(&serde_json::json!(true)),
            )],
            ..ChatRequest::default()
        };
        let rendered = tmpl.render(&req)?;
        let s = tok.special();
        tmpl.strip_added_specials(&rendered, s.add_bos, s.add_eos)
            .to_owned()
    } else {
        a.prompt.clone()
    };
    let ids = tok.encode(&text, true, true)?;
    Ok((tok, ids))
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// The context size in force: `-c`, or the model's training context for `-c 0`.
fn context_size(a: &RunArgs) -> anyhow::Result<u32> {
    if a.ctx_size != 0 {
        return Ok(a.ctx_size);
    }
    let file = bloomery_gguf::GgufModel::open(&a.model)?;
    let arch = file.metadata().get_str("general.architecture")?.to_owned();
    let key = format!("{arch}.context_length");
    u32::try_from(file.metadata().get_uint(&key)?).context("context length")
}

/// The sampler settings of the flags (a random seed when none is given).
fn sampler_params(a: &RunArgs, ctx: u32) -> SamplerParams {
    SamplerParams {
        top_k: a.top_k,
        typ_p: a.typical,
        top_p: a.top_p,
        min_p: a.min_p,
        temp: a.temp,
        penalty_last_n: usize::try_from(a.repeat_last_n).unwrap_or(ctx as usize),
        penalty_repeat: a.repeat_penalty,
        penalty_freq: a.frequency_penalty,
        penalty_present: a.presence_penalty,
        min_keep: 0,
        seed: a.seed.unwrap_or_else(|| u64::from(rand::random::<u32>())),
    }
}

/// Counts and times of one generation.
#[derive(Default)]
struct Stats {
    load_secs: f64,
    prompt_tokens: usize,
    prompt_secs: f64,
    generated: usize,
    evals: usize,
    eval_secs: f64,
    gen_secs: f64,
}

/// Samples up to `limit` tokens after the prompt whose last logits are `logits`, streaming text to
/// stdout; stops at an end-of-generation token or the end of the context.
fn generate(
    model: &mut LoadedModel,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    mut logits: Vec<f32>,
    limit: usize,
    stats: &mut Stats,
) -> anyhow::Result<()> {
    let ctx = model.options.ctx_per_slot as usize;
    let mut decoder = StreamDecoder::new(tok, false);
    let mut piece = String::with_capacity(64);
    let mut out = std::io::stdout().lock();
    let mut pos = stats.prompt_tokens;
    let mut batch = BatchInputs {
        tokens: vec![0],
        positions: vec![0],
        slots: vec![0],
        output_rows: vec![0],
        history: vec![],
    };
    let started = Instant::now();
    while stats.generated < limit {
        let id = sampler.sample(&logits);
        sampler.accept(id);
        stats.generated += 1;
        if tok.is_eog(id) {
            break;
        }
        piece.clear();
        decoder.push_to(id, &mut piece);
        out.write_all(piece.as_bytes())?;
        out.flush()?;
        if stats.generated >= limit || pos >= ctx {
            break;
        }
        batch.tokens[0] = id as i32;
        batch.positions[0] = pos as i32;
        let t = Instant::now();
        logits = model.forward(&batch)?;
        stats.eval_secs += t.elapsed().as_secs_f64();
        stats.evals += 1;
        pos += 1;
    }
    out.write_all(decoder.flush().as_bytes())?;
    writeln!(out)?;
    out.flush()?;
    stats.gen_secs = started.elapsed().as_secs_f64();
    Ok(())
}

/// Prints the timings to stderr in llama.cpp's layout.
fn print_timings(s: &Stats) {
    let per = |secs: f64, n: usize| if n > 0 { secs * 1e3 / n as f64 } else { 0.0 };
    eprintln!();
    eprintln!("load time        = {:10.2} ms", s.load_secs * 1e3);
    eprintln!(
        "prompt eval time = {:10.2} ms / {:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
        s.prompt_secs * 1e3,
        s.prompt_tokens,
        per(s.prompt_secs, s.prompt_tokens),
        rate(s.prompt_tokens, s.prompt_secs)
    );
    eprintln!(
        "       eval time = {:10.2} ms / {:5} runs   ({:8.2} ms per token, {:8.2} tokens per second)",
        s.eval_secs * 1e3,
        s.evals,
        per(s.eval_secs, s.evals),
        rate(s.evals, s.eval_secs)
    );
    eprintln!(
        "      generated  = {:10.2} ms / {:5} tokens ({:8.2} tokens per second, sampling included)",
        s.gen_secs * 1e3,
        s.generated,
        rate(s.generated, s.gen_secs)
    );
}

/// Runs the command.
pub fn run(cli: &Cli, a: &RunArgs) -> anyhow::Result<()> {
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    let ctx = context_size(a)?;
    let mut stats = Stats::default();
    let load_started = Instant::now();
    let options = LoadOptions {
        n_slots: 1,
        ctx_per_slot: ctx,
        kv_type: DType::F16,
        threads: a.threads,
        graphs: true,
        mlock: a.placement.mlock,
    };
    let mut model = LoadedModel::load_offloaded(
        &reg,
        &a.model,
        options,
        a.n_gpu_layers > 0,
        &a.placement.request()?,
    )?;
    stats.load_secs = load_started.elapsed().as_secs_f64();
    eprintln!("running on {}", model.kernel_plugin());
    let (tok, prompt) = prompt_tokens(&model, a)?;
    if prompt.is_empty() {
        bail!("the prompt gives no tokens");
    }
    if prompt.len() > ctx as usize {
        bail!(
            "the prompt has {} tokens, but the context holds {} (raise -c)",
            prompt.len(),
            ctx
        );
    }
    let params = sampler_params(a, ctx);
    eprintln!(
        "sampler: seed {}, top_k {}, typical {}, top_p {}, min_p {}, temp {}, repeat_penalty {} (last {}), presence {}, frequency {}",
        params.seed, params.top_k, params.typ_p, params.top_p, params.min_p, params.temp,
        params.penalty_repeat, params.penalty_last_n, params.penalty_present, params.penalty_freq
    );
    let mut sampler = Sampler::new(params, model.spec.hparams.n_vocab as usize);
    for &t in &prompt {
        sampler.accept(t);
    }
    let n = prompt.len();
    stats.prompt_tokens = n;
    let started = Instant::now();
    // Batches of the size the placement plan sized the card's scratch for; only the last one's
    // logits are read.
    let batch = DEFAULT_BATCH_ROWS as usize;
    let mut logits = Vec::new();
    for (i, chunk) in prompt.chunks(batch).enumerate() {
        let from = (i * batch) as i32;
        let last = from as usize + chunk.len() == n;
        logits = model.forward(&BatchInputs {
            tokens: chunk.iter().map(|&t| t as i32).collect(),
            positions: (from..from + chunk.len() as i32).collect(),
            slots: vec![0; chunk.len()],
            output_rows: if last {
                vec![chunk.len() as i32 - 1]
            } else {
                Vec::new()
            },
            history: vec![],
        })?;
    }
    stats.prompt_secs = started.elapsed().as_secs_f64();
    let limit = usize::try_from(a.n_predict).unwrap_or(usize::MAX);
    generate(&mut model, &tok, &mut sampler, logits, limit, &mut stats)?;
    print_timings(&stats);
    if let Some(d) = model.disk_stats() {
        eprintln!("{d}");
    }
    Ok(())
}
