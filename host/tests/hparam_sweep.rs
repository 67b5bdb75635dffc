//! Hostile hyperparameters (issue 40): the tiny file of every architecture the model plugins
//! serve (the example plugin's included) with each integer key of its architecture rewritten to
//! values a crafted file could hold: 0, 1, 2^31 − 1, 2^32 − 1, the true value ± 1, `u64::MAX` and
//! negatives where the type holds them, the key retyped to u64 `u64::MAX` and to i32 −1, and each
//! integer array filled with 0, 1, 2^31 − 1, 2^32 − 1 or −1. `bloomery info` and a one-token
//! `run` of each must succeed or end with a named error (a non-zero exit status and one `error:`
//! line, or `info`'s line naming the plugin that refuses the file), never panic, die by a signal
//! or hang. Each process runs under a 4 GiB address-space limit, so that a table sized by a
//! hostile count fails its allocation (an abort, which this test reports) rather than paging the
//! machine. The counts per architecture are printed (`--nocapture`).

mod common;

use common::plugin_dir;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bloomery_gguf::{Array, GgufFile, GgufWriter, Value};

/// The address space each child may map, in KiB (`ulimit -v`).
const ADDRESS_LIMIT_KIB: u64 = 4 << 20;
/// How long one child may run before it counts as hung.
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// Where `cargo xtask test` builds the example plugin (its own workspace and target folder).
fn example_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/model-plugin/target/debug");
    assert!(
        dir.join("libbloomery_model_qwen3.so").is_file(),
        "build the example first: cargo build --manifest-path examples/model-plugin/Cargo.toml"
    );
    dir
}

/// The plugin file that serves each architecture.
fn plugin_of(arch: &str) -> &'static str {
    match arch {
        "qwen3moe" => "model-qwen3moe.so",
        "gemma3" => "model-gemma3.so",
        "qwen35moe" | "qwen35" => "model-qwen35.so",
        "qwen3" => "model-qwen3-example.so",
        "glm4moe" => "model-glm4moe.so",
        "solar-open2" | "kimi-linear" => "model-solar-open2.so",
        "glm5-next" => "model-glm5-next.so",
        other => panic!("no plugin listed for {other}"),
    }
}

/// A plugin folder for `arch` with only what its runs need (the plugin that serves it and
/// cpu-scalar), so that each of the many children starts quickly (a debug build loading every
/// plugin took three times as long).
fn small_plugin_dir(dir: &Path, arch: &str) -> PathBuf {
    let out = dir.join(format!("plugins-{arch}"));
    std::fs::create_dir(&out).unwrap();
    let model = plugin_of(arch);
    let from = if model == "model-qwen3-example.so" {
        example_dir().join("libbloomery_model_qwen3.so")
    } else {
        plugin_dir().join(model)
    };
    std::fs::copy(&from, out.join(model)).unwrap();
    let scalar = "kernel-cpu-scalar.so";
    std::fs::copy(plugin_dir().join(scalar), out.join(scalar)).unwrap();
    out
}

/// How one child ended.
#[derive(Debug)]
enum Outcome {
    /// Exit status 0, the file accepted.
    Ok,
    /// A non-zero exit status with one `error:` line, or `info`'s line saying which plugin
    /// refuses the file and why; no panic.
    Named,
    /// Anything else: a signal, a panic, a hang, or a failure without a named error.
    Bad(String),
}

/// Runs `bloomery ARGS` under the address-space limit and the timeout.
fn run_child(plugins: &Path, args: &[&str]) -> Outcome {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {ADDRESS_LIMIT_KIB}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(plugins)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || std::io::read_to_string(r).unwrap_or_default())
    };
    let (out_reader, err_reader) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > CHILD_TIMEOUT {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (out, text) = (out_reader.join().unwrap(), err_reader.join().unwrap());
    let tail = || text.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
    let Some(status) = status else {
        return Outcome::Bad(format!("hung for {CHILD_TIMEOUT:?}: {}", tail()));
    };
    if text.contains("panicked") || out.contains("panicked") {
        return Outcome::Bad(format!("a panic: {}", tail()));
    }
    if status.success() {
        // `info` describes any file it can parse and names the plugin's refusal on stdout.
        let refused = out
            .lines()
            .filter(|l| l.contains("refuses the file:"))
            .count();
        return if refused == 1 {
            Outcome::Named
        } else {
            Outcome::Ok
        };
    }
    let Some(code) = status.code() else {
        return Outcome::Bad(format!("killed by a signal ({status}): {}", tail()));
    };
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("error:")).collect();
    let [line] = errors[..] else {
        return Outcome::Bad(format!("exit {code} without one named error: {}", tail()));
    };
    // A cause printed twice (the message and again as its source) ends the line twice.
    let end = &line[line.char_indices().rev().nth(39).map_or(0, |(i, _)| i)..];
    if line.matches(end).count() > 1 {
        return Outcome::Bad(format!("the error repeats itself: {line}"));
    }
    Outcome::Named
}

/// The hostile values of an integer of `original`'s type: each that type can hold, then the key
/// retyped to u64 `u64::MAX` and to i32 −1.
fn hostile(original: &Value) -> Vec<Value> {
    let v = original.as_uint();
    let wide: Vec<i128> = [
        Some(0),
        Some(1),
        Some((1 << 31) - 1),
        Some((1 << 32) - 1),
        Some(u64::MAX as i128),
        Some(-1),
        Some(i64::MIN as i128),
        v.map(|v| i128::from(v) - 1),
        v.map(|v| i128::from(v) + 1),
    ]
    .into_iter()
    .flatten()
    .collect();
    let same = |x: i128| -> Option<Value> {
        Some(match original {
            Value::U8(_) => Value::U8(x.try_into().ok()?),
            Value::I8(_) => Value::I8(x.try_into().ok()?),
            Value::U16(_) => Value::U16(x.try_into().ok()?),
            Value::I16(_) => Value::I16(x.try_into().ok()?),
            Value::U32(_) => Value::U32(x.try_into().ok()?),
            Value::I32(_) => Value::I32(x.try_into().ok()?),
            Value::U64(_) => Value::U64(x.try_into().ok()?),
            Value::I64(_) => Value::I64(x.try_into().ok()?),
            _ => return None,
        })
    };
    let mut out: Vec<Value> = wide.into_iter().filter_map(same).collect();
    out.push(Value::U64(u64::MAX));
    out.push(Value::I32(-1));
    let mut unique = Vec::new();
    for x in out {
        if &x != original && !unique.contains(&x) {
            unique.push(x);
        }
    }
    unique
}

/// The same array with every element set to `x` (when its elements are integers that hold it).
fn filled(a: &Array, x: i128) -> Option<Array> {
    fn all<T: Copy + TryFrom<i128>>(v: &[T], x: i128) -> Option<Vec<T>> {
        let x = T::try_from(x).ok()?;
        Some(vec![x; v.len()])
    }
    Some(match a {
        Array::U8(v) => Array::U8(all(v, x)?),
        Array::I8(v) => Array::I8(all(v, x)?),
        Array::U16(v) => Array::U16(all(v, x)?),
        Array::I16(v) => Array::I16(all(v, x)?),
        Array::U32(v) => Array::U32(all(v, x)?),
        Array::I32(v) => Array::I32(all(v, x)?),
        Array::U64(v) => Array::U64(all(v, x)?),
        Array::I64(v) => Array::I64(all(v, x)?),
        _ => return None,
    })
}

fn is_int(v: &Value) -> bool {
    matches!(
        v,
        Value::U8(_)
            | Value::I8(_)
            | Value::U16(_)
            | Value::I16(_)
            | Value::U32(_)
            | Value::I32(_)
            | Value::U64(_)
            | Value::I64(_)
    )
}

/// Every (key, hostile value) of the architecture `arch` in `file`.
fn cases(file: &GgufFile, arch: &str) -> Vec<(String, Value)> {
    let prefix = format!("{arch}.");
    let mut out = Vec::new();
    for e in file.metadata().entries() {
        if !e.key.starts_with(&prefix) {
            continue;
        }
        if is_int(&e.value) {
            out.extend(hostile(&e.value).into_iter().map(|v| (e.key.clone(), v)));
        } else if let Value::Array(a) = &e.value {
            for x in [0, 1, (1 << 31) - 1, (1 << 32) - 1, -1] {
                if let Some(f) = filled(a, x) {
                    out.push((e.key.clone(), Value::Array(f)));
                }
            }
        }
    }
    out
}

/// `src` rewritten with `key` set to `value`, into `dst`.
fn rewrite(src: &GgufFile, key: &str, value: &Value, dst: &Path) {
    let mut w = GgufWriter::new();
    for e in src.metadata().entries() {
        let v = if e.key == key { value } else { &e.value };
        w.set(&e.key, v.clone()).unwrap();
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, t.dtype, &t.shape).unwrap();
    }
    w.write_file(dst, |t, sink| {
        let src_t = src.tensor(&t.name).unwrap();
        std::io::Write::write_all(sink, src.tensor_data(src_t).unwrap())
    })
    .unwrap();
}

/// The value as the report shows it (an array filled with one value as `[x; n]`).
fn short(v: &Value) -> String {
    match v {
        Value::Array(a) => {
            let s = format!("{a:?}");
            let first = s
                .split(['(', ',', ']'])
                .nth(1)
                .unwrap_or("")
                .trim_start_matches('[');
            format!("[{first}; {}]", a.len())
        }
        v => format!("{v:?}"),
    }
}

#[test]
fn hostile_hyperparameters_end_in_named_errors_never_in_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let archs = [
        "qwen3moe",
        "gemma3",
        "qwen35moe",
        "qwen35",
        "qwen3",
        "glm4moe",
        "solar-open2",
        "kimi-linear",
        "glm5-next",
    ];
    let mut all = Vec::new();
    for arch in archs {
        let path = dir.path().join(format!("{arch}.gguf"));
        let p = path.to_str().unwrap();
        let plugins = small_plugin_dir(dir.path(), arch);
        let out = Command::new(env!("CARGO_BIN_EXE_bloomery"))
            .arg("--plugin-dir")
            .arg(&plugins)
            .args(["synth", "--arch", arch, "--preset", "tiny", "-o", p])
            // Q8_0 weights: each case rewrites the whole file, and f32 files made this test
            // write ≈ 20 GB (a quarter with Q8_0; the keys are what the cases change).
            .args([
                "--embd",
                "Q8_0",
                "--output-type",
                "Q8_0",
                "--experts",
                "Q8_0",
            ])
            .args(["--attn", "Q8_0", "--dense", "Q8_0"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let file = GgufFile::open(&path).unwrap();
        for (key, value) in cases(&file, arch) {
            all.push((arch, path.clone(), key, value, plugins.clone()));
        }
    }
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((arch, path, key, value, plugins)) = all.get(i) else {
                    break;
                };
                let src = GgufFile::open(path).unwrap();
                let case = dir.path().join(format!("case{i}.gguf"));
                rewrite(&src, key, value, &case);
                let m = case.to_str().unwrap();
                let info = run_child(plugins, &["info", "-m", m]);
                let run_args = ["run", "-m", m, "-c", "64", "-t", "1", "-p", "hi", "-n", "1"];
                let run = run_child(plugins, &run_args);
                std::fs::remove_file(&case).unwrap();
                results
                    .lock()
                    .unwrap()
                    .push((*arch, key.clone(), short(value), info, run));
            });
        }
    });
    let results = results.into_inner().unwrap();
    let mut bad = Vec::new();
    println!("arch        cases  info ok/named  run ok/named  bad");
    for arch in archs {
        let of: Vec<_> = results.iter().filter(|r| r.0 == arch).collect();
        let count = |f: &dyn Fn(&Outcome) -> bool, which: usize| {
            of.iter()
                .filter(|r| f(if which == 0 { &r.3 } else { &r.4 }))
                .count()
        };
        let is_ok = |o: &Outcome| matches!(o, Outcome::Ok);
        let is_named = |o: &Outcome| matches!(o, Outcome::Named);
        let n_bad = of
            .iter()
            .filter(|r| matches!(r.3, Outcome::Bad(_)) || matches!(r.4, Outcome::Bad(_)))
            .count();
        println!(
            "{arch:<11} {:>5}  {:>4}/{:<5}    {:>4}/{:<5}   {n_bad}",
            of.len(),
            count(&is_ok, 0),
            count(&is_named, 0),
            count(&is_ok, 1),
            count(&is_named, 1),
        );
        for r in of {
            for (cmd, o) in [("info", &r.3), ("run", &r.4)] {
                if let Outcome::Bad(why) = o {
                    bad.push(format!("{arch} {} = {} ({cmd}): {why}", r.1, r.2));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} runs did not end in a named error:\n{}",
        bad.len(),
        2 * results.len(),
        bad.join("\n")
    );
}
