//! `bloomery serve` flags, spelled as llama-server spells them, each with its `LLAMA_ARG_*`
//! environment twin (the flag wins). Flags llama-server knows that bloomery does not implement
//! yet are parsed, then refused by name at start: never silently ignored.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

/// Options of `bloomery serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// The GGUF file (the first part of a split model).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FNAME",
        env = "LLAMA_ARG_MODEL"
    )]
    pub model: PathBuf,
    /// Context size in tokens, shared by the slots (0: the model's training context).
    #[arg(
        short = 'c',
        long = "ctx-size",
        default_value_t = 4096,
        env = "LLAMA_ARG_CTX_SIZE"
    )]
    pub ctx_size: u32,
    /// Slots: requests served at once, each with ctx-size / parallel positions.
    #[arg(
        long = "parallel",
        default_value_t = 1,
        env = "LLAMA_ARG_N_PARALLEL",
        allow_negative_numbers = true
    )]
    pub parallel: i32,
    /// Address to listen on.
    #[arg(long = "host", default_value = "127.0.0.1", env = "LLAMA_ARG_HOST")]
    pub host: String,
    /// Port to listen on.
    #[arg(long = "port", default_value_t = 8080, env = "LLAMA_ARG_PORT")]
    pub port: u16,
    /// API keys (comma-separated); requests must carry one as `Authorization: Bearer` or
    /// `X-Api-Key`. /health and /v1/models stay public.
    #[arg(long = "api-key", env = "LLAMA_API_KEY")]
    pub api_key: Option<String>,
    /// Name the model is listed and answered under (default: the file path).
    #[arg(short = 'a', long = "alias", env = "LLAMA_ARG_ALIAS")]
    pub alias: Option<String>,
    /// Default number of tokens to generate (-1: until end of generation or context).
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_N_PREDICT")]
    pub n_predict: i64,
    /// Default temperature.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Default top-k (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    /// Default top-p (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Default min-p (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Default seed (-1: a random one per request).
    #[arg(short = 's', long = "seed", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_SEED")]
    pub seed: i64,
    /// CPU threads (0 or -1: one per core).
    #[arg(short = 't', long = "threads", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_THREADS")]
    pub threads: i32,
    /// Most tokens in one forward pass (logical batch).
    #[arg(
        short = 'b',
        long = "batch-size",
        default_value_t = 2048,
        env = "LLAMA_ARG_BATCH"
    )]
    pub batch_size: u32,
    /// Most tokens in one forward pass (physical batch; the smaller of the two is used).
    #[arg(long = "ubatch-size", default_value_t = bloomery_tiering::plan::DEFAULT_BATCH_ROWS, env = "LLAMA_ARG_UBATCH")]
    pub ubatch_size: u32,
    /// Flash attention: on, off or auto (the CPU kernels' attention is exact either way).
    #[arg(long = "flash-attn", default_value = "auto", num_args = 0..=1, default_missing_value = "on", env = "LLAMA_ARG_FLASH_ATTN")]
    pub flash_attn: String,
    /// K cache type: f32 or f16.
    #[arg(
        long = "cache-type-k",
        default_value = "f16",
        env = "LLAMA_ARG_CACHE_TYPE_K"
    )]
    pub cache_type_k: String,
    /// V cache type: f32 or f16 (must equal the K type).
    #[arg(
        long = "cache-type-v",
        default_value = "f16",
        env = "LLAMA_ARG_CACHE_TYPE_V"
    )]
    pub cache_type_v: String,
    /// Layers on the GPU: 0 runs on the CPU; anything else runs the whole model on the best GPU
    /// kernel plugin (no partial offload yet), or on the CPU with a warning when none can.
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "gpu-layers",
        env = "LLAMA_ARG_N_GPU_LAYERS"
    )]
    pub n_gpu_layers: Option<String>,
    /// Where routed experts go (`-cmoe`, `-ncmoe`, `-ot`, budgets).
    #[command(flatten)]
    pub placement: crate::flags::placement::PlacementArgs,
    /// Host RAM for saved prompt states in MiB (0: off, -1: no limit).
    #[arg(
        long = "cache-ram",
        default_value_t = 8192,
        allow_negative_numbers = true,
        env = "LLAMA_ARG_CACHE_RAM"
    )]
    pub cache_ram: i64,
    /// Folder for `/slots/:id?action=save|restore` files.
    #[arg(long = "slot-save-path", env = "LLAMA_ARG_SLOT_SAVE_PATH")]
    pub slot_save_path: Option<PathBuf>,
    /// Sample every token, even where a request's grammar admits one alone (schemajump, on by
    /// default, takes such runs without sampling and evaluates them as one chunk).
    #[arg(long = "no-schemajump")]
    pub no_schemajump: bool,
    /// Serve Prometheus metrics at /metrics.
    #[arg(long = "metrics", env = "LLAMA_ARG_ENDPOINT_METRICS")]
    pub metrics: bool,
    /// Serve /slots (the default).
    #[arg(long = "slots", overrides_with = "no_slots")]
    pub slots: bool,
    /// Do not serve /slots.
    #[arg(long = "no-slots", env = "LLAMA_ARG_NO_ENDPOINT_SLOTS")]
    pub no_slots: bool,
    /// Use the Jinja chat template (always on: the flag is accepted for compatibility).
    #[arg(long = "jinja", overrides_with = "no_jinja")]
    pub jinja: bool,
    /// Do not use Jinja features beyond the template itself: tool calls are refused.
    #[arg(long = "no-jinja")]
    pub no_jinja: bool,
    /// Chat template: Jinja source or a built-in name (`chatml`).
    #[arg(long = "chat-template", env = "LLAMA_ARG_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
    /// Chat template read from a file.
    #[arg(long = "chat-template-file", env = "LLAMA_ARG_CHAT_TEMPLATE_FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// Where thinking goes: `auto`/`deepseek` put `<think>` spans into `reasoning_content`,
    /// `deepseek-legacy` also keeps them in `content`, `none` leaves them in `content`.
    #[arg(
        long = "reasoning-format",
        default_value = "auto",
        env = "LLAMA_ARG_THINK"
    )]
    pub reasoning_format: String,
    /// Thinking budget: -1 unrestricted, 0 thinking off (other budgets are refused).
    #[arg(long = "reasoning-budget", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_THINK_BUDGET")]
    pub reasoning_budget: i64,
    /// Read the model into memory instead of mapping it (not implemented yet: refused).
    #[arg(long = "no-mmap", env = "LLAMA_ARG_NO_MMAP")]
    pub no_mmap: bool,
    /// Requests that may wait for a slot; more are answered 503 with Retry-After.
    #[arg(long = "queue-depth", default_value_t = 64)]
    pub queue_depth: usize,
}

/// How `<think>` spans are returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Left in `content`.
    None,
    /// Moved to `reasoning_content`.
    Split,
    /// Copied to `reasoning_content` and kept in `content`.
    Legacy,
}

impl ServeArgs {
    /// The most rows a prompt pass evaluates: the smaller of `-b` and `-ub`, at least one.
    pub fn n_batch(&self) -> u32 {
        crate::flags::placement::pass_rows(self.batch_size, self.ubatch_size)
    }

    /// Slots in force.
    pub fn n_slots(&self) -> u32 {
        // -1 is llama-server's "auto": four slots.
        if self.parallel == -1 {
            4
        } else {
            self.parallel.max(1) as u32
        }
    }

    /// The prompt cache's budget in bytes (`None`: off).
    pub fn cache_ram_bytes(&self) -> Option<u64> {
        match self.cache_ram {
            0 => None,
            -1 => Some(u64::MAX),
            mib => Some((mib as u64).saturating_mul(1 << 20)),
        }
    }

    /// The reasoning format in force.
    pub fn reasoning(&self) -> anyhow::Result<ReasoningFormat> {
        parse_reasoning(&self.reasoning_format)
    }

    /// Refuses, by name, every flag that is known but not implemented and every value out of
    /// range.
    pub fn validate(&self) -> anyhow::Result<()> {
        let not_yet = |flag: &str, what: &str| -> anyhow::Result<()> {
            bail!("{flag} is not implemented yet ({what}); leave it out")
        };
        self.placement.request()?;
        if self.cache_ram < -1 {
            bail!(
                "-cram/--cache-ram {}: expected MiB, 0 (off) or -1 (no limit)",
                self.cache_ram
            );
        }
        if self.no_mmap {
            not_yet("--no-mmap", "the model is always mapped")?;
        }
        if self.parallel == 0 || self.parallel < -1 {
            bail!(
                "-np/--parallel {} must be a positive number of slots",
                self.parallel
            );
        }
        if !["on", "off", "auto", "1", "0", "true", "false"].contains(&self.flash_attn.as_str()) {
            bail!(
                "-fa/--flash-attn {:?}: expected on, off or auto",
                self.flash_attn
            );
        }
        if self.cache_type_k != self.cache_type_v {
            bail!(
                "-ctk {} and -ctv {} differ: the CPU cache holds K and V in one type",
                self.cache_type_k,
                self.cache_type_v
            );
        }
        if !["f16", "f32"].contains(&self.cache_type_k.as_str()) {
            bail!(
                "-ctk/-ctv {}: only f16 and f32 caches are implemented yet",
                self.cache_type_k
            );
        }
        if self.reasoning_budget != -1 && self.reasoning_budget != 0 {
            bail!(
                "--reasoning-budget {}: only -1 (unrestricted) and 0 (thinking off) are implemented",
                self.reasoning_budget
            );
        }
        if self.chat_template.is_some() && self.chat_template_file.is_some() {
            bail!("give --chat-template or --chat-template-file, not both");
        }
        if self.queue_depth == 0 {
            bail!("--queue-depth must be at least 1");
        }
        self.reasoning()?;
        Ok(())
    }
}

/// Parses a `--reasoning-format` value.
pub fn parse_reasoning(v: &str) -> anyhow::Result<ReasoningFormat> {
    Ok(match v {
        "none" => ReasoningFormat::None,
        "auto" | "deepseek" => ReasoningFormat::Split,
        "deepseek-legacy" => ReasoningFormat::Legacy,
        other => {
            bail!("--reasoning-format {other:?}: expected none, auto, deepseek or deepseek-legacy")
        }
    })
}
