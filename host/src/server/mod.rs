//! `bloomery serve`: a drop-in llama-server. The HTTP listener is up before the model loads
//! (/health answers 503 meanwhile); one scheduler thread owns the model and batches every slot's
//! work into shared forward passes; each route speaks its API's shapes (llama.cpp native, OpenAI,
//! Anthropic).

pub mod anthropic;
pub mod bind;
pub mod budget;
pub mod chat;
pub mod chat_continue;
pub mod control;
pub mod cors;
pub mod embeddings;
pub mod error;
pub mod gcp;
pub mod gen;
pub mod guard;
pub mod infill;
pub mod listen;
pub mod metrics;
pub mod native;
pub mod offload;
pub mod openai;
pub mod page;
pub mod params;
pub mod prefix;
pub mod prompt_log;
pub mod request_log;
pub mod sampler_fields;
pub mod shutdown;
pub mod structured;
pub mod systemone;
pub mod template;
pub mod tls;
pub mod tool_generic;
pub mod tool_grammar;
pub mod tool_parse;
pub mod tools;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bloomery_text::{ChatTemplate, Tokenizer};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower::Layer;

use bloomery_devices::Registry;
use bloomery_exec::decision::placement::{HeadDevice, HeadHome};
use bloomery_exec::decision::{head_file, DecisionHead};
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_plugin_api::kernel::DeviceClass;
use bloomery_runtime::request::Request as Job;
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::sleep::{Phase, Sleeper};
use bloomery_runtime::status::Shared;
use bloomery_runtime::{Runtime, RuntimeConfig};

use self::error::ApiError;
use self::params::Defaults;
use crate::flags::serve::{ReasoningFormat, ServeArgs};

/// What the routes need once the model is loaded.
pub struct Ready {
    /// The vocabulary.
    pub tok: Arc<Tokenizer>,
    /// `POST /v1/systemone`'s template and temperatures, when the model has a decision head.
    pub decision: Option<Arc<systemone::Decider>>,
    /// The chat template.
    pub template: ChatTemplate,
    /// Its source, for /props.
    pub template_source: String,
    /// What the template renders (system role, reasoning tags), probed at load.
    pub template_caps: chat_continue::TemplateCaps,
    /// Under `--no-jinja`: llama.cpp's built-in template that renders chat prompts instead.
    pub builtin: Option<bloomery_text::builtin::Builtin>,
    /// Jobs for the scheduler (bounded: the wait queue); one that comes while the model sleeps
    /// wakes it.
    pub jobs: mpsc::Sender<Job>,
    /// Slot views and counters (kept across sleeps).
    pub shared: Arc<Shared>,
    /// The totals `/metrics` last reported: its throughput gauges' window.
    pub scrape: std::sync::Mutex<metrics::Window>,
    /// With `--sleep-idle-seconds`: where the model is, and its wake-up.
    pub sleeper: Option<Sleeper>,
    /// Context positions per slot.
    pub n_ctx_slot: usize,
    /// Draft decoding as the slots run it (`--spec-*`), for /props and /slots.
    pub spec: bloomery_runtime::spec::SpecConfig,
    /// Slots.
    pub n_slots: usize,
    /// The model's name in answers.
    pub model_id: String,
    /// The model file's path.
    pub model_path: String,
    /// `meta` of /v1/models.
    pub model_meta: Value,
    /// Request defaults.
    pub defaults: Defaults,
    /// The largest request body read (`guard::body_limit` of the context).
    pub body_limit: usize,
    /// How the embedding routes embed (`None`: without `--embeddings` they are refused).
    pub embeddings: Option<embeddings::EmbeddingMode>,
    /// The vocabulary's fill-in-the-middle tokens (`/infill`).
    pub fim: infill::Fim,
}

impl Ready {
    /// Returns once the model is loaded, waking it if it sleeps and waiting for the reload
    /// (llama-server's `wait_until_no_sleep`): for routes that need the model but queue no job
    /// (a job on the queue wakes it by itself). A failed reload is a 500 that says why.
    pub async fn wake(&self) -> Result<(), ApiError> {
        match &self.sleeper {
            Some(s) => s.wake().await.map_err(ApiError::internal),
            None => Ok(()),
        }
    }

    /// Whether the model is freed now: asleep, loading again, or its reload failed (`/props`'
    /// `is_sleeping`).
    pub fn is_sleeping(&self) -> bool {
        self.sleeper
            .as_ref()
            .is_some_and(|s| s.phase() != Phase::Awake)
    }
}

/// The server's state: flags, and the loaded model once it is ready.
pub struct AppState {
    /// The command line.
    pub args: ServeArgs,
    /// Set when the model has loaded.
    pub ready: OnceLock<Arc<Ready>>,
    /// How thinking is returned.
    pub reasoning: ReasoningFormat,
    /// Accepted API keys (empty: no key needed).
    pub api_keys: Vec<String>,
    /// Set by the first SIGTERM or SIGINT: new requests get 503 while running ones finish.
    pub draining: AtomicBool,
    /// Where requests' CPU work runs (`--threads-http`).
    pub cpu: offload::CpuPool,
    /// Unix seconds when the server started (`/metrics`' `Process-Start-Time-Unix` header).
    pub started_unix: u64,
    /// What `/` serves.
    pub page: crate::flags::web::Page,
    /// Whether OpenAI answers carry the `__verbose` debug object by default (`-v`, `-lv` > 9).
    pub debug_answers: bool,
    /// The chat completions running now, for `/v1/chat/completions/control`.
    pub running: Arc<control::Running>,
    /// The chat page's default settings (`--ui-config`), `/props`' `ui_settings`.
    pub ui_settings: Value,
}

impl AppState {
    /// The loaded model, or 503 while it loads.
    pub fn ready(&self) -> Result<Arc<Ready>, ApiError> {
        self.ready
            .get()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("Loading model"))
    }

    /// The loaded model, woken if it sleeps (every route but `/health`, `GET /props`, `/models`
    /// and `/metrics`, as llama-server); 503 while it first loads.
    pub async fn awake(&self) -> Result<Arc<Ready>, ApiError> {
        let ready = self.ready()?;
        ready.wake().await?;
        Ok(ready)
    }

    /// Whether a shutdown is draining the server.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The largest request body read now.
    pub fn body_limit(&self) -> usize {
        self.ready
            .get()
            .map_or(guard::LOADING_BODY_LIMIT, |r| r.body_limit)
    }
}

/// The shared state as handlers see it.
pub type AppRef = Arc<AppState>;

/// Every route, for the 404 body.
pub const ROUTES: &[&str] = &[
    "GET /health",
    "GET /v1/health",
    "GET /props",
    "POST /props",
    "GET /slots",
    "GET /metrics",
    "GET /models",
    "GET /v1/models",
    "POST /completion",
    "POST /completions",
    "POST /v1/completions",
    "POST /chat/completions",
    "POST /v1/chat/completions",
    "POST /chat/completions/input_tokens",
    "POST /v1/chat/completions/input_tokens",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /v1/responses",
    "POST /responses",
    "POST /v1/responses/input_tokens",
    "POST /responses/input_tokens",
    "POST /tokenize",
    "POST /detokenize",
    "POST /apply-template",
    "POST /infill",
    "POST /slots/:id?action=save|restore|erase",
    "POST /residency/reset",
    "POST /embedding",
    "POST /embeddings",
    "POST /v1/embeddings",
    "POST /rerank",
    "POST /reranking",
    "POST /v1/rerank",
    "POST /v1/reranking",
    "POST /v1/systemone",
];

/// The router over `state`, with `cors` around every route and the fallback, outside the guard
/// (a preflight is answered before any other check), and Vertex AI's prediction routes where
/// `gcp` gives them (dispatching to the same router without them).
pub fn router(
    state: AppRef,
    cors: tower_http::cors::CorsLayer,
    methods: Option<axum::http::HeaderValue>,
    gcp: Option<&gcp::Gcp>,
) -> Router {
    let plain = routes(Arc::clone(&state), cors.clone(), methods.clone(), None);
    match gcp {
        None => plain,
        Some(g) => {
            let extra = g.routes(plain, &state.args.api_prefix);
            routes(state, cors, methods, Some(extra))
        }
    }
}

/// [`router`]'s routes, with `extra` beside them.
fn routes(
    state: AppRef,
    cors: tower_http::cors::CorsLayer,
    methods: Option<axum::http::HeaderValue>,
    extra: Option<Router<AppRef>>,
) -> Router {
    let mut api = Router::new()
        .route("/health", get(native::health))
        .route("/v1/health", get(native::health))
        .route("/props", get(native::props).post(native::set_props))
        .route("/slots", get(native::slots))
        .route("/slots/{id}", post(native::slot_action))
        .route("/residency/reset", post(native::residency_reset))
        .route("/metrics", get(metrics::metrics))
        .route("/models", get(native::models))
        .route("/v1/models", get(native::models))
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/infill", post(native::infill))
        .route("/tokenize", post(native::tokenize))
        .route("/detokenize", post(native::detokenize))
        .route("/apply-template", post(native::apply_template))
        .route("/embedding", post(embeddings::native))
        .route("/embeddings", post(embeddings::native))
        .route("/v1/embeddings", post(embeddings::openai))
        .route("/rerank", post(embeddings::rerank))
        .route("/reranking", post(embeddings::rerank))
        .route("/v1/rerank", post(embeddings::rerank))
        .route("/v1/reranking", post(embeddings::rerank))
        .route("/v1/completions", post(openai::completions))
        .route("/chat/completions", post(openai::chat))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/chat/completions/control", post(control::control))
        .route(
            "/chat/completions/input_tokens",
            post(openai::chat_input_tokens),
        )
        .route(
            "/v1/chat/completions/input_tokens",
            post(openai::chat_input_tokens),
        )
        .route("/v1/responses", post(openai::responses))
        .route("/responses", post(openai::responses))
        .route(
            "/v1/responses/input_tokens",
            post(openai::responses_input_tokens),
        )
        .route(
            "/responses/input_tokens",
            post(openai::responses_input_tokens),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/systemone", post(systemone::systemone));
    if let Some(extra) = extra {
        api = api.merge(extra);
    }
    let mut app = page::add(api, &state.page)
        .layer(middleware::from_fn_with_state(state.clone(), guard::guard))
        // `guard` reads every body under the limit the context sets.
        .layer(DefaultBodyLimit::disable())
        .layer(cors);
    if let Some(methods) = methods {
        app = app.layer(middleware::from_fn_with_state(methods, cors::spell_methods));
    }
    let prefix: Arc<str> = state.args.api_prefix.as_str().into();
    if !prefix.is_empty() {
        // Every route and the page under `--api-prefix`: the path is cut before routing.
        let cut = middleware::from_fn_with_state(Arc::clone(&prefix), prefix::cut);
        app = Router::new().fallback_service(cut.layer(app.with_state(Arc::clone(&state))));
    }
    // Outermost: refused requests get their line too.
    app.layer(middleware::from_fn_with_state(
        prefix,
        request_log::log_requests,
    ))
    .with_state(state)
}

/// llama-server's 404, listing the routes.
pub(crate) async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    let mut e = ApiError::not_found(format!("no route for {method} {}", uri.path()));
    e.extra = Some(json!({ "routes": ROUTES }));
    e.into_response()
}

/// Parses a JSON request body, or a 400 that says why.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("malformed JSON in the request body: {e}")))
}

/// The context size in force: `-c`, or the model's training context for `-c 0`.
fn context_size(a: &ServeArgs, file: &bloomery_gguf::GgufModel) -> anyhow::Result<u32> {
    if a.ctx_size != 0 {
        return Ok(a.ctx_size);
    }
    let arch = file.metadata().get_str("general.architecture")?.to_owned();
    let n = file
        .metadata()
        .get_uint(&format!("{arch}.context_length"))?;
    u32::try_from(n).context("context length")
}

/// The model's layer count (`{arch}.block_count`).
pub(crate) fn block_count(file: &bloomery_gguf::GgufModel) -> anyhow::Result<u64> {
    let arch = file.metadata().get_str("general.architecture")?.to_owned();
    Ok(file.metadata().get_uint(&format!("{arch}.block_count"))?)
}

/// The model's decision head (its own, or `--decision-head`'s file), on the device
/// `--decision-head-device` names or else the backbone's; `None` for a model without one.
fn decision_head(
    reg: &Registry,
    model: &LoadedModel,
    a: &ServeArgs,
) -> anyhow::Result<Option<DecisionHead>> {
    let asked = a
        .decision_head_device
        .as_deref()
        .map(HeadDevice::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let backbone = reg
        .kernels
        .iter()
        .find(|k| k.name == model.kernel_plugin())
        .map_or(DeviceClass::Cpu, |k| k.probe.class);
    let on = HeadDevice::choose(asked, backbone).map_err(anyhow::Error::msg)?;
    let home = || HeadHome::open(reg, model, on);
    Ok(match &a.decision_head {
        Some(path) => Some(head_file::load(model, path, home()?)?),
        None if DecisionHead::declared_in(model) => DecisionHead::from_model(model, home()?)?,
        None => None,
    })
}

/// Loads the model as the flags place it, with its decision head (at start, and again after
/// sleep).
fn load_model(
    reg: &Registry,
    a: &ServeArgs,
) -> anyhow::Result<(LoadedModel, Option<DecisionHead>)> {
    let (file, overrides) = a.metadata.open(&a.model)?;
    let n_ctx = context_size(a, &file)?;
    let n_slots = a.n_slots();
    let n_ctx_slot = n_ctx / n_slots;
    if n_ctx_slot < 2 {
        anyhow::bail!("-c {n_ctx} over {n_slots} slots leaves {n_ctx_slot} positions per slot");
    }
    let gpu = crate::flags::serve::gpu_layers(a.n_gpu_layers.as_deref(), block_count(&file)?)?;
    let (kv_type_k, kv_type_v) = a.cache.types()?;
    let threads = u32::try_from(a.threads).unwrap_or(0);
    let options = LoadOptions {
        n_slots,
        ctx_per_slot: n_ctx_slot,
        kv_type_k,
        kv_type_v,
        threads,
        graphs: true,
        mlock: a.mlock(),
        overrides,
        check_tensors: a.placement.experts.check_tensors,
        draft_n_max: a.spec.planned_n_max()?,
        draft_history: a.spec.planned_history()?,
    };
    // Prompts are evaluated in batches of at most n_batch rows (the engine's config below).
    let mut request = a.placement.request()?;
    request.batch_rows = a.n_batch();
    let model = LoadedModel::load_offloaded(reg, &a.model, options, gpu, &request)?;
    tracing::info!("running on {}", model.kernel_plugin());
    let head = decision_head(reg, &model, a)?;
    Ok((model, head))
}

/// The separate draft file `--spec-draft-model` names (`-md`), loaded as the model is (its
/// slots, context, cache types and placement), or none.
fn load_draft(
    reg: &Registry,
    a: &ServeArgs,
    model: &LoadedModel,
) -> anyhow::Result<Option<LoadedModel>> {
    let Some(path) = &a.spec.draft_model else {
        return Ok(None);
    };
    if a.sleep_idle().is_some() {
        anyhow::bail!(
            "--spec-draft-model with --sleep-idle-seconds: the reload after sleeping loads the \
             model alone"
        );
    }
    let (file, _) = a.metadata.open(path)?;
    let gpu = crate::flags::serve::gpu_layers(a.n_gpu_layers.as_deref(), block_count(&file)?)?;
    let options = LoadOptions {
        overrides: &[],
        ..model.options
    };
    let mut request = a.placement.request()?;
    request.batch_rows = a.n_batch();
    let simple = a.spec.draft_simple()?;
    let options = LoadOptions {
        // A draft model drafts from its own cache: no verify passes of its own.
        draft_n_max: if simple { 0 } else { options.draft_n_max },
        draft_history: false,
        ..options
    };
    let draft = LoadedModel::load_offloaded(reg, path, options, gpu, &request)
        .with_context(|| format!("--spec-draft-model {}", path.display()))?;
    let named = |e: String| anyhow::anyhow!("--spec-draft-model {}: {e}", path.display());
    if simple {
        let target = crate::text::tokenizer(&model.file)?;
        let own = crate::text::tokenizer(&file)?;
        bloomery_runtime::draft_model::check_vocab(&target, &own).map_err(named)?;
        bloomery_runtime::draft_model::check_draft_simple(model, &draft).map_err(named)?;
        tracing::info!("drafting with the draft model {}", path.display());
    } else {
        bloomery_runtime::spec::check_draft_model(&model.spec, &draft.spec).map_err(named)?;
        tracing::info!("drafting with the MTP block of {}", path.display());
    }
    Ok(Some(draft))
}

/// Loads the model and starts the scheduler thread (one that sleeps when idle, with
/// `--sleep-idle-seconds`).
fn load(plugin_dirs: &[PathBuf], a: &ServeArgs) -> anyhow::Result<Ready> {
    let reg = Registry::load_all(plugin_dirs)?;
    let (mut model, head) = load_model(&reg, a)?;
    let n_slots = a.n_slots();
    let n_ctx = context_size(a, &model.file)?;
    let n_ctx_slot = model.options.ctx_per_slot;
    let no_shift = model.shift_refusal();
    if let Some(why) = &no_shift {
        if a.context_shift() {
            anyhow::bail!("--context-shift: {why}");
        }
        if a.cache_reuse > 0 {
            anyhow::bail!("--cache-reuse: {why}");
        }
    }
    let embeddings = embeddings::mode(a, &model.file, model.spec.hparams.n_embd as usize)?;
    if let Some(m) = embeddings {
        model.check_embeddings()?;
        tracing::info!(
            "serving embeddings: pooling {}, normalization {}",
            m.pooling.name(),
            m.normalize
        );
    }
    let tok = Arc::new(crate::text::tokenizer(&model.file)?);
    let meta = model.file.metadata();
    let text_of = |id: Option<u32>| {
        id.and_then(|i| tok.token_text(i))
            .unwrap_or_default()
            .to_owned()
    };
    let choice = template::choose(
        template::Flags::of_serve(a),
        meta.get_str("tokenizer.chat_template").ok(),
        &text_of(tok.bos()),
        &text_of(tok.eos()),
    )?;
    if let Some(b) = choice.builtin {
        tracing::info!(
            "--no-jinja: chat prompts in llama.cpp's built-in template {}",
            b.name().unwrap_or("dots1 (detected)")
        );
    }
    let arch = model.spec.architecture.to_string();
    let hp = &model.spec.hparams;
    let size: u64 = model
        .file
        .parts()
        .iter()
        .map(|p| p.bytes().len() as u64)
        .sum();
    let model_path = a.model.display().to_string();
    let model_meta = json!({
        "vocab_type": 2,
        "n_vocab": hp.n_vocab,
        "n_ctx_train": meta.get_uint(&format!("{arch}.context_length")).unwrap_or(0),
        "n_embd": hp.n_embd,
        "n_params": 0,
        "size": size,
    });
    let mut sampler = SamplerParams {
        temp: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        typ_p: a.typical,
        // -1: the slot's context, as llama-server reads it.
        penalty_last_n: usize::try_from(a.repeat_last_n).unwrap_or(n_ctx_slot as usize),
        penalty_repeat: a.repeat_penalty,
        penalty_freq: a.frequency_penalty,
        penalty_present: a.presence_penalty,
        ..SamplerParams::default()
    };
    a.sampling
        .apply(&mut sampler, &tok, hp.n_vocab as usize, &a.escapes)?;

    let defaults = Defaults {
        sampler,
        seed: u64::try_from(a.seed).ok(),
        n_predict: usize::try_from(a.n_predict).ok(),
        ignore_eos: a.ignore_eos,
        special: a.special,
        stop: a
            .reverse_prompt
            .iter()
            .map(|r| a.escapes.apply(r))
            .collect(),
        cache_prompt: a.cache_prompt(),
        n_keep: a.keep,
        n_cache_reuse: a.cache_reuse as usize,
        no_shift,
        sse_ping_interval: a.sse_ping_interval,
        grammar: match a.grammar.gbnf()? {
            Some(text) => {
                let spec = a.grammar.spec(&tok)?.context("the default grammar")?;
                Some((text, spec))
            }
            None => None,
        },
        tok: Arc::clone(&tok),
        n_vocab: hp.n_vocab as usize,
        budget: budget::BudgetDefaults {
            tokens: a.reasoning_budget,
            message: a.reasoning_budget_message.clone(),
        },
    };
    let fim = infill::Fim::of(model.file.metadata(), &tok, hp.n_vocab as usize);
    let body_limit = guard::body_limit(n_ctx as usize, tok.max_token_bytes());
    let decision = match &head {
        Some(h) => {
            tracing::info!(
                "decision head from {}: width {}, {} heads, {} routing + {} decoder blocks, on {}",
                h.source_name,
                h.hp.width,
                h.hp.n_head,
                h.hp.n_routing,
                h.hp.n_joint,
                h.device_plugin()
            );
            Some(Arc::new(systemone::decider(meta, &arch, &tok)?))
        }
        None => None,
    };
    let draft = load_draft(&reg, a, &model)?;
    // With a draft file its MTP block drafts: the type is checked against it.
    let drafts_with = draft.as_ref().unwrap_or(&model);
    let spec = a
        .spec
        .config(drafts_with.spec.caps.n_mtp_layers, &model.spec.architecture)?;
    let cfg = RuntimeConfig {
        n_ctx_slot: n_ctx_slot as usize,
        n_batch: a.n_batch() as usize,
        cache_ram: a.cache_ram_bytes(),
        queue_depth: a.queue_depth,
        max_checkpoints: a.ctx_checkpoints as usize,
        checkpoint_every: a.checkpoint_min_step as usize,
        schemajump: !a.grammar.no_schemajump,
        context_shift: a.context_shift(),
        spec,
        slot_similarity: a.slot_prompt_similarity,
    };
    let tok_rt = Arc::clone(&tok);
    let (jobs, shared, sleeper) = match a.sleep_idle() {
        None => {
            let runtime = match draft {
                Some(d) if head.is_none() => {
                    Runtime::start_with_draft_model(model, d, tok_rt, cfg)?
                }
                Some(_) => anyhow::bail!("--spec-draft-model: a decision model drafts nothing"),
                None => Runtime::start_with_head(model, head, tok_rt, cfg)?,
            };
            (runtime.sender(), Arc::clone(runtime.shared()), None)
        }
        Some(after) => {
            let args = a.clone();
            let reload = Box::new(move || load_model(&reg, &args).map_err(|e| format!("{e:#}")));
            let s = Sleeper::start(model, head, tok_rt, cfg, after, reload)?;
            tracing::info!("sleeping after {} s without a task", after.as_secs());
            (s.sender(), Arc::clone(s.shared()), Some(s))
        }
    };
    Ok(Ready {
        tok,
        template_caps: chat_continue::TemplateCaps::probe(&choice.template, &choice.source),
        template: choice.template,
        template_source: choice.source,
        builtin: choice.builtin,
        jobs,
        shared,
        scrape: Default::default(),
        sleeper,
        n_ctx_slot: n_ctx_slot as usize,
        spec,
        n_slots: n_slots as usize,
        model_id: a.model_id(),
        model_path,
        model_meta,
        defaults,
        body_limit,
        embeddings,
        decision,
        fim,
    })
}

/// Runs the server until interrupted, with the plugins of `plugin_dirs`.
/// `verbose` is the global `-v/--verbose`: with it (or `-lv` above 9) OpenAI answers carry
/// the `__verbose` debug object unless a request's `verbose` says otherwise, as llama-server's.
pub fn serve(plugin_dirs: &[PathBuf], a: &ServeArgs, verbose: bool) -> anyhow::Result<()> {
    a.validate()?;
    let reasoning = a.reasoning()?;
    let api_keys = a.api_keys()?;
    let state = Arc::new(AppState {
        args: a.clone(),
        ready: OnceLock::new(),
        reasoning,
        api_keys,
        draining: AtomicBool::new(false),
        cpu: offload::CpuPool::new(a.threads_http()),
        started_unix: gen::unix_now(),
        page: a.web.page(),
        debug_answers: verbose || a.log.verbosity.is_some_and(|n| n > 9),
        running: Arc::default(),
        ui_settings: a.web.ui_settings()?,
    });
    prompt_log::start(a.log_prompts_dir.as_deref());
    let cors = cors::layer(&a.web)?;
    let cors_methods = cors::preflight_methods(&a.web)?;
    let gcp = gcp::Gcp::from(|name| std::env::var(name).ok())?;
    let tls = match a.web.tls_files()? {
        Some((key, cert)) => Some(tls::acceptor(&key, &cert)?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let plugin_dirs = plugin_dirs.to_vec();
    let served = rt.block_on(async move {
        let mut signals = shutdown::Signals::new().context("listening for SIGTERM and SIGINT")?;
        let port = match &gcp {
            Some(g) if g.port != a.port => {
                tracing::warn!(
                    "Google Cloud prediction mode: AIP_HTTP_PORT {} instead of --port {}",
                    g.port,
                    a.port
                );
                g.port
            }
            _ => a.port,
        };
        let bound = bind::bind_all(&bind::hosts(&a.host)?, port, a.reuse_port).await?;
        let urls: Vec<String> = bound
            .iter()
            .map(|(_, addr)| format!("{scheme}://{addr}"))
            .collect();
        let addr = bound[0].1;
        let listeners = bound.into_iter().map(|(l, _)| l).collect();
        tracing::info!("listening on {} (loading the model)", urls.join(", "));
        eprintln!(
            "bloomery: listening on {}; loading {}",
            urls.join(", "),
            a.model.display()
        );
        match &state.page {
            crate::flags::web::Page::BuiltIn => {
                eprintln!("bloomery: the chat page is at {scheme}://{addr}/");
            }
            crate::flags::web::Page::Folder(dir) => {
                eprintln!("bloomery: serving {} at {scheme}://{addr}/", dir.display());
            }
            crate::flags::web::Page::Off => {}
        }
        let loader_state = Arc::clone(&state);
        let args = a.clone();
        let (fail_tx, mut fail_rx) = mpsc::channel::<anyhow::Error>(1);
        tokio::task::spawn_blocking(move || match load(&plugin_dirs, &args) {
            Ok(ready) => {
                let _ = loader_state.ready.set(Arc::new(ready));
                eprintln!("bloomery: model loaded; serving");
            }
            Err(e) => {
                let _ = fail_tx.blocking_send(e);
            }
        });
        let timeouts = listen::Timeouts {
            idle: Duration::from_secs(a.idle_timeout),
            write: Duration::from_secs(a.timeout),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let app = router(Arc::clone(&state), cors, cors_methods, gcp.as_ref());
        let mut http = std::pin::pin!(listen::serve(listeners, app, timeouts, tls, async {
            let _ = stop_rx.await;
        }));
        tokio::select! {
            () = &mut http => anyhow::bail!("the HTTP server stopped"),
            Some(e) = fail_rx.recv() => Err(e.context("loading the model")),
            first = signals.next() => {
                shutdown::drain(&state, &mut signals, first, stop_tx, http).await;
                Ok(())
            }
        }
    });
    // A model still loading, or a request's work still running, is not waited for.
    rt.shutdown_background();
    served
}

/// The status and JSON of /health: 200 while the model serves, sleeps or wakes; 503 while it
/// first loads or the server drains; 500 once the scheduler has stopped or the last reload after
/// sleep failed (requests could only fail; the next one tries the reload again).
pub fn health_body(state: &AppState) -> (StatusCode, Value) {
    let e = match state.ready.get() {
        None => ApiError::unavailable("Loading model"),
        Some(ready) if ready.jobs.is_closed() => ApiError::internal(
            "the scheduler has stopped: requests cannot be served (see the log for why)",
        ),
        Some(ready) => match ready.sleeper.as_ref().map(Sleeper::phase) {
            Some(Phase::Failed(why)) => ApiError::internal(why),
            _ if state.is_draining() => ApiError::unavailable("the server is shutting down"),
            _ => return (StatusCode::OK, json!({"status": "ok"})),
        },
    };
    (e.status, e.body())
}
