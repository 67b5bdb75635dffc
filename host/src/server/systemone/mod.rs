//! `POST /v1/systemone`: a decision model's typed answers (llama-server b11434's route): the
//! request is checked (`request`), its prompt built from the model's `systemone` template
//! (`prompt`), the runtime runs the backbone and the decision head (a job with `decide`: its
//! prompt shares passes with other requests, the head runs over every decision ready in the same
//! pass, and a prefix on the same state comes from the slots or the prompt cache), and each
//! question's options' scores become its answer (`answer`). A client that goes away cancels the
//! job and frees its slot.

pub mod answer;
pub mod prompt;
pub mod request;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use bloomery_runtime::request::{Decision, Event};
use bloomery_text::{ChatTemplate, Tokenizer};
use serde_json::{json, Map, Value};

use self::answer::Temperatures;
use crate::server::error::ApiError;
use crate::server::gen;
use crate::server::AppRef;

/// What the route needs from a model with a decision head.
pub struct Decider {
    /// The `systemone` template.
    pub template: ChatTemplate,
    /// Temperatures from the file.
    pub temperatures: Temperatures,
}

/// POST /v1/systemone.
pub async fn systemone(State(state): State<AppRef>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let ready = state.awake().await?;
    let Some(decider) = ready.decision.clone() else {
        return Err(ApiError::not_supported(
            "This model is not a decision model",
        ));
    };
    let tok = Arc::clone(&ready.tok);
    let d = Arc::clone(&decider);
    let (prompt, questions) = state
        .cpu
        .run(move || {
            let body: Value = serde_json::from_slice(&body)
                .map_err(|e| ApiError::invalid(format!("invalid JSON: {e}")))?;
            let (st, questions) = request::parse(&body)?;
            let prompt = prompt::build(&d.template, &tok, &st, &questions)?;
            Ok((prompt, questions))
        })
        .await?;
    let n = prompt.tokens.len();
    if n > ready.n_ctx_slot {
        return Err(ApiError::exceeds_context(n, ready.n_ctx_slot));
    }
    let decision = Decision {
        questions: prompt.questions,
        options: prompt.options,
        shared: prompt.shared,
    };
    let mut events = gen::queue_decision(&ready, prompt.tokens, decision)?;
    let scores = loop {
        match events.recv().await {
            Some(Event::Decided(d)) => break d.scores,
            Some(Event::Failed(f)) => return Err(f.into()),
            Some(_) => {}
            None => return Err(ApiError::internal("the scheduler dropped the decision")),
        }
    };
    let mut answers = Map::new();
    let mut at = 0;
    for q in &questions {
        let k = q.options.len();
        let s = scores
            .get(at..at + k)
            .ok_or_else(|| ApiError::internal("the head gave too few scores"))?;
        at += k;
        answers.insert(q.id.clone(), answer::answer(q, s, &decider.temperatures));
    }
    Ok(Json(json!({
        "model": ready.model_id,
        "answers": answers,
        "usage": {"input_tokens": n, "output_tokens": 0},
    })))
}

/// The decision route's setup for a model whose runtime decides: the `systemone` template (the
/// file's `tokenizer.chat_template.systemone`, else the published one for a head file) and the
/// file's temperatures (`{arch}.decision.temperature.*`).
pub fn decider(
    meta: &bloomery_gguf::Metadata,
    arch: &str,
    tok: &Tokenizer,
) -> anyhow::Result<Decider> {
    let source = meta
        .get_str("tokenizer.chat_template.systemone")
        .unwrap_or(bloomery_plugin_api::decision::SYSTEMONE_TEMPLATE);
    let text_of = |id: Option<u32>| {
        id.and_then(|i| tok.token_text(i))
            .unwrap_or_default()
            .to_owned()
    };
    let template = ChatTemplate::new(source, &text_of(tok.bos()), &text_of(tok.eos()))?;
    let prefix = format!("{arch}.decision.temperature.");
    let mut temps = std::collections::HashMap::new();
    for e in meta.entries() {
        if let Some(name) = e.key.strip_prefix(&prefix) {
            let t = match &e.value {
                bloomery_gguf::Value::F32(v) => *v,
                bloomery_gguf::Value::F64(v) => *v as f32,
                other => anyhow::bail!("{}: expected a number, found {other:?}", e.key),
            };
            if t.is_nan() || t <= 0.0 {
                anyhow::bail!("invalid decision temperature: {} = {t}", e.key);
            }
            temps.insert(name.to_owned(), t);
        }
    }
    Ok(Decider {
        template,
        temperatures: Temperatures(temps),
    })
}
