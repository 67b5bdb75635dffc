//! `bloomery run`: generates text from a prompt through the runtime's scheduler (as `serve`
//! does), streaming it to stdout, with llama.cpp's flag spellings and its sampler chain; timings
//! go to stderr.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_runtime::request::{Event, Finish, GenParams};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::{Runtime, RuntimeConfig};
use bloomery_text::{ChatRequest, TemplateValue};
use bloomery_tiering::plan::DEFAULT_BATCH_ROWS;
use clap::Args;

use super::Cli;
use crate::server::template;

/// Options of `bloomery run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The GGUF file (the first part of a split model); or `-hf`/`-mu` fetch one.
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model_arg: Option<PathBuf>,
    /// The model file loaded: `-m`'s, or the one `-hf`/`-mu` fetched.
    #[arg(skip)]
    pub model: PathBuf,
    /// Where the model comes from besides `-m` (`-hf`, `-hff`, `-hft`, `--offline`, `-mu`).
    #[command(flatten)]
    pub hub: crate::flags::hub::HubArgs,
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
    /// Wrap the prompt in the chat template as one user message.
    #[arg(long)]
    pub chat: bool,
    /// `--chat`'s template: Jinja source, `chatml`, or with `--no-jinja` one of llama.cpp's
    /// built-in names (default: the model's own).
    #[arg(long = "chat-template")]
    pub chat_template: Option<String>,
    /// `--chat`'s template read from a file.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
    /// Jinja templates (the default).
    #[arg(long = "jinja", overrides_with = "no_jinja")]
    pub jinja: bool,
    /// llama.cpp's built-in templates instead of Jinja, picked by `--chat-template NAME` or
    /// detected from the template's text (llama-cli's `--no-jinja`).
    #[arg(long = "no-jinja", overrides_with = "jinja")]
    pub no_jinja: bool,
    /// Context size in tokens (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: u32,
    /// CPU threads (0: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: u32,
    /// K and V cache types (`-ctk`, `-ctv`).
    #[command(flatten)]
    pub cache: crate::flags::cache_type::CacheTypeArgs,
    /// Layers on the GPU, llama.cpp's `-ngl`: 0 runs on the CPU; any other value runs the whole
    /// model on the best GPU kernel plugin (CPU fallback with one warning; no partial offload yet).
    #[arg(long = "n-gpu-layers", default_value_t = 0)]
    pub n_gpu_layers: u32,
    /// Where routed experts go when the model runs on a GPU (`-cmoe`, `-ncmoe`, `-ot`, budgets).
    #[command(flatten)]
    pub placement: crate::flags::placement::PlacementArgs,
    /// The sampler stages beyond the basic ones, and their order.
    #[command(flatten)]
    pub sampling: crate::flags::sampling::SamplingArgs,
    /// Escape sequences in the prompt and the DRY breakers (`-e`, `--no-escape`).
    #[command(flatten)]
    pub escapes: crate::flags::escapes::EscapeArgs,
    /// A grammar or JSON schema the output follows.
    #[command(flatten)]
    pub grammar: crate::flags::grammar::GrammarArgs,
    /// Draft decoding (`--spec-*`).
    #[command(flatten)]
    pub spec: crate::flags::spec::SpecArgs,
    /// Metadata overrides (`--override-kv`, the rope flags).
    #[command(flatten)]
    pub metadata: crate::flags::metadata::MetadataArgs,
}

/// The prompt as token ids, wrapped in the chat template when asked.
fn prompt_tokens(
    model: &LoadedModel,
    a: &RunArgs,
) -> anyhow::Result<(bloomery_text::Tokenizer, Vec<u32>)> {
    let tok = crate::text::tokenizer(&model.file)?;
    let text = if a.chat {
        chat_prompt(model, &tok, a)?
    } else {
        a.escapes.apply(&a.prompt)
    };
    let ids = tok.encode(&text, true, true)?;
    Ok((tok, ids))
}

/// `--chat`: the prompt as one user message in the chosen template.
fn chat_prompt(
    model: &LoadedModel,
    tok: &bloomery_text::Tokenizer,
    a: &RunArgs,
) -> anyhow::Result<String> {
    let meta = model.file.metadata();
    let text_of = |id: Option<u32>| {
        id.and_then(|i| tok.token_text(i))
            .unwrap_or_default()
            .to_owned()
    };
    let flags = template::Flags {
        text: a.chat_template.as_deref(),
        file: a.chat_template_file.as_deref(),
        jinja: !a.no_jinja,
    };
    let choice = template::choose(
        flags,
        meta.get_str("tokenizer.chat_template").ok(),
        &text_of(tok.bos()),
        &text_of(tok.eos()),
    )?;
    let prompt = a.escapes.apply(&a.prompt);
    if let Some(b) = choice.builtin {
        return Ok(b.render(&[("user", prompt.as_str())], true));
    }
    let req = ChatRequest {
        messages: TemplateValue::from(&serde_json::json!([
            {"role": "user", "content": prompt}
        ])),
        add_generation_prompt: true,
        kwargs: vec![(
            "enable_thinking".into(),
            TemplateValue::from(&serde_json::json!(true)),
        )],
        ..ChatRequest::default()
    };
    let rendered = choice.template.render(&req)?;
    let s = tok.special();
    Ok(choice
        .template
        .strip_added_specials(&rendered, s.add_bos, s.add_eos)
        .to_owned())
}

/// The context size in force: `-c`, or the model's training context for `-c 0`.
fn context_size(a: &RunArgs, file: &bloomery_gguf::GgufModel) -> anyhow::Result<u32> {
    if a.ctx_size != 0 {
        return Ok(a.ctx_size);
    }
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
        seed: a.seed.unwrap_or_else(|| u64::from(rand::random::<u32>())),
        ..SamplerParams::default()
    }
}

/// Prints the timings to stderr in llama.cpp's layout.
fn print_timings(load_secs: f64, f: &Finish) {
    let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    // The first token comes from the prompt's pass; each later one from a run of its own.
    let runs = f.n_predicted.saturating_sub(1);
    eprintln!();
    eprintln!("load time        = {:10.2} ms", load_secs * 1e3);
    eprintln!(
        "prompt eval time = {:10.2} ms / {:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
        f.prompt_ms,
        f.n_prompt,
        per(f.prompt_ms, f.n_prompt),
        rate(f.n_prompt, f.prompt_ms)
    );
    eprintln!(
        "       eval time = {:10.2} ms / {:5} runs   ({:8.2} ms per token, {:8.2} tokens per second)",
        f.predicted_ms,
        runs,
        per(f.predicted_ms, runs),
        rate(runs, f.predicted_ms)
    );
    let all = f.prompt_ms + f.predicted_ms;
    eprintln!(
        "      generated  = {:10.2} ms / {:5} tokens ({:8.2} tokens per second, prompt included)",
        all,
        f.n_predicted,
        rate(f.n_predicted, all)
    );
}

/// Runs the command.
pub fn run(cli: &Cli, a: &RunArgs) -> anyhow::Result<()> {
    let template_flags = a.chat_template.is_some() || a.chat_template_file.is_some() || a.no_jinja;
    if template_flags && !a.chat {
        bail!("--chat-template, --chat-template-file and --no-jinja apply to --chat (add it)");
    }
    let reg = Registry::load_all(&cli.plugin_dirs())?;
    let (file, overrides) = a.metadata.open(&a.model)?;
    let ctx = context_size(a, &file)?;
    drop(file);
    let load_started = Instant::now();
    let (kv_type_k, kv_type_v) = a.cache.types()?;
    let options = LoadOptions {
        n_slots: 1,
        ctx_per_slot: ctx,
        kv_type_k,
        kv_type_v,
        threads: a.threads,
        graphs: true,
        mlock: a.placement.experts.mlock,
        overrides,
        check_tensors: a.placement.experts.check_tensors,
        draft_n_max: a.spec.planned_n_max()?,
        draft_history: a.spec.planned_history()?,
    };
    let model = LoadedModel::load_offloaded(
        &reg,
        &a.model,
        options,
        a.n_gpu_layers > 0,
        &a.placement.request()?,
    )?;
    let load_secs = load_started.elapsed().as_secs_f64();
    eprintln!("running on {}", model.kernel_plugin());
    let (tok, prompt) = prompt_tokens(&model, a)?;
    let grammar = a.grammar.spec(&tok)?;
    if prompt.is_empty() {
        bail!("the prompt gives no tokens");
    }
    if prompt.len() >= ctx as usize {
        bail!(
            "the prompt has {} tokens, but the context holds {} (raise -c)",
            prompt.len(),
            ctx
        );
    }
    let mut params = sampler_params(a, ctx);
    let n_vocab = model.spec.hparams.n_vocab as usize;
    a.sampling.apply(&mut params, &tok, n_vocab, &a.escapes)?;
    eprintln!(
        "sampler: seed {}, top_k {}, typical {}, top_p {}, min_p {}, temp {}, repeat_penalty {} (last {}), presence {}, frequency {}",
        params.seed, params.top_k, params.typ_p, params.top_p, params.min_p, params.temp,
        params.penalty_repeat, params.penalty_last_n, params.penalty_present, params.penalty_freq
    );
    a.spec.refuse_draft_model("run")?;
    let spec = a
        .spec
        .config(model.spec.caps.n_mtp_layers, &model.spec.architecture)?;
    let runtime = Runtime::start(
        model,
        Arc::new(tok),
        RuntimeConfig {
            n_ctx_slot: ctx as usize,
            // Prompts go in batches of the size the placement plan sized the card's scratch for.
            n_batch: DEFAULT_BATCH_ROWS as usize,
            cache_ram: None,
            queue_depth: 1,
            max_checkpoints: bloomery_runtime::DEFAULT_MAX_CHECKPOINTS,
            checkpoint_every: bloomery_runtime::DEFAULT_CHECKPOINT_EVERY,
            schemajump: !a.grammar.no_schemajump,
            context_shift: false,
            spec,
            slot_similarity: bloomery_runtime::DEFAULT_SLOT_SIMILARITY,
        },
    )?;
    let gen = GenParams {
        sampler: params,
        n_predict: usize::try_from(a.n_predict).ok(),
        stop: Vec::new(),
        n_probs: 0,
        post_sampling_probs: false,
        return_progress: false,
        ignore_eos: false,
        cache_prompt: false,
        forced: Vec::new(),
        prompt_only: a.n_predict == 0,
        grammar,
        t_max_predict_ms: None,
        preserved: Vec::new(),
        special: false,
        shift: bloomery_runtime::request::ShiftParams::default(),
        reasoning_budget: None,
    };
    let mut events = runtime.submit_blocking(prompt, gen, Some(0))?;
    let mut out = std::io::stdout().lock();
    let finish = loop {
        match events.blocking_recv() {
            Some(Event::Token(piece)) => {
                out.write_all(piece.text.as_bytes())?;
                out.flush()?;
            }
            Some(Event::Started { .. } | Event::PromptProgress(_)) => {}
            Some(Event::Done(f)) => break f,
            Some(Event::Failed(msg)) => bail!("{msg}"),
            Some(Event::Embedded(_) | Event::Decided(_)) => {
                bail!("the scheduler answered a generation with an embedding or a decision")
            }
            None => bail!("the scheduler stopped before the request ended"),
        }
    };
    writeln!(out)?;
    out.flush()?;
    let model = runtime.shutdown()?;
    print_timings(load_secs, &finish);
    if let Some(d) = model.disk_stats() {
        eprintln!("{d}");
    }
    Ok(())
}
