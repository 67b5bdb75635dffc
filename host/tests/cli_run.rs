//! `bloomery run` and `bloomery bench` through the real binary on a synthetic tiny model.

mod common;

use common::plugin_dir;

use std::path::Path;
use std::process::{Command, Output};

fn bloomery(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bloomery"))
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .args(args)
        .output()
        .expect("the bloomery binary runs")
}

fn ok(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

fn tiny(dir: &Path) -> String {
    let path = dir.join("tiny.gguf");
    let p = path.to_str().unwrap().to_owned();
    ok(&bloomery(&["synth", "--arch", "qwen3moe", "-o", &p]));
    p
}

/// The count N in the stderr line that starts with `what` (`what = ... / N tokens ...`).
fn counted(stderr: &str, what: &str) -> usize {
    let line = stderr
        .lines()
        .find(|l| l.trim_start().starts_with(what))
        .unwrap_or_else(|| panic!("no {what} line in:\n{stderr}"));
    line.split('/')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in: {line}"))
}

/// The count in the stderr line `generated = ... / N tokens`.
fn generated(stderr: &str) -> usize {
    counted(stderr, "generated")
}

fn run(model: &str, extra: &[&str]) -> Output {
    let mut args = vec!["run", "-m", model, "-c", "64", "-t", "2"];
    args.extend_from_slice(extra);
    bloomery(&args)
}

#[test]
fn run_generates_and_reports_timings() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let (stdout, stderr) = ok(&run(&m, &["-p", "hello world", "-n", "12", "-s", "1"]));
    let n = generated(&stderr);
    assert!((1..=12).contains(&n), "{stderr}");
    assert!(stdout.len() > 1, "no text: {stdout:?}");
    assert!(stderr.contains("prompt eval time"), "{stderr}");
    assert!(stderr.contains("tokens per second"), "{stderr}");
}

#[test]
fn greedy_and_seeded_runs_repeat_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let greedy = ["-p", "the cat sat", "-n", "16", "--temp", "0"];
    let a = ok(&run(&m, &greedy)).0;
    let b = ok(&run(&m, &greedy)).0;
    assert_eq!(a, b);
    let seeded = ["-p", "the cat sat", "-n", "16", "-s", "42", "--temp", "1.5"];
    let a = ok(&run(&m, &seeded)).0;
    let b = ok(&run(&m, &seeded)).0;
    assert_eq!(a, b);
}

#[test]
fn mlock_locks_the_whole_file_on_the_cpu_and_changes_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let greedy = ["-p", "the cat sat", "-n", "8", "--temp", "0"];
    let plain = ok(&run(&m, &greedy)).0;
    let (text, stderr) = ok(&run(&m, &[&greedy[..], &["--mlock", "-v"]].concat()));
    assert_eq!(text, plain);
    // "--mlock: 28.1 MiB of the model locked in RAM (VmLck 28736 kB)": the kernel's count.
    let line = stderr
        .lines()
        .find(|l| l.contains("--mlock:"))
        .unwrap_or_else(|| panic!("no --mlock line in:\n{stderr}"));
    let kib: u64 = line
        .split("VmLck ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no VmLck in: {line}"));
    let len = std::fs::metadata(&m).unwrap().len();
    assert!(
        kib * 1024 >= len,
        "{kib} kB locked for a file of {len} bytes: {line}"
    );
}

#[test]
fn a_host_budget_without_a_card_reads_experts_from_the_file_and_changes_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let greedy = ["-p", "the cat sat", "-n", "8", "--temp", "0", "-ngl", "0"];
    let plain = ok(&run(&m, &greedy)).0;
    // The tiny file's routed experts are 0.75 MiB each, 8 a layer: 8 MiB holds one layer's.
    let (text, stderr) = ok(&run(&m, &[&greedy[..], &["--host-budget", "8M"]].concat()));
    assert_eq!(text, plain);
    // "disk tier: 10 experts read from the file, …"
    let line = stderr
        .lines()
        .find(|l| l.starts_with("disk tier:"))
        .unwrap_or_else(|| panic!("no disk tier line in:\n{stderr}"));
    let reads: usize = line
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in: {line}"));
    assert!(reads > 0, "{line}");
    // A card's placement flag without a card says it changes nothing.
    let (text, stderr) = ok(&run(&m, &[&greedy[..], &["-cmoe"]].concat()));
    assert_eq!(text, plain);
    assert!(
        stderr.contains("-cmoe: no card: every routed expert is computed by the CPU already"),
        "{stderr}"
    );
}

#[test]
fn chat_wraps_the_prompt_in_the_template() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let (_, stderr) = ok(&run(&m, &["-p", "hi", "-n", "4", "--chat", "--temp", "0"]));
    // `<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n` is more than the 1–2 tokens of "hi".
    let n = counted(&stderr, "prompt eval time");
    assert!(n >= 8, "{stderr}");
}

#[test]
fn n_zero_generates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let (stdout, stderr) = ok(&run(&m, &["-p", "hello", "-n", "0"]));
    assert_eq!(stdout.trim(), "");
    assert_eq!(generated(&stderr), 0);
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_with_both_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let out = bloomery(&["run", "-m", &m, "-c", "8", "-p", &"word ".repeat(40)]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the context holds 8"), "{stderr}");
    let n: usize = stderr
        .split("the prompt has ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt length in: {stderr}"));
    assert!(n > 8, "{stderr}");
}

#[test]
fn bench_prints_a_table_with_pp_and_tg_rows() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let (stdout, _) = ok(&bloomery(&[
        "bench", "-m", &m, "-p", "16", "-n", "4", "-r", "2", "-t", "2",
    ]));
    let lines: Vec<&str> = stdout.lines().collect();
    // llama-bench's padded columns (threads shown: no card here).
    assert_eq!(
        lines[0],
        "| model                          |       size |     params | backend    | threads |            test |                  t/s |"
    );
    assert_eq!(
        lines[1],
        "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |"
    );
    let pp = lines.iter().find(|l| l.contains(" pp16 |")).unwrap();
    let tg = lines.iter().find(|l| l.contains(" tg4 |")).unwrap();
    for row in [pp, tg] {
        // llama.cpp's description: no size class for 2 layers, the type guessed (no file type).
        assert!(
            row.starts_with("| qwen3moe ?B (guessed) all F32  |"),
            "{row}"
        );
        assert!(row.contains(" ± "), "{row}");
        assert!(row.contains("|       2 |"), "{row}");
        assert_eq!(row.chars().count(), lines[0].chars().count(), "{row}");
    }
    let build = lines.last().unwrap();
    assert!(
        build.starts_with("build: ") && build.ends_with(')'),
        "{build}"
    );
}

/// The fields of llama-bench b11434 (host/tests/fixtures/PROVENANCE.md).
fn llama_bench_fields() -> Vec<&'static str> {
    include_str!("fixtures/llama_bench/fields.txt")
        .lines()
        .collect()
}

/// A bench of the tiny file: two prompt sizes and a generation, after 0 and 8 tokens.
fn bench_output(m: &str, format: &str) -> String {
    ok(&bloomery(&[
        "bench", "-m", m, "-p", "8,16", "-n", "4", "-d", "0,8", "-r", "2", "-t", "2", "-o", format,
    ]))
    .0
}

#[test]
fn bench_json_is_one_array_of_every_test_with_llama_benchs_fields() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let v: serde_json::Value = serde_json::from_str(&bench_output(&m, "json")).unwrap();
    let tests = v.as_array().unwrap();
    assert_eq!(tests.len(), 6);
    let fields = llama_bench_fields();
    for t in tests {
        let keys: Vec<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys[..fields.len()], fields[..]);
        assert_eq!(keys[fields.len()..], ["samples_ns", "samples_ts"]);
        assert_eq!(t["n_threads"], 2);
        assert_eq!(t["samples_ns"].as_array().unwrap().len(), 2);
        assert!(t["avg_ts"].as_f64().unwrap() > 0.0, "{t}");
        assert_eq!(t["model_type"], "qwen3moe ?B (guessed) all F32");
    }
    let depth_prompt: Vec<(i64, i64, i64)> = tests
        .iter()
        .map(|t| {
            let n = |k: &str| t[k].as_i64().unwrap();
            (n("n_depth"), n("n_prompt"), n("n_gen"))
        })
        .collect();
    assert_eq!(
        depth_prompt,
        [
            (0, 8, 0),
            (0, 16, 0),
            (0, 0, 4),
            (8, 8, 0),
            (8, 16, 0),
            (8, 0, 4)
        ]
    );
}

#[test]
fn bench_jsonl_csv_and_sql_carry_the_same_tests() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let jsonl = bench_output(&m, "jsonl");
    let lines: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[5]["n_depth"], 8);
    let csv = bench_output(&m, "csv");
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], llama_bench_fields().join(","));
    assert_eq!(rows.len(), 7);
    assert!(
        rows[1].starts_with('"') && rows[1].ends_with('"'),
        "{}",
        rows[1]
    );
    let sql = bench_output(&m, "sql");
    assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS llama_bench (\n"));
    assert_eq!(sql.matches("INSERT INTO llama_bench (").count(), 6);
}

#[test]
fn bench_lists_and_ranges_run_every_combination_and_plot_them() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let png = dir.path().join("depth.png");
    let (stdout, _) = ok(&bloomery(&[
        "bench",
        "-m",
        &m,
        "-p",
        "0",
        "-n",
        "2-4+2",
        "-pg",
        "4,2",
        "-d",
        "1-16*4",
        "-r",
        "1",
        "-t",
        "1,2",
        "--no-warmup",
        "--delay",
        "0",
        "-ub",
        "8",
        "--plot",
        png.to_str().unwrap(),
    ]));
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| qwen3moe"))
        .collect();
    // 2 thread counts x 3 depths (1, 4, 16) x (tg2, tg4, pp4+tg2).
    assert_eq!(rows.len(), 18, "{stdout}");
    assert!(
        rows.iter().any(|r| r.contains(" pp4+tg2 @ d16 |")),
        "{stdout}"
    );
    // -t and -ub were given: their columns show.
    assert!(
        stdout
            .lines()
            .next()
            .unwrap()
            .contains("| threads | n_ubatch |"),
        "{stdout}"
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn bench_refuses_what_it_cannot_do_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    for (flags, says) in [
        (
            &["-ctk", "bf16"][..],
            "-ctk bf16: bf16 caches are not implemented",
        ),
        (&["-fa", "off"][..], "-fa off: not supported"),
        (&["-ngl", "1"][..], "-ngl 1: not supported"),
        (&["-p", "1-8+0"][..], "-p \"1-8+0\": the range"),
        (
            &["-nkvo", "1"][..],
            "-nkvo: not supported by bloomery bench",
        ),
    ] {
        let mut args = vec!["bench", "-m", &m, "-r", "1"];
        args.extend_from_slice(flags);
        let out = bloomery(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} ran");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[test]
fn bench_depth_runs_the_tests_after_that_many_tokens_of_context() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    // A context of max(p, n) alone could not hold positions 40 .. 48.
    let (stdout, _) = ok(&bloomery(&[
        "bench", "-m", &m, "-p", "8", "-n", "4", "-d", "40", "-r", "1", "-t", "2",
    ]));
    assert!(stdout.contains(" pp8 @ d40 |"), "{stdout}");
    assert!(stdout.contains(" tg4 @ d40 |"), "{stdout}");
}

#[test]
fn bench_parallel_decodes_that_many_sequences_in_their_own_slots() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    // Each sequence needs its own slot, every slot its own 10 tokens of context first.
    let (stdout, _) = ok(&bloomery(&[
        "bench", "-m", &m, "-p", "0", "-n", "4", "-np", "3", "-d", "10", "-r", "1", "-t", "2",
    ]));
    assert!(stdout.contains(" tg4 x3 @ d10 |"), "{stdout}");
}

#[test]
fn a_prompt_over_one_batch_is_evaluated_in_batches_and_counted_whole() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let prompt = "word ".repeat(200);
    let out = bloomery(&[
        "run", "-m", &m, "-c", "2048", "-t", "2", "-p", &prompt, "-n", "4", "--temp", "0",
    ]);
    let (_, stderr) = ok(&out);
    // More than one 512-row batch, every token counted.
    let n = counted(&stderr, "prompt eval time");
    assert!(n > 512, "{stderr}");
    assert_eq!(generated(&stderr), 4, "{stderr}");
}

/// The line of `bloomery plan -m MODEL -cmoe EXTRA…` that starts with `head`.
fn plan_line(model: &str, extra: &[&str], head: &str) -> String {
    let mut args = vec!["plan", "-m", model, "-cmoe"];
    args.extend_from_slice(extra);
    let (stdout, _) = ok(&bloomery(&args));
    stdout
        .lines()
        .find(|l| l.trim_start().starts_with(head))
        .unwrap_or_else(|| panic!("no {head} line in: {stdout}"))
        .to_owned()
}

#[test]
fn plan_sizes_the_scratch_for_the_physical_batch() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let scratch = |extra: &[&str]| -> f64 {
        let line = plan_line(&m, extra, "scratch");
        let mut words = line.split_whitespace().skip(1);
        let (n, unit) = (words.next().unwrap(), words.next().unwrap());
        let n: f64 = n.parse().unwrap();
        match unit {
            "GiB" => n * 1024.0,
            "MiB" => n,
            _ => panic!("{line}"),
        }
    };
    // 1,536 more rows at (at least) 32 KiB of kernel scratch each, plus the larger arenas.
    let (base, wide) = (scratch(&[]), scratch(&["-ub", "2048"]));
    assert!(wide - base >= 48.0, "{base} MiB -> {wide} MiB");
    // -b caps the pass as in the server: the smaller of the two.
    assert_eq!(scratch(&["-ub", "2048", "-b", "512"]), base);
}

#[test]
fn plan_names_the_layers_the_staging_sets_hold_between_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    // The tiny model's four layers all on the host: the last two wait in the two sets.
    let lent = plan_line(&m, &[], "expert staging");
    assert!(
        lent.contains("holding the experts of blk.2, blk.3"),
        "{lent}"
    );
    let kept = plan_line(&m, &["--no-decode-staging"], "expert staging");
    assert!(!kept.contains("holding"), "{kept}");
}

#[test]
fn plan_and_run_take_llama_cpp_card_flags_and_refuse_what_they_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    // One device (the CPU plugin here): naming it, as main card, alone, with its whole share
    // and one budget for every card is a plan on it.
    let line = plan_line(
        &m,
        &["-dev", "CUDA0", "-mg", "0", "-sm", "none", "-ts", "1"],
        "card budget",
    );
    assert!(line.contains("unlimited"), "{line}");
    let line = plan_line(&m, &["--gpu-budget", "1G"], "card budget");
    assert!(line.contains("1.00 GiB"), "{line}");
    // What names a card that is not there, or a split bloomery does not make, is one line.
    let refused = |args: &[&str], want: &str| {
        let out = bloomery(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} ran");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    };
    refused(
        &["plan", "-m", &m, "-dev", "CUDA0,CUDA1"],
        "-dev: device 1 is not there (1 found)",
    );
    refused(&["plan", "-m", &m, "-mg", "1"], "-mg 1: only 1 card in use");
    refused(&["plan", "-m", &m, "-sm", "row"], "-sm row: not supported");
    refused(
        &["run", "-m", &m, "-p", "hi", "-n", "1", "-ts", "1,1"],
        "-ts gives 2 shares for 1 card in use",
    );
    refused(
        &["bench", "-m", &m, "-p", "0", "-n", "1", "-ts", "1;1,3;1"],
        "-ts 1;1,3;1: not supported by bloomery bench",
    );
}
