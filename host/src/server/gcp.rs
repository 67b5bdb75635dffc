//! Google Cloud Vertex AI's prediction protocol, as llama-server b11434 serves it
//! (`tools/server/server-http.cpp`, `gcp_params` and `register_gcp_compat`) when the environment
//! says `AIP_MODE=PREDICTION`: the server listens on `AIP_HTTP_PORT` (default 8080, over
//! `--port`), answers `AIP_HEALTH_ROUTE` as `/health` when set, and takes `POST
//! AIP_PREDICT_ROUTE` (default `/predict`) bodies `{"instances": [...]}` of at most 128
//! instances, each a request body naming its route in `@requestFormat` (a path, or its camelCase
//! alias: `chatCompletions` for `/v1/chat/completions`). The instances run side by side through
//! the server's own routes (each with the request's headers, so an API key applies to each);
//! the answer is `{"predictions": [...]}`, one per instance in order: the route's JSON body, or
//! an error object where the instance was malformed or its route streams.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{bail, Context};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::error::ApiError;
use super::ROUTES;

/// Most instances one prediction request may hold (llama-server's `MAX_INSTANCES`).
const MAX_INSTANCES: usize = 128;

/// The prediction settings the environment gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gcp {
    /// `AIP_HEALTH_ROUTE`: a second path for `/health` (none when unset, empty, or `/health`
    /// itself).
    pub health: Option<String>,
    /// `AIP_PREDICT_ROUTE` (default `/predict`).
    pub predict: String,
    /// `AIP_HTTP_PORT` (default 8080): the port the server listens on.
    pub port: u16,
}

impl Gcp {
    /// The settings when `AIP_MODE` is `PREDICTION` (none otherwise), read through `var`
    /// (the process environment when serving). A route that is one of the server's own, or a
    /// port that is not a number, is an error naming the variable.
    pub fn from(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Gcp>> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        if set("AIP_MODE").as_deref() != Some("PREDICTION") {
            return Ok(None);
        }
        let route = |name: &str| {
            set(name).map(|v| match v.starts_with('/') {
                true => v,
                false => format!("/{v}"),
            })
        };
        let predict = route("AIP_PREDICT_ROUTE").unwrap_or_else(|| "/predict".into());
        for (name, r) in [
            ("AIP_PREDICT_ROUTE", Some(&predict)),
            ("AIP_HEALTH_ROUTE", route("AIP_HEALTH_ROUTE").as_ref()),
        ] {
            if r.is_some_and(|r| r.contains(['{', '}', '*'])) {
                bail!(
                    "{name}={}: a route may not hold {{, }} or *",
                    r.unwrap_or(&predict)
                );
            }
        }
        if taken(&predict) {
            bail!("AIP_PREDICT_ROUTE={predict} conflicts with an existing route");
        }
        let health =
            route("AIP_HEALTH_ROUTE").filter(|h| !["/health", "/v1/health"].contains(&h.as_str()));
        if let Some(h) = health.as_ref().filter(|h| taken(h) || **h == predict) {
            bail!("AIP_HEALTH_ROUTE={h} conflicts with an existing route");
        }
        let port = match set("AIP_HTTP_PORT") {
            Some(p) => p
                .parse()
                .with_context(|| format!("AIP_HTTP_PORT={p:?}: expected a port number"))?,
            None => 8080,
        };
        Ok(Some(Gcp {
            health,
            predict,
            port,
        }))
    }

    /// The prediction routes, dispatching to `app` (the server's routes, under `prefix`), for
    /// the server's router to hold beside its own (so its API key and limits apply to them).
    pub fn routes<S: Clone + Send + Sync + 'static>(&self, app: Router, prefix: &str) -> Router<S> {
        let to = Arc::new(Dispatch {
            app,
            prefix: prefix.to_owned(),
            aliases: aliases(),
        });
        let mut r = Router::new().route(&self.predict, post(predict).with_state(Arc::clone(&to)));
        if let Some(health) = &self.health {
            r = r.route(health, get(health_route).with_state(to));
        }
        r
    }
}

/// Whether `path` is one of the server's own routes or the chat page's.
fn taken(path: &str) -> bool {
    path == "/v1/chat/completions/control"
        || super::page::is_asset_path(path)
        || routes().any(|(_, p)| p == path)
}

/// The server's routes as `(method, path)`, without those taking path parameters.
fn routes() -> impl Iterator<Item = (&'static str, &'static str)> {
    ROUTES
        .iter()
        .filter_map(|r| r.split_once(' '))
        .filter(|(_, path)| !path.contains(':'))
}

/// A route's camelCase alias, as llama-server derives it: `/v1` dropped, then each `/`, `-` or
/// `_` capitalises the letter after it (`/v1/chat/completions` → `chatCompletions`).
pub fn alias(path: &str) -> String {
    let rest = path
        .strip_prefix("/v1")
        .filter(|r| !r.is_empty())
        .unwrap_or(path);
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    let (mut out, mut cap) = (String::new(), false);
    for c in rest.chars() {
        match c {
            '/' | '-' | '_' => cap = true,
            c => {
                out.extend(if cap {
                    c.to_uppercase().collect()
                } else {
                    vec![c]
                });
                cap = false;
            }
        }
    }
    out
}

/// Each alias and path to the route it names (the first route listed wins an alias).
fn aliases() -> HashMap<String, (Method, &'static str)> {
    let mut map = HashMap::new();
    for (method, path) in routes() {
        let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::POST);
        map.entry(alias(path)).or_insert((method.clone(), path));
        map.entry(path.to_owned()).or_insert((method, path));
    }
    map
}

/// What the prediction routes dispatch to.
struct Dispatch {
    app: Router,
    prefix: String,
    aliases: HashMap<String, (Method, &'static str)>,
}

impl Dispatch {
    /// `body` sent to `method path` with `headers`, as the server answers it.
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &HeaderMap,
        body: Vec<u8>,
    ) -> Response {
        let mut req = Request::new(Body::from(body));
        *req.method_mut() = method;
        *req.uri_mut() = match format!("{}{path}", self.prefix).parse() {
            Ok(uri) => uri,
            Err(e) => return ApiError::internal(format!("route {path}: {e}")).into_response(),
        };
        *req.headers_mut() = headers.clone();
        req.headers_mut().remove(header::CONTENT_LENGTH);
        req.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        match self.app.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    /// One instance's prediction.
    async fn instance(&self, headers: &HeaderMap, instance: &Value) -> Value {
        let invalid = |m: &str| ApiError::invalid(m).body();
        let Some(obj) = instance.as_object() else {
            return invalid("each instance must be a JSON object");
        };
        let Some(format) = obj.get("@requestFormat").and_then(Value::as_str) else {
            return invalid("each instance must include a string @requestFormat");
        };
        let Some((method, path)) = self.aliases.get(format).cloned() else {
            return invalid(&format!(
                "no handler registered for @requestFormat: {format}"
            ));
        };
        let mut payload = obj.clone();
        payload.remove("@requestFormat");
        if payload.contains_key("stream") {
            tracing::warn!(
                "ignoring an instance's stream field: the predict route does not stream"
            );
            payload.insert("stream".into(), Value::Bool(false));
        }
        let body = serde_json::to_vec(&Value::Object(payload)).unwrap_or_default();
        let res = self.send(method, path, headers, body).await;
        let streams = res
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
        if streams {
            return invalid("predict route does not support streaming responses");
        }
        match axum::body::to_bytes(res.into_body(), usize::MAX).await {
            Ok(b) if b.is_empty() => Value::Null,
            Ok(b) => serde_json::from_slice(&b)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into_owned())),
            Err(e) => ApiError::internal(format!("reading the route's answer: {e}")).body(),
        }
    }
}

/// `POST AIP_PREDICT_ROUTE`.
async fn predict(State(to): State<Arc<Dispatch>>, headers: HeaderMap, body: Bytes) -> Response {
    let data: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return ApiError::invalid(e.to_string()).into_response(),
    };
    if !data.is_object() {
        return ApiError::invalid("request body must be a JSON object").into_response();
    }
    let Some(instances) = data.get("instances").and_then(Value::as_array) else {
        return ApiError::invalid("request body must include an array field named instances")
            .into_response();
    };
    if instances.len() > MAX_INSTANCES {
        return ApiError::invalid(format!(
            "instances array exceeds maximum size of {MAX_INSTANCES}"
        ))
        .into_response();
    }
    let predictions =
        futures_util::future::join_all(instances.iter().map(|i| to.instance(&headers, i))).await;
    axum::Json(json!({ "predictions": predictions })).into_response()
}

/// `GET AIP_HEALTH_ROUTE`: `/health`'s answer.
async fn health_route(State(to): State<Arc<Dispatch>>, headers: HeaderMap) -> Response {
    to.send(Method::GET, "/health", &headers, Vec::new()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_llama_servers() {
        assert_eq!(alias("/v1/chat/completions"), "chatCompletions");
        assert_eq!(alias("/apply-template"), "applyTemplate");
        assert_eq!(alias("/v1/messages/count_tokens"), "messagesCountTokens");
        assert_eq!(alias("/completion"), "completion");
        let map = aliases();
        assert_eq!(map["chatCompletions"].1, "/chat/completions");
        assert_eq!(map["/v1/embeddings"], (Method::POST, "/v1/embeddings"));
        assert_eq!(map["health"], (Method::GET, "/health"));
    }

    #[test]
    fn the_environment_turns_it_on() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(Gcp::from(env(&[])).unwrap(), None);
        assert_eq!(Gcp::from(env(&[("AIP_MODE", "TRAINING")])).unwrap(), None);
        let on = Gcp::from(env(&[("AIP_MODE", "PREDICTION")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            on,
            Gcp {
                health: None,
                predict: "/predict".into(),
                port: 8080
            }
        );
        let set = Gcp::from(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_PREDICT_ROUTE", "v1/endpoints/x:predict"),
            ("AIP_HEALTH_ROUTE", "/ready"),
            ("AIP_HTTP_PORT", "9000"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(set.predict, "/v1/endpoints/x:predict");
        assert_eq!((set.health.as_deref(), set.port), (Some("/ready"), 9000));
        let clash = Gcp::from(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_PREDICT_ROUTE", "/completion"),
        ]));
        assert!(clash
            .unwrap_err()
            .to_string()
            .contains("AIP_PREDICT_ROUTE=/completion"));
        let port = Gcp::from(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_HTTP_PORT", "http"),
        ]));
        assert!(port.unwrap_err().to_string().contains("AIP_HTTP_PORT"));
    }
}
