//! `serve -md` (`--spec-draft-model`): Qwen3.8-Flash-Next's MTP block from its separate MTP-only
//! file drafts for the trunk (`bloomery synth --arch qwen4exp --preset tiny|tiny-mtp --seed 7`):
//! greedy `/completion` tokens with `-md FILE --spec-type draft-mtp` are those of the trunk
//! served alone, with drafts made; a draft file that cannot draft for the trunk, `-md` without
//! `--spec-type draft-mtp`, and `-md` for `run` are refused by name.

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

/// `bloomery synth --arch qwen4exp --preset PRESET --seed 7` into `dir`.
fn synth(dir: &Path, preset: &str) -> String {
    let p = dir
        .join(format!("{preset}.gguf"))
        .to_str()
        .unwrap()
        .to_owned();
    let out = bloomery(&[
        "synth", "--arch", "qwen4exp", "--preset", preset, "--seed", "7", "-o", &p,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    p
}

/// A running `bloomery serve`.
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

fn serve(args: &[&str]) -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .args(["serve", "--port", &port.to_string(), "-c", "256", "-t", "2"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server { child, port };
    let start = Instant::now();
    while http(port, "/health", "").map(|r| r.0) != Some(200) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "serve did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// One HTTP/1.1 request (GET without a body, else POST); the status and the body.
fn http(port: u16, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let method = if body.is_empty() { "GET" } else { "POST" };
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

/// The greedy tokens of a prompt (token ids; the end id 270 at 20) and the drafts made.
fn complete(s: &Server) -> (Vec<u64>, u64) {
    let body = r#"{"prompt": [75, 67, 158, 115, 127, 160, 138, 16, 113, 78, 27, 118, 271, 168, 107, 182, 154, 90, 171, 230, 270, 259], "n_predict": 24, "temperature": 0, "ignore_eos": true, "return_tokens": true}"#;
    let (status, text) = http(s.port, "/completion", body).unwrap();
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let tokens = v["tokens"].as_array().unwrap();
    let tokens = tokens.iter().map(|t| t.as_u64().unwrap()).collect();
    (tokens, v["timings"]["draft_n"].as_u64().unwrap_or(0))
}

#[test]
fn serve_md_drafts_with_the_mtp_file_and_gives_the_tokens_of_the_trunk_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (trunk, mtp) = (synth(dir.path(), "tiny"), synth(dir.path(), "tiny-mtp"));
    let (alone, drafted) = complete(&serve(&["-m", &trunk]));
    assert_eq!((alone.len(), drafted), (24, 0));
    // Drafting is on by default with a draft file (issue 48): no --spec-type needed.
    let s = serve(&["-m", &trunk, "-md", &mtp]);
    let (with, drafted) = complete(&s);
    eprintln!("-md: {drafted} tokens drafted");
    assert_eq!(with, alone, "tokens differ with -md");
    assert!(drafted > 0, "nothing drafted");
}

/// `bloomery ARGS` fails, saying `what`.
fn refused(args: &[&str], what: &str) {
    let out = bloomery(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} ran");
    assert!(err.contains(what), "{args:?}: {err}");
}

#[test]
fn a_draft_file_that_cannot_draft_or_is_not_asked_for_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (trunk, mtp) = (synth(dir.path(), "tiny"), synth(dir.path(), "tiny-mtp"));
    let serve = |extra: &[&str]| {
        let mut a = vec![
            "serve",
            "--port",
            "0",
            "-c",
            "256",
            "-t",
            "2",
            "-m",
            trunk.as_str(),
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>, what: &str| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        refused(&a, what);
    };
    run(
        serve(&["-md", &trunk, "--spec-type", "draft-mtp"]),
        "holds no MTP (nextn) block",
    );
    // Drafting is on by default with a draft file (issue 48); turned off, the file is refused.
    run(
        serve(&["-md", &mtp, "--spec-type", "none"]),
        "--spec-type draft-mtp",
    );
    refused(
        &[
            "run",
            "-m",
            &trunk,
            "--spec-draft-model",
            &mtp,
            "-p",
            "hi",
            "-n",
            "1",
        ],
        "does not load a draft file",
    );
    // llama.cpp's short spelling, not clap's cluster `-m d`.
    refused(
        &["run", "-m", &trunk, "-md", &mtp, "-p", "hi", "-n", "1"],
        "does not load a draft file",
    );
}
