//! llama-server's `POST /v1/chat/completions/control`: `{"id": "chatcmpl-…", "action":
//! "reasoning_end"}` ends the thinking span of a chat completion still running that asked for
//! `reasoning_control`, at its next token (`bloomery_runtime::reasoning_budget::EndSwitch`).
//! The answer is b11434's: `{"success": true}`, or `false` with a `message` when no completion
//! of that id runs or it did not ask for control; a missing id or another action is a 400.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use bloomery_runtime::reasoning_budget::EndSwitch;
use serde_json::json;

use super::error::ApiError;
use super::native::ok;
use super::params::Fields;
use super::{parse_body, AppRef};

/// The chat completions running now, by id, each with its switch (`None`: it did not ask for
/// reasoning control).
#[derive(Default)]
pub struct Running {
    by_id: Mutex<HashMap<String, Option<EndSwitch>>>,
}

impl Running {
    /// Records completion `id` until the returned guard drops (its answer or stream ends).
    pub fn enter(self: &Arc<Self>, id: String, switch: Option<EndSwitch>) -> Live {
        self.lock().insert(id.clone(), switch);
        Live {
            running: Arc::clone(self),
            id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<EndSwitch>>> {
        self.by_id.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running chat completion's entry in [`Running`], removed on drop.
pub struct Live {
    running: Arc<Running>,
    id: String,
}

impl Live {
    /// The completion's id (`chatcmpl-…`), which its answer carries.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.running.lock().remove(&self.id);
    }
}

/// `POST /v1/chat/completions/control`.
pub async fn control(State(state): State<AppRef>, body: Bytes) -> Result<Response, ApiError> {
    state.ready()?;
    let body = parse_body(&body)?;
    let f = Fields::of(&body)?;
    let id = f.str("id")?.unwrap_or("");
    if id.is_empty() {
        return Err(ApiError::invalid("missing completion id"));
    }
    if f.str("action")? != Some("reasoning_end") {
        return Err(ApiError::invalid("unknown control action"));
    }
    let answer = match state.running.lock().get(id) {
        None => json!({"success": false, "message": "no active completion for this id"}),
        Some(None) => json!({
            "success": false,
            "message": "reasoning control not enabled for this completion",
        }),
        Some(Some(switch)) => {
            switch.set();
            json!({"success": true})
        }
    };
    Ok(ok(answer))
}
