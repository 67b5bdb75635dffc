//! `bloomery serve`'s flags for browsers and transport, spelled as llama-server spells them: the
//! chat page (`--ui`/`--no-ui`, `--path`), CORS (`--cors-*`) and TLS (`--ssl-key-file`,
//! `--ssl-cert-file`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

/// llama-server's default `--cors-methods`.
pub const CORS_METHODS: &str = "GET, POST, DELETE, OPTIONS";

/// The chat page, CORS and TLS.
#[derive(Args, Debug, Clone)]
pub struct WebArgs {
    /// Serve the chat page at `/` (the default; `--no-ui`/`--no-webui` turns it off).
    #[arg(long = "ui", overrides_with = "no_ui", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_UI")]
    pub ui: bool,
    /// Do not serve the chat page.
    #[arg(long = "no-ui", overrides_with = "ui")]
    pub no_ui: bool,
    /// Serve this folder's files at `/` instead of the built-in chat page.
    #[arg(long = "path", value_name = "PATH", env = "LLAMA_ARG_STATIC_PATH")]
    pub path: Option<PathBuf>,
    /// JSON of the chat page's default settings (`/props`' `ui_settings`; a setting the user
    /// changed in the browser wins).
    #[arg(
        long = "ui-config",
        visible_alias = "webui-config",
        value_name = "JSON",
        env = "LLAMA_ARG_UI_CONFIG"
    )]
    pub ui_config: Option<String>,
    /// A file of that JSON (read instead of `--ui-config`).
    #[arg(
        long = "ui-config-file",
        visible_alias = "webui-config-file",
        value_name = "PATH",
        env = "LLAMA_ARG_UI_CONFIG_FILE"
    )]
    pub ui_config_file: Option<PathBuf>,
    /// Origins allowed by CORS, comma-separated; `*` (the default) allows any, and `localhost`
    /// only origins on this machine.
    #[arg(
        long = "cors-origins",
        default_value = "*",
        env = "LLAMA_ARG_CORS_ORIGINS"
    )]
    pub cors_origins: String,
    /// Methods allowed by CORS, comma-separated.
    #[arg(long = "cors-methods", default_value = CORS_METHODS, env = "LLAMA_ARG_CORS_METHODS")]
    pub cors_methods: String,
    /// Request headers allowed by CORS, comma-separated (`*`: any).
    #[arg(
        long = "cors-headers",
        default_value = "*",
        env = "LLAMA_ARG_CORS_HEADERS"
    )]
    pub cors_headers: String,
    /// Allow credentials for CORS (the default); with `--cors-origins *` the request's origin is
    /// echoed back.
    #[arg(long = "cors-credentials", overrides_with = "no_cors_credentials", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_CORS_CREDENTIALS")]
    pub cors_credentials: bool,
    /// Do not allow credentials for CORS.
    #[arg(long = "no-cors-credentials", overrides_with = "cors_credentials")]
    pub no_cors_credentials: bool,
    /// A PEM file with the TLS private key (serve HTTPS; needs `--ssl-cert-file`).
    #[arg(
        long = "ssl-key-file",
        value_name = "FNAME",
        env = "LLAMA_ARG_SSL_KEY_FILE"
    )]
    pub ssl_key_file: Option<PathBuf>,
    /// A PEM file with the TLS certificate chain (serve HTTPS; needs `--ssl-key-file`).
    #[arg(
        long = "ssl-cert-file",
        value_name = "FNAME",
        env = "LLAMA_ARG_SSL_CERT_FILE"
    )]
    pub ssl_cert_file: Option<PathBuf>,
}

/// What `/` serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Page {
    /// The built-in chat page.
    BuiltIn,
    /// The files of a folder (`--path`).
    Folder(PathBuf),
    /// Nothing (`--no-ui`).
    Off,
}

impl WebArgs {
    /// What `/` serves.
    pub fn page(&self) -> Page {
        match (&self.path, self.ui && !self.no_ui) {
            (_, false) => Page::Off,
            (Some(dir), true) => Page::Folder(dir.clone()),
            (None, true) => Page::BuiltIn,
        }
    }

    /// The page's default settings (`--ui-config`, `--ui-config-file`; an empty object without
    /// them). Text that is not JSON is refused by name, as llama-server refuses to start.
    pub fn ui_settings(&self) -> anyhow::Result<serde_json::Value> {
        let (text, from) = match (&self.ui_config_file, &self.ui_config) {
            (Some(f), _) => (
                std::fs::read_to_string(f)
                    .with_context(|| format!("--ui-config-file {}", f.display()))?,
                format!("--ui-config-file {}", f.display()),
            ),
            (None, Some(t)) => (t.clone(), "--ui-config".to_owned()),
            (None, None) => return Ok(serde_json::json!({})),
        };
        serde_json::from_str(&text).with_context(|| format!("{from}: failed to parse UI config"))
    }

    /// Whether CORS allows credentials.
    pub fn cors_credentials(&self) -> bool {
        self.cors_credentials && !self.no_cors_credentials
    }

    /// The key and certificate files when both are given; one without the other is refused.
    pub fn tls_files(&self) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
        match (&self.ssl_key_file, &self.ssl_cert_file) {
            (Some(k), Some(c)) => Ok(Some((k.clone(), c.clone()))),
            (None, None) => Ok(None),
            (Some(_), None) => bail!("--ssl-key-file needs --ssl-cert-file as well"),
            (None, Some(_)) => bail!("--ssl-cert-file needs --ssl-key-file as well"),
        }
    }

    /// Refuses a `--path` that is not a folder, and a lone TLS file.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Page::Folder(dir) = self.page() {
            if !dir.is_dir() {
                bail!("--path {}: not a folder", dir.display());
            }
        }
        self.tls_files()?;
        Ok(())
    }
}
