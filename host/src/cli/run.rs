//! `bloomery run`: generates text from a prompt, streaming it to stdout, with llama.cpp's flag
//! spellings and its sampler chain; timings go to stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use bloomery_plugin_api::DType;
use bloomery_text::{ChatRequest, StreamDecoder, TemplateValue};
use clap::Args;

use super::Cli;
use crate::engine::executor::BatchInputs;
use crate::model::{LoadOptions, LoadedModel};
use crate::plugins::Registry;
use crate::sampling::{Sampler, SamplerParams};

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

/// Runs the command.
pub fn run(cli: &Cli, a: &RunArgs) -> anyhow::Result<()> {
    let reg = Registry::load(&cli.plugin_dir())?;
    let ctx = if a.ctx_size == 0 {
        let file = bloomery_gguf::GgufModel::open(&a.model)?;
        let arch = file.metadata().get_str("general.architecture")?.to_owned();
        let key = format!("{arch}.context_length");
        u32::try_from(file.metadata().get_uint(&key)?).context("context length")?
    } else {
        a.ctx_size
    };
    let load_started = Instant::now();
    let mut model = LoadedModel::load(
        &reg,
        &a.model,
        LoadOptions {
            n_slots: 1,
            ctx_per_slot: ctx,
            kv_type: DType::F16,
            threads: a.threads,
        },
    )?;
    let load_secs = load_started.elapsed().as_secs_f64();
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
    let n_vocab = model.spec.hparams.n_vocab as usize;
    let seed = a.seed.unwrap_or_else(|| u64::from(rand::random::<u32>()));
    let params = SamplerParams {
        top_k: a.top_k,
        typ_p: a.typical,
        top_p: a.top_p,
        min_p: a.min_p,
        temp: a.temp,
        penalty_last_n: if a.repeat_last_n < 0 {
            ctx as usize
        } else {
            a.repeat_last_n as usize
        },
        penalty_repeat: a.repeat_penalty,
        penalty_freq: a.frequency_penalty,
        penalty_present: a.presence_penalty,
        min_keep: 0,
        seed,
    };
    eprintln!(
        "sampler: seed {seed}, top_k {}, typical {}, top_p {}, min_p {}, temp {}, repeat_penalty {} (last {}), presence {}, frequency {}",
        params.top_k,
        params.typ_p, params.top_p, params.min_p, params.temp, params.penalty_repeat,
        params.penalty_last_n, params.penalty_present, params.penalty_freq
    );
    let mut sampler = Sampler::new(params, n_vocab);
    for &t in &prompt {
        sampler.accept(t);
    }

    let n = prompt.len();
    let prompt_started = Instant::now();
    let mut logits = model.forward(&BatchInputs {
        tokens: prompt.iter().map(|&t| t as i32).collect(),
        positions: (0..n as i32).collect(),
        slots: vec![0; n],
        output_rows: vec![n as i32 - 1],
        history: vec![],
    })?;
    let prompt_secs = prompt_started.elapsed().as_secs_f64();

    let limit = if a.n_predict < 0 {
        usize::MAX
    } else {
        a.n_predict as usize
    };
    let mut decoder = StreamDecoder::new(&tok, false);
    let mut out = std::io::stdout().lock();
    let mut generated = 0usize;
    let mut evals = 0usize;
    let mut eval_secs = 0f64;
    let mut pos = n;
    let gen_started = Instant::now();
    let mut batch = BatchInputs {
        tokens: vec![0],
        positions: vec![0],
        slots: vec![0],
        output_rows: vec![0],
        history: vec![],
    };
    while generated < limit {
        let id = sampler.sample(&logits);
        sampler.accept(id);
        generated += 1;
        if tok.is_eog(id) {
            break;
        }
        out.write_all(decoder.push(id).as_bytes())?;
        out.flush()?;
        if generated >= limit || pos >= ctx as usize {
            break;
        }
        batch.tokens[0] = id as i32;
        batch.positions[0] = pos as i32;
        let t = Instant::now();
        logits = model.forward(&batch)?;
        eval_secs += t.elapsed().as_secs_f64();
        evals += 1;
        pos += 1;
    }
    out.write_all(decoder.flush().as_bytes())?;
    writeln!(out)?;
    out.flush()?;
    let gen_secs = gen_started.elapsed().as_secs_f64();
    eprintln!();
    eprintln!("load time        = {:10.2} ms", load_secs * 1e3);
    eprintln!(
        "prompt eval time = {:10.2} ms / {:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
        prompt_secs * 1e3,
        n,
        prompt_secs * 1e3 / n as f64,
        rate(n, prompt_secs)
    );
    eprintln!(
        "       eval time = {:10.2} ms / {:5} runs   ({:8.2} ms per token, {:8.2} tokens per second)",
        eval_secs * 1e3,
        evals,
        if evals > 0 { eval_secs * 1e3 / evals as f64 } else { 0.0 },
        rate(evals, eval_secs)
    );
    eprintln!(
        "      generated  = {:10.2} ms / {:5} tokens ({:8.2} tokens per second, sampling included)",
        gen_secs * 1e3,
        generated,
        rate(generated, gen_secs)
    );
    Ok(())
}
