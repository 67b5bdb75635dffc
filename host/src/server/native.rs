//! llama.cpp's own routes: /health, /props, /slots, /metrics, /v1/models, /completion (and
//! /infill), /tokenize, /detokenize, /apply-template.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::gen::{self, collect, native_probs, sse_data, timings};
use super::params::{gen_params, Fields};
use super::{chat, parse_body, AppRef, Ready};
use bloomery_runtime::draft_gate::GateView;
use bloomery_runtime::request::{Event, Finish, GenParams, Request, SlotAction, SlotCommand};
use bloomery_runtime::sampling::MirostatVersion;
use bloomery_runtime::status::SlotView;

/// GET /health.
pub async fn health(State(state): State<AppRef>) -> Response {
    let (status, body) = super::health_body(&state);
    (status, Json(body)).into_response()
}

/// The sampling settings as llama-server lists them under `params`.
fn settings_json(ready: &Ready, p: &GenParams) -> Value {
    let s = &p.sampler;
    json!({
        "n_predict": p.n_predict.map_or(-1, |n| n as i64),
        "seed": s.seed,
        "temperature": s.temp,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "typical_p": s.typ_p,
        "repeat_last_n": s.penalty_last_n.min(i64::MAX as usize),
        "repeat_penalty": s.penalty_repeat,
        "presence_penalty": s.penalty_present,
        "frequency_penalty": s.penalty_freq,
        "min_keep": s.min_keep,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "dry_multiplier": s.dry_multiplier,
        "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": s.dry_penalty_last_n,
        "mirostat": match s.mirostat {
            None => 0,
            Some(MirostatVersion::V1) => 1,
            Some(MirostatVersion::V2) => 2,
        },
        "mirostat_tau": s.mirostat_tau,
        "mirostat_eta": s.mirostat_eta,
        "adaptive_target": s.adaptive_target,
        "adaptive_decay": s.adaptive_decay,
        // llama-server's shape: a negative infinity (a banned token) is JSON's null.
        "logit_bias": s.logit_bias.iter().map(|&(t, b)| json!({"bias": if b.is_finite() { json!(b) } else { Value::Null }, "token": t})).collect::<Vec<_>>(),
        "stop": p.stop,
        "n_probs": p.n_probs,
        "post_sampling_probs": p.post_sampling_probs,
        "ignore_eos": p.ignore_eos,
        "cache_prompt": p.cache_prompt,
        "n_ctx": ready.n_ctx_slot,
        "samplers": s.order.iter().map(|st| st.name()).collect::<Vec<_>>(),
        "speculative.types": ready.spec.names(),
    })
}

fn default_params(ready: &Ready) -> GenParams {
    let mut sampler = ready.defaults.sampler.clone();
    sampler.seed = ready.defaults.seed.unwrap_or(u64::from(u32::MAX));
    if ready.defaults.ignore_eos {
        super::params::ban_eog(&mut sampler, &ready.tok);
    }
    GenParams {
        sampler,
        n_predict: ready.defaults.n_predict,
        stop: ready.defaults.stop.clone(),
        n_probs: 0,
        post_sampling_probs: false,
        return_progress: false,
        ignore_eos: ready.defaults.ignore_eos,
        cache_prompt: true,
        forced: Vec::new(),
        prompt_only: false,
        grammar: None,
        t_max_predict_ms: None,
        preserved: Vec::new(),
        special: ready.defaults.special,
        shift: bloomery_runtime::request::ShiftParams::default(),
        reasoning_budget: None,
    }
}

/// Whether the slots draft (llama-server's `speculative`: a slot with a draft source; schemajump's
/// grammar drafts are not one), as the runtime publishes it: the flags may ask for drafting
/// that the runtime then turns off (no room for the rollback state, say).
fn drafts(views: &[SlotView]) -> bool {
    views.iter().any(|v| v.speculative)
}

/// A slot's drafting gates as `/slots` and `/props` show them (a bloomery field: llama-server
/// has no gate): the chain's last drafter's, with those of the n-gram drafters consulted before
/// it under `first` where there are any; None where drafting is not gated.
fn gates_json(gates: &[GateView]) -> Option<Value> {
    let (last, first) = gates.split_last()?;
    let mut v = gate_json(last);
    if !first.is_empty() {
        v["first"] = first.iter().map(gate_json).collect();
    }
    Some(v)
}

/// One drafter's gate: its type, whether the slot consults it now, how often that changed,
/// and the running averages behind the choice (null until measured).
fn gate_json(g: &GateView) -> Value {
    let ms = |s: Option<f64>| s.map(|s| s * 1e3);
    json!({
        "drafter": g.drafter,
        "drafting": g.on,
        "switches": g.switches,
        "plain_step_ms": ms(g.plain_s),
        "draft_step_ms": ms(g.drafting_s),
        "tokens_per_draft_step": g.kept,
    })
}

/// The published slot views.
fn slot_views(ready: &Ready) -> Result<Vec<SlotView>, ApiError> {
    Ok(ready
        .shared
        .slots
        .lock()
        .map_err(|_| ApiError::internal("slot table poisoned"))?
        .clone())
}

/// GET /props.
pub async fn props(State(state): State<AppRef>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let views = slot_views(&ready)?;
    let mut params = settings_json(&ready, &default_params(&ready));
    // llama-server lists the default grammar's text ("" for none).
    params["grammar"] = json!(ready
        .defaults
        .grammar
        .as_ref()
        .map_or("", |(t, _)| t.as_str()));
    Ok(Json(json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": ready.n_ctx_slot,
            "speculative": drafts(&views),
            "is_processing": false,
            "params": params,
        },
        // Each slot's drafting gate, where drafting is gated (a bloomery field).
        "bloomery_draft_gates": views
            .iter()
            .filter_map(|v| gates_json(&v.gates).map(|g| json!({"id": v.id, "gate": g})))
            .collect::<Vec<_>>(),
        "total_slots": ready.n_slots,
        "model_path": ready.model_path,
        "model_alias": ready.model_id,
        "chat_template": ready.template_source,
        "modalities": {"vision": false, "audio": false},
        "build_info": concat!("b0-bloomery-", env!("CARGO_PKG_VERSION")),
        "is_sleeping": ready.is_sleeping(),
        "ui_settings": state.ui_settings,
    })))
}

/// POST /props, with `--props`: llama-server b11434 answers `{"success": true}` and changes
/// nothing; here too nothing changes, so a body naming a property is refused by name rather
/// than taken and ignored. Without `--props`, llama-server's 501.
pub async fn set_props(State(state): State<AppRef>, body: Bytes) -> Result<Json<Value>, ApiError> {
    if !state.args.props {
        return Err(ApiError::not_supported(
            "This server does not support changing global properties. Start it with `--props`",
        ));
    }
    // llama-server waits for the model here too.
    state.awake().await?;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let Value::Object(fields) = parse_body(&body)? else {
            return Err(ApiError::invalid("POST /props takes a JSON object"));
        };
        if let Some(name) = fields.keys().next() {
            return Err(ApiError::invalid(format!(
                "POST /props cannot change {name:?}: no server property can be changed while it \
                 runs (restart with the flag instead)"
            )));
        }
    }
    Ok(Json(json!({"success": true})))
}

/// GET /slots.
pub async fn slots(
    State(state): State<AppRef>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    if !state.args.endpoint_slots() {
        return Err(ApiError::not_supported(
            "This server does not support slots endpoint (started with --no-slots)",
        ));
    }
    let ready = state.awake().await?;
    // llama-server reads the slots through a task, which counts as activity.
    if let Some(s) = &ready.sleeper {
        s.touch();
    }
    let views = slot_views(&ready)?;
    if q.get("fail_on_no_slot").is_some_and(|v| v != "0") && views.iter().all(|v| v.is_processing) {
        return Err(ApiError::unavailable("no slot available"));
    }
    // As llama-server b11434 shows a slot: the task's fields only while it has one (its
    // `params` are not kept, so not shown).
    Ok(Json(Value::Array(
        views
            .iter()
            .map(|v| {
                let mut slot = json!({
                    "id": v.id,
                    "n_ctx": ready.n_ctx_slot,
                    "speculative": v.speculative,
                    "is_processing": v.is_processing,
                    "n_cached": v.n_cached,
                });
                if let Some(g) = gates_json(&v.gates) {
                    slot["bloomery_draft_gate"] = g;
                }
                if v.is_processing {
                    slot["id_task"] = json!(0);
                    slot["next_token"] = json!([{
                        "has_next_token": true,
                        "has_new_line": false,
                        "n_remain": v.n_remain,
                        "n_decoded": v.n_decoded,
                    }]);
                }
                slot
            })
            .collect(),
    )))
}

/// POST /slots/:id?action=save|restore|erase (save and restore need --slot-save-path; the body's
/// `filename` names a file inside it).
pub async fn slot_action(
    State(state): State<AppRef>,
    Path(id): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    if !state.args.endpoint_slots() {
        return Err(ApiError::not_supported(
            "This server does not support slots endpoint (started with --no-slots)",
        ));
    }
    let ready = state.awake().await?;
    let id: usize = id
        .parse()
        .ok()
        .filter(|&i| i < ready.n_slots)
        .ok_or_else(|| ApiError::invalid(format!("no slot {id} ({} slots)", ready.n_slots)))?;
    let action = q.get("action").map(String::as_str);
    let file = |body: &Bytes| -> Result<(String, std::path::PathBuf), ApiError> {
        let dir = state.args.slot_save_path.as_ref().ok_or_else(|| {
            ApiError::not_supported(
                "This server does not support slots action. Start it with `--slot-save-path`",
            )
        })?;
        let v = parse_body(body)?;
        let f = Fields::of(&v)?;
        let name = f
            .str("filename")?
            .ok_or_else(|| ApiError::invalid("\"filename\" is required"))?;
        let plain =
            !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
        if !plain {
            return Err(ApiError::invalid(format!(
                "invalid filename {name:?}: a plain file name inside --slot-save-path"
            )));
        }
        Ok((name.to_owned(), dir.join(name)))
    };
    let (cmd, filename) = match action {
        Some("save") => {
            let (name, path) = file(&body)?;
            (SlotAction::Save(path), Some(name))
        }
        Some("restore") => {
            let (name, path) = file(&body)?;
            (SlotAction::Restore(path), Some(name))
        }
        Some("erase") => (SlotAction::Erase, None),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "action {other:?}: expected save, restore or erase"
            )))
        }
        None => return Err(ApiError::invalid("missing ?action=save|restore|erase")),
    };
    let kind = match cmd {
        SlotAction::Save(_) => "save",
        SlotAction::Restore(_) => "restore",
        SlotAction::Erase => "erase",
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    ready
        .jobs
        .try_send(Request::Slot(SlotCommand {
            id,
            action: cmd,
            reply: tx,
        }))
        .map_err(|_| ApiError::unavailable("the server is busy; retry later"))?;
    let r = rx
        .await
        .map_err(|_| ApiError::internal("the scheduler dropped the slot action"))?
        .map_err(ApiError::invalid)?;
    Ok(Json(match kind {
        "save" => {
            json!({"id_slot": id, "filename": filename, "n_saved": r.n_tokens, "n_written": r.n_bytes, "timings": {"save_ms": r.ms}})
        }
        "restore" => {
            json!({"id_slot": id, "filename": filename, "n_restored": r.n_tokens, "n_read": r.n_bytes, "timings": {"restore_ms": r.ms}})
        }
        _ => json!({"id_slot": id, "n_erased": r.n_tokens}),
    }))
}

/// POST /residency/reset: forgets the routing counts that move experts onto the card (the
/// placement stays); 501 when the model has no host experts.
pub async fn residency_reset(State(state): State<AppRef>) -> Result<Json<Value>, ApiError> {
    let ready = state.awake().await?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    ready
        .jobs
        .try_send(Request::ResidencyReset(tx))
        .map_err(|_| ApiError::unavailable("the server is busy; retry later"))?;
    let tiered = rx
        .await
        .map_err(|_| ApiError::internal("the scheduler dropped the reset"))?;
    if !tiered {
        return Err(ApiError::not_supported(
            "this model keeps no routed experts in host RAM: there is no residency to reset",
        ));
    }
    Ok(Json(json!({"success": true})))
}

/// GET /v1/models and /models.
pub async fn models(State(state): State<AppRef>) -> Json<Value> {
    let ready = state.ready.get();
    let id = ready.map_or_else(|| state.args.model_id(), |r| r.model_id.clone());
    let meta = ready.map_or(Value::Null, |r| r.model_meta.clone());
    let entry = json!({
        "id": id,
        "aliases": state.args.aliases(),
        "tags": state.args.tags(),
        "object": "model",
        "created": gen::unix_now(),
        "owned_by": "llamacpp",
        "meta": meta,
    });
    Json(json!({
        "object": "list",
        "data": [entry.clone()],
        "models": [{"name": id, "model": id, "type": "model", "description": "", "tags": [], "capabilities": ["completion"]}],
    }))
}

/// A JSON token id, checked against the vocabulary.
pub(crate) fn token_id(ready: &Ready, x: &Value) -> Result<u32, ApiError> {
    let n_vocab = ready.tok.vocab_size();
    x.as_u64()
        .filter(|&i| (i as usize) < n_vocab)
        .map(|i| i as u32)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "token {x} is not an id of the {n_vocab}-token vocabulary"
            ))
        })
}

/// The fewest tokens `text` can give: a prompt that cannot fit a slot's context is refused
/// before it is tokenized.
pub fn fewest_tokens(ready: &Ready, text: &str) -> usize {
    ready
        .tok
        .max_token_bytes()
        .map_or(0, |m| text.len().div_ceil(m))
}

/// A 400 for a prompt known to hold at least `n` tokens, when that cannot fit a slot.
pub fn check_fits(ready: &Ready, at_least: usize) -> Result<(), ApiError> {
    if at_least >= ready.n_ctx_slot {
        return Err(ApiError::exceeds_context_at_least(
            at_least,
            ready.n_ctx_slot,
        ));
    }
    Ok(())
}

/// A native prompt: a string, token ids, a mix of both, or llama-server's JSON prompt object
/// (`{"prompt_string": ...}`).
pub(crate) fn prompt_tokens(ready: &Ready, v: &Value) -> Result<Vec<u32>, ApiError> {
    let encode = |s: &str, first: bool| {
        ready
            .tok
            .encode(s, first, true)
            .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))
    };
    match v {
        Value::String(s) => {
            check_fits(ready, fewest_tokens(ready, s))?;
            encode(s, true)
        }
        Value::Array(items) => {
            let at_least = items
                .iter()
                .map(|x| x.as_str().map_or(1, |s| fewest_tokens(ready, s)))
                .sum();
            if at_least > items.len() {
                check_fits(ready, at_least)?;
            }
            let mut out = Vec::new();
            for (i, x) in items.iter().enumerate() {
                match x {
                    Value::String(s) => out.extend(encode(s, i == 0)?),
                    Value::Number(_) => out.push(token_id(ready, x)?),
                    _ => {
                        return Err(ApiError::invalid(
                            "\"prompt\" items must be strings or token ids",
                        ))
                    }
                }
            }
            Ok(out)
        }
        // llama-server's JSON prompt object; bloomery serves no multimodal model.
        Value::Object(o) => match o.get("prompt_string") {
            _ if o.contains_key("multimodal_data") => Err(ApiError::invalid(
                "Multimodal data provided, but model does not support multimodal requests.",
            )),
            Some(inner @ (Value::String(_) | Value::Array(_))) => prompt_tokens(ready, inner),
            _ => Err(ApiError::invalid(
                "a prompt object needs \"prompt_string\": a string or a list of mixed strings and tokens",
            )),
        },
        _ => Err(ApiError::invalid(
            "\"prompt\" elements must be a string, a list of tokens, a JSON object containing a prompt string, or a list of mixed strings & tokens.",
        )),
    }
}

/// The prompts of a body: one, or several when `prompt` is an array of prompts.
pub fn prompts(ready: &Ready, f: &Fields<'_>) -> Result<Vec<Vec<u32>>, ApiError> {
    let p = f
        .get("prompt")
        .ok_or_else(|| ApiError::invalid("\"prompt\" is required"))?;
    // As llama-server: an array with no token id at its top level is a list of prompts.
    match p {
        Value::Array(items) if !items.is_empty() && !items.iter().any(Value::is_number) => {
            items.iter().map(|x| prompt_tokens(ready, x)).collect()
        }
        _ => Ok(vec![prompt_tokens(ready, p)?]),
    }
}

/// The slot a request asks for (`id_slot`; negative: any), or a 400 when there is no such
/// slot.
pub fn id_slot(f: &Fields<'_>, n_slots: usize) -> Result<Option<usize>, ApiError> {
    match f.i64("id_slot")?.map(usize::try_from) {
        None | Some(Err(_)) => Ok(None),
        Some(Ok(id)) if id < n_slots => Ok(Some(id)),
        Some(Ok(id)) => Err(ApiError::invalid(format!(
            "id_slot {id} does not exist: this server has {n_slots} slots (0 to {})",
            n_slots - 1
        ))),
    }
}

/// Keeps only `response_fields` (paths like `generation_settings/n_predict`, unnested).
fn filter_fields(v: Value, fields: &[String]) -> Value {
    if fields.is_empty() {
        return v;
    }
    let mut out = Map::new();
    for f in fields {
        let mut cur = &v;
        let mut found = true;
        for part in f.split('/') {
            match cur.get(part) {
                Some(x) => cur = x,
                None => {
                    found = false;
                    break;
                }
            }
        }
        if found {
            out.insert(f.clone(), cur.clone());
        }
    }
    Value::Object(out)
}

/// The final native object of a finished generation.
pub fn final_json(
    ready: &Ready,
    params: &GenParams,
    prompt: &[u32],
    out: &gen::Outcome,
    return_tokens: bool,
) -> Value {
    let f = &out.finish;
    let mut v = json!({
        "index": 0,
        "content": out.text,
        "tokens": if return_tokens { out.pieces.iter().map(|p| p.id).collect::<Vec<_>>() } else { vec![] },
        "id_slot": f.id_slot,
        "stop": true,
        "model": ready.model_id,
        "tokens_predicted": f.n_predicted,
        "tokens_evaluated": f.n_prompt,
        "generation_settings": settings_json(ready, params),
        "prompt": ready.tok.decode(prompt, true),
        "has_new_line": out.text.contains('\n'),
        "truncated": f.truncated,
        "stop_type": f.stop_type.name(),
        "stopping_word": f.stopping_word,
        "tokens_cached": f.n_cached + f.n_predicted,
        "timings": timings(f),
    });
    if params.n_probs > 0 {
        v["completion_probabilities"] =
            native_probs(&ready.tok, ready.defaults.special, &out.pieces);
    }
    v
}

/// POST /completion: the native completion, streamed or not.
pub async fn completion(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let (body, prompts) = body_and_prompts(&state, &ready, body).await?;
    run_native(ready, &Fields::of(&body)?, prompts).await
}

/// A completion body parsed and its prompts tokenized, off the HTTP threads; the request's
/// `prompt` goes to `--log-prompts-dir` (/completion and /v1/completions).
pub(crate) async fn body_and_prompts(
    state: &super::AppState,
    ready: &Arc<Ready>,
    body: Bytes,
) -> Result<(Value, Vec<Vec<u32>>), ApiError> {
    let r = Arc::clone(ready);
    let dir = state.args.log_prompts_dir.clone();
    state
        .cpu
        .run(move || {
            let body = parse_body(&body)?;
            let prompts = prompts(&r, &Fields::of(&body)?)?;
            if let Some(p) = body.get("prompt") {
                super::prompt_log::write(dir.as_deref(), super::prompt_log::Logged::Json(p));
            }
            Ok((body, prompts))
        })
        .await
}

async fn run_native(
    ready: Arc<Ready>,
    f: &Fields<'_>,
    prompts: Vec<Vec<u32>>,
) -> Result<Response, ApiError> {
    // At most every token of the vocabulary, as llama-server caps it.
    let n_vocab = ready.tok.vocab_size() as i64;
    let n_probs = f.i64("n_probs")?.unwrap_or(0).clamp(0, n_vocab) as usize;
    let mut params = gen_params(f, &ready.defaults, n_probs)?;
    super::budget::for_completion(f, &ready.defaults.budget, &ready.tok, &mut params)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let return_tokens = f.bool("return_tokens")?.unwrap_or(false);
    let fields = f.strings("response_fields")?;
    let slot = id_slot(f, ready.n_slots)?;
    // Each prompt `n_cmpl` times, in prompt order (llama-server's task indices).
    let n = gen::n_cmpl(f, ready.n_slots)?;
    let mut receivers = Vec::new();
    for p in &prompts {
        for rx in gen::submit_n(&ready, p, &params, slot, n)? {
            receivers.push((p.clone(), rx));
        }
    }
    let ping = gen::sse_ping(f, &ready)?;
    if stream {
        let timings_per_token = f.bool("timings_per_token")?.unwrap_or(false);
        return Ok(native_stream(
            ready,
            params,
            receivers,
            timings_per_token,
            ping,
        ));
    }
    let mut results = Vec::new();
    for (i, (prompt, rx)) in receivers.into_iter().enumerate() {
        let out = collect(rx).await?;
        let mut v = final_json(&ready, &params, &prompt, &out, return_tokens);
        v["index"] = json!(i);
        results.push(filter_fields(v, &fields));
    }
    Ok(if results.len() == 1 {
        Json(results.remove(0)).into_response()
    } else {
        Json(Value::Array(results)).into_response()
    })
}

/// The native stream: a partial chunk per token, then the full object with `stop: true`, for
/// each completion (prompts times `n_cmpl`), interleaved as they come, each chunk with its
/// completion's `index`, as llama-server streams its tasks.
fn native_stream(
    ready: Arc<Ready>,
    params: GenParams,
    receivers: Vec<(Vec<u32>, gen::Events)>,
    timings_per_token: bool,
    ping: Option<std::time::Duration>,
) -> Response {
    /// One completion's stream so far.
    struct One {
        prompt: Vec<u32>,
        text: String,
        pieces: Vec<bloomery_runtime::request::Piece>,
        id_slot: usize,
    }
    let (all, receivers): (Vec<One>, Vec<gen::Events>) = receivers
        .into_iter()
        .map(|(prompt, rx)| {
            let one = One {
                prompt,
                text: String::new(),
                pieces: Vec::new(),
                id_slot: 0,
            };
            (one, rx)
        })
        .unzip();
    gen::event_streams(
        receivers,
        ping,
        all,
        Vec::new(),
        b"",
        move |all, i, ev, out| {
            let st = &mut all[i];
            match ev {
                Event::Started { id_slot, .. } => {
                    st.id_slot = id_slot;
                    false
                }
                Event::PromptProgress(pp) => {
                    let mut chunk = json!({
                        "index": i,
                        "content": "",
                        "tokens": [],
                        "stop": false,
                        "id_slot": st.id_slot,
                        "tokens_predicted": 0,
                        "tokens_evaluated": st.prompt.len(),
                        "prompt_progress": gen::prompt_progress(&pp),
                    });
                    if timings_per_token {
                        chunk["timings"] = gen::prompt_progress_timings(&pp);
                    }
                    out.extend_from_slice(&sse_data(&chunk));
                    false
                }
                Event::Token(p) => {
                    st.text.push_str(&p.text);
                    let mut chunk = json!({
                        "index": i,
                        "content": p.text,
                        "tokens": [p.id],
                        "stop": false,
                        "id_slot": st.id_slot,
                        "tokens_predicted": st.pieces.len() + 1,
                        "tokens_evaluated": st.prompt.len(),
                    });
                    if params.n_probs > 0 {
                        chunk["completion_probabilities"] = native_probs(
                            &ready.tok,
                            ready.defaults.special,
                            std::slice::from_ref(&p),
                        );
                    }
                    if timings_per_token {
                        chunk["timings"] = gen::progress_timings(&p.so_far);
                    }
                    st.pieces.push(p);
                    out.extend_from_slice(&sse_data(&chunk));
                    false
                }
                Event::Done(finish) => {
                    let done = gen::Outcome {
                        text: std::mem::take(&mut st.text),
                        pieces: std::mem::take(&mut st.pieces),
                        finish,
                    };
                    let mut v = final_json(&ready, &params, &st.prompt, &done, false);
                    v["content"] = json!("");
                    v["index"] = json!(i);
                    out.extend_from_slice(&sse_data(&v));
                    true
                }
                Event::Embedded(_) | Event::Decided(_) => super::gen::stream_not_a_generation(out),
                Event::Failed(failure) => {
                    out.extend_from_slice(&sse_data(&ApiError::from(failure).body()));
                    true
                }
            }
        },
    )
}

/// POST /infill: fill-in-the-middle for models with FIM tokens ([`super::infill`]).
pub async fn infill(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let r = Arc::clone(&ready);
    let a = &state.args;
    let lim = super::infill::Limits {
        n_batch: i64::from(a.batch_size),
        n_predict: a.n_predict,
        n_ctx: ready.n_ctx_slot as i64,
        spm: a.spm_infill,
    };
    let dir = a.log_prompts_dir.clone();
    let (body, prompt) = state
        .cpu
        .run(move || {
            let body = parse_body(&body)?;
            let prompt = super::infill::prompt(&r, &body, &lim)?;
            super::prompt_log::write(dir.as_deref(), super::prompt_log::Logged::Ids(&prompt));
            Ok((body, prompt))
        })
        .await?;
    run_native(ready, &Fields::of(&body)?, vec![prompt]).await
}

/// POST /tokenize.
pub async fn tokenize(State(state): State<AppRef>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let ready = state.awake().await?;
    state.cpu.run(move || tokenize_body(&ready, &body)).await
}

fn tokenize_body(ready: &Ready, body: &[u8]) -> Result<Json<Value>, ApiError> {
    let body = parse_body(body)?;
    let f = Fields::of(&body)?;
    let content = f.str("content")?.unwrap_or("");
    let add_special = f.bool("add_special")?.unwrap_or(false);
    let parse_special = f.bool("parse_special")?.unwrap_or(true);
    let with_pieces = f.bool("with_pieces")?.unwrap_or(false);
    let ids = ready
        .tok
        .encode(content, add_special, parse_special)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if !with_pieces {
        return Ok(Json(json!({ "tokens": ids })));
    }
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = ready.tok.token_to_piece(id, true);
            let piece = match std::str::from_utf8(bytes) {
                Ok(s) => json!(s),
                Err(_) => json!(bytes),
            };
            json!({"id": id, "piece": piece})
        })
        .collect();
    Ok(Json(json!({ "tokens": tokens })))
}

/// POST /detokenize.
pub async fn detokenize(State(state): State<AppRef>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let ready = state.awake().await?;
    state.cpu.run(move || detokenize_body(&ready, &body)).await
}

fn detokenize_body(ready: &Ready, body: &[u8]) -> Result<Json<Value>, ApiError> {
    let body = parse_body(body)?;
    let f = Fields::of(&body)?;
    let ids: Vec<u32> = match f.get("tokens") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| token_id(ready, x))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "\"tokens\" must be an array of token ids",
            ))
        }
    };
    Ok(Json(json!({ "content": ready.tok.decode(&ids, true) })))
}

/// POST /apply-template.
pub async fn apply_template(
    State(state): State<AppRef>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let ready = state.awake().await?;
    let st = Arc::clone(&state);
    state
        .cpu
        .run(move || {
            let body = parse_body(&body)?;
            let f = Fields::of(&body)?;
            let messages = chat::openai_messages(f.get("messages").unwrap_or(&Value::Null))?;
            // The prompt a chat request would run (tools a template never renders included).
            let job =
                super::openai::prepare_chat(&st, &ready, &f, &messages, f.get("tools"), false)?;
            Ok(Json(json!({ "prompt": job.prompt.text })))
        })
        .await
}

/// Finish details shared by the OpenAI and Anthropic shapes.
pub fn finish_reason(f: &Finish, tool_calls: bool) -> &'static str {
    if tool_calls {
        return "tool_calls";
    }
    match f.stop_type {
        bloomery_runtime::request::StopType::Limit => "length",
        _ => "stop",
    }
}

/// 200 with JSON.
pub fn ok(v: Value) -> Response {
    (StatusCode::OK, Json(v)).into_response()
}
