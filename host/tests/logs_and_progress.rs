//! What the binary writes on stderr when it is not a terminal: progress as plain lines without
//! control codes (model load, `synth`, `bench --progress`), and `serve`'s one log line per
//! request with its route, status, slot, token counts and rates (also in `--log-file`).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::plugin_dir;

fn bloomery(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .args(args)
        .output()
        .expect("the bloomery binary runs")
}

fn stderr_of(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "failed:\n{err}");
    assert!(!err.contains('\x1b'), "control codes on a pipe:\n{err:?}");
    err
}

fn tiny(dir: &Path) -> (String, String) {
    let p = dir.join("tiny.gguf").to_str().unwrap().to_owned();
    let err = stderr_of(&bloomery(&["synth", "--arch", "qwen3moe", "-o", &p]));
    (p, err)
}

#[test]
fn progress_off_a_terminal_is_plain_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (m, synth) = tiny(dir.path());
    // The last line says the whole file was written.
    let last = synth.lines().last().unwrap();
    assert!(last.starts_with("synth: written: "), "{synth}");
    let (done, total) = last["synth: written: ".len()..].split_once(" of ").unwrap();
    assert_eq!(done, total, "{synth}");
    let bench = stderr_of(&bloomery(&[
        "bench",
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "2",
        "-t",
        "2",
        "--progress",
    ]));
    assert!(!bench.contains("depth run"), "no context to fill:\n{bench}");
    for want in [
        "model load: mapped: ",
        "bench: 0/6: benchmark 1/2: starting",
        "bench: 1/6: benchmark 1/2: prompt run 1/2",
        "bench: 5/6: benchmark 2/2: generation run 2/2",
    ] {
        assert!(
            bench.lines().any(|l| l.starts_with(want)),
            "no {want:?} in:\n{bench}"
        );
    }
}

/// A running `bloomery serve` whose stderr goes to a file.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request; the status and the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((
        status,
        text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned(),
    ))
}

fn serve(model: &str, stderr: &Path, extra: &[&str]) -> Server {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .args([
            "serve",
            "-m",
            model,
            "--port",
            &port.to_string(),
            "-c",
            "256",
            "-t",
            "2",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .unwrap();
    let server = Server { child, port };
    let start = Instant::now();
    while http(port, "GET", "/health", "").map(|r| r.0) != Some(200) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "serve did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// The first line of `path` containing `needle`, waiting a little for it.
fn line_with(path: &Path, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains(needle)) {
            return l.to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no line with {needle:?} in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_logs_one_line_per_request_with_its_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = tiny(dir.path());
    let (err, log) = (dir.path().join("stderr.txt"), dir.path().join("server.log"));
    let s = serve(&m, &err, &["--log-file", log.to_str().unwrap()]);
    let body = r#"{"prompt": "the cat sat on the mat", "n_predict": 4, "ignore_eos": true, "temperature": 0}"#;
    assert_eq!(
        http(s.port, "POST", "/completion", body).map(|r| r.0),
        Some(200)
    );
    let first = line_with(&err, "request: POST /completion 200");
    assert!(first.contains(" | slot 0 | prompt "), "{first}");
    assert!(first.contains(" tokens (0 cached), "), "{first}");
    assert!(first.contains(" | generated 4 tokens, "), "{first}");
    assert!(first.ends_with(" t/s"), "{first}");
    // The same prompt again: all but its last token come from the slot's cache.
    assert_eq!(
        http(s.port, "POST", "/completion", body).map(|r| r.0),
        Some(200)
    );
    let start = Instant::now();
    let again = loop {
        let text = std::fs::read_to_string(&err).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("request: POST /completion 200"))
            .collect();
        if lines.len() == 2 {
            break lines[1].to_owned();
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(again.contains("prompt 1 tokens ("), "{again}");
    assert!(!again.contains("(0 cached)"), "{again}");
    // A request that fails gets its line, with its status.
    assert_eq!(
        http(s.port, "POST", "/completion", "{").map(|r| r.0),
        Some(400)
    );
    line_with(&err, "request: POST /completion 400");
    assert_eq!(http(s.port, "GET", "/nowhere", "").map(|r| r.0), Some(404));
    line_with(&err, "request: GET /nowhere 404");
    // A monitor's poll is not logged at the default level.
    assert_eq!(http(s.port, "GET", "/health", "").map(|r| r.0), Some(200));
    assert_eq!(
        http(s.port, "GET", "/after-health", "").map(|r| r.0),
        Some(404)
    );
    line_with(&err, "request: GET /after-health 404");
    let text = std::fs::read_to_string(&err).unwrap();
    assert!(!text.contains("request: GET /health"), "{text}");
    // The log file holds the same lines; neither has control codes.
    line_with(&log, "request: POST /completion 200 | slot 0");
    for f in [&err, &log] {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !text.contains('\x1b'),
            "control codes in {}:\n{text:?}",
            f.display()
        );
        assert!(text.contains("model load: mapped: ") || f == &log, "{text}");
    }
}
