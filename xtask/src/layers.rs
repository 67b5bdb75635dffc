//! `cargo xtask layers`: the dependency direction of docs/architecture.md, checked. Crates point
//! one way (a crate depends only on crates of lower layers; plugins never on the host's crates),
//! and within each crate no module reaches, through others, back to itself. A failure names the
//! crates or the cycle of modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The host's crates by layer, bottom first: each may depend only on crates of lower layers.
/// Plugins (`plugins/*/*`) may depend on layer 0 and the kernel crates only.
const LAYERS: &[(&str, u32)] = &[
    ("bloomery-plugin-api", 0),
    ("bloomery-text", 0),
    ("bloomery-grammar", 0),
    ("bloomery-gguf", 1),
    ("bloomery-kernels-cpu", 1),
    ("bloomery-kernels-cuda", 2),
    ("bloomery-devices", 2),
    ("bloomery-tiering", 3),
    ("bloomery-exec", 4),
    ("bloomery-runtime", 5),
    ("bloomery", 6),
];

/// The crates a plugin may link: the ABI and the kernel sources.
const PLUGIN_MAY_USE: &[&str] = &[
    "bloomery-plugin-api",
    "bloomery-kernels-cpu",
    "bloomery-kernels-cuda",
];

/// A workspace crate: its package name, folder, and the `bloomery*` crates it depends on (not
/// counting dev-dependencies, which only its tests link).
struct Member {
    name: String,
    dir: PathBuf,
    deps: Vec<String>,
}

/// Runs both checks; the error lists every violation.
pub fn check(root: &Path) -> Result<()> {
    let members = members(root)?;
    let mut problems = crate_direction(&members);
    for m in &members {
        let src = m.dir.join("src");
        if src.join("lib.rs").exists() {
            problems.extend(
                module_cycles(&src)?
                    .into_iter()
                    .map(|c| format!("{}: modules in a cycle: {}", m.name, c.join(" -> "))),
            );
        }
    }
    if !problems.is_empty() {
        bail!(
            "the dependency direction of docs/architecture.md is broken:\n  {}",
            problems.join("\n  ")
        );
    }
    println!(
        "layers: {} crates point one way, no module cycles",
        members.len()
    );
    Ok(())
}

/// Every member of the workspace's `members` list.
fn members(root: &Path) -> Result<Vec<Member>> {
    let text = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let list = text
        .split("members = [")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .context("Cargo.toml: no members list")?;
    let mut out = Vec::new();
    for dir in list.split(',').map(|d| d.trim().trim_matches('"')) {
        if dir.is_empty() {
            continue;
        }
        let manifest = root.join(dir).join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest)
            .with_context(|| format!("reading {}", manifest.display()))?;
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|v| v.trim_matches('"').to_owned())
            .with_context(|| format!("{}: no package name", manifest.display()))?;
        out.push(Member {
            name,
            dir: root.join(dir),
            deps: bloomery_deps(&text),
        });
    }
    Ok(out)
}

/// The `bloomery*` crates a manifest's `[dependencies]` and `[build-dependencies]` name.
fn bloomery_deps(manifest: &str) -> Vec<String> {
    let mut section = "";
    let mut deps = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section != "[dependencies]" && section != "[build-dependencies]" {
            continue;
        }
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        if name.starts_with("bloomery") {
            deps.push(name);
        }
    }
    deps
}

/// Each dependency that does not point down a layer.
fn crate_direction(members: &[Member]) -> Vec<String> {
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut problems = Vec::new();
    for m in members {
        let is_plugin = m.dir.components().any(|c| c.as_os_str() == "plugins");
        for d in &m.deps {
            if is_plugin {
                if !PLUGIN_MAY_USE.contains(&d.as_str()) {
                    problems.push(format!(
                        "{} is a plugin and depends on {d}: plugins link only {}",
                        m.name,
                        PLUGIN_MAY_USE.join(", ")
                    ));
                }
                continue;
            }
            match (layer.get(m.name.as_str()), layer.get(d.as_str())) {
                (Some(&a), Some(&b)) if b < a => {}
                (Some(&a), Some(&b)) => problems.push(format!(
                    "{} (layer {a}) depends on {d} (layer {b}): dependencies point down",
                    m.name
                )),
                (None, _) if m.name == "xtask" => {}
                (None, _) => problems.push(format!(
                    "{} has no layer in xtask/src/layers.rs (and docs/architecture.md)",
                    m.name
                )),
                (_, None) => {
                    problems.push(format!("{} depends on {d}, which has no layer", m.name))
                }
            }
        }
    }
    problems
}

/// The cycles among a crate's top-level modules, each as the modules along it. The root
/// (`lib.rs`) is the crate's facade: a path through an item it re-exports (`pub use m::X`) leads
/// to the module that defines it; only items the root defines itself make it a module of the
/// graph.
fn module_cycles(src: &Path) -> Result<Vec<Vec<String>>> {
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(src)? {
        let p = e?.path();
        let stem = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if p.is_dir()
            || (p.extension().is_some_and(|x| x == "rs") && stem != "lib" && stem != "main")
        {
            names.insert(stem);
        }
    }
    let root = std::fs::read_to_string(src.join("lib.rs"))?;
    let reexports = reexports(&root, &names);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges
        .entry(ROOT.into())
        .or_default()
        .extend(root_refs(&root, &names));
    for m in &names {
        let mut files = Vec::new();
        let file = src.join(format!("{m}.rs"));
        if file.exists() {
            files.push((file, true));
        }
        let folder = src.join(m);
        rust_files(&folder, &folder, &mut files)?;
        let out = edges.entry(m.clone()).or_default();
        for (f, top) in files {
            let text = std::fs::read_to_string(&f)?;
            for r in module_refs(&text, top, &names, &reexports) {
                if &r != m {
                    out.insert(r);
                }
            }
        }
    }
    Ok(cycles(&edges))
}

/// The root's name in the module graph.
const ROOT: &str = "<root>";

/// Items the root re-exports from its modules (`pub use m::X;`, `pub use m::{X, Y};`): item →
/// module.
fn reexports(root: &str, names: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in code_lines(root) {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.strip_prefix("self::").unwrap_or(rest);
        let module = first_segment(rest);
        if !names.contains(&module) {
            continue;
        }
        let items = rest[module.len()..]
            .trim_start_matches("::")
            .trim_end_matches(';');
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            // The name it is seen by: the last segment, or the alias after `as`.
            let item = item.trim();
            let seen = item.rsplit(" as ").next().unwrap_or(item);
            let seen = seen.rsplit("::").next().unwrap_or(seen).trim();
            if !seen.is_empty() {
                out.insert(seen.to_owned(), module.clone());
            }
        }
    }
    out
}

/// Every `.rs` file under `dir` (within module folder `module`); its `mod.rs` speaks for the
/// module itself (`super::` there is the crate root).
fn rust_files(dir: &Path, module: &Path, out: &mut Vec<(PathBuf, bool)>) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries {
        let p = e?.path();
        if p.is_dir() {
            rust_files(&p, module, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            let top = p == module.join("mod.rs");
            out.push((p, top));
        }
    }
    Ok(())
}

/// Source lines without comments (doc links name modules they do not use).
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .filter(|l| !l.trim().is_empty())
}

/// The first path segments after each `prefix` in `line` (`crate::a::b`, `crate::{a, b::c}`).
fn segments_after(line: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in line.match_indices(prefix) {
        let before = line[..i].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &line[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            out.extend(inner.split(',').map(first_segment));
        } else {
            out.push(first_segment(rest));
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

fn first_segment(path: &str) -> String {
    path.trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The top-level modules (or the root) a module's file refers to; `top` says whether `super::`
/// in it names the crate root.
fn module_refs(
    text: &str,
    top: bool,
    names: &BTreeSet<String>,
    reexports: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code_lines(text) {
        let mut found = segments_after(line, "crate::");
        if top {
            found.extend(segments_after(line, "super::"));
        }
        for s in found {
            if names.contains(&s) {
                out.insert(s);
            } else if let Some(m) = reexports.get(&s) {
                out.insert(m.clone());
            } else if s != "self" && s != "super" {
                out.insert(ROOT.into());
            }
        }
    }
    out
}

/// The modules the root's own code uses: not its `mod` declarations, its re-exports, nor the
/// bodies of its exported macros (`$crate::` paths, which expand in the caller's crate).
fn root_refs(text: &str, names: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code_lines(text) {
        let t = line.trim();
        if t.starts_with("mod ")
            || t.starts_with("pub mod ")
            || t.starts_with("pub(crate) mod ")
            || t.starts_with("pub use ")
            || t.contains("$crate::")
        {
            continue;
        }
        for n in names {
            let path = format!("{n}::");
            let used = t.match_indices(&path).any(|(i, _)| {
                !t[..i]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            if used {
                out.insert(n.clone());
            }
        }
    }
    out
}

/// One cycle per strongly connected set of two or more modules, as a path around it.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut seen_sets: Vec<BTreeSet<String>> = Vec::new();
    for start in edges.keys() {
        // The shortest path back to `start`, breadth first.
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.as_str()]);
        let mut closing = None;
        while let Some(at) = queue.pop_front() {
            for next in edges.get(at).into_iter().flatten() {
                if next == start {
                    closing = Some(at);
                    break;
                }
                if !prev.contains_key(next.as_str()) {
                    prev.insert(next, at);
                    queue.push_back(next);
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let Some(mut at) = closing else { continue };
        let mut path = vec![start.clone()];
        let mut back = vec![at.to_owned()];
        while at != start {
            at = prev[at];
            if at != start {
                back.push(at.to_owned());
            }
        }
        back.reverse();
        path.extend(back);
        path.push(start.clone());
        let set: BTreeSet<String> = path.iter().cloned().collect();
        if !seen_sets.contains(&set) {
            seen_sets.push(set);
            found.push(path);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(pairs: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            g.entry((*a).into()).or_default().insert((*b).into());
            g.entry((*b).into()).or_default();
        }
        g
    }

    #[test]
    fn a_cycle_is_found_and_a_chain_is_not() {
        assert!(cycles(&graph(&[("a", "b"), ("b", "c")])).is_empty());
        let c = cycles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
        assert_eq!(c, vec![vec!["a", "b", "c", "a"]]);
    }

    #[test]
    fn references_are_read_from_paths_and_groups_but_not_comments() {
        let names: BTreeSet<String> = ["model", "state", "error"].map(String::from).into();
        let text = "use crate::{model::LoadOptions, error::E};\n/// see [`crate::state`]\n\
                    fn f() { crate::RootItem; super::model::x(); }";
        let reexported: BTreeMap<String, String> = [("Spec".to_owned(), "state".to_owned())].into();
        let refs = module_refs(text, true, &names, &reexported);
        let want: BTreeSet<String> = ["model", "error", "<root>"].map(String::from).into();
        assert_eq!(refs, want);
        // A re-exported item leads to its module, not the root.
        let refs = module_refs("use crate::Spec;", true, &names, &reexported);
        assert_eq!(refs, ["state".to_owned()].into());
        // In a nested file `super::` is the module itself.
        assert!(!module_refs("use super::model::X;", false, &names, &reexported).contains("model"));
        assert_eq!(
            reexports(
                "pub use state::{Spec, Kind as K};\npub use self::model::M;",
                &names
            ),
            [
                ("Spec".to_owned(), "state".to_owned()),
                ("K".to_owned(), "state".to_owned()),
                ("M".to_owned(), "model".to_owned())
            ]
            .into()
        );
    }

    #[test]
    fn a_dependency_up_the_layers_is_refused() {
        let m = |name: &str, dir: &str, deps: &[&str]| Member {
            name: name.into(),
            dir: PathBuf::from(dir),
            deps: deps.iter().map(|d| (*d).into()).collect(),
        };
        assert!(crate_direction(&[m("bloomery-exec", "exec", &["bloomery-tiering"])]).is_empty());
        assert_eq!(
            crate_direction(&[m("bloomery-tiering", "tiering", &["bloomery-exec"])]).len(),
            1
        );
        assert_eq!(
            crate_direction(&[m("x", "plugins/models/x", &["bloomery-devices"])]).len(),
            1
        );
    }
}
