//! The Hugging Face cache on disk, laid out as the Hub's own clients and llama.cpp b11434
//! (`common/hf-cache.cpp`) lay it out, so that each reuses the others' downloads:
//! `models--user--model/refs/main` holds the commit, `blobs/<oid>` the bytes, and
//! `snapshots/<commit>/<path>` a relative symbolic link to the blob. Also the plain cache folder
//! `-mu` downloads into (`LLAMA_CACHE`, else `~/.cache/llama.cpp`).

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};

use super::repo::{valid_commit, valid_repo_id};

/// One file of a repository: where it is in the repository, where its bytes are fetched from,
/// where they land, and the path the model is loaded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    /// Its path in the repository.
    pub path: String,
    /// Its URL (`{endpoint}{repo}/resolve/{commit}/{path}`); empty for a file read from the cache.
    pub url: String,
    /// Where the download is written: the blob (`blobs/<oid>`), or the snapshot path when the
    /// file has no object id or its snapshot path exists already.
    pub local: PathBuf,
    /// Its path in the snapshot (`snapshots/<commit>/<path>`).
    pub snapshot: PathBuf,
}

/// An environment variable as a path, when set and not empty.
fn env_path(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<PathBuf> {
    env(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The Hub cache folder: the first of `LLAMA_CACHE`, `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`,
/// `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`, `$HOME/.cache/huggingface/hub` that is set.
pub fn hub_dir(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<PathBuf> {
    let entries: [(&str, &[&str]); 6] = [
        ("LLAMA_CACHE", &[]),
        ("HF_HUB_CACHE", &[]),
        ("HUGGINGFACE_HUB_CACHE", &[]),
        ("HF_HOME", &["hub"]),
        ("XDG_CACHE_HOME", &["huggingface", "hub"]),
        ("HOME", &[".cache", "huggingface", "hub"]),
    ];
    for (name, tail) in entries {
        if let Some(base) = env_path(env, name) {
            return Ok(tail.iter().fold(base, |p, t| p.join(t)));
        }
    }
    bail!("cannot find the Hugging Face cache folder: set HF_HOME, LLAMA_CACHE or HOME")
}

/// The plain download folder of `-mu`: `LLAMA_CACHE`, else `$XDG_CACHE_HOME/llama.cpp`, else
/// `$HOME/.cache/llama.cpp`.
pub fn url_dir(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = env_path(env, "LLAMA_CACHE") {
        return Ok(dir);
    }
    if let Some(dir) = env_path(env, "XDG_CACHE_HOME") {
        return Ok(dir.join("llama.cpp"));
    }
    match env_path(env, "HOME") {
        Some(home) => Ok(home.join(".cache").join("llama.cpp")),
        None => bail!("cannot find the download folder: set LLAMA_CACHE or HOME"),
    }
}

/// A repository's folder in the Hub cache (`models--user--model`).
pub fn repo_dir(hub: &Path, repo: &str) -> PathBuf {
    hub.join(format!("models--{}", repo.replace('/', "--")))
}

/// Whether `sub` stays inside the folder it is joined to (relative, no `..` above it).
pub fn inside(sub: &str) -> bool {
    let mut depth = 0i64;
    for c in Path::new(sub).components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Writes `text` to `path` through a temporary file beside it, renamed into place.
pub fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("failed to write file: {}", path.display()))
}

/// The commit a cached repository's refs name: `refs/main`'s, else the first valid one.
fn cached_commit(repo_dir: &Path) -> Option<String> {
    let mut fallback = None;
    for entry in std::fs::read_dir(repo_dir.join("refs")).ok()?.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let commit = text.lines().next().unwrap_or("").to_owned();
        if !valid_commit(&commit) {
            continue;
        }
        if entry.file_name() == "main" {
            return Some(commit);
        }
        fallback.get_or_insert(commit);
    }
    fallback
}

/// The files of `repo` in the cache's snapshot of its cached commit, in the order the folder
/// walk finds them (each already at its snapshot path).
pub fn cached_files(hub: &Path, repo: &str) -> Vec<RepoFile> {
    if !valid_repo_id(repo) {
        return Vec::new();
    }
    let dir = repo_dir(hub, repo);
    let Some(commit) = cached_commit(&dir) else {
        return Vec::new();
    };
    let root = dir.join("snapshots").join(commit);
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(folder) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let Ok(kind) = e.file_type() else { continue };
            let path = e.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() || kind.is_symlink() {
                let Ok(rel) = path.strip_prefix(&root) else {
                    continue;
                };
                files.push(RepoFile {
                    path: rel.to_string_lossy().replace('\\', "/"),
                    url: String::new(),
                    local: path.clone(),
                    snapshot: path,
                });
            }
        }
    }
    files
}

/// The models in the Hub cache as `-cl` lists them (`user/model:TAG`): one per repository and
/// quant tag, from each repository's cached snapshot, skipping files without a tag, split parts
/// after the first, projectors and draft sidecars. Sorted.
pub fn cached_models(hub: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(hub) else {
        return Vec::new();
    };
    let mut out = std::collections::BTreeSet::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(repo) = name.strip_prefix("models--").map(|r| r.replace("--", "/")) else {
            continue;
        };
        for f in cached_files(hub, &repo) {
            let Some(s) = super::pick::split_info(&f.path) else {
                continue;
            };
            let sidecar = ["mmproj", "mtp-", "eagle3-", "dflash-", "dspark-"]
                .iter()
                .any(|k| s.prefix.contains(k));
            if s.index == 1 && !s.tag.is_empty() && !sidecar {
                out.insert(format!("{repo}:{}", s.tag));
            }
        }
    }
    out.into_iter().collect()
}

/// Puts a downloaded file at its snapshot path and returns that path: a relative symbolic link
/// to its blob, or the blob itself moved there (copied if it cannot move) when links fail.
pub fn finalize(file: &RepoFile) -> anyhow::Result<PathBuf> {
    let (local, snapshot) = (&file.local, &file.snapshot);
    if local == snapshot || snapshot.symlink_metadata().is_ok() || !local.exists() {
        return Ok(snapshot.clone());
    }
    let parent = snapshot.parent().context("a snapshot path has a folder")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    if let Some(target) = relative(local, parent) {
        if std::os::unix::fs::symlink(&target, snapshot).is_ok() {
            return Ok(snapshot.clone());
        }
    }
    tracing::warn!(
        "cannot link {} to its blob: moving the blob there",
        snapshot.display()
    );
    if std::fs::rename(local, snapshot).is_err() {
        std::fs::copy(local, snapshot).with_context(|| {
            format!(
                "failed to copy {} to {}",
                local.display(),
                snapshot.display()
            )
        })?;
    }
    Ok(snapshot.clone())
}

/// `to` relative to the folder `from` (both absolute or both relative to the same place).
fn relative(to: &Path, from: &Path) -> Option<PathBuf> {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    if common == 0 {
        return None;
    }
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_cache_folders_follow_llama_cpps_order() {
        let all = [
            ("LLAMA_CACHE", "/l"),
            ("HF_HUB_CACHE", "/h"),
            ("HF_HOME", "/hh"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(hub_dir(&env(&all)).unwrap(), Path::new("/l"));
        assert_eq!(hub_dir(&env(&all[1..])).unwrap(), Path::new("/h"));
        assert_eq!(hub_dir(&env(&all[2..])).unwrap(), Path::new("/hh/hub"));
        assert_eq!(
            hub_dir(&env(&all[3..])).unwrap(),
            Path::new("/x/huggingface/hub")
        );
        assert_eq!(
            hub_dir(&env(&all[4..])).unwrap(),
            Path::new("/home/u/.cache/huggingface/hub")
        );
        assert_eq!(
            hub_dir(&env(&[("HF_HOME", ""), ("HOME", "/u")])).unwrap(),
            Path::new("/u/.cache/huggingface/hub")
        );
        assert!(hub_dir(&env(&[])).is_err());
        assert_eq!(url_dir(&env(&all)).unwrap(), Path::new("/l"));
        assert_eq!(url_dir(&env(&all[3..])).unwrap(), Path::new("/x/llama.cpp"));
        assert_eq!(
            url_dir(&env(&all[4..])).unwrap(),
            Path::new("/home/u/.cache/llama.cpp")
        );
        assert_eq!(
            repo_dir(Path::new("/c"), "a/b-c"),
            Path::new("/c/models--a--b-c")
        );
    }

    #[test]
    fn repository_paths_must_stay_inside_the_snapshot() {
        assert!(inside("a.gguf") && inside("d/../a.gguf") && inside("./d/a.gguf"));
        assert!(!inside("../a.gguf") && !inside("/etc/passwd") && !inside("d/../../a"));
    }

    #[test]
    fn links_point_from_the_snapshot_to_the_blob() {
        let r = relative(
            Path::new("/c/m/blobs/abc"),
            Path::new("/c/m/snapshots/0123/sub"),
        );
        assert_eq!(r.unwrap(), Path::new("../../../blobs/abc"));
    }
}
