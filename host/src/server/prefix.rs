//! `--api-prefix`: every route and the page served under a path (`/api/health`), as
//! llama-server registers them. The prefix is cut from the path before routing, so the routes,
//! the API-key guard and the page see the paths they know.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Runs a request under `prefix` with the prefix cut from its path; the prefix alone is
/// redirected to `prefix/` (the page's relative links need the slash), anything else is a 404.
pub async fn cut(State(prefix): State<Arc<str>>, mut req: Request, next: Next) -> Response {
    let uri = req.uri().clone();
    let path = uri.path();
    if path == &*prefix {
        let to = match uri.query() {
            Some(q) => format!("{prefix}/?{q}"),
            None => format!("{prefix}/"),
        };
        return (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, to)]).into_response();
    }
    let Some(rest) = path.strip_prefix(&*prefix).filter(|r| r.starts_with('/')) else {
        return super::not_found(req.method().clone(), uri).await;
    };
    let mut cut = rest.to_owned();
    if let Some(q) = uri.query() {
        cut.push('?');
        cut.push_str(q);
    }
    match cut.parse::<Uri>() {
        Ok(new) => *req.uri_mut() = new,
        Err(e) => {
            return super::error::ApiError::invalid(format!("request path: {e}")).into_response()
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use tower::{Layer, ServiceExt};

    fn app() -> Router {
        let inner = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/", get(|| async { "page" }));
        let prefix: Arc<str> = "/api".into();
        let cut = axum::middleware::from_fn_with_state(prefix, cut);
        Router::new().fallback_service(cut.layer(inner))
    }

    async fn get_path(path: &str) -> (StatusCode, String, Option<String>) {
        let r = app()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = r.status();
        let location = r
            .headers()
            .get(header::LOCATION)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        (
            status,
            String::from_utf8_lossy(&body).into_owned(),
            location,
        )
    }

    #[tokio::test]
    async fn routes_answer_under_the_prefix_only() {
        assert_eq!(get_path("/api/health").await.1, "ok");
        assert_eq!(get_path("/api/health?x=1").await.1, "ok");
        assert_eq!(get_path("/api/").await.1, "page");
        let (status, _, to) = get_path("/api?a=b").await;
        assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
        assert_eq!(to.as_deref(), Some("/api/?a=b"));
        assert_eq!(get_path("/health").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get_path("/apihealth").await.0, StatusCode::NOT_FOUND);
    }
}
