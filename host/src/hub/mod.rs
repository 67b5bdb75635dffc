//! Model downloads: `-hf user/model[:quant]` from the Hugging Face Hub (or the endpoint
//! `MODEL_ENDPOINT`/`HF_ENDPOINT` names) into the Hub's cache layout, and `-mu URL` into the
//! download folder, as llama-server b11434 does them (`common/download.cpp`,
//! `common/hf-cache.cpp`, `common/arg.cpp`'s models handler): the repository's main commit and
//! file list from the API, the model file picked by its quant ([`pick`]), every part of a split
//! model fetched side by side, `--offline` (or an unreachable Hub) served from the cache.
//! Projectors (`mmproj`) are not fetched, as multimodal input is not supported; draft sidecars
//! (`mtp-…`) are not fetched either: a draft model is given with `-md`.

pub mod cache;
pub mod fetch;
pub mod pick;
pub mod repo;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde_json::Value;

use self::cache::RepoFile;

/// How a download goes: `-hff`'s file, `-hft`'s token, `--offline`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fetch<'a> {
    /// The repository's file to load instead of the one the quant picks.
    pub hf_file: Option<&'a str>,
    /// A bearer token.
    pub token: Option<&'a str>,
    /// Cached files only.
    pub offline: bool,
}

/// The Hub's address: `MODEL_ENDPOINT`, else `HF_ENDPOINT`, else https://huggingface.co/, always
/// ending in `/`.
pub fn endpoint(env: &dyn Fn(&str) -> Option<String>) -> String {
    let mut e = env("MODEL_ENDPOINT")
        .filter(|v| !v.is_empty())
        .or_else(|| env("HF_ENDPOINT").filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "https://huggingface.co/".to_owned());
    if !e.ends_with('/') {
        e.push('/');
    }
    e
}

/// The repository's main commit (else its first branch's), recorded in the cache's
/// `refs/<branch>`.
fn main_commit(
    agent: &ureq::Agent,
    endpoint: &str,
    hub: &Path,
    repo: &str,
    token: Option<&str>,
) -> anyhow::Result<String> {
    let refs = fetch::api_get(agent, &format!("{endpoint}api/models/{repo}/refs"), token)?;
    let branches = refs
        .get("branches")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("the Hub's refs of {repo} list no branches"))?;
    let mut chosen: Option<(&str, &str)> = None;
    for b in branches {
        let (Some(name), Some(commit)) = (
            b.get("name").and_then(Value::as_str),
            b.get("targetCommit").and_then(Value::as_str),
        ) else {
            continue;
        };
        if !repo::valid_commit(commit) || !cache::inside(name) {
            continue;
        }
        if name == "main" {
            chosen = Some((name, commit));
            break;
        }
        chosen.get_or_insert((name, commit));
    }
    let (name, commit) = chosen.ok_or_else(|| anyhow!("no valid branch for {repo}"))?;
    cache::write_atomic(&cache::repo_dir(hub, repo).join("refs").join(name), commit)?;
    Ok(commit.to_owned())
}

/// The repository's files at its main commit, as the Hub lists them.
fn hub_files(
    agent: &ureq::Agent,
    endpoint: &str,
    hub: &Path,
    repo: &str,
    token: Option<&str>,
) -> anyhow::Result<Vec<RepoFile>> {
    if !repo::valid_repo_id(repo) {
        bail!("invalid repository: {repo}");
    }
    let commit = main_commit(agent, endpoint, hub, repo, token)?;
    let dir = cache::repo_dir(hub, repo);
    let snapshot = dir.join("snapshots").join(&commit);
    let url = format!("{endpoint}api/models/{repo}/tree/{commit}?recursive=true");
    let tree = fetch::api_get(agent, &url, token)?;
    let items = tree
        .as_array()
        .ok_or_else(|| anyhow!("the Hub's file list of {repo} is not an array"))?;
    let mut files = Vec::new();
    for item in items {
        if item.get("type").and_then(Value::as_str) != Some("file") {
            continue;
        }
        let Some(path) = item.get("path").and_then(Value::as_str) else {
            continue;
        };
        if !cache::inside(path) {
            tracing::warn!("{repo}: skipping the file {path:?}: it leaves the repository");
            continue;
        }
        let oid = match item.get("lfs") {
            Some(lfs) if lfs.is_object() => lfs.get("oid").and_then(Value::as_str),
            _ => item.get("oid").and_then(Value::as_str),
        }
        .unwrap_or("");
        if !oid.is_empty() && !repo::valid_oid(oid) {
            tracing::warn!("{repo}: skipping {path}: its object id {oid:?} is not valid");
            continue;
        }
        let at = snapshot.join(path);
        let local = if !oid.is_empty() && !at.exists() {
            dir.join("blobs").join(oid)
        } else {
            at.clone()
        };
        files.push(RepoFile {
            path: path.to_owned(),
            url: format!("{endpoint}{repo}/resolve/{commit}/{path}"),
            local,
            snapshot: at,
        });
    }
    Ok(files)
}

/// Fetches the files in `want` (those not on disk yet) side by side.
fn fetch_all(agent: &ureq::Agent, want: &[&RepoFile], token: Option<&str>) -> anyhow::Result<()> {
    std::thread::scope(|s| {
        let runs: Vec<_> = want
            .iter()
            .map(|f| {
                s.spawn(move || {
                    fetch::download(
                        agent,
                        &fetch::Download {
                            url: &f.url,
                            path: &f.local,
                            token,
                            keep_existing: true,
                        },
                    )
                })
            })
            .collect();
        for r in runs {
            r.join()
                .map_err(|_| anyhow!("a download thread panicked"))??;
        }
        Ok(())
    })
}

/// `-hf spec` (with `-hff`, `-hft`, `--offline`): the model file's path in the cache, fetched
/// first unless cached.
pub fn from_repo(
    a: &Fetch,
    spec: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<PathBuf> {
    let rt = repo::split_repo_tag(spec)?;
    let hub = cache::hub_dir(env)?;
    let end = endpoint(env);
    let agent = fetch::agent();
    let api_token = a.token.filter(|t| {
        let ok = repo::valid_token(t);
        if !ok {
            tracing::warn!("-hf: the token is not a Hugging Face token (hf_…): sent with downloads, not with API calls");
        }
        ok
    });
    let mut listing_error = None;
    let mut files = Vec::new();
    if !a.offline {
        match hub_files(&agent, &end, &hub, &rt.repo, api_token) {
            Ok(f) => files = f,
            Err(e) => {
                tracing::warn!("-hf {spec}: {e:#}; looking in the cache");
                listing_error = Some(e);
            }
        }
    }
    let from_cache = files.is_empty();
    if from_cache {
        files = cache::cached_files(&hub, &rt.repo);
    }
    let listed = if from_cache {
        format!("{}'s cached snapshot", rt.repo)
    } else {
        rt.repo.clone()
    };
    if files.is_empty() {
        let why = match listing_error {
            Some(e) => format!("{e:#}"),
            None if a.offline => "offline, and the cache has no snapshot of it".to_owned(),
            None => "the repository has no files".to_owned(),
        };
        bail!(
            "-hf {spec}: no files of {} ({why}; cache: {})",
            rt.repo,
            hub.display()
        );
    }
    if files.iter().any(|f| f.path == "preset.ini") {
        bail!(
            "-hf {spec}: not supported: {} is a preset repository (preset.ini), which starts \
             llama-server's model router; bloomery serves one model",
            rt.repo
        );
    }
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let ggufs = || {
        let list: Vec<&str> = paths
            .iter()
            .copied()
            .filter(|p| p.ends_with(".gguf"))
            .collect();
        if list.is_empty() {
            "none".to_owned()
        } else {
            list.join(", ")
        }
    };
    let primary = match a.hf_file {
        Some(name) => paths
            .iter()
            .position(|p| *p == name)
            .ok_or_else(|| anyhow!("-hff {name}: not in {listed}; its GGUF files: {}", ggufs()))?,
        None => pick::best_model(&paths, &rt.tag).ok_or_else(|| match rt.tag.as_str() {
            "" => anyhow!("-hf {spec}: no GGUF model files in {listed}"),
            tag => anyhow!(
                "-hf {spec}: no GGUF file of {listed} matches {tag}; its GGUF files: {}",
                ggufs()
            ),
        })?,
    };
    let parts = pick::split_parts(&paths, primary);
    for skipped in paths
        .iter()
        .filter(|p| p.ends_with(".gguf") && p.contains("mmproj"))
    {
        tracing::info!("-hf: {skipped} not fetched: multimodal input is not supported");
    }
    let want: Vec<&RepoFile> = parts.iter().map(|&i| &files[i]).collect();
    if a.offline {
        if let Some(f) = want.iter().find(|f| !f.local.exists()) {
            bail!(
                "-hf {spec}: required file is not available in cache (offline mode): {}",
                f.local.display()
            );
        }
    } else {
        fetch_all(&agent, &want, a.token)
            .with_context(|| format!("-hf {spec}: downloading {}", files[primary].path))?;
    }
    let mut model = PathBuf::new();
    for &i in &parts {
        let at = cache::finalize(&files[i])?;
        if i == primary {
            model = at;
        }
    }
    tracing::info!("-hf {spec}: {}", model.display());
    Ok(model)
}

/// `-mu url`: every part of the file the URL names, fetched to `model` (`-m`, when given; a split
/// model's parts beside it) or to the download folder, and the path of the first part.
pub fn from_url(
    a: &Fetch,
    url: &str,
    model: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<PathBuf> {
    let parts = pick::all_parts(url);
    let name_of = |u: &str| {
        let u = u.split('#').next().unwrap_or(u);
        let u = u.split('?').next().unwrap_or(u);
        u.rsplit('/').next().unwrap_or(u).to_owned()
    };
    let paths: Vec<PathBuf> = if let (1, Some(m)) = (parts.len(), model) {
        vec![m.to_path_buf()]
    } else {
        let dir = match model.and_then(Path::parent) {
            Some(d) => d.to_path_buf(),
            None => {
                let d = cache::url_dir(env)?;
                std::fs::create_dir_all(&d).with_context(|| {
                    format!("failed to create cache directory: {}", d.display())
                })?;
                d
            }
        };
        parts.iter().map(|p| dir.join(name_of(p))).collect()
    };
    if a.offline {
        if let Some(p) = paths.iter().find(|p| !p.exists()) {
            bail!(
                "-mu {url}: required file is not available in cache (offline mode): {}",
                p.display()
            );
        }
        return Ok(paths[0].clone());
    }
    let agent = fetch::agent();
    for (u, p) in parts.iter().zip(&paths) {
        fetch::download(
            &agent,
            &fetch::Download {
                url: u,
                path: p,
                token: a.token,
                keep_existing: false,
            },
        )
        .with_context(|| format!("-mu {url}"))?;
    }
    Ok(paths[0].clone())
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn the_endpoint_is_read_as_llama_cpp_reads_it() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                vars.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(endpoint(&env(&[])), "https://huggingface.co/");
        assert_eq!(
            endpoint(&env(&[("HF_ENDPOINT", "http://h:1")])),
            "http://h:1/"
        );
        assert_eq!(
            endpoint(&env(&[
                ("HF_ENDPOINT", "http://h:1"),
                ("MODEL_ENDPOINT", "http://m/")
            ])),
            "http://m/"
        );
    }
}
