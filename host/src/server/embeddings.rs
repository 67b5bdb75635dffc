//! llama-server's embedding routes, served with `--embeddings` from the model's final-norm rows
//! pooled as `--pooling` says: `/embedding` and `/embeddings` answer one object per input with
//! its rows (one per token with pooling `none`), `/v1/embeddings` OpenAI's list (`encoding_format`
//! float or base64, `usage`). Each input is its own request to the scheduler, batched with the
//! others like any prompt. The rerank routes are refused: no model plugin has a rank head.

use std::sync::Arc;

use anyhow::bail;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde_json::{json, Value};

use super::error::ApiError;
use super::gen::{self, Events};
use super::native::prompt_tokens;
use super::params::Fields;
use super::{parse_body, AppRef, Ready};
use crate::flags::serve::ServeArgs;
use bloomery_gguf::GgufModel;
use bloomery_runtime::embedding::{normalize, Pooling};
use bloomery_runtime::request::{Embedded, Event, GenParams};

/// How the server embeds (`--embeddings`, `--pooling`, `--embd-normalize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddingMode {
    /// The pooling of every request.
    pub pooling: Pooling,
    /// The default normalization of pooled rows (a request's `embd_normalize` overrides it).
    pub normalize: i32,
    /// Values in a row (the model's width).
    pub n_embd: usize,
}

/// What `--pooling` or the model's `{arch}.pooling_type` names (llama.cpp's ids: 0 none, 1
/// mean, 2 cls, 3 last, 4 rank).
fn pooling_named(name: &str) -> anyhow::Result<Pooling> {
    Ok(match name {
        "none" | "0" => Pooling::None,
        "mean" | "1" => Pooling::Mean,
        "cls" | "2" => Pooling::Cls,
        "last" | "3" => Pooling::Last,
        "rank" | "4" => bail!(
            "pooling rank needs a model with a rank (classifier) head, and no model plugin has one"
        ),
        other => bail!("unknown pooling `{other}` (none, mean, cls, last or rank)"),
    })
}

/// The embedding mode the flags ask for with `file` (`None` without `--embeddings`): the
/// pooling is `--pooling`, else the model's `{arch}.pooling_type` as llama.cpp reads it, else
/// `none`.
pub fn mode(
    a: &ServeArgs,
    file: &GgufModel,
    n_embd: usize,
) -> anyhow::Result<Option<EmbeddingMode>> {
    let pooling = match &a.pooling {
        Some(p) => Some(pooling_named(p).map_err(|e| anyhow::anyhow!("--pooling {p}: {e}"))?),
        None => None,
    };
    if !a.embeddings {
        if a.pooling.is_some() {
            tracing::warn!("--pooling applies to embeddings, which --embeddings turns on");
        }
        return Ok(None);
    }
    let pooling = match pooling {
        Some(p) => p,
        None => {
            let meta = file.metadata();
            let arch = meta.get_str("general.architecture")?;
            let key = format!("{arch}.pooling_type");
            match meta.get_uint(&key) {
                Ok(id) => pooling_named(&id.to_string())
                    .map_err(|e| anyhow::anyhow!("the model's `{key}` is {id}: {e}"))?,
                Err(_) => Pooling::None,
            }
        }
    };
    Ok(Some(EmbeddingMode {
        pooling,
        normalize: a.embd_normalize,
        n_embd,
    }))
}

/// POST /embedding and /embeddings: llama-server's native shape.
pub async fn native(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    embed(state, body, false).await
}

/// POST /v1/embeddings: OpenAI's shape (a body with `content` instead of `input` gets the
/// native one, as llama-server answers it).
pub async fn openai(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    embed(state, body, true).await
}

/// POST /rerank, /reranking, /v1/rerank, /v1/reranking: refused, as llama-server refuses them
/// without a rank model.
pub async fn rerank(State(_state): State<AppRef>) -> ApiError {
    ApiError::not_supported(
        "This server does not support reranking: it needs a model with a rank (classifier) head, \
         and no model plugin has one (--reranking and --pooling rank are refused)",
    )
}

/// A request's inputs and options, read from its body.
struct Asked {
    inputs: Vec<Vec<u32>>,
    oai: bool,
    base64: bool,
    normalize: i32,
    model: Option<String>,
}

async fn embed(state: AppRef, body: Bytes, oai: bool) -> Result<Response, ApiError> {
    let ready = state.awake().await?;
    let Some(mode) = ready.embeddings else {
        return Err(ApiError::not_supported(
            "This server does not support embeddings. Start it with `--embeddings`",
        ));
    };
    if oai && mode.pooling == Pooling::None {
        return Err(ApiError::invalid(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
        ));
    }
    let r = Arc::clone(&ready);
    let asked = state
        .cpu
        .run(move || read_request(&r, mode, &parse_body(&body)?, oai))
        .await?;
    let mut queued = Vec::with_capacity(asked.inputs.len());
    for (i, prompt) in asked.inputs.into_iter().enumerate() {
        let params = GenParams::embedding();
        let embed = Some(mode.pooling);
        // A full queue refuses the request (503) before any of it runs; once its first input
        // is queued, the rest wait for room.
        queued.push(if i == 0 {
            gen::queue(&ready, prompt, params, None, embed)?
        } else {
            gen::queue_waiting(&ready, prompt, params, embed).await?
        });
    }
    let mut results = Vec::with_capacity(queued.len());
    for rx in queued {
        results.push(collect(rx).await?);
    }
    let rows = |e: &Embedded| -> Vec<Vec<f32>> {
        match mode.pooling {
            Pooling::None => e.rows.clone(),
            _ => e
                .rows
                .iter()
                .map(|r| normalize(r, asked.normalize))
                .collect(),
        }
    };
    if !asked.oai {
        let list: Vec<Value> = results
            .iter()
            .enumerate()
            .map(|(i, e)| json!({"index": i, "embedding": rows(e)}))
            .collect();
        return Ok(Json(Value::Array(list)).into_response());
    }
    let mut data = Vec::with_capacity(results.len());
    for (i, e) in results.iter().enumerate() {
        let row = rows(e).into_iter().next().unwrap_or_default();
        data.push(if asked.base64 {
            let bytes: Vec<u8> = row.iter().flat_map(|x| x.to_le_bytes()).collect();
            json!({
                "embedding": base64::engine::general_purpose::STANDARD.encode(bytes),
                "index": i,
                "object": "embedding",
                "encoding_format": "base64",
            })
        } else {
            json!({"embedding": row, "index": i, "object": "embedding"})
        });
    }
    let n_tokens: usize = results.iter().map(|e| e.n_prompt).sum();
    Ok(Json(json!({
        "model": asked.model.unwrap_or_else(|| ready.model_id.clone()),
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "data": data,
    }))
    .into_response())
}

/// Reads a body: `input` (or `content`, answered in the native shape) as one input or a list
/// of them, `encoding_format`, `embd_normalize`, `dimensions` and `model`; every input
/// tokenized and held to the slot's context as llama-server holds it for the pooling.
fn read_request(
    ready: &Ready,
    mode: EmbeddingMode,
    body: &Value,
    oai: bool,
) -> Result<Asked, ApiError> {
    let f = Fields::of(body)?;
    let (input, oai) = match (f.get("input"), f.get("content")) {
        (Some(input), _) => (input, oai),
        (None, Some(content)) => (content, false),
        (None, None) => {
            return Err(ApiError::invalid(
                "\"input\" or \"content\" must be provided",
            ))
        }
    };
    let base64 = match f.str("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "The format to return the embeddings in. Can be either float or base64",
            ))
        }
    };
    if let Some(d) = f.i64("dimensions")? {
        if d != mode.n_embd as i64 {
            return Err(ApiError::invalid(format!(
                "\"dimensions\" {d}: the model's embeddings have {} values, and shortening them is not supported",
                mode.n_embd
            )));
        }
    }
    let normalize = match f.int_in("embd_normalize", i32::MIN.into(), i32::MAX.into())? {
        Some(_) if mode.pooling == Pooling::None => {
            return Err(ApiError::invalid(
                "\"embd_normalize\": pooling none returns each token's row as it is (llama-server ignores the field)",
            ))
        }
        Some(n) => n as i32,
        None => mode.normalize,
    };
    let entries: Vec<&Value> = match input {
        Value::Array(items) if !items.iter().any(Value::is_number) => items.iter().collect(),
        one => vec![one],
    };
    if entries.is_empty() {
        return Err(ApiError::invalid("\"input\" must not be empty"));
    }
    let inputs = entries
        .into_iter()
        .map(|v| {
            let tokens = entry_tokens(ready, v)?;
            fits(ready, mode.pooling, tokens.len())?;
            Ok(tokens)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Asked {
        inputs,
        oai,
        base64,
        normalize,
        model: f.str("model")?.map(str::to_owned),
    })
}

/// One input: a prompt as `/completion` takes it, or OpenAI's `{"content": [parts]}` whose
/// text parts are joined.
fn entry_tokens(ready: &Ready, v: &Value) -> Result<Vec<u32>, ApiError> {
    let Some(content) = v.as_object().and_then(|o| o.get("content")) else {
        return prompt_tokens(ready, v);
    };
    let Value::Array(parts) = content else {
        return Err(ApiError::invalid("\"content\" must be an array"));
    };
    let mut text = String::new();
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(part.get("text").and_then(Value::as_str).unwrap_or("")),
            Some(t @ ("image_url" | "input_audio" | "input_video" | "video_url")) => {
                return Err(ApiError::invalid(format!(
                    "\"content\" part of type `{t}`: multimodal input is not supported"
                )))
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "\"content\" parts must be of type `text`, got {}",
                    other.map_or_else(|| "none".to_owned(), |t| format!("`{t}`"))
                )))
            }
        }
    }
    prompt_tokens(ready, &Value::String(text))
}

/// An input of `n` tokens held to the slot's context as llama-server b11434 holds it: pooling
/// `last` reads the last row and leaves a position for it, the others may fill the context.
fn fits(ready: &Ready, pooling: Pooling, n: usize) -> Result<(), ApiError> {
    let n_ctx = ready.n_ctx_slot;
    if n == 0 {
        return Err(ApiError::invalid("Input content cannot be empty"));
    }
    match pooling {
        Pooling::Last if n >= n_ctx => Err(ApiError::exceeds_context(n, n_ctx)),
        Pooling::Last => Ok(()),
        _ if n > n_ctx => Err(ApiError {
            message: format!(
                "input ({n} tokens) is larger than the max context size ({n_ctx} tokens). skipping"
            ),
            ..ApiError::exceeds_context(n, n_ctx)
        }),
        _ => Ok(()),
    }
}

/// Waits for an embedding's rows.
async fn collect(mut rx: Events) -> Result<Embedded, ApiError> {
    while let Some(e) = rx.recv().await {
        match e {
            Event::Started { .. } | Event::PromptProgress(_) => {}
            Event::Embedded(e) => return Ok(e),
            Event::Failed(failure) => return Err(ApiError::from(failure)),
            Event::Token(_) | Event::Done(_) | Event::Decided(_) => {
                return Err(ApiError::internal(
                    "the scheduler answered an embedding with another kind of result",
                ))
            }
        }
    }
    Err(ApiError::internal("the scheduler dropped the request"))
}

#[cfg(test)]
mod tests {
    use super::pooling_named;
    use bloomery_runtime::embedding::Pooling;

    #[test]
    fn poolings_by_name_and_llama_cpp_id_and_rank_refused() {
        assert_eq!(pooling_named("mean").unwrap(), Pooling::Mean);
        assert_eq!(pooling_named("3").unwrap(), Pooling::Last);
        assert!(pooling_named("rank")
            .unwrap_err()
            .to_string()
            .contains("rank (classifier) head"));
        assert!(pooling_named("max").is_err());
    }
}
