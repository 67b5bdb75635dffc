//! Errors in llama-server's JSON shape: `{"error": {"code", "message", "type"}}` with its status
//! codes and type names.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bloomery_runtime::request::{Failure, FailureKind};
use serde_json::{json, Value};

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// llama-server's `type`.
    pub kind: &'static str,
    /// What went wrong.
    pub message: String,
    /// Extra fields merged into the error object (e.g. `n_prompt_tokens`, `n_ctx`).
    pub extra: Option<Value>,
}

impl ApiError {
    /// An error of any status and `type`.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            extra: None,
        }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 401 `authentication_error`.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "Invalid API Key",
        )
    }

    /// 404 `not_found_error`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// 500 `server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 501 `not_supported_error`.
    pub fn not_supported(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "not_supported_error", message)
    }

    /// 503 `unavailable_error`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            message,
        )
    }

    /// 400 `exceed_context_size_error`, with the counts llama-server reports.
    pub fn exceeds_context(n_prompt_tokens: usize, n_ctx: usize) -> Self {
        ApiError {
            extra: Some(json!({"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx})),
            ..Self::new(
                StatusCode::BAD_REQUEST,
                "exceed_context_size_error",
                format!(
                    "the request exceeds the available context size ({n_prompt_tokens} prompt tokens, {n_ctx} per slot), try increasing it"
                ),
            )
        }
    }

    /// As [`ApiError::exceeds_context`] for a prompt refused before it was tokenized: it holds
    /// at least `n_prompt_tokens` tokens.
    pub fn exceeds_context_at_least(n_prompt_tokens: usize, n_ctx: usize) -> Self {
        ApiError {
            message: format!(
                "the request exceeds the available context size (at least {n_prompt_tokens} prompt tokens, {n_ctx} per slot), try increasing it"
            ),
            ..Self::exceeds_context(n_prompt_tokens, n_ctx)
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        let mut e = json!({
            "code": self.status.as_u16(),
            "message": self.message,
            "type": self.kind,
        });
        if let (Some(Value::Object(extra)), Value::Object(obj)) = (&self.extra, &mut e) {
            for (k, v) in extra {
                obj.insert(k.clone(), v.clone());
            }
        }
        json!({ "error": e })
    }
}

impl From<Failure> for ApiError {
    /// A request the scheduler ended early: 400 for what this server cannot give, 503 for a
    /// shutdown, 500 for an internal failure.
    fn from(f: Failure) -> Self {
        match f.kind {
            FailureKind::Invalid => ApiError::invalid(f.message),
            FailureKind::ShuttingDown => ApiError::unavailable(f.message),
            FailureKind::Internal => ApiError::internal(f.message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}
