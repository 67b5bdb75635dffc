//! OpenAI routes: /v1/chat/completions, /v1/completions and /v1/responses (served as a chat),
//! streamed in OpenAI's chunk order or answered whole.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};

use super::chat::{self, ChatPrompt, Delta, DeltaSplitter, OfferedTools};
use super::chat_continue;
use super::control::Live;
use super::error::ApiError;
use super::gen::{
    collect, collect_all, event_stream, event_streams, n_cmpl, openai_logprobs, progress_timings,
    prompt_progress, prompt_progress_timings, random_id, sse_data, submit, submit_n, timings,
    unix_now, Outcome,
};
use super::native::{check_fits, fewest_tokens, final_json, finish_reason, id_slot, ok};
use super::params::{gen_params, Fields, I32_MAX};
use super::structured;
use super::tool_generic;
use super::tool_parse::ToolCall;
use super::tools::ToolFormat;
use super::{parse_body, AppRef, AppState, Ready};
use crate::flags::serve::{parse_reasoning, ReasoningFormat};
use bloomery_runtime::request::{Event, Finish, GenParams, Piece};

const FINGERPRINT: &str = concat!("b0-bloomery-", env!("CARGO_PKG_VERSION"));

/// `usage` of a finished request.
fn usage(f: &Finish) -> Value {
    json!({
        "completion_tokens": f.n_predicted,
        "prompt_tokens": f.n_prompt,
        "total_tokens": f.n_prompt + f.n_predicted,
        "prompt_tokens_details": {"cached_tokens": f.n_cached},
    })
}

/// A chat request made ready to run.
pub struct ChatJob {
    /// The rendered prompt.
    pub prompt: ChatPrompt,
    /// The tools offered and the template's call format (tool calls are parsed only then).
    pub tools: Option<OfferedTools>,
    /// How thinking comes back.
    pub reasoning: ReasoningFormat,
}

impl ChatJob {
    /// Whether the template writes thinking spans, and whether the prompt ends inside one (what
    /// a reasoning budget needs).
    pub fn thinking(&self, ready: &super::Ready) -> (bool, bool) {
        (
            ready.builtin.is_none() && super::budget::template_thinks(&ready.template_source),
            self.prompt.starts_in_thinking,
        )
    }
}

/// Renders a chat from OpenAI-shaped `messages` and `tools` with the request's template options.
/// With `to_run`, a prompt whose text cannot fit a slot is refused before it is tokenized (a
/// count of tokens has no such limit), and the rendering goes to `--log-prompts-dir`.
pub fn prepare_chat(
    state: &AppState,
    ready: &Ready,
    f: &Fields<'_>,
    messages: &Value,
    tools: Option<&Value>,
    to_run: bool,
) -> Result<ChatJob, ApiError> {
    let job = render_chat(state, ready, f, messages, tools, to_run)?;
    if to_run {
        let text = super::prompt_log::Logged::Text(&job.prompt.text);
        super::prompt_log::write(state.args.log_prompts_dir.as_deref(), text);
    }
    Ok(job)
}

/// [`prepare_chat`]'s rendering.
fn render_chat(
    state: &AppState,
    ready: &Ready,
    f: &Fields<'_>,
    messages: &Value,
    tools: Option<&Value>,
    to_run: bool,
) -> Result<ChatJob, ApiError> {
    // `tool_choice: "none"`: no tools offered to the template, none parsed from the answer.
    let offered = match f.get("tool_choice") {
        Some(Value::String(s)) => s != "none",
        Some(choice) => choice.get("type").and_then(Value::as_str) != Some("none"),
        None => true,
    };
    if ready.builtin.is_some() {
        super::template::refuse_tools(f)?;
    }
    let (continuation, add_generation_prompt) =
        chat_continue::requested(f, state.args.prefill_assistant(), messages)?;
    if let Some(b) = ready.builtin {
        return builtin_chat(state, ready, f, b, messages, add_generation_prompt, to_run);
    }
    let joined;
    let messages = match continuation {
        Some(_) => {
            let raw = f
                .get("messages")
                .and_then(Value::as_array)
                .and_then(|m| m.last());
            joined = chat_continue::with_parts_joined(messages, raw)?;
            &joined
        }
        None => messages,
    };
    let tools = chat::tools(tools)?.filter(|_| offered);
    // A template that never reads `tools` would drop them without a word: they are described
    // in the system message instead, and the reply is a JSON object of calls or an answer.
    let offers_tools = tools
        .and_then(Value::as_array)
        .is_some_and(|list| !list.is_empty());
    let generic = offers_tools && !tool_generic::renders_tools(&ready.template_source);
    let described;
    let messages = match tools {
        Some(list) if generic => {
            let choice = super::tools::choice(f)?;
            let parallel = super::tools::parallel(f)?;
            described = tool_generic::with_tools_described(messages, list, &choice, parallel)?;
            &described
        }
        _ => messages,
    };
    let format = if generic {
        Some(ToolFormat::GenericJson)
    } else {
        ToolFormat::of_template(&ready.template_source)
    };
    // Checked at start (`ServeArgs::validate`).
    let kwargs = chat::template_kwargs(f, state.args.template_kwargs().unwrap_or_default())?;
    let reasoning = match f.str("reasoning_format")? {
        Some(v) => parse_reasoning(v).map_err(|e| ApiError::invalid(e.to_string()))?,
        None => state.reasoning,
    };
    // Checked at start (`ServeArgs::validate`).
    let enable_thinking = state.args.enable_thinking().unwrap_or(true);
    let prompt = chat::render(
        &ready.template,
        &ready.tok,
        messages,
        tools,
        &kwargs,
        chat::RenderSwitches {
            enable_thinking,
            reasoning_effort: state.args.reasoning_effort(),
            add_generation_prompt,
            continuation,
            caps: &ready.template_caps,
        },
        |text| {
            if to_run {
                check_fits(ready, fewest_tokens(ready, text))
            } else {
                Ok(())
            }
        },
    )?;
    Ok(ChatJob {
        prompt,
        tools: tools.map(|list| OfferedTools {
            list: list.clone(),
            format,
        }),
        reasoning,
    })
}

/// A chat rendered in llama.cpp's built-in template (`--no-jinja`), as llama-server's legacy
/// path renders it: roles and texts only, a continued final message written whole (the legacy
/// path has no continuation), `chat_template_kwargs` checked and unused, no reasoning parsed.
fn builtin_chat(
    state: &AppState,
    ready: &Ready,
    f: &Fields<'_>,
    b: bloomery_text::builtin::Builtin,
    messages: &Value,
    add_generation_prompt: bool,
    to_run: bool,
) -> Result<ChatJob, ApiError> {
    chat::template_kwargs(f, state.args.template_kwargs().unwrap_or_default())?;
    if let Some(v) = f.str("reasoning_format")? {
        parse_reasoning(v).map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    let raw = f.get("messages");
    let text = super::template::builtin_prompt(b, messages, raw, add_generation_prompt);
    if to_run {
        check_fits(ready, fewest_tokens(ready, &text))?;
    }
    let tokens = ready
        .tok
        .encode(&text, true, true)
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?;
    Ok(ChatJob {
        prompt: ChatPrompt {
            tokens,
            text,
            starts_in_thinking: false,
            may_open_thinking: false,
        },
        tools: None,
        reasoning: ReasoningFormat::None,
    })
}

/// A call's id: the one the model wrote (Solar), else a new one.
fn call_id(c: &ToolCall) -> String {
    c.id.clone().unwrap_or_else(|| random_id("call_"))
}

fn tool_calls_json(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                json!({
                    "id": call_id(c),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect(),
    )
}

/// POST /v1/chat/completions/input_tokens: the prompt tokens the chat would take.
pub async fn chat_input_tokens(
    State(state): State<AppRef>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let st = Arc::clone(&state);
    state
        .cpu
        .run(move || {
            let body = parse_body(&body)?;
            let f = Fields::of(&body)?;
            let messages = chat::openai_messages(f.get("messages").unwrap_or(&Value::Null))?;
            let job = prepare_chat(&st, &ready, &f, &messages, f.get("tools"), false)?;
            Ok(input_tokens(job.prompt.tokens.len()))
        })
        .await
}

/// POST /v1/responses/input_tokens: the prompt tokens a Responses request would take.
pub async fn responses_input_tokens(
    State(state): State<AppRef>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let st = Arc::clone(&state);
    state
        .cpu
        .run(move || {
            let body = parse_body(&body)?;
            let f = Fields::of(&body)?;
            let messages = responses_messages(&f)?;
            let job = prepare_chat(&st, &ready, &f, &messages, None, false)?;
            Ok(input_tokens(job.prompt.tokens.len()))
        })
        .await
}

/// The OpenAI routes' token count, as llama-server answers it.
fn input_tokens(n: usize) -> Response {
    ok(json!({ "input_tokens": n, "object": "response.input_tokens" }))
}

/// POST /v1/chat/completions.
pub async fn chat(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let (st, r) = (Arc::clone(&state), Arc::clone(&ready));
    let (body, job) = state
        .cpu
        .run(move || {
            let body = parse_body(&body)?;
            let f = Fields::of(&body)?;
            let messages = chat::openai_messages(f.get("messages").unwrap_or(&Value::Null))?;
            let job = prepare_chat(&st, &r, &f, &messages, f.get("tools"), true)?;
            Ok((body, job))
        })
        .await?;
    let f = Fields::of(&body)?;
    let n_probs = if f.bool("logprobs")?.unwrap_or(false) {
        f.i64("top_logprobs")?.unwrap_or(1).clamp(1, 20) as usize
    } else {
        0
    };
    let mut params = gen_params(&f, &ready.defaults, n_probs)?;
    structured::for_chat(&f, &mut params, job.tools.as_ref(), &job.prompt, &ready.tok)?;
    let switch = super::budget::for_openai_chat(
        &f,
        &ready.defaults.budget,
        &ready.tok,
        job.thinking(&ready),
        &mut params,
    )?;
    let model = f
        .str("model")?
        .map_or_else(|| ready.model_id.clone(), str::to_owned);
    let slot = id_slot(&f, ready.n_slots)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let n = n_cmpl(&f, ready.n_slots)?;
    let ping = super::gen::sse_ping(&f, &ready)?;
    let verbose = Verbose::of(&state, &f, &params, &job.prompt.tokens)?;
    // The completion's id, known to /v1/chat/completions/control while it runs.
    let live = state.running.enter(random_id("chatcmpl-"), switch);
    let receivers = submit_n(&ready, &job.prompt.tokens, &params, slot, n)?;
    if stream {
        let usage = include_usage(&f)?;
        let per_token = f.bool("timings_per_token")?.unwrap_or(false);
        return Ok(chat_stream(
            ready,
            job,
            model,
            receivers,
            Framing {
                logprobs: n_probs > 0,
                include_usage: usage,
                timings_per_token: per_token,
                ping,
                verbose,
            },
            live,
        ));
    }
    let outs = collect_all(receivers).await?;
    let choices: Vec<Value> = outs
        .iter()
        .enumerate()
        .map(|(i, out)| chat_choice(&ready, &job, out, n_probs > 0, i))
        .collect();
    let first = &outs[0].finish;
    let mut answer = json!({
        "choices": choices,
        "created": unix_now(),
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "object": "chat.completion",
        "usage": usage(first),
        "id": live.id(),
        "timings": timings(first),
    });
    if let Some(v) = &verbose {
        answer["__verbose"] = v.finished(&ready, &outs[0]);
    }
    Ok(ok(answer))
}

/// One choice of a chat answer: the message parsed from the text, the finish reason and
/// (with `logprobs`) the probabilities.
fn chat_choice(ready: &Ready, job: &ChatJob, out: &Outcome, logprobs: bool, index: usize) -> Value {
    let parsed = chat::parse(
        &out.text,
        job.prompt.starts_in_thinking,
        job.reasoning,
        job.tools.as_ref(),
    );
    let mut message = json!({
        "role": "assistant",
        "content": if parsed.content.is_empty() && !parsed.tool_calls.is_empty() { Value::Null } else { json!(parsed.content) },
    });
    if let Some(r) = &parsed.reasoning {
        message["reasoning_content"] = json!(r);
    }
    if !parsed.tool_calls.is_empty() {
        message["tool_calls"] = tool_calls_json(&parsed.tool_calls);
    }
    let mut choice = json!({
        "finish_reason": finish_reason(&out.finish, !parsed.tool_calls.is_empty()),
        "index": index,
        "message": message,
    });
    if logprobs {
        choice["logprobs"] = openai_logprobs(&ready.tok, ready.defaults.special, &out.pieces);
    }
    choice
}

/// `stream_options.include_usage` (false when absent, as in llama-server).
fn include_usage(f: &Fields<'_>) -> Result<bool, ApiError> {
    match f.get("stream_options") {
        None => Ok(false),
        Some(Value::Object(o)) => Ok(Fields(o).bool("include_usage")?.unwrap_or(false)),
        Some(_) => Err(ApiError::invalid("\"stream_options\" must be an object")),
    }
}

/// The chat stream: role chunk, deltas, finish chunk, the usage chunk when `include_usage`
/// asks for it, for each choice (`n`), interleaved as they come, each chunk with its choice's
/// `index`, as llama-server streams its tasks; then `[DONE]`. A choice's last chunk carries
/// its timings.
/// How a streamed OpenAI answer is framed: the request's switches and its keep-alive.
struct Framing {
    /// Each token's `logprobs`.
    logprobs: bool,
    /// A last chunk with the usage (`stream_options.include_usage`).
    include_usage: bool,
    /// `timings` in every chunk.
    timings_per_token: bool,
    /// The keep-alive comment's interval ([`super::gen::sse_ping`]).
    ping: Option<std::time::Duration>,
    /// With the request's `verbose`: what the `__verbose` debug object needs.
    verbose: Option<Arc<Verbose>>,
}

/// What llama-server's `__verbose` debug object (the request's `verbose`, or `-v`) is made of:
/// the native answer ([`final_json`]) of the request's parameters and prompt.
struct Verbose {
    params: GenParams,
    prompt: Vec<u32>,
}

impl Verbose {
    /// The request's `verbose` (default: `-v`), and what it needs when on.
    fn of(
        state: &AppState,
        f: &Fields<'_>,
        params: &GenParams,
        prompt: &[u32],
    ) -> Result<Option<Arc<Verbose>>, ApiError> {
        let on = f.bool("verbose")?.unwrap_or(state.debug_answers);
        Ok(on.then(|| {
            Arc::new(Verbose {
                params: params.clone(),
                prompt: prompt.to_vec(),
            })
        }))
    }

    /// The final native object of `out` (streamed: its text and tokens went out already, so
    /// they are empty, as llama-server's).
    fn finished(&self, ready: &Ready, out: &Outcome) -> Value {
        final_json(ready, &self.params, &self.prompt, out, true)
    }

    /// A streamed token's native object (llama-server's partial result).
    fn partial(index: usize, id_slot: Option<usize>, p: &Piece) -> Value {
        json!({
            "index": index,
            "content": p.text,
            "tokens": [p.id],
            "stop": false,
            "id_slot": id_slot.map_or(-1, |s| s as i64),
            "tokens_predicted": p.so_far.n_predicted,
            "tokens_evaluated": p.so_far.n_prompt,
        })
    }
}

/// The end of a streamed generation as a `__verbose` object takes it: no text or tokens.
fn streamed_outcome(f: &Finish) -> Outcome {
    Outcome {
        text: String::new(),
        pieces: Vec::new(),
        finish: f.clone(),
    }
}

fn chat_stream(
    ready: Arc<Ready>,
    job: ChatJob,
    model: String,
    receivers: Vec<super::gen::Events>,
    framing: Framing,
    live: Live,
) -> Response {
    let Framing {
        logprobs,
        include_usage,
        timings_per_token,
        ping,
        verbose,
    } = framing;
    /// One choice's stream so far.
    struct Choice {
        split: DeltaSplitter,
        /// Tool calls streamed so far.
        calls: usize,
    }
    impl Choice {
        /// A part's `delta` objects: a tool call is its id and name, then its arguments.
        fn deltas(&mut self, d: &Delta) -> Vec<Value> {
            match d {
                Delta::Content(c) => vec![json!({ "content": c })],
                Delta::Reasoning(r) => vec![json!({ "reasoning_content": r })],
                Delta::Call(c) => {
                    let index = self.calls;
                    self.calls += 1;
                    vec![
                        json!({"tool_calls": [{"index": index, "id": call_id(c), "type": "function",
                            "function": {"name": c.name, "arguments": ""}}]}),
                        json!({"tool_calls": [{"index": index, "function": {"arguments": c.arguments}}]}),
                    ]
                }
            }
        }
    }
    struct St {
        ready: Arc<Ready>,
        head: Value,
        choices: Vec<Choice>,
        /// Ends the completion's entry for /v1/chat/completions/control with the stream.
        _live: Live,
    }
    impl St {
        /// One `chat.completion.chunk` frame with these choices (and timings, when given).
        fn chunk(&self, out: &mut Vec<u8>, choices: Value, timings: Option<Value>) {
            let mut c = self.head.clone();
            c["choices"] = choices;
            if let Some(t) = timings {
                c["timings"] = t;
            }
            out.extend_from_slice(&sse_data(&c));
        }
    }
    let head = json!({
        "id": live.id(),
        "created": unix_now(),
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "object": "chat.completion.chunk",
    });
    let choices = (0..receivers.len())
        .map(|_| Choice {
            split: DeltaSplitter::new(
                job.prompt.starts_in_thinking,
                job.reasoning,
                job.tools.clone(),
            ),
            calls: 0,
        })
        .collect();
    let st = St {
        ready,
        head,
        choices,
        _live: live,
    };
    let mut prelude = Vec::new();
    for i in 0..receivers.len() {
        st.chunk(
            &mut prelude,
            json!([{"finish_reason": null, "index": i, "delta": {"role": "assistant", "content": null}}]),
            None,
        );
    }
    let done: &[u8] = b"data: [DONE]\n\n";
    event_streams(
        receivers,
        ping,
        st,
        prelude,
        done,
        move |st, i, ev, out| match ev {
            Event::Started { .. } => false,
            Event::PromptProgress(pp) => {
                // As llama-server: a role delta that carries the progress.
                let mut c = st.head.clone();
                c["choices"] = json!([{"finish_reason": null, "index": i, "delta": {"role": "assistant", "content": null}}]);
                if timings_per_token {
                    c["timings"] = prompt_progress_timings(&pp);
                }
                c["prompt_progress"] = prompt_progress(&pp);
                out.extend_from_slice(&sse_data(&c));
                false
            }
            Event::Token(p) => {
                let choice = &mut st.choices[i];
                let parts = choice.split.push(&p.text);
                let deltas: Vec<Value> = parts.iter().flat_map(|d| choice.deltas(d)).collect();
                let last = deltas.len().saturating_sub(1);
                for (j, delta) in deltas.into_iter().enumerate() {
                    let mut c = json!({"finish_reason": null, "index": i, "delta": delta});
                    if logprobs && j == 0 {
                        c["logprobs"] = openai_logprobs(
                            &st.ready.tok,
                            st.ready.defaults.special,
                            std::slice::from_ref(&p),
                        );
                    }
                    // As llama-server: the token's last chunk carries the timings so far.
                    let timings =
                        (timings_per_token && j == last).then(|| progress_timings(&p.so_far));
                    st.chunk(out, json!([c]), timings);
                }
                false
            }
            Event::Done(f) => {
                let choice = &mut st.choices[i];
                let parts = choice.split.finish();
                let deltas: Vec<Value> = parts.iter().flat_map(|d| choice.deltas(d)).collect();
                let called = choice.split.called();
                for delta in deltas {
                    st.chunk(
                        out,
                        json!([{"finish_reason": null, "index": i, "delta": delta}]),
                        None,
                    );
                }
                let mut last = st.head.clone();
                last["choices"] =
                    json!([{"finish_reason": finish_reason(&f, called), "index": i, "delta": {}}]);
                // As llama-server: the final result's first chunk carries `__verbose`.
                if let Some(v) = &verbose {
                    last["__verbose"] = v.finished(&st.ready, &streamed_outcome(&f));
                }
                if include_usage {
                    out.extend_from_slice(&sse_data(&last));
                    last = st.head.clone();
                    last["choices"] = json!([]);
                    last["usage"] = usage(&f);
                }
                last["timings"] = timings(&f);
                out.extend_from_slice(&sse_data(&last));
                true
            }
            Event::Embedded(_) | Event::Decided(_) => super::gen::stream_not_a_generation(out),
            Event::Failed(failure) => {
                out.extend_from_slice(&sse_data(&ApiError::from(failure).body()));
                true
            }
        },
    )
}

/// POST /v1/completions.
pub async fn completions(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let (body, mut prompts) = super::native::body_and_prompts(&state, &ready, body).await?;
    let f = Fields::of(&body)?;
    if prompts.len() != 1 {
        return Err(ApiError::invalid("/v1/completions takes one prompt"));
    }
    let prompt = prompts.remove(0);
    let n_probs = f.i64("logprobs")?.unwrap_or(0).clamp(0, 20) as usize;
    let mut params = gen_params(&f, &ready.defaults, n_probs)?;
    super::budget::for_completion(&f, &ready.defaults.budget, &ready.tok, &mut params)?;
    let model = f
        .str("model")?
        .map_or_else(|| ready.model_id.clone(), str::to_owned);
    let stream = f.bool("stream")?.unwrap_or(false);
    let n = n_cmpl(&f, ready.n_slots)?;
    let slot = id_slot(&f, ready.n_slots)?;
    let ping = super::gen::sse_ping(&f, &ready)?;
    let verbose = Verbose::of(&state, &f, &params, &prompt)?;
    let receivers = submit_n(&ready, &prompt, &params, slot, n)?;
    let id = random_id("cmpl-");
    if stream {
        let per_token = f.bool("timings_per_token")?.unwrap_or(false);
        return Ok(completions_stream(
            ready,
            id,
            model,
            receivers,
            Framing {
                logprobs: n_probs > 0,
                include_usage: false,
                timings_per_token: per_token,
                ping,
                verbose,
            },
        ));
    }
    let outs = collect_all(receivers).await?;
    let choices: Vec<Value> = outs
        .iter()
        .enumerate()
        .map(|(i, out)| {
            json!({
                "text": out.text,
                "index": i,
                "logprobs": if n_probs > 0 { openai_logprobs(&ready.tok, ready.defaults.special, &out.pieces) } else { Value::Null },
                "finish_reason": finish_reason(&out.finish, false),
            })
        })
        .collect();
    let first = &outs[0].finish;
    let mut answer = json!({
        "choices": choices,
        "created": unix_now(),
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "object": "text_completion",
        "usage": usage(first),
        "id": id,
        "timings": timings(first),
    });
    if let Some(v) = &verbose {
        answer["__verbose"] = v.finished(&ready, &outs[0]);
    }
    Ok(ok(answer))
}

/// The text completion stream: a chunk per token and a finish chunk with the usage for each
/// choice (`n`), interleaved as they come, each with its choice's `index`; then `[DONE]`.
fn completions_stream(
    ready: Arc<Ready>,
    id: String,
    model: String,
    receivers: Vec<super::gen::Events>,
    framing: Framing,
) -> Response {
    let Framing {
        logprobs,
        timings_per_token,
        ping,
        verbose,
        ..
    } = framing;
    let head = json!({"id": id, "created": unix_now(), "model": model, "system_fingerprint": FINGERPRINT, "object": "text_completion"});
    let done: &[u8] = b"data: [DONE]\n\n";
    // Each choice's slot, once started (a token's `__verbose` names it).
    let slots = vec![None; receivers.len()];
    event_streams(
        receivers,
        ping,
        slots,
        Vec::new(),
        done,
        move |slots, i, ev, out| {
            let mut c = head.clone();
            match ev {
                Event::Started { id_slot, .. } => {
                    slots[i] = Some(id_slot);
                    false
                }
                Event::PromptProgress(pp) => {
                    c["choices"] =
                        json!([{"text": "", "index": i, "logprobs": null, "finish_reason": null}]);
                    if timings_per_token {
                        c["timings"] = prompt_progress_timings(&pp);
                    }
                    c["prompt_progress"] = prompt_progress(&pp);
                    out.extend_from_slice(&sse_data(&c));
                    false
                }
                Event::Token(p) => {
                    let lp = if logprobs {
                        openai_logprobs(
                            &ready.tok,
                            ready.defaults.special,
                            std::slice::from_ref(&p),
                        )
                    } else {
                        Value::Null
                    };
                    c["choices"] = json!([{"text": p.text, "index": i, "logprobs": lp, "finish_reason": null}]);
                    if timings_per_token {
                        c["timings"] = progress_timings(&p.so_far);
                    }
                    if verbose.is_some() {
                        c["__verbose"] = Verbose::partial(i, slots[i], &p);
                    }
                    out.extend_from_slice(&sse_data(&c));
                    false
                }
                Event::Done(f) => {
                    c["choices"] = json!([{"text": "", "index": i, "logprobs": null, "finish_reason": finish_reason(&f, false)}]);
                    c["usage"] = usage(&f);
                    if let Some(v) = &verbose {
                        c["__verbose"] = v.finished(&ready, &streamed_outcome(&f));
                    }
                    c["timings"] = timings(&f);
                    out.extend_from_slice(&sse_data(&c));
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

/// The text of a Responses input item's content parts; other parts (images, files) are refused
/// as a chat's are.
fn input_text(parts: &[Value]) -> Result<String, ApiError> {
    let mut out = String::new();
    for p in parts {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                out.push_str(t)
            }
            (Some(kind @ ("input_text" | "output_text" | "text")), _) => {
                return Err(ApiError::invalid(format!(
                    "an \"{kind}\" part needs a \"text\" string"
                )))
            }
            (Some(other), _) => {
                return Err(ApiError::invalid(format!(
                    "\"input\": content parts of type \"{other}\" are not supported (text only)"
                )))
            }
            (None, _) => {
                return Err(ApiError::invalid(
                    "\"input\": a content part without a type",
                ))
            }
        }
    }
    Ok(out)
}

/// Responses API `input` (+ `instructions`) as chat messages.
fn responses_messages(f: &Fields<'_>) -> Result<Value, ApiError> {
    let mut msgs = Vec::new();
    if let Some(i) = f.str("instructions")? {
        msgs.push(json!({"role": "system", "content": i}));
    }
    match f.get("input") {
        Some(Value::String(s)) => msgs.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for it in items {
                let role = it.get("role").and_then(Value::as_str).unwrap_or("user");
                let content = match it.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => input_text(parts)?,
                    _ => return Err(ApiError::invalid("each \"input\" item needs \"content\"")),
                };
                msgs.push(json!({"role": if role == "developer" { "system" } else { role }, "content": content}));
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "\"input\" must be a string or an array of messages",
            ))
        }
    }
    chat::openai_messages(&Value::Array(msgs))
}

/// POST /v1/responses: the Responses API served as a chat completion.
pub async fn responses(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let (st, r) = (Arc::clone(&state), Arc::clone(&ready));
    let (body, job) = state
        .cpu
        .run(move || {
            let body = parse_body(&body)?;
            let f = Fields::of(&body)?;
            let messages = responses_messages(&f)?;
            let job = prepare_chat(&st, &r, &f, &messages, None, true)?;
            Ok((body, job))
        })
        .await?;
    let f = Fields::of(&body)?;
    let mut params = gen_params(&f, &ready.defaults, 0)?;
    structured::for_chat(&f, &mut params, None, &job.prompt, &ready.tok)?;
    super::budget::for_chat(
        &f,
        &ready.defaults.budget,
        &ready.tok,
        job.thinking(&ready),
        &mut params,
    )?;
    if let Some(n) = f.int_in("max_output_tokens", -1, I32_MAX)? {
        params.n_predict = usize::try_from(n).ok();
    }
    let model = f
        .str("model")?
        .map_or_else(|| ready.model_id.clone(), str::to_owned);
    let ping = super::gen::sse_ping(&f, &ready)?;
    let rx = submit(
        &ready,
        job.prompt.tokens.clone(),
        params,
        id_slot(&f, ready.n_slots)?,
    )?;
    let ids = RespIds {
        id: random_id("resp_"),
        msg: random_id("msg_"),
        model,
    };
    if !f.bool("stream")?.unwrap_or(false) {
        let out = collect(rx).await?;
        let parsed = chat::parse(
            &out.text,
            job.prompt.starts_in_thinking,
            job.reasoning,
            None,
        );
        return Ok(ok(ids.response(
            "completed",
            &parsed.content,
            Some(&out.finish),
        )));
    }
    let timings_per_token = f.bool("timings_per_token")?.unwrap_or(false);
    Ok(responses_stream(ids, job, rx, timings_per_token, ping))
}

/// The ids a Responses answer repeats.
struct RespIds {
    id: String,
    msg: String,
    model: String,
}

impl RespIds {
    /// The `response` object.
    fn response(&self, status: &str, text: &str, f: Option<&Finish>) -> Value {
        let output = if f.is_some() {
            json!([{"type": "message", "id": self.msg, "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}])
        } else {
            json!([])
        };
        let usage = f.map_or(Value::Null, |f| {
            json!({"input_tokens": f.n_prompt, "output_tokens": f.n_predicted, "total_tokens": f.n_prompt + f.n_predicted,
                "input_tokens_details": {"cached_tokens": f.n_cached}, "output_tokens_details": {"reasoning_tokens": 0}})
        });
        json!({"id": self.id, "object": "response", "created_at": unix_now(), "status": status,
            "model": self.model, "output": output, "usage": usage})
    }
}

/// The Responses event stream: created, item and part added, text deltas, done, completed.
fn responses_stream(
    ids: RespIds,
    job: ChatJob,
    rx: super::gen::Events,
    timings_per_token: bool,
    ping: Option<std::time::Duration>,
) -> Response {
    struct St {
        ids: RespIds,
        split: DeltaSplitter,
        text: String,
        seq: u64,
    }
    impl St {
        fn ev(&mut self, out: &mut Vec<u8>, name: &str, mut v: Value) {
            v["type"] = json!(name);
            v["sequence_number"] = json!(self.seq);
            self.seq += 1;
            out.extend_from_slice(&super::gen::sse_event(name, &v));
        }
        /// A text delta event per content part; the last one carries `timings` when given.
        fn deltas(&mut self, out: &mut Vec<u8>, ds: Vec<Delta>, timings: Option<Value>) {
            let texts: Vec<String> = ds
                .into_iter()
                .filter_map(|d| match d {
                    Delta::Content(c) => Some(c),
                    _ => None,
                })
                .collect();
            let last = texts.len().saturating_sub(1);
            for (i, c) in texts.into_iter().enumerate() {
                self.text.push_str(&c);
                let msg = self.ids.msg.clone();
                let mut v =
                    json!({"output_index": 0, "content_index": 0, "item_id": msg, "delta": c});
                if let Some(t) = timings.as_ref().filter(|_| i == last) {
                    v["timings"] = t.clone();
                }
                self.ev(out, "response.output_text.delta", v);
            }
        }
    }
    let split = DeltaSplitter::new(job.prompt.starts_in_thinking, job.reasoning, None);
    let mut st = St {
        ids,
        split,
        text: String::new(),
        seq: 0,
    };
    let mut prelude = Vec::new();
    let created = st.ids.response("in_progress", "", None);
    let msg = st.ids.msg.clone();
    st.ev(
        &mut prelude,
        "response.created",
        json!({"response": created}),
    );
    st.ev(&mut prelude, "response.output_item.added", json!({"output_index": 0, "item": {"type": "message", "id": msg, "status": "in_progress", "role": "assistant", "content": []}}));
    st.ev(&mut prelude, "response.content_part.added", json!({"output_index": 0, "content_index": 0, "item_id": msg, "part": {"type": "output_text", "text": "", "annotations": []}}));
    event_stream(rx, ping, st, prelude, move |st, ev, out| match ev {
        Event::Started { .. } => false,
        Event::PromptProgress(pp) => {
            // As llama-server: an in-progress event that carries the progress.
            let mut v = json!({"response": st.ids.response("in_progress", "", None)});
            if timings_per_token {
                v["timings"] = prompt_progress_timings(&pp);
            }
            v["prompt_progress"] = prompt_progress(&pp);
            st.ev(out, "response.in_progress", v);
            false
        }
        Event::Token(p) => {
            let ds = st.split.push(&p.text);
            let t = timings_per_token.then(|| progress_timings(&p.so_far));
            st.deltas(out, ds, t);
            false
        }
        Event::Done(fin) => {
            let ds = st.split.finish();
            st.deltas(out, ds, None);
            let (msg, text) = (st.ids.msg.clone(), st.text.clone());
            st.ev(
                out,
                "response.output_text.done",
                json!({"output_index": 0, "content_index": 0, "item_id": msg, "text": text}),
            );
            let done = st.ids.response("completed", &text, Some(&fin));
            st.ev(
                out,
                "response.completed",
                json!({"response": done, "timings": timings(&fin)}),
            );
            true
        }
        Event::Embedded(_) | Event::Decided(_) => super::gen::stream_not_a_generation(out),
        Event::Failed(failure) => {
            st.ev(out, "error", json!({"message": failure.message}));
            true
        }
    })
}
