//! `bloomery serve` flags, spelled as llama-server spells them, each with its `LLAMA_ARG_*`
//! environment twin (the flag wins). Flags llama-server knows that bloomery does not implement
//! yet are parsed, then refused by name at start: never silently ignored.

use std::path::PathBuf;

use anyhow::bail;
use bloomery_exec::decision::placement::HeadDevice;
use clap::Args;

/// Options of `bloomery serve`, declared section by section as `--help` lists them
/// (`cli/help.rs`: common, sampling, server, placement).
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Print help (`-h`, `--help`, `--usage`).
    #[arg(short = 'h', long = "help", visible_alias = "usage", action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// The GGUF file (the first part of a split model); or `-hf`/`-mu` fetch one.
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FNAME",
        env = "LLAMA_ARG_MODEL"
    )]
    pub model_arg: Option<PathBuf>,
    /// The model file loaded: `-m`'s, or the one `-hf`/`-mu` fetched
    /// ([`HubArgs::model_file`](crate::flags::hub::HubArgs::model_file) sets it).
    #[arg(skip)]
    pub model: PathBuf,
    /// Where the model comes from besides `-m` (`-hf`, `-hff`, `-hft`, `--offline`, `-mu`).
    #[command(flatten)]
    pub hub: crate::flags::hub::HubArgs,
    /// Context size in tokens, shared by the slots (0, the default: the model's training
    /// context).
    #[arg(
        short = 'c',
        long = "ctx-size",
        default_value_t = 0,
        env = "LLAMA_ARG_CTX_SIZE"
    )]
    pub ctx_size: u32,
    /// Default number of tokens to generate (-1: until end of generation or context).
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_N_PREDICT")]
    pub n_predict: i64,
    /// Default temperature.
    #[arg(
        long = "temp",
        visible_alias = "temperature",
        default_value_t = 0.8,
        allow_negative_numbers = true,
        env = "LLAMA_ARG_TEMPERATURE"
    )]
    pub temp: f32,
    /// Default top-k (0: off).
    #[arg(long = "top-k", default_value_t = 40, env = "LLAMA_ARG_TOP_K")]
    pub top_k: i32,
    /// Default top-p (1: off).
    #[arg(long = "top-p", default_value_t = 0.95, env = "LLAMA_ARG_TOP_P")]
    pub top_p: f32,
    /// Default min-p (0: off).
    #[arg(long = "min-p", default_value_t = 0.05, env = "LLAMA_ARG_MIN_P")]
    pub min_p: f32,
    /// Default locally typical sampling mass (1: off).
    #[arg(long = "typical", visible_alias = "typical-p", default_value_t = 1.0)]
    pub typical: f32,
    /// Default tokens the penalties look back over (0: off, -1: the context size).
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i32,
    /// Default repetition penalty (1: off).
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        env = "LLAMA_ARG_REPEAT_PENALTY"
    )]
    pub repeat_penalty: f32,
    /// Default presence penalty (0: off).
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        env = "LLAMA_ARG_PRESENCE_PENALTY"
    )]
    pub presence_penalty: f32,
    /// Default frequency penalty (0: off).
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        env = "LLAMA_ARG_FREQUENCY_PENALTY"
    )]
    pub frequency_penalty: f32,
    /// Keep generating past end-of-generation tokens unless a request says otherwise.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Special tokens' text in the output, as llama-server's `-sp` (default: only a chat
    /// format's tool-call tags).
    #[arg(long = "special")]
    pub special: bool,
    /// Slots: requests served at once, each with ctx-size / parallel positions (-1, llama-server's
    /// auto, is refused: see [`NP_AUTO`]).
    #[arg(
        long = "parallel",
        default_value_t = 1,
        env = "LLAMA_ARG_N_PARALLEL",
        allow_negative_numbers = true
    )]
    pub parallel: i32,
    /// Addresses to listen on, comma-separated (with several, `::` binds IPv6 alone).
    #[arg(long = "host", default_value = "127.0.0.1", env = "LLAMA_ARG_HOST")]
    pub host: String,
    /// Port to listen on.
    #[arg(long = "port", default_value_t = 8080, env = "LLAMA_ARG_PORT")]
    pub port: u16,
    /// API keys (comma-separated); requests must carry one as `Authorization: Bearer` or
    /// `X-Api-Key`. /health and /v1/models stay public.
    #[arg(long = "api-key", env = "LLAMA_API_KEY")]
    pub api_key: Option<String>,
    /// Names the model is listed under, comma-separated; the first in sorted order is the id it
    /// is answered under (default: the file's name), as llama-server's `-a`.
    #[arg(short = 'a', long = "alias", env = "LLAMA_ARG_ALIAS")]
    pub alias: Option<String>,
    /// Tags listed with the model in `/v1/models`, comma-separated (informational).
    #[arg(long = "tags", env = "LLAMA_ARG_TAGS")]
    pub tags: Option<String>,
    /// Reuse a slot's cached prefix unless a request says otherwise (the default).
    #[arg(long = "cache-prompt", overrides_with = "no_cache_prompt", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_CACHE_PROMPT")]
    pub cache_prompt: bool,
    /// Do not reuse cached prefixes unless a request asks to.
    #[arg(long = "no-cache-prompt", overrides_with = "cache_prompt")]
    pub no_cache_prompt: bool,
    /// A chat ending with an assistant message continues that message instead of answering it
    /// (the default, as llama-server's assistant prefill).
    #[arg(long = "prefill-assistant", overrides_with = "no_prefill_assistant", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_PREFILL_ASSISTANT")]
    pub prefill_assistant: bool,
    /// Render a final assistant message as a whole turn and answer after it.
    #[arg(long = "no-prefill-assistant", overrides_with = "prefill_assistant")]
    pub no_prefill_assistant: bool,
    /// When generation reaches a slot's context, drop half of what follows the kept tokens
    /// (`--keep`, a request's `n_keep`/`n_discard`) and go on, as llama-server does (off by
    /// default; refused at start for models whose cache cannot move positions).
    #[arg(long = "context-shift", overrides_with = "no_context_shift", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_CONTEXT_SHIFT")]
    pub context_shift: bool,
    /// Stop generating at the context's end (the default).
    #[arg(long = "no-context-shift", overrides_with = "context_shift")]
    pub no_context_shift: bool,
    /// Prompt tokens a context shift keeps by default (-1: the whole prompt); a request's
    /// `n_keep` overrides it.
    #[arg(long = "keep", default_value_t = 0, allow_negative_numbers = true)]
    pub keep: i32,
    /// Reuse cached runs of at least N tokens that moved within a new prompt by moving them in
    /// the cache (0: off; a request's `n_cache_reuse` overrides it; refused at start for
    /// models whose cache cannot move positions).
    #[arg(
        long = "cache-reuse",
        default_value_t = 0,
        env = "LLAMA_ARG_CACHE_REUSE"
    )]
    pub cache_reuse: u32,
    /// Most checkpoints of recurrent state a slot keeps (hybrid models; 0: none).
    #[arg(
        long = "ctx-checkpoints",
        visible_alias = "swa-checkpoints",
        default_value_t = 32,
        env = "LLAMA_ARG_CTX_CHECKPOINTS"
    )]
    pub ctx_checkpoints: u32,
    /// Prompt positions between checkpoints of recurrent state (one is also taken at the end of
    /// every prompt).
    #[arg(
        long = "checkpoint-min-step",
        default_value_t = 8192,
        env = "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"
    )]
    pub checkpoint_min_step: u32,
    /// Deprecated in llama-server and without effect there; accepted with the same warning.
    #[arg(
        long = "defrag-thold",
        allow_negative_numbers = true,
        env = "LLAMA_ARG_DEFRAG_THOLD"
    )]
    pub defrag_thold: Option<f32>,
    /// How the model is loaded: `auto` or `mmap` (mapped), `mmap+mlock` (mapped and locked in
    /// RAM, as `--mlock`); `none`, `mlock` and `dio` are refused (the model is always mapped).
    #[arg(
        long = "load-mode",
        default_value = "auto",
        env = "LLAMA_ARG_LOAD_MODE"
    )]
    pub load_mode: String,
    /// The path the API and the page are served under (`/api`: `/api/health`), without the
    /// trailing slash; empty: the root.
    #[arg(long = "api-prefix", default_value = "", env = "LLAMA_ARG_API_PREFIX")]
    pub api_prefix: String,
    /// Seconds a stream may stay silent before a keep-alive comment (`:`) goes out; 0 or -1:
    /// none. A request's `sse_ping_interval` overrides it.
    #[arg(
        long = "sse-ping-interval",
        default_value_t = 30,
        allow_negative_numbers = true,
        env = "LLAMA_ARG_SSE_PING_INTERVAL"
    )]
    pub sse_ping_interval: i64,
    /// Template variables every chat renders with (a JSON object); a request's
    /// `chat_template_kwargs` override them one by one.
    #[arg(long = "chat-template-kwargs", env = "LLAMA_ARG_CHAT_TEMPLATE_KWARGS")]
    pub chat_template_kwargs: Option<String>,
    /// How much of a request's prompt a free slot's cache must share (a fraction) for the
    /// request to go there rather than to the least recently used free slot; 0: always the
    /// least recently used.
    #[arg(long = "slot-prompt-similarity", value_name = "SIMILARITY", default_value_t = bloomery_runtime::DEFAULT_SLOT_SIMILARITY)]
    pub slot_prompt_similarity: f32,
    /// Seconds without a task after which the server frees the model (weights, caches, the
    /// scheduler) and loads it again for the next request that needs it; -1: never (llama-server's
    /// `--sleep-idle-seconds`).
    #[arg(long = "sleep-idle-seconds", value_name = "SECONDS", default_value_t = -1, allow_negative_numbers = true)]
    pub sleep_idle_seconds: i64,
    /// Answer POST /props (it changes no property: a body naming one is refused by name).
    #[arg(long = "props", env = "LLAMA_ARG_ENDPOINT_PROPS")]
    pub props: bool,
    /// A file of API keys, one per line (added to `--api-key`'s).
    #[arg(long = "api-key-file", env = "LLAMA_ARG_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Draft decoding (`--spec-*`).
    #[command(flatten)]
    pub spec: crate::flags::spec::SpecArgs,
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
    /// K and V cache types (`-ctk`, `-ctv`).
    #[command(flatten)]
    pub cache: crate::flags::cache_type::CacheTypeArgs,
    /// Layers on the GPU, as llama-server reads `-ngl`: `auto` (the default) or `all` or a
    /// count of at least the model's layers put the whole model on the best GPU kernel plugin
    /// (its routed experts placed by the plan: `-ncmoe`, `-cmoe`, `--gpu-budget`), or on the CPU
    /// with a warning when none can run it; 0 keeps it on the CPU. A count between is refused:
    /// offloading part of the layers is not implemented.
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "gpu-layers",
        env = "LLAMA_ARG_N_GPU_LAYERS"
    )]
    pub n_gpu_layers: Option<String>,
    /// Where routed experts go (`-cmoe`, `-ncmoe`, `-ot`, budgets).
    #[command(flatten)]
    pub placement: crate::flags::placement::PlacementArgs,
    /// The sampler stages beyond the basic ones, and their order.
    #[command(flatten)]
    pub sampling: crate::flags::sampling::SamplingArgs,
    /// Escape sequences in `-r` and the DRY breakers (`-e`, `--no-escape`).
    #[command(flatten)]
    pub escapes: crate::flags::escapes::EscapeArgs,
    /// A stop string for requests that bring none (`-r`; repeatable), as llama-server's
    /// reverse prompts.
    #[arg(long = "reverse-prompt", value_name = "PROMPT")]
    pub reverse_prompt: Vec<String>,
    /// The chat page, CORS and TLS.
    #[command(flatten)]
    pub web: crate::flags::web::WebArgs,
    /// How the server logs.
    #[command(flatten)]
    pub log: crate::flags::logging::LogArgs,
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
    /// Metadata overrides (`--override-kv`, the rope flags).
    #[command(flatten)]
    pub metadata: crate::flags::metadata::MetadataArgs,
    /// The default grammar of requests that bring none (`--grammar`, `--grammar-file`,
    /// `-j/--json-schema`, `-jf/--json-schema-file`), and `--no-schemajump`.
    #[command(flatten)]
    pub grammar: crate::flags::grammar::GrammarArgs,
    /// Serve embeddings (`/embedding`, `/embeddings`, `/v1/embeddings`) from the model's
    /// final-norm rows; completions are served as well.
    #[arg(
        long = "embedding",
        visible_alias = "embeddings",
        env = "LLAMA_ARG_EMBEDDINGS"
    )]
    pub embeddings: bool,
    /// Pooling of embeddings: none, mean, cls or last (rank needs a rank head, which no model
    /// plugin has); default: the model's `pooling_type`, else none.
    #[arg(long = "pooling", env = "LLAMA_ARG_POOLING")]
    pub pooling: Option<String>,
    /// Normalization of pooled embeddings: -1 none, 0 max absolute (int16 range), 1 taxicab,
    /// 2 Euclidean, above 2 the p-norm.
    #[arg(
        long = "embd-normalize",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub embd_normalize: i32,
    /// Print a bash completion script for `bloomery serve` and exit.
    #[arg(long = "completion-bash")]
    pub completion_bash: bool,
    /// Write each completion's prompt to a file in this folder (a debugging aid; created if
    /// missing).
    #[arg(long = "log-prompts-dir", value_name = "PATH")]
    pub log_prompts_dir: Option<std::path::PathBuf>,
    /// `/infill` puts the suffix before the prefix (SPM order) instead of after it (PSM).
    #[arg(long = "spm-infill")]
    pub spm_infill: bool,
    /// Let other processes bind the same port (SO_REUSEPORT), as llama-server's `--reuse-port`.
    #[arg(long = "reuse-port", env = "LLAMA_ARG_REUSE_PORT")]
    pub reuse_port: bool,
    /// Serve Prometheus metrics at /metrics.
    #[arg(long = "metrics", env = "LLAMA_ARG_ENDPOINT_METRICS")]
    pub metrics: bool,
    /// Serve /slots (the default; `--no-slots` turns it off).
    #[arg(long = "slots", overrides_with = "no_slots", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_ENDPOINT_SLOTS")]
    pub slots: bool,
    /// Do not serve /slots.
    #[arg(long = "no-slots", overrides_with = "slots")]
    pub no_slots: bool,
    /// Chat templates with llama-server's Jinja extensions, tool calls included (the default;
    /// `--no-jinja`: llama.cpp's built-in templates).
    #[arg(long = "jinja", overrides_with = "no_jinja", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_JINJA")]
    pub jinja: bool,
    /// llama.cpp's built-in (C++) templates instead of Jinja, as llama-server's: picked by
    /// `--chat-template NAME` or detected from the template's text; no tools, no template
    /// variables, no reasoning parsing.
    #[arg(long = "no-jinja", overrides_with = "jinja")]
    pub no_jinja: bool,
    /// Chat template: Jinja source, `chatml`, or with `--no-jinja` a built-in name of llama.cpp
    /// (`llama3`, `command-r`, `gemma`, `mistral-v7`, … every name llama-server b11434 lists).
    #[arg(long = "chat-template", env = "LLAMA_ARG_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
    /// Chat template read from a file (under `--no-jinja`, detected as llama-server detects it).
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
    /// Reasoning in chats: on, off (the template's `enable_thinking` false, and a thinking
    /// block the template opens closed at once) or auto (on unless --reasoning-budget is 0).
    #[arg(
        long = "reasoning",
        default_value = "auto",
        env = "LLAMA_ARG_REASONING"
    )]
    pub reasoning: String,
    /// The chat template's `reasoning_effort` (`default`: none given, the template's own).
    #[arg(
        long = "reasoning-effort",
        default_value = "default",
        env = "LLAMA_ARG_REASONING_EFFORT"
    )]
    pub reasoning_effort: String,
    /// Thinking budget in tokens: -1 unrestricted, 0 thinking off, N the end of a thinking span
    /// forced after N tokens.
    #[arg(long = "reasoning-budget", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_THINK_BUDGET")]
    pub reasoning_budget: i64,
    /// Text forced before the end of a thinking span whose budget ran out.
    #[arg(
        long = "reasoning-budget-message",
        default_value = "",
        env = "LLAMA_ARG_THINK_BUDGET_MESSAGE"
    )]
    pub reasoning_budget_message: String,
    /// Read the model into memory instead of mapping it (not implemented yet: refused).
    #[arg(long = "no-mmap", env = "LLAMA_ARG_NO_MMAP")]
    pub no_mmap: bool,
    /// Requests that may wait for a slot; more are answered 503 with Retry-After.
    #[arg(long = "queue-depth", default_value_t = 64)]
    pub queue_depth: usize,
    /// A decision head for `POST /v1/systemone`: `joint_head.safetensors`, with its
    /// `joint_head_config.json` beside it, over a `qwen35` backbone (a `clef` file carries its own).
    #[arg(long = "decision-head", value_name = "FILE")]
    pub decision_head: Option<PathBuf>,
    /// Where the decision head runs: `gpu` on the card beside the backbone, `cpu` on the CPU
    /// (the backbone's final-norm rows copied to the host); default: the backbone's device.
    #[arg(long = "decision-head-device", value_name = "cpu|gpu")]
    pub decision_head_device: Option<String>,
    /// Seconds a client may take to send a request's body, and that a response write may stall
    /// (the client not reading), before its connection is closed (llama-server's read/write
    /// timeout).
    #[arg(long = "timeout", default_value_t = 3600, env = "LLAMA_ARG_TIMEOUT")]
    pub timeout: u64,
    /// Seconds a connection may stay idle between requests, and a client may take to send a
    /// request's headers, before it is closed.
    #[arg(long = "idle-timeout", default_value_t = 5)]
    pub idle_timeout: u64,
    /// Threads for the CPU work of requests (reading JSON, tokenizing, chat templates,
    /// probability tables), off the threads that answer HTTP; -1: the larger of --parallel + 4
    /// and the cores less one, as llama-server sizes its HTTP threads.
    #[arg(long = "threads-http", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_THREADS_HTTP")]
    pub threads_http: i32,
    /// Seconds SIGTERM or SIGINT lets running requests finish before each is cut (a stream
    /// ends with an error frame, and the log names what was cut); a second signal exits at once.
    #[arg(long = "shutdown-timeout", default_value_t = 5)]
    pub shutdown_timeout: u64,
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

/// Why `-np -1` is refused: what llama-server b11434 makes of it (tools/server/server.cpp) needs
/// the shared KV pool that `-kvu` names.
pub const NP_AUTO: &str = "-np/--parallel -1 (auto): llama-server b11434 resolves it to 4 slots \
    sharing one unified KV pool (-kvu), each slot able to use the whole context; here each slot \
    holds ctx-size/parallel positions of its own and no shared pool exists (-kvu is refused): give \
    -np N for N slots of ctx-size/N positions, or leave -np out for one slot with the whole context";

/// A comma-separated list as llama-server keeps `-a` and `--tags`: each entry trimmed, empty
/// ones dropped, sorted and without repeats (a `std::set`).
fn name_set(list: Option<&str>) -> Vec<String> {
    let set: std::collections::BTreeSet<String> = list
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    set.into_iter().collect()
}

impl ServeArgs {
    /// The model's names (`-a`), sorted; without `-a`, the one name llama-server b11434 gives
    /// it (`server.cpp`): the `-hf` value as given, else the model's path as given.
    pub fn aliases(&self) -> Vec<String> {
        let set = name_set(self.alias.as_deref());
        if !set.is_empty() {
            return set;
        }
        let name = self
            .hub
            .listed_name()
            .map_or_else(|| self.model.display().to_string(), String::from);
        vec![name]
    }

    /// The model's tags (`--tags`), sorted.
    pub fn tags(&self) -> Vec<String> {
        name_set(self.tags.as_deref())
    }

    /// The id the model is listed and answered under: its first name in sorted order
    /// (llama-server b11434's `model_name`).
    pub fn model_id(&self) -> String {
        self.aliases().swap_remove(0)
    }

    /// The most rows a prompt pass evaluates: the smaller of `-b` and `-ub`, at least one.
    pub fn n_batch(&self) -> u32 {
        crate::flags::placement::pass_rows(self.batch_size, self.ubatch_size)
    }

    /// Threads for requests' CPU work: `--threads-http`, or llama-server's default for -1.
    pub fn threads_http(&self) -> usize {
        match usize::try_from(self.threads_http) {
            Ok(n) => n,
            Err(_) => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                (self.n_slots() as usize + 4).max(cores.saturating_sub(1))
            }
        }
    }

    /// Slots in force (`validate` refuses any `-np` below 1).
    pub fn n_slots(&self) -> u32 {
        self.parallel.max(1) as u32
    }

    /// Whether the model's mapped bytes are locked in RAM (`--mlock` or `-lm mmap+mlock`).
    pub fn mlock(&self) -> bool {
        self.placement.experts.mlock || self.load_mode == "mmap+mlock"
    }

    /// The API keys of `--api-key` and `--api-key-file`.
    pub fn api_keys(&self) -> anyhow::Result<Vec<String>> {
        let mut keys: Vec<String> = self
            .api_key
            .iter()
            .flat_map(|k| k.split(','))
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--api-key-file {}: {e}", path.display()))?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned),
            );
        }
        Ok(keys)
    }

    /// Whether `/slots` is served (`--slots`, `--no-slots`, `LLAMA_ARG_ENDPOINT_SLOTS`).
    pub fn endpoint_slots(&self) -> bool {
        self.slots && !self.no_slots
    }

    /// Whether tool calls are allowed (`--jinja`, `--no-jinja`, `LLAMA_ARG_JINJA`).
    pub fn jinja(&self) -> bool {
        self.jinja && !self.no_jinja
    }

    /// Whether context shift is on.
    pub fn context_shift(&self) -> bool {
        self.context_shift && !self.no_context_shift
    }

    /// Whether requests reuse cached prefixes by default.
    pub fn cache_prompt(&self) -> bool {
        self.cache_prompt && !self.no_cache_prompt
    }

    /// Whether a final assistant message is continued (llama-server's assistant prefill).
    pub fn prefill_assistant(&self) -> bool {
        self.prefill_assistant && !self.no_prefill_assistant
    }

    /// How long the server stays idle before it sleeps (`None`: never).
    pub fn sleep_idle(&self) -> Option<std::time::Duration> {
        u64::try_from(self.sleep_idle_seconds)
            .ok()
            .map(std::time::Duration::from_secs)
    }

    /// The prompt cache's budget in bytes (`None`: off).
    pub fn cache_ram_bytes(&self) -> Option<u64> {
        match self.cache_ram {
            0 => None,
            -1 => Some(u64::MAX),
            mib => Some((mib as u64).saturating_mul(1 << 20)),
        }
    }

    /// Whether chats render with `enable_thinking` (`--reasoning`; auto: unless the budget is
    /// 0), or the value's error.
    pub fn enable_thinking(&self) -> anyhow::Result<bool> {
        match self.reasoning.as_str() {
            "on" | "enabled" | "true" | "1" => Ok(true),
            "off" | "disabled" | "false" | "0" => Ok(false),
            "auto" | "-1" => Ok(self.reasoning_budget != 0),
            v => bail!("-rea/--reasoning {v:?}: expected on, off or auto"),
        }
    }

    /// The `reasoning_effort` chats render with (`None`: the template's default).
    pub fn reasoning_effort(&self) -> Option<&str> {
        (self.reasoning_effort != "default").then_some(self.reasoning_effort.as_str())
    }

    /// `--chat-template-kwargs` as an object (empty when not given), or why it is refused.
    pub fn template_kwargs(&self) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
        let Some(text) = &self.chat_template_kwargs else {
            return Ok(serde_json::Map::new());
        };
        match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(_) => bail!("--chat-template-kwargs {text:?}: expected a JSON object"),
            Err(e) => bail!("--chat-template-kwargs {text:?}: {e}"),
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
        self.enable_thinking()?;
        if self.cache_ram < -1 {
            bail!(
                "-cram/--cache-ram {}: expected MiB, 0 (off) or -1 (no limit)",
                self.cache_ram
            );
        }
        if self.no_mmap {
            not_yet("--no-mmap", "the model is always mapped")?;
        }
        if self.parallel == -1 {
            bail!("{NP_AUTO}");
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
        let (_, v) = self.cache.types()?;
        if v.is_quantized() && ["off", "0", "false"].contains(&self.flash_attn.as_str()) {
            bail!(
                "-ctv {} with -fa {}: a quantized V cache needs flash attention, as in llama.cpp",
                self.cache.cache_type_v,
                self.flash_attn
            );
        }
        if !(-1..=i64::from(i32::MAX)).contains(&self.reasoning_budget) {
            bail!(
                "--reasoning-budget {}: expected -1 (unrestricted), 0 or a number of tokens",
                self.reasoning_budget
            );
        }
        if self.chat_template.is_some() && self.chat_template_file.is_some() {
            bail!("give --chat-template or --chat-template-file, not both");
        }
        if let Some(d) = &self.decision_head_device {
            HeadDevice::parse(d).map_err(anyhow::Error::msg)?;
        }
        if self.queue_depth == 0 {
            bail!("--queue-depth must be at least 1");
        }
        if !["auto", "mmap", "mmap+mlock"].contains(&self.load_mode.as_str()) {
            bail!(
                "-lm/--load-mode {}: not supported: the model is always mapped (auto, mmap or \
                 mmap+mlock)",
                self.load_mode
            );
        }
        if self.defrag_thold.is_some() {
            tracing::warn!(
                "DEPRECATED: --defrag-thold is deprecated and no longer necessary to specify"
            );
        }
        if self.timeout == 0 || self.idle_timeout == 0 {
            bail!("-to/--timeout and --idle-timeout are seconds, at least 1");
        }
        if self.sleep_idle_seconds > i64::from(i32::MAX) {
            // llama-server reads an int.
            bail!(
                "--sleep-idle-seconds {}: out of range (at most {})",
                self.sleep_idle_seconds,
                i32::MAX
            );
        }
        if self.sleep_idle_seconds == 0 || self.sleep_idle_seconds < -1 {
            // llama-server's own words for the value it refuses.
            bail!(
                "--sleep-idle-seconds {}: invalid value: cannot be 0 or less than -1",
                self.sleep_idle_seconds
            );
        }
        if !(0.0..=1.0).contains(&self.slot_prompt_similarity) {
            bail!(
                "-sps/--slot-prompt-similarity {}: a fraction from 0 to 1",
                self.slot_prompt_similarity
            );
        }
        if self.sse_ping_interval < -1 || self.sse_ping_interval > i64::from(i32::MAX) {
            bail!(
                "--sse-ping-interval {}: seconds, or -1 for no keep-alive",
                self.sse_ping_interval
            );
        }
        if self.threads_http == 0 || self.threads_http < -1 {
            bail!(
                "--threads-http {}: a number of threads, or -1 for the default",
                self.threads_http
            );
        }
        if !self.api_prefix.is_empty()
            && (!self.api_prefix.starts_with('/') || self.api_prefix.ends_with('/'))
        {
            bail!(
                "--api-prefix {:?}: a path that starts with '/' and has no trailing '/' (as /api)",
                self.api_prefix
            );
        }
        for key in self.template_kwargs()?.keys() {
            if RESERVED_KWARGS.contains(&key.as_str()) {
                bail!("--chat-template-kwargs may not set {key:?}: it comes from each request");
            }
            if key == "enable_thinking" {
                tracing::warn!(
                    "Setting 'enable_thinking' via --chat-template-kwargs is deprecated. Use \
                     --reasoning on / --reasoning off instead."
                );
            }
        }
        self.reasoning()?;
        self.web.validate()?;
        Ok(())
    }
}

/// Variables a chat template receives from the request's own fields, which
/// `chat_template_kwargs` (the request's or `--chat-template-kwargs`) may not replace.
pub const RESERVED_KWARGS: &[&str] = &["messages", "tools", "add_generation_prompt"];

/// Whether `-ngl` (`value`; absent is llama-server's `auto`) puts a model of `n_layer` layers on
/// the GPU; a partial count is refused by name.
pub fn gpu_layers(value: Option<&str>, n_layer: u64) -> anyhow::Result<bool> {
    let n = match value {
        None | Some("auto") | Some("all") => return Ok(true),
        Some(v) => v.parse::<i64>().map_err(|_| {
            anyhow::anyhow!("-ngl/--n-gpu-layers {v:?}: expected a number, auto or all")
        })?,
    };
    match n {
        0 => Ok(false),
        // -1 is auto, -2 and below all, as llama-server reads them.
        n if n < 0 || n as u64 >= n_layer => Ok(true),
        n => bail!(
            "-ngl {n}: not supported: offloading {n} of the model's {n_layer} layers is not \
             implemented; -ngl 0 runs on the CPU, -ngl {n_layer} (or all) puts every layer on the \
             card, and -ncmoe/-cmoe/--gpu-budget keep routed experts in host RAM"
        ),
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

#[cfg(test)]
mod tests {
    use super::{gpu_layers, ServeArgs};
    use clap::Parser;

    #[derive(Parser)]
    #[command(disable_help_flag = true)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    /// As llama-server b11434 keeps `-a` and `--tags` (`common/arg.cpp`: split at commas,
    /// trimmed, in a `std::set`) and names the model (`server-context.cpp`: its first alias;
    /// without one, `server.cpp` makes the `-hf` value, else the path as given, its one alias).
    #[test]
    fn aliases_and_tags_are_sorted_sets_and_the_first_alias_is_the_id() {
        let parse = |args: &[&str]| {
            let argv = ["serve", "-m", "/models/some.gguf"].iter().chain(args);
            let mut a = Cli::try_parse_from(argv).unwrap().serve;
            a.model = a.model_arg.clone().unwrap();
            a
        };
        let a = parse(&[
            "-a",
            "tinyllama-2, fim,code,,fim",
            "--tags",
            "chat,fim,small",
        ]);
        assert_eq!(a.aliases(), ["code", "fim", "tinyllama-2"]);
        assert_eq!(a.tags(), ["chat", "fim", "small"]);
        assert_eq!(a.model_id(), "code");
        let plain = parse(&[]);
        assert_eq!(plain.aliases(), ["/models/some.gguf"]);
        assert!(plain.tags().is_empty());
        assert_eq!(plain.model_id(), "/models/some.gguf");
        let hf = parse(&["--hf-repo", "user/model-GGUF:q8_0"]);
        assert_eq!(hf.aliases(), ["user/model-GGUF:q8_0"]);
        assert_eq!(hf.model_id(), "user/model-GGUF:q8_0");
    }

    #[test]
    fn ngl_is_read_as_llama_server_reads_it() {
        assert!(gpu_layers(None, 48).unwrap(), "auto by default");
        for v in ["auto", "all", "99", "48", "-1", "-2"] {
            assert!(gpu_layers(Some(v), 48).unwrap(), "{v}");
        }
        assert!(!gpu_layers(Some("0"), 48).unwrap());
        let e = gpu_layers(Some("20"), 48).unwrap_err().to_string();
        assert!(
            e.starts_with("-ngl 20: not supported: offloading 20 of the model's 48"),
            "{e}"
        );
        assert!(gpu_layers(Some("many"), 48).is_err());
    }
}
