//! CORS as llama-server b11434 answers it (`tools/server/server-http.cpp`), on tower-http's
//! layer: every response names the allowed origin, and every `OPTIONS` request is a preflight
//! answered before the API key, the drain or the model's loading are checked (a browser sends no
//! key with it). By default (`--cors-origins *` with credentials) the request's `Origin` is
//! echoed back and credentials are allowed; `--cors-origins localhost` echoes only origins on
//! this machine.
//!
//! A list of allowed methods goes out as `--cors-methods` spells it (llama-server's default
//! `GET, POST, DELETE, OPTIONS`, spaces kept), after each item is checked to be a method.
//! Where llama-server writes `*` for the allowed request headers while allowing credentials
//! (which browsers do not read as a wildcard then, and never for `Authorization`), the layer
//! echoes the headers the preflight asks for, so a browser may send its key; a list of several
//! origins is matched against the request's rather than sent whole.

use anyhow::{bail, Context};
use axum::extract::{Request, State};
use axum::http::header::ACCESS_CONTROL_ALLOW_METHODS;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, Any, CorsLayer};

use crate::flags::web::WebArgs;

/// The CORS layer `--cors-origins`, `--cors-methods`, `--cors-headers` and
/// `--cors-credentials` describe; a value that is not a method or header name is refused by name.
pub fn layer(a: &WebArgs) -> anyhow::Result<CorsLayer> {
    let credentials = a.cors_credentials();
    let origins = match a.cors_origins.trim() {
        "*" if credentials => AllowOrigin::mirror_request(),
        "*" => AllowOrigin::from(Any),
        "localhost" => AllowOrigin::predicate(|origin: &HeaderValue, _: &Parts| {
            origin.to_str().is_ok_and(is_localhost)
        }),
        list => {
            let values = csv(list)
                .map(|o| {
                    HeaderValue::from_str(o)
                        .with_context(|| format!("--cors-origins: {o:?} is not an origin"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            AllowOrigin::list(values)
        }
    };
    let methods = match a.cors_methods.trim() {
        "*" if credentials => AllowMethods::mirror_request(),
        "*" => AllowMethods::from(Any),
        list => AllowMethods::list(
            csv(list)
                .map(|m| {
                    Method::from_bytes(m.as_bytes())
                        .with_context(|| format!("--cors-methods: {m:?} is not a method"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        ),
    };
    let headers = match a.cors_headers.trim() {
        "*" if credentials => AllowHeaders::mirror_request(),
        "*" => AllowHeaders::from(Any),
        list => AllowHeaders::list(
            csv(list)
                .map(|h| {
                    HeaderName::from_bytes(h.as_bytes())
                        .with_context(|| format!("--cors-headers: {h:?} is not a header name"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        ),
    };
    if csv(&a.cors_origins).count() == 0 {
        bail!("--cors-origins is empty: give *, localhost or origins");
    }
    Ok(CorsLayer::new()
        .allow_origin(origins)
        .allow_methods(methods)
        .allow_headers(headers)
        .allow_credentials(credentials))
}

/// The `Access-Control-Allow-Methods` value a preflight carries as `--cors-methods` spells it,
/// when that is a list (`None` for `*`, which the layer answers itself).
pub fn preflight_methods(a: &WebArgs) -> anyhow::Result<Option<HeaderValue>> {
    let list = a.cors_methods.trim();
    if list == "*" {
        return Ok(None);
    }
    let value = HeaderValue::from_str(list)
        .with_context(|| format!("--cors-methods: {list:?} is not a header value"))?;
    Ok(Some(value))
}

/// Middleware: sets a preflight answer's allowed methods to `methods` verbatim (tower-http
/// joins a list without spaces).
pub async fn spell_methods(
    State(methods): State<HeaderValue>,
    req: Request,
    next: Next,
) -> Response {
    let mut res = next.run(req).await;
    if let Some(v) = res.headers_mut().get_mut(ACCESS_CONTROL_ALLOW_METHODS) {
        *v = methods;
    }
    res
}

/// The non-empty items of a comma-separated list, trimmed.
fn csv(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Whether an origin (`scheme://host[:port]`) names this machine, as llama-server reads one:
/// `localhost`, `127.0.0.1` or `[::1]`.
fn is_localhost(origin: &str) -> bool {
    let Some((_, rest)) = origin.split_once("://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

#[cfg(test)]
mod tests {
    use super::is_localhost;

    #[test]
    fn localhost_origins_are_told_from_others() {
        for o in [
            "http://localhost",
            "http://localhost:8080",
            "https://127.0.0.1:3000",
            "http://[::1]:5173",
        ] {
            assert!(is_localhost(o), "{o}");
        }
        for o in [
            "http://localhost.example.com",
            "http://127.0.0.2",
            "https://example.com",
            "localhost",
            "null",
        ] {
            assert!(!is_localhost(o), "{o}");
        }
    }
}
