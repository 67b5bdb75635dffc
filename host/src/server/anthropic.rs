//! Anthropic routes: /v1/messages (whole or as the `message_start` … `message_stop` event
//! sequence) and /v1/messages/count_tokens.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use serde_json::{json, Value};

use super::chat::{self, Delta, DeltaSplitter};
use super::error::ApiError;
use super::gen::{collect, event_stream, random_id, sse_event, submit};
use super::native::{id_slot, ok};
use super::openai::{prepare_chat, ChatJob};
use super::params::{gen_params, Fields};
use super::tool_parse::ToolCall;
use super::{parse_body, AppRef};
use bloomery_runtime::request::{Event, FailureKind, Finish, StopType};

fn stop_reason(f: &Finish, tool_use: bool) -> &'static str {
    if tool_use {
        return "tool_use";
    }
    match f.stop_type {
        StopType::Limit => "max_tokens",
        StopType::Word => "stop_sequence",
        StopType::Eos => "end_turn",
    }
}

fn stop_sequence(f: &Finish) -> Value {
    if f.stop_type == StopType::Word {
        json!(f.stopping_word)
    } else {
        Value::Null
    }
}

fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

/// The chat of an Anthropic body, rendered (`to_run`: see [`prepare_chat`]).
fn prepare(
    state: &super::AppState,
    ready: &super::Ready,
    f: &Fields<'_>,
    to_run: bool,
) -> Result<ChatJob, ApiError> {
    let (messages, tools) = chat::anthropic_to_openai(f.0)?;
    let messages = chat::openai_messages(&messages)?;
    prepare_chat(state, ready, f, &messages, tools.as_ref(), to_run)
}

/// The body and its rendered chat, worked out on the CPU pool.
async fn prepared(state: &AppRef, body: Bytes, to_run: bool) -> Result<(Value, ChatJob), ApiError> {
    let ready = state.awake().await?;
    let st = Arc::clone(state);
    state
        .cpu
        .run(move || {
            let body = parse_body(&body)?;
            let job = prepare(&st, &ready, &Fields::of(&body)?, to_run)?;
            Ok((body, job))
        })
        .await
}

/// POST /v1/messages/count_tokens.
pub async fn count_tokens(
    State(state): State<AppRef>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let (_, job) = prepared(&state, body, false).await?;
    Ok(Json(json!({ "input_tokens": job.prompt.tokens.len() })))
}

/// POST /v1/messages.
pub async fn messages(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let (body, job) = prepared(&state, body, true).await?;
    let f = Fields::of(&body)?;
    let mut params = gen_params(&f, &ready.defaults, 0)?;
    super::structured::for_chat(&f, &mut params, job.tools.as_ref(), &job.prompt, &ready.tok)?;
    super::budget::for_chat(
        &f,
        &ready.defaults.budget,
        &ready.tok,
        job.thinking(&ready),
        &mut params,
    )?;
    if f.get("max_tokens").is_none() {
        params.n_predict = Some(4096);
    }
    let model = f
        .str("model")?
        .map_or_else(|| ready.model_id.clone(), str::to_owned);
    let n_prompt = job.prompt.tokens.len();
    let slot = id_slot(&f, ready.n_slots)?;
    let ping = super::gen::sse_ping(&f, &ready)?;
    let rx = submit(&ready, job.prompt.tokens.clone(), params, slot)?;
    if f.bool("stream")?.unwrap_or(false) {
        return Ok(stream_messages(job, model, n_prompt, rx, ping));
    }
    let out = collect(rx).await?;
    let parsed = chat::parse(
        &out.text,
        job.prompt.starts_in_thinking,
        job.reasoning,
        job.tools.as_ref(),
    );
    let mut content = Vec::new();
    if let Some(r) = &parsed.reasoning {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if !parsed.content.is_empty() || parsed.tool_calls.is_empty() {
        content.push(json!({"type": "text", "text": parsed.content}));
    }
    for c in &parsed.tool_calls {
        content.push(json!({"type": "tool_use", "id": random_id("toolu_"), "name": c.name, "input": tool_input(&c.arguments)}));
    }
    let f = &out.finish;
    Ok(ok(json!({
        "id": random_id("msg_"),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop_reason(f, !parsed.tool_calls.is_empty()),
        "stop_sequence": stop_sequence(f),
        "usage": {
            "input_tokens": f.n_prompt - f.n_cached,
            "output_tokens": f.n_predicted,
            "cache_read_input_tokens": f.n_cached,
            "cache_creation_input_tokens": 0,
        },
    })))
}

/// The open content block of a stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    Thinking,
    Text,
}

fn stream_messages(
    job: ChatJob,
    model: String,
    n_prompt: usize,
    rx: super::gen::Events,
    ping: Option<std::time::Duration>,
) -> Response {
    struct St {
        split: DeltaSplitter,
        open: Block,
        index: usize,
    }
    let split = DeltaSplitter::new(job.prompt.starts_in_thinking, job.reasoning, job.tools);
    let st = St {
        split,
        open: Block::None,
        index: 0,
    };
    let prelude = sse_event("message_start", &json!({
        "type": "message_start",
        "message": {"id": random_id("msg_"), "type": "message", "role": "assistant", "content": [], "model": model,
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": n_prompt, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}},
    }))
    .to_vec();
    event_stream(rx, ping, st, prelude, |st, ev, out| match ev {
        // llama-server's Anthropic stream shows no prompt progress.
        Event::Started { .. } | Event::PromptProgress(_) => false,
        Event::Token(p) => {
            for d in st.split.push(&p.text) {
                emit_delta(&mut st.open, &mut st.index, &d, out);
            }
            false
        }
        Event::Done(f) => {
            for d in st.split.finish() {
                emit_delta(&mut st.open, &mut st.index, &d, out);
            }
            close(&mut st.open, &mut st.index, out);
            out.extend_from_slice(&sse_event("message_delta", &json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(&f, st.split.called()), "stop_sequence": stop_sequence(&f)},
                "usage": {"output_tokens": f.n_predicted}})));
            out.extend_from_slice(&sse_event("message_stop", &json!({"type": "message_stop"})));
            true
        }
        Event::Embedded(_) | Event::Decided(_) => super::gen::stream_not_a_generation(out),
        Event::Failed(failure) => {
            let kind = match failure.kind {
                FailureKind::Invalid => "invalid_request_error",
                FailureKind::ShuttingDown | FailureKind::Internal => "api_error",
            };
            out.extend_from_slice(&sse_event(
                "error",
                &json!({"type": "error", "error": {"type": kind, "message": failure.message}}),
            ));
            true
        }
    })
}

fn close(open: &mut Block, index: &mut usize, out: &mut Vec<u8>) {
    if *open == Block::None {
        return;
    }
    if *open == Block::Thinking {
        out.extend_from_slice(&sse_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": *index,
            "delta": {"type": "signature_delta", "signature": ""}}),
        ));
    }
    out.extend_from_slice(&sse_event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": *index}),
    ));
    *index += 1;
    *open = Block::None;
}

/// A whole tool call as its own block: start (id, name), the input as one JSON delta, stop.
fn emit_call(index: &mut usize, c: &ToolCall, out: &mut Vec<u8>) {
    out.extend_from_slice(&sse_event("content_block_start", &json!({"type": "content_block_start", "index": *index,
        "content_block": {"type": "tool_use", "id": random_id("toolu_"), "name": c.name, "input": {}}})));
    out.extend_from_slice(&sse_event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": *index,
        "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
    ));
    out.extend_from_slice(&sse_event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": *index}),
    ));
    *index += 1;
}

fn emit_delta(open: &mut Block, index: &mut usize, d: &Delta, out: &mut Vec<u8>) {
    let (want, delta) = match d {
        Delta::Call(c) => {
            close(open, index, out);
            emit_call(index, c, out);
            return;
        }
        Delta::Reasoning(r) => (
            Block::Thinking,
            json!({"type": "thinking_delta", "thinking": r}),
        ),
        Delta::Content(c) => (Block::Text, json!({"type": "text_delta", "text": c})),
    };
    if *open != want {
        close(open, index, out);
        let block = if want == Block::Thinking {
            json!({"type": "thinking", "thinking": "", "signature": ""})
        } else {
            json!({"type": "text", "text": ""})
        };
        out.extend_from_slice(&sse_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": *index, "content_block": block}),
        ));
        *open = want;
    }
    out.extend_from_slice(&sse_event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": *index, "delta": delta}),
    ));
}
