//! `bloomery serve`: a drop-in llama-server. The HTTP listener is up before the model loads
//! (/health answers 503 meanwhile); one scheduler thread owns the model and batches every slot's
//! work into shared forward passes; each route speaks its API's shapes (llama.cpp native, OpenAI,
//! Anthropic).

pub mod anthropic;
pub mod chat;
pub mod error;
pub mod gen;
pub mod native;
pub mod openai;
pub mod params;
pub mod structured;
pub mod tools;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bloomery_plugin_api::DType;
use bloomery_text::{ChatTemplate, Tokenizer};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_runtime::request::Request as Job;
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::status::Shared;
use bloomery_runtime::{Runtime, RuntimeConfig};

use self::error::ApiError;
use self::params::Defaults;
use crate::flags::serve::{ReasoningFormat, ServeArgs};

/// What the routes need once the model is loaded.
pub struct Ready {
    /// The vocabulary.
    pub tok: Arc<Tokenizer>,
    /// The chat template.
    pub template: ChatTemplate,
    /// Its source, for /props.
    pub template_source: String,
    /// Jobs for the scheduler (bounded: the wait queue).
    pub jobs: mpsc::Sender<Job>,
    /// Slot views and counters.
    pub shared: Arc<Shared>,
    /// Context positions per slot.
    pub n_ctx_slot: usize,
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
}

impl AppState {
    /// The loaded model, or 503 while it loads.
    pub fn ready(&self) -> Result<Arc<Ready>, ApiError> {
        self.ready
            .get()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("Loading model"))
    }
}

/// The shared state as handlers see it.
pub type AppRef = Arc<AppState>;

/// Every route, for the 404 body.
pub const ROUTES: &[&str] = &[
    "GET /health",
    "GET /v1/health",
    "GET /props",
    "GET /slots",
    "GET /metrics",
    "GET /models",
    "GET /v1/models",
    "POST /completion",
    "POST /completions",
    "POST /v1/completions",
    "POST /chat/completions",
    "POST /v1/chat/completions",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /v1/responses",
    "POST /responses",
    "POST /tokenize",
    "POST /detokenize",
    "POST /apply-template",
    "POST /infill",
    "POST /slots/:id?action=save|restore|erase",
    "POST /residency/reset",
    "POST /embedding",
    "POST /embeddings",
    "POST /v1/embeddings",
];

/// Paths answered without an API key.
const PUBLIC: &[&str] = &["/health", "/v1/health", "/models", "/v1/models"];

/// The router over `state`.
pub fn router(state: AppRef) -> Router {
    Router::new()
        .route("/health", get(native::health))
        .route("/v1/health", get(native::health))
        .route("/props", get(native::props))
        .route("/slots", get(native::slots))
        .route("/slots/{id}", post(native::slot_action))
        .route("/residency/reset", post(native::residency_reset))
        .route("/metrics", get(native::metrics))
        .route("/models", get(native::models))
        .route("/v1/models", get(native::models))
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/infill", post(native::infill))
        .route("/tokenize", post(native::tokenize))
        .route("/detokenize", post(native::detokenize))
        .route("/apply-template", post(native::apply_template))
        .route("/embedding", post(native::embeddings))
        .route("/embeddings", post(native::embeddings))
        .route("/v1/embeddings", post(native::embeddings))
        .route("/v1/completions", post(openai::completions))
        .route("/chat/completions", post(openai::chat))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/responses", post(openai::responses))
        .route("/responses", post(openai::responses))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(64 << 20))
        .with_state(state)
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    let mut e = ApiError::not_found(format!("no route for {method} {}", uri.path()));
    e.extra = Some(json!({ "routes": ROUTES }));
    e.into_response()
}

/// API-key check, and a 500 for a handler that panics (the server keeps serving).
async fn guard(
    State(state): State<AppRef>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    if !state.api_keys.is_empty()
        && req.method() != Method::OPTIONS
        && !PUBLIC.contains(&req.uri().path())
    {
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let x_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        let ok = [bearer, x_key]
            .into_iter()
            .flatten()
            .any(|k| state.api_keys.iter().any(|a| a == k.trim()));
        if !ok {
            return ApiError::unauthorized().into_response();
        }
    }
    use futures_util::FutureExt;
    match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(r) => r,
        Err(panic) => {
            let what = bloomery_runtime::panic_message(panic.as_ref());
            tracing::error!("a request handler panicked: {what}");
            ApiError::internal(format!("internal error: {what}")).into_response()
        }
    }
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

/// Loads the model and starts the scheduler thread.
fn load(plugin_dir: &Path, a: &ServeArgs) -> anyhow::Result<Ready> {
    let reg = Registry::load(plugin_dir)?;
    let file = bloomery_gguf::GgufModel::open(&a.model)?;
    let n_ctx = context_size(a, &file)?;
    let n_slots = a.n_slots();
    let n_ctx_slot = n_ctx / n_slots;
    if n_ctx_slot < 2 {
        anyhow::bail!("-c {n_ctx} over {n_slots} slots leaves {n_ctx_slot} positions per slot");
    }
    // -ngl: 0 keeps everything on the CPU; anything else (99, all, auto) puts the whole model on
    // the best GPU kernel plugin (partial offload is not implemented), falling back to the CPU
    // with one warning.
    let gpu = a.n_gpu_layers.as_deref().is_some_and(|n| n != "0");
    let kv_type = if a.cache_type_k == "f32" {
        DType::F32
    } else {
        DType::F16
    };
    let threads = u32::try_from(a.threads).unwrap_or(0);
    let options = LoadOptions {
        n_slots,
        ctx_per_slot: n_ctx_slot,
        kv_type,
        threads,
        graphs: true,
        mlock: a.placement.mlock,
    };
    // Prompts are evaluated in batches of at most n_batch rows (the engine's config below).
    let mut request = a.placement.request()?;
    request.batch_rows = a.n_batch();
    let model = LoadedModel::load_offloaded(&reg, &a.model, options, gpu, &request)?;
    tracing::info!("running on {}", model.kernel_plugin());
    let tok = Arc::new(crate::text::tokenizer(&model.file)?);
    let meta = model.file.metadata();
    let text_of = |id: Option<u32>| {
        id.and_then(|i| tok.token_text(i))
            .unwrap_or_default()
            .to_owned()
    };
    let (template, template_source) = match (&a.chat_template, &a.chat_template_file) {
        (Some(t), _) if t == "chatml" => (
            ChatTemplate::new(
                crate::text::CHATML_FALLBACK,
                &text_of(tok.bos()),
                &text_of(tok.eos()),
            )?,
            crate::text::CHATML_FALLBACK.to_owned(),
        ),
        (Some(t), _) if t.contains("{%") || t.contains("{{") => (
            ChatTemplate::new(t, &text_of(tok.bos()), &text_of(tok.eos()))?,
            t.clone(),
        ),
        (Some(t), _) => anyhow::bail!(
            "--chat-template {t:?}: not Jinja source and not a built-in name (built in: chatml)"
        ),
        (None, Some(path)) => {
            let src = std::fs::read_to_string(path)
                .with_context(|| format!("reading --chat-template-file {}", path.display()))?;
            (
                ChatTemplate::new(&src, &text_of(tok.bos()), &text_of(tok.eos()))?,
                src,
            )
        }
        (None, None) => {
            let src = meta
                .get_str("tokenizer.chat_template")
                .map(str::to_owned)
                .unwrap_or_else(|_| crate::text::CHATML_FALLBACK.to_owned());
            (crate::text::chat_template(&model.file, &tok)?, src)
        }
    };
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
    let sampler = SamplerParams {
        temp: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        ..SamplerParams::default()
    };
    let defaults = Defaults {
        sampler,
        seed: u64::try_from(a.seed).ok(),
        n_predict: usize::try_from(a.n_predict).ok(),
    };
    let runtime = Runtime::start(
        model,
        Arc::clone(&tok),
        RuntimeConfig {
            n_ctx_slot: n_ctx_slot as usize,
            n_batch: a.n_batch() as usize,
            cache_ram: a.cache_ram_bytes(),
            queue_depth: a.queue_depth,
            schemajump: !a.no_schemajump,
        },
    )?;
    Ok(Ready {
        tok,
        template,
        template_source,
        jobs: runtime.sender(),
        shared: Arc::clone(runtime.shared()),
        n_ctx_slot: n_ctx_slot as usize,
        n_slots: n_slots as usize,
        model_id: a.alias.clone().unwrap_or_else(|| model_path.clone()),
        model_path,
        model_meta,
        defaults,
    })
}

/// Runs the server until interrupted, with the plugins of `plugin_dir`.
pub fn serve(plugin_dir: &Path, a: &ServeArgs) -> anyhow::Result<()> {
    a.validate()?;
    let reasoning = a.reasoning()?;
    let api_keys = a
        .api_key
        .as_deref()
        .map(|k| {
            k.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let state = Arc::new(AppState {
        args: a.clone(),
        ready: OnceLock::new(),
        reasoning,
        api_keys,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let plugin_dir = plugin_dir.to_owned();
    rt.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", a.host, a.port)
            .parse()
            .with_context(|| format!("--host {} --port {}", a.host, a.port))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        tracing::info!("listening on http://{addr} (loading the model)");
        eprintln!(
            "bloomery: listening on http://{addr}; loading {}",
            a.model.display()
        );
        let loader_state = Arc::clone(&state);
        let args = a.clone();
        let (fail_tx, mut fail_rx) = mpsc::channel::<anyhow::Error>(1);
        tokio::task::spawn_blocking(move || match load(&plugin_dir, &args) {
            Ok(ready) => {
                let _ = loader_state.ready.set(Arc::new(ready));
                eprintln!("bloomery: model loaded; serving");
            }
            Err(e) => {
                let _ = fail_tx.blocking_send(e);
            }
        });
        let app = router(Arc::clone(&state));
        let server = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        tokio::select! {
            r = server => r.context("the HTTP server stopped"),
            Some(e) = fail_rx.recv() => Err(e.context("loading the model")),
        }
    })
}

/// The status and JSON of /health.
pub fn health_body(state: &AppState) -> (StatusCode, Value) {
    match state.ready.get() {
        Some(_) => (StatusCode::OK, json!({"status": "ok"})),
        None => {
            let e = ApiError::unavailable("Loading model");
            (e.status, e.body())
        }
    }
}
