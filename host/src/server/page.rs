//! The chat page at `/`: one HTML, one script and one style sheet (`host/webui/`), written by
//! hand, with no build step, and compiled into the binary, so `dist/bloomery` serves it with no
//! other file. `--path DIR` serves a folder's files instead; `--no-ui` serves nothing at `/`.
//! The page's files answer without an API key (the page asks for one when the API wants it)
//! and while the model loads (the page shows the loading state).

use axum::handler::HandlerWithoutStateExt;
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tower_http::services::ServeDir;

use super::{not_found, AppRef};
use crate::flags::web::Page;

/// One file of the built-in page.
struct Asset {
    /// Its path on the server.
    path: &'static str,
    /// Its media type.
    mime: &'static str,
    /// Its bytes.
    body: &'static str,
}

/// Whether `path` is one of the built-in page's files (or `/`).
pub fn is_asset_path(path: &str) -> bool {
    path == "/" || ASSETS.iter().any(|a| a.path == path)
}

/// The built-in page's files (`/` serves `index.html`).
const ASSETS: &[Asset] = &[
    Asset {
        path: "/index.html",
        mime: "text/html; charset=utf-8",
        body: include_str!("../../webui/index.html"),
    },
    Asset {
        path: "/chat.js",
        mime: "text/javascript; charset=utf-8",
        body: include_str!("../../webui/chat.js"),
    },
    Asset {
        path: "/chat.css",
        mime: "text/css; charset=utf-8",
        body: include_str!("../../webui/chat.css"),
    },
];

/// `router` with what `/` serves added: the built-in page's routes, or a folder's files for
/// every GET no API route answers (`not_found` answers the rest).
pub fn add(router: Router<AppRef>, page: &Page) -> Router<AppRef> {
    match page {
        Page::Off => router.fallback(not_found),
        Page::BuiltIn => {
            let mut r = router.route("/", get(|| async { serve(&ASSETS[0]) }));
            for a in ASSETS {
                r = r.route(a.path, get(move || async move { serve(a) }));
            }
            r.fallback(not_found)
        }
        Page::Folder(dir) => {
            let files = ServeDir::new(dir)
                .call_fallback_on_method_not_allowed(true)
                .fallback(not_found.into_service());
            router.fallback_service(files)
        }
    }
}

/// Whether `path` is one of the page's files, which answer without an API key: the built-in
/// page's, or any GET of a `--path` folder (files the operator chose to publish).
pub fn is_page_file(page: &Page, method: &Method, path: &str) -> bool {
    let get = method == Method::GET || method == Method::HEAD;
    match page {
        Page::Off => false,
        Page::BuiltIn => get && (path == "/" || ASSETS.iter().any(|a| a.path == path)),
        Page::Folder(_) => {
            get && !super::ROUTES
                .iter()
                .any(|r| r.split(' ').nth(1) == Some(path))
        }
    }
}

/// One asset, revalidated on every load (the binary may have changed).
fn serve(a: &Asset) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(a.mime)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        a.body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_files_are_public_and_api_routes_are_not() {
        let g = Method::GET;
        assert!(is_page_file(&Page::BuiltIn, &g, "/"));
        assert!(is_page_file(&Page::BuiltIn, &g, "/chat.js"));
        assert!(!is_page_file(&Page::BuiltIn, &g, "/slots"));
        assert!(!is_page_file(&Page::BuiltIn, &Method::POST, "/"));
        assert!(!is_page_file(&Page::Off, &g, "/"));
        let folder = Page::Folder("/srv".into());
        assert!(is_page_file(&folder, &g, "/logo.png"));
        assert!(!is_page_file(&folder, &g, "/props"));
        assert!(!is_page_file(&folder, &g, "/metrics"));
    }

    #[test]
    fn the_page_names_only_files_it_serves() {
        let html = ASSETS[0].body;
        for a in &ASSETS[1..] {
            assert!(
                html.contains(&a.path[1..]),
                "index.html does not load {}",
                a.path
            );
        }
    }
}
