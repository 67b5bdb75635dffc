//! What every request passes before its handler: the API key, the shutdown's drain, the body's
//! size and arrival time, and a handler's panic; and llama-server's JSON error shape for the
//! answers axum gives on its own (405).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::{FutureExt, StreamExt};

use super::error::ApiError;
use super::{AppRef, AppState};

/// Paths answered without an API key (llama-server b11434's public endpoints; `/models` and
/// `/v1/models` need the key).
const PUBLIC: &[&str] = &["/health", "/v1/health"];

/// Paths answered while the server drains (they report the drain rather than refuse).
const DURING_DRAIN: &[&str] = &["/health", "/v1/health"];

/// The body limit before the model has loaded (every route but /health answers 503 then).
pub const LOADING_BODY_LIMIT: usize = 1 << 20;

/// The largest request body worth reading for a model with `n_ctx` context positions (all
/// slots') and tokens of at most `max_token_bytes` bytes of text: every position's token as
/// JSON-escaped text (six bytes a byte at worst, `\u00XX`), or a token id with its separator,
/// plus a mebibyte for the other fields. A larger body cannot be a prompt that fits.
pub fn body_limit(n_ctx: usize, max_token_bytes: Option<usize>) -> usize {
    let per_position = max_token_bytes.unwrap_or(64).max(8).saturating_mul(6);
    n_ctx
        .saturating_mul(per_position)
        .saturating_add(LOADING_BODY_LIMIT)
}

/// The API key, the drain, the body, and a 500 for a handler that panics (the server keeps
/// serving).
pub async fn guard(State(state): State<AppRef>, req: Request, next: Next) -> Response {
    if !state.api_keys.is_empty()
        && req.method() != Method::OPTIONS
        && !PUBLIC.contains(&req.uri().path())
        && !super::page::is_page_file(&state.page, req.method(), req.uri().path())
        && !key_accepted(&state.api_keys, req.headers())
    {
        return ApiError::unauthorized().into_response();
    }
    if state.is_draining() && !DURING_DRAIN.contains(&req.uri().path()) {
        return ApiError::unavailable("the server is shutting down").into_response();
    }
    let req = match buffered(&state, req).await {
        Ok(req) => req,
        Err(e) => {
            let mut r = e.into_response();
            // The rest of an unread body would be taken for the next request.
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return r;
        }
    };
    let response = match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(r) => r,
        Err(panic) => {
            let what = bloomery_runtime::panic_message(panic.as_ref());
            tracing::error!("a request handler panicked: {what}");
            return ApiError::internal(format!("internal error: {what}")).into_response();
        }
    };
    json_shaped(response)
}

/// Whether `Authorization: Bearer KEY` (the scheme in any case, as RFC 9110 has it) or
/// `X-Api-Key: KEY` names an accepted key. Every key is compared in full, whatever matched.
fn key_accepted(keys: &[String], headers: &HeaderMap) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim_start().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        });
    let x_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let mut accepted = false;
    for offered in [bearer, x_key].into_iter().flatten() {
        for key in keys {
            accepted |= same_key(offered.trim().as_bytes(), key.as_bytes());
        }
    }
    accepted
}

/// Equal bytes, in time that depends on the lengths only (a key's bytes are never compared
/// one at a time with an early exit).
fn same_key(offered: &[u8], key: &[u8]) -> bool {
    let mut diff = u8::from(offered.len() != key.len());
    for (i, &k) in key.iter().enumerate() {
        diff |= k ^ offered.get(i).copied().unwrap_or(!k);
    }
    std::hint::black_box(diff) == 0
}

/// The request with its body read whole: at most the body limit (413 past it) within
/// `--timeout` seconds (408 past them).
async fn buffered(state: &AppState, req: Request) -> Result<Request, ApiError> {
    let limit = state.body_limit();
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    let (parts, body) = req.into_parts();
    let timeout = Duration::from_secs(state.args.timeout);
    let read = async {
        let mut stream = body.into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::invalid(format!("reading the request body: {e}")))?;
            if bytes.len() + chunk.len() > limit {
                return Err(too_large(limit));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    let bytes = tokio::time::timeout(timeout, read).await.map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s (-to/--timeout)",
                timeout.as_secs()
            ),
        )
    })??;
    Ok(Request::from_parts(parts, Body::from(Bytes::from(bytes))))
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!(
            "the request body exceeds {limit} bytes, more than any prompt this server's context holds"
        ),
    )
}

/// A 405 that axum's router answered with an empty body, in llama-server's error shape (its
/// `Allow` header kept).
fn json_shaped(response: Response) -> Response {
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let allowed = allow
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut r = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("this route does not take that method; it takes {allowed}"),
    )
    .into_response();
    if let Some(allow) = allow {
        r.headers_mut().insert(header::ALLOW, allow);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_is_matched_in_any_case_and_keys_whole() {
        let keys = vec!["k1".to_owned(), "secret".to_owned()];
        let with = |name: &str, value: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
            key_accepted(&keys, &h)
        };
        assert!(with("authorization", "Bearer secret"));
        assert!(with("authorization", "bearer secret"));
        assert!(with("authorization", "BEARER k1"));
        assert!(with("x-api-key", "k1"));
        assert!(!with("authorization", "Bearer secre"));
        assert!(!with("authorization", "Bearer secrets"));
        assert!(!with("authorization", "Basic secret"));
        assert!(!with("authorization", "secret"));
        assert!(!same_key(b"", b"k"));
        assert!(same_key(b"", b""));
    }

    #[test]
    fn the_body_limit_grows_with_the_context() {
        assert_eq!(body_limit(0, Some(10)), LOADING_BODY_LIMIT);
        assert_eq!(body_limit(1000, Some(10)), LOADING_BODY_LIMIT + 60_000);
        // Token ids as JSON take up to eight bytes a position, whatever the vocabulary.
        assert_eq!(body_limit(1000, Some(2)), LOADING_BODY_LIMIT + 48_000);
        assert_eq!(body_limit(1000, None), LOADING_BODY_LIMIT + 384_000);
    }
}
