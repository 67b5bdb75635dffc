//! HTTP for `-hf` and `-mu`, with llama.cpp b11434's rules (`common/download.cpp`): JSON from
//! the Hub's API, and files fetched to `<path>.downloadInProgress` then renamed into place, resumed
//! with a byte range when the server takes ranges, tried three times (two seconds, then four,
//! between tries). A plain URL's download keeps the server's ETag beside the file
//! (`<path>.etag`) and is fetched again only when the ETag changes; a Hub file is never fetched
//! again once its blob is on disk (its name is its content's hash).

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde_json::Value;

use crate::progress::{Progress, Unit};

/// How many times a file's download is tried.
const TRIES: u32 = 3;
/// The wait before the second try, doubled before each later one.
const FIRST_RETRY_WAIT: Duration = Duration::from_secs(2);

/// The user agent every request carries.
fn user_agent() -> String {
    format!("bloomery/{}", env!("CARGO_PKG_VERSION"))
}

/// A client that reports every status to the caller (no status is an error by itself) and
/// follows redirects (the Hub sends file downloads to its CDN), keeping the token on a redirect
/// to the same host only.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(10)
        .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
        .build()
        .into()
}

/// `GET url` as JSON (the Hub's API), with `token` as a bearer token when it is one. A status
/// other than 200 is an error carrying the body's `error` text.
pub fn api_get(agent: &ureq::Agent, url: &str, token: Option<&str>) -> anyhow::Result<Value> {
    let mut req = agent
        .get(url)
        .header("User-Agent", user_agent())
        .header("Accept", "application/json");
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut res = req.call().map_err(|e| anyhow!("GET {url}: {e}"))?;
    let status = res.status().as_u16();
    let body = res
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .map_err(|e| anyhow!("GET {url}: {e}"))?;
    if status != 200 {
        let why = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(Value::as_str).map(String::from))
            .unwrap_or(body);
        bail!("GET {url} failed ({status}): {why}");
    }
    serde_json::from_str(&body).with_context(|| format!("GET {url}: the answer is not JSON"))
}

/// What one download is told.
pub struct Download<'a> {
    /// The URL.
    pub url: &'a str,
    /// Where the file goes.
    pub path: &'a Path,
    /// A bearer token for the request.
    pub token: Option<&'a str>,
    /// Whether the file on disk is kept without asking the server (a Hub blob): otherwise its
    /// ETag decides.
    pub keep_existing: bool,
}

/// The file the ETag of `path` is kept in.
fn etag_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".etag");
    PathBuf::from(p)
}

/// The temporary file `path` is downloaded to.
fn partial_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".downloadInProgress");
    PathBuf::from(p)
}

/// Fetches one file (see the module's rules). Returns whether it was fetched (false: the file on
/// disk was kept).
pub fn download(agent: &ureq::Agent, d: &Download) -> anyhow::Result<bool> {
    let exists = d.path.exists();
    if exists && d.keep_existing {
        return Ok(false);
    }
    let head = {
        let mut req = agent.head(d.url).header("User-Agent", user_agent());
        if let Some(t) = d.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        req.call()
    };
    let head = match head {
        Ok(h) if h.status().is_success() => h,
        Ok(_) | Err(_) if exists => return Ok(false),
        Ok(h) => bail!("{}: HEAD failed with status {}", d.url, h.status().as_u16()),
        Err(e) => bail!("{}: {e}", d.url),
    };
    let header = |name: &str| {
        head.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let etag = header("ETag").unwrap_or_default();
    let total: Option<u64> = header("Content-Length").and_then(|v| v.parse().ok());
    let ranges = header("Accept-Ranges").is_some_and(|v| v != "none");
    if exists {
        let last = std::fs::read_to_string(etag_path(d.path)).unwrap_or_default();
        if etag.is_empty() || last.lines().next() == Some(etag.as_str()) {
            return Ok(false);
        }
        std::fs::remove_file(d.path)
            .with_context(|| format!("unable to delete file: {}", d.path.display()))?;
    }
    if let Some(dir) = d.path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let partial = partial_path(d.path);
    let name = d.url.rsplit('/').next().unwrap_or(d.url);
    let name = name.split('?').next().unwrap_or(name);
    let mut progress = Progress::new(
        &format!("downloading {name}"),
        total.unwrap_or(0),
        Unit::Bytes,
        crate::progress::on_terminal(),
        false,
    );
    let mut wait = FIRST_RETRY_WAIT;
    let mut last_error = anyhow!("no try was made");
    for attempt in 0..TRIES {
        if attempt > 0 {
            tracing::warn!("{}: {last_error:#}; trying again in {wait:?}", d.url);
            std::thread::sleep(wait);
            wait *= 2;
        }
        match pull(agent, d, &partial, ranges, &mut progress) {
            Ok(()) => {
                std::fs::rename(&partial, d.path).with_context(|| {
                    format!(
                        "unable to rename {} to {}",
                        partial.display(),
                        d.path.display()
                    )
                })?;
                if !etag.is_empty() && !d.keep_existing {
                    super::cache::write_atomic(&etag_path(d.path), &etag)?;
                }
                progress.finish();
                return Ok(true);
            }
            Err(e) => last_error = e,
        }
    }
    Err(last_error.context(format!("{}: download failed after {TRIES} tries", d.url)))
}

/// One try: appends the rest of the file to `partial` (from its length when the server takes
/// ranges, from the start otherwise).
fn pull(
    agent: &ureq::Agent,
    d: &Download,
    partial: &Path,
    ranges: bool,
    progress: &mut Progress,
) -> anyhow::Result<()> {
    if partial.exists() && !ranges {
        std::fs::remove_file(partial)
            .with_context(|| format!("unable to delete file: {}", partial.display()))?;
    }
    let have = std::fs::metadata(partial).map_or(0, |m| m.len());
    let mut req = agent.get(d.url).header("User-Agent", user_agent());
    if let Some(t) = d.token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let res = req.call().map_err(|e| anyhow!("{e}"))?;
    let status = res.status().as_u16();
    if have > 0 && status != 206 {
        bail!("the server did not answer the resumed download with 206 Partial Content ({status})");
    }
    if have == 0 && status != 200 {
        bail!("the download was answered with status {status}");
    }
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(partial)
        .with_context(|| {
            format!(
                "error opening local file for writing: {}",
                partial.display()
            )
        })?;
    let mut body = res.into_body().into_reader();
    let mut buf = vec![0u8; 1 << 20];
    progress.inc(have.saturating_sub(progress.done()));
    loop {
        let n = body.read(&mut buf).map_err(|e| anyhow!("{e}"))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])
            .with_context(|| format!("error writing to file: {}", partial.display()))?;
        progress.inc(n as u64);
    }
    out.sync_all()
        .with_context(|| format!("error closing file: {}", partial.display()))?;
    Ok(())
}
