//! The decision head of the synthetic tiny `clef` file against the float64 reference of
//! `tests/oracle/clef_head.py` (numpy from the published math, checked there against torch's
//! MultiheadAttention and TransformerDecoderLayer): golden `fixtures/clef_head_tiny.json`, see
//! fixtures/PROVENANCE.md. The same head written as `joint_head.safetensors` (torch names, packed
//! `in_proj`, raw scalars) beside the tiny `qwen35` file, whose backbone the tiny `clef` file
//! shares (same seed, same tensors), gives the same scores; a missing, extra or mis-shaped tensor
//! of that form is refused by name.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::decision::placement::HeadHome;
use bloomery_exec::decision::{head_file, DecisionHead, HeadRequest, OptionSpan, QuestionSpan};
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_gguf::GgufModel;
use bloomery_plugin_api::DType;
use bloomery_runtime::request::{Decided, Decision, Event, GenParams, Job, Request as Submit};
use bloomery_runtime::{Runtime, RuntimeConfig};
use common::{plugin_dir, tiny_of};
use sha2::{Digest, Sha256};

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

fn golden() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/clef_head_tiny.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// The golden's request: hidden rows, tokens, question and option spans.
struct Request {
    hidden: Vec<f32>,
    tokens: Vec<i32>,
    questions: Vec<QuestionSpan>,
    options: Vec<OptionSpan>,
}

fn request(g: &serde_json::Value) -> Request {
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap() as u32;
    Request {
        hidden: g["hidden"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect(),
        tokens: g["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect(),
        questions: g["questions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| QuestionSpan {
                kind: u(q, "kind"),
                start: u(q, "start"),
                end: u(q, "end"),
            })
            .collect(),
        options: g["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| OptionSpan {
                question: u(o, "question"),
                start: u(o, "start"),
                end: u(o, "end"),
            })
            .collect(),
    }
}

fn scores(head: &DecisionHead, r: &Request) -> Vec<f32> {
    head.scores(&HeadRequest {
        hidden: &r.hidden,
        tokens: &r.tokens,
        questions: &r.questions,
        options: &r.options,
    })
    .unwrap()
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).abs())
        .fold(0.0, f64::max)
}

fn tiny(arch: &str, dir: &Path) -> PathBuf {
    tiny_of(arch, dir, F32)
}

#[test]
fn clef_file_head_matches_the_f64_reference_within_2e5() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let path = tiny("clef", dir.path());
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha,
        g["file_sha256"].as_str().unwrap(),
        "synth output changed: rerun tests/oracle/clef_head.py (fixtures/PROVENANCE.md)"
    );
    let reg = Registry::load(&plugin_dir()).unwrap();
    let m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    let head = DecisionHead::from_model(&m, HeadHome::backbone(&m))
        .unwrap()
        .expect("a clef file has a head");
    let want: Vec<f64> = g["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let got = scores(&head, &request(&g));
    let d = max_diff(&got, &want);
    eprintln!(
        "clef head: {} scores, max |d| {d:.2e} against f64",
        got.len()
    );
    assert!(d < 2e-5, "max |d| {d} over 2e-5: {got:?} against {want:?}");
}

/// Writes the head of the `clef` file at `clef` as `joint_head.safetensors` and its config into
/// `dir`, under torch's names; `edit` may change the tensor list first.
fn write_safetensors(
    clef: &Path,
    dir: &Path,
    edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>),
) -> PathBuf {
    let file = GgufModel::open(clef).unwrap();
    let values = |name: &str| -> (Vec<usize>, Vec<f32>) {
        let t = file.tensor(name).unwrap_or_else(|| panic!("{name}"));
        let bytes = file.data(name).unwrap();
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        (t.info.shape.iter().rev().map(|&x| x as usize).collect(), v)
    };
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let globals = [
        ("hidden_norm", "decision.hidden_norm"),
        ("memory_projection", "decision.proj_memory"),
        ("question_projection", "decision.proj_question"),
        (
            "option_question_projection",
            "decision.proj_option_question",
        ),
        ("global_projection", "decision.proj_global"),
        ("option_context_projection", "decision.proj_option_context"),
        ("option_lexical_projection", "decision.proj_option_lexical"),
        ("option_summary_norm", "decision.option_summary_norm"),
        ("field_norm", "decision.field_norm"),
        ("option_norm", "decision.option_norm"),
        ("residual_scorer.0", "decision.scorer"),
        ("residual_scorer.3", "decision.scorer_out"),
        ("type_embedding", "token_types"),
    ];
    let copy = |out: &mut Vec<_>, st: &str, gg: &str| {
        for s in ["weight", "bias"] {
            if file.tensor(&format!("{gg}.{s}")).is_some() {
                let (shape, v) = values(&format!("{gg}.{s}"));
                out.push((format!("{st}.{s}"), shape, v));
            }
        }
    };
    for (st, gg) in globals {
        copy(&mut out, st, gg);
    }
    let attn = |out: &mut Vec<_>, st: &str, gg: &str| {
        for s in ["weight", "bias"] {
            let mut shape = Vec::new();
            let mut v = Vec::new();
            for x in ["q", "k", "v"] {
                let (sh, part) = values(&format!("{gg}{x}.{s}"));
                shape = sh;
                v.extend(part);
            }
            shape[0] *= 3;
            out.push((format!("{st}.in_proj_{s}"), shape, v));
            let (sh, o) = values(&format!("{gg}o.{s}"));
            out.push((format!("{st}.out_proj.{s}"), sh, o));
        }
    };
    let meta = |k: &str| file.metadata().get_uint(k).unwrap() as usize;
    let (routing, joint) = (
        meta("clef.decision.routing_block_count"),
        meta("clef.decision.block_count"),
    );
    for i in 0..routing {
        let (p, d) = (format!("dec.blk.{i}."), format!("evidence_layers.{i}."));
        copy(
            &mut out,
            &format!("{d}query_norm"),
            &format!("{p}cross_attn_norm"),
        );
        copy(
            &mut out,
            &format!("{d}memory_norm"),
            &format!("{p}cross_attn_norm_kv"),
        );
        attn(
            &mut out,
            &format!("{d}attention"),
            &format!("{p}cross_attn_"),
        );
        copy(
            &mut out,
            &format!("{d}feedforward_norm"),
            &format!("{p}ffn_norm"),
        );
        copy(
            &mut out,
            &format!("{d}feedforward.0"),
            &format!("{p}ffn_up"),
        );
        copy(
            &mut out,
            &format!("{d}feedforward.3"),
            &format!("{p}ffn_down"),
        );
    }
    for j in 0..joint {
        let (p, d) = (format!("dec.blk.{}.", routing + j), format!("layers.{j}."));
        copy(&mut out, &format!("{d}norm1"), &format!("{p}attn_norm"));
        attn(&mut out, &format!("{d}self_attn"), &format!("{p}attn_"));
        copy(
            &mut out,
            &format!("{d}norm2"),
            &format!("{p}cross_attn_norm"),
        );
        attn(
            &mut out,
            &format!("{d}multihead_attn"),
            &format!("{p}cross_attn_"),
        );
        copy(&mut out, &format!("{d}norm3"), &format!("{p}ffn_norm"));
        copy(&mut out, &format!("{d}linear1"), &format!("{p}ffn_up"));
        copy(&mut out, &format!("{d}linear2"), &format!("{p}ffn_down"));
    }
    let (_, s) = values("decision.scales");
    let raw = [
        f64::from(s[0]).ln(),
        f64::from(s[1]).ln(),
        (f64::from(s[2]) / (1.0 - f64::from(s[2]))).ln(),
    ];
    for (name, r) in ["prior_logit_scale", "joint_logit_scale", "residual_gate"]
        .into_iter()
        .zip(raw)
    {
        out.push((name.into(), Vec::new(), vec![r as f32]));
    }
    edit(&mut out);
    let bytes: HashMap<String, Vec<u8>> = out
        .iter()
        .map(|(n, _, v)| (n.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = out
        .iter()
        .map(|(n, shape, _)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                shape.clone(),
                &bytes[n],
            )
            .unwrap();
            (n.clone(), view)
        })
        .collect();
    let path = dir.join("joint_head.safetensors");
    safetensors::tensor::serialize_to_file(views, None, &path).unwrap();
    let cfg = format!("{{\"routing_layers\": {routing}, \"layers\": {joint}, \"heads\": 4}}");
    std::fs::write(dir.join(head_file::CONFIG_NAME), cfg).unwrap();
    path
}

#[test]
fn safetensors_head_beside_qwen35_gives_the_clef_files_scores() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let clef = tiny("clef", dir.path());
    let qwen35 = tiny("qwen35", dir.path());
    let st = write_safetensors(&clef, dir.path(), |_| {});
    let reg = Registry::load(&plugin_dir()).unwrap();
    let m = LoadedModel::load(&reg, &qwen35, common::GOLDEN_OPTS).unwrap();
    assert!(!DecisionHead::declared_in(&m));
    assert!(DecisionHead::from_model(&m, HeadHome::backbone(&m))
        .unwrap()
        .is_none());
    let head = head_file::load(&m, &st, HeadHome::backbone(&m)).unwrap();
    let r = request(&g);
    let got = scores(&head, &r);
    let mc = LoadedModel::load(&reg, &clef, common::GOLDEN_OPTS).unwrap();
    let in_file = scores(
        &DecisionHead::from_model(&mc, HeadHome::backbone(&mc))
            .unwrap()
            .unwrap(),
        &r,
    );
    let d = got
        .iter()
        .zip(&in_file)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("safetensors head against the clef file's: max |d| {d:.2e}");
    assert!(d < 1e-6, "{got:?} against {in_file:?}");
}

#[test]
fn safetensors_head_with_a_missing_extra_or_misshaped_tensor_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let clef = tiny("clef", dir.path());
    let qwen35 = tiny("qwen35", dir.path());
    let reg = Registry::load(&plugin_dir()).unwrap();
    let m = LoadedModel::load(&reg, &qwen35, common::GOLDEN_OPTS).unwrap();
    type Edit = Box<dyn FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|t| t.retain(|(n, ..)| n != "field_norm.bias")),
            "decision.field_norm.bias",
        ),
        (
            Box::new(|t| {
                let (_, s, v) = t
                    .iter()
                    .find(|(n, ..)| n == "layers.1.linear2.bias")
                    .unwrap()
                    .clone();
                t.push(("layers.2.linear2.bias".into(), s, v));
            }),
            "dec.blk.4.ffn_down.bias",
        ),
        (
            Box::new(|t| {
                let e = t
                    .iter_mut()
                    .find(|(n, ..)| n == "option_norm.weight")
                    .unwrap();
                e.1 = vec![32];
                e.2.truncate(32);
            }),
            "decision.option_norm.weight",
        ),
        (
            Box::new(|t| t.push(("layers.0.extra.weight".into(), vec![2], vec![0.0; 2]))),
            "layers.0.extra.weight",
        ),
        (
            Box::new(|t| t.retain(|(n, ..)| n != "residual_gate")),
            "residual_gate",
        ),
    ];
    for (i, (edit, name)) in cases.into_iter().enumerate() {
        let sub = dir.path().join(format!("case{i}"));
        std::fs::create_dir_all(&sub).unwrap();
        let st = write_safetensors(&clef, &sub, edit);
        let err = head_file::load(&m, &st, HeadHome::backbone(&m))
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(name), "case {i}: `{err}` does not name {name}");
    }
}

/// Several requests through one run of the head (`scores_batch`) give each request's scores alone
/// within 1e-6: stacked rows, spans moved with them, and each request's attention over its own
/// rows only (attending over the others' rows moves the scores by ~1e-2).
#[test]
fn requests_stacked_in_one_head_run_score_as_each_alone() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let path = tiny("clef", dir.path());
    let reg = Registry::load(&plugin_dir()).unwrap();
    let m = LoadedModel::load(&reg, &path, common::GOLDEN_OPTS).unwrap();
    let head = DecisionHead::from_model(&m, HeadHome::backbone(&m))
        .unwrap()
        .unwrap();
    let a = request(&g);
    // A second, different request: the first 20 rows in reverse order, its first two questions.
    let e = head.hp.n_embd as usize;
    let n = 20;
    let b = Request {
        hidden: a.hidden[..n * e]
            .chunks_exact(e)
            .rev()
            .flatten()
            .copied()
            .collect(),
        tokens: a.tokens[..n].iter().rev().copied().collect(),
        questions: a.questions[..2].to_vec(),
        options: a
            .options
            .iter()
            .filter(|o| o.question < 2)
            .copied()
            .collect(),
    };
    let reqs = [&a, &b, &a];
    let alone: Vec<Vec<f32>> = reqs.iter().map(|r| scores(&head, r)).collect();
    let together = head
        .scores_batch(
            &reqs
                .iter()
                .map(|r| HeadRequest {
                    hidden: &r.hidden,
                    tokens: &r.tokens,
                    questions: &r.questions,
                    options: &r.options,
                })
                .collect::<Vec<_>>(),
        )
        .unwrap();
    assert_eq!(together.len(), 3);
    assert_ne!(alone[0], alone[1], "the two requests differ");
    let mut worst = 0f32;
    for (x, y) in alone.iter().zip(&together) {
        assert_eq!(x.len(), y.len());
        for (p, q) in x.iter().zip(y) {
            worst = worst.max((p - q).abs());
        }
    }
    eprintln!("3 requests in one head run against each alone: max |d| {worst:.2e}");
    assert!(worst < 1e-6, "{together:?} against {alone:?}");
}

/// A decision job for `r` (its tokens, spans, no shared prefix) and the receiver of its events.
fn decision_job(r: &Request) -> (Job, tokio::sync::mpsc::UnboundedReceiver<Event>) {
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        prompt: r.tokens.iter().map(|&t| t as u32).collect(),
        params: GenParams::decision(),
        id_slot: None,
        embed: None,
        decide: Some(Box::new(Decision {
            questions: r.questions.clone(),
            options: r.options.clone(),
            shared: 0,
        })),
        events,
    };
    (job, rx)
}

fn decided(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Decided {
    loop {
        match rx
            .blocking_recv()
            .expect("the runtime dropped the decision")
        {
            Event::Decided(d) => return d,
            Event::Started { .. } | Event::PromptProgress(_) => {}
            other => panic!("a decision got {other:?}"),
        }
    }
}

/// Eight decisions that start together (one intake, as concurrent requests queued during a
/// pass) share the scheduler's passes and one run of the head, which the runtime's counters
/// show; each one's scores equal its scores run alone within 1e-6. Before batching, each
/// decision ran alone (eight head runs, eight passes).
#[test]
fn decisions_that_start_together_share_passes_and_one_head_run() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let runtime = decision_runtime(dir.path(), 8, 512);
    // Eight different prompts: the golden's, each with its tokens shifted by i.
    let base = request(&g);
    let reqs: Vec<Request> = (0..8)
        .map(|i| Request {
            hidden: Vec::new(),
            tokens: base.tokens.iter().map(|&t| (t + 3 * i) % 500).collect(),
            questions: base.questions.clone(),
            options: base.options.clone(),
        })
        .collect();
    let alone: Vec<Decided> = reqs
        .iter()
        .map(|r| {
            let (job, rx) = decision_job(r);
            runtime
                .sender()
                .blocking_send(Submit::Generate(Box::new(job)))
                .unwrap();
            decided(rx)
        })
        .collect();
    let c = &runtime.shared().counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let (runs, passes) = (get(&c.decision_head_runs), get(&c.decode_calls));
    assert_eq!(runs, 8);
    let (jobs, receivers): (Vec<Job>, Vec<_>) = reqs.iter().map(decision_job).unzip();
    runtime
        .sender()
        .blocking_send(Submit::GenerateTogether(jobs))
        .unwrap();
    let together: Vec<Decided> = receivers.into_iter().map(decided).collect();
    assert_eq!(
        get(&c.decision_head_runs) - runs,
        1,
        "one head run for all eight"
    );
    assert_eq!(
        get(&c.decode_calls) - passes,
        1,
        "one pass for all eight prompts"
    );
    assert_eq!(get(&c.decisions), 16);
    let mut worst = 0f32;
    for (a, b) in alone.iter().zip(&together) {
        assert_eq!(b.n_batched, 8);
        assert_eq!(a.scores.len(), b.scores.len());
        for (x, y) in a.scores.iter().zip(&b.scores) {
            worst = worst.max((x - y).abs());
        }
    }
    assert_ne!(alone[0].scores, alone[1].scores, "the prompts differ");
    eprintln!("8 decisions in one head run against each alone: max |d| {worst:.2e}");
    assert!(worst < 1e-6);
}

/// A runtime of `n_slots` slots serving decisions on the tiny `clef` file in `dir`, with passes
/// of at most `n_batch` rows and no prompt cache.
fn decision_runtime(dir: &Path, n_slots: u32, n_batch: usize) -> Runtime {
    let path = tiny("clef", dir);
    let reg = Registry::load(&plugin_dir()).unwrap();
    let options = LoadOptions {
        n_slots,
        ctx_per_slot: 64,
        ..common::GOLDEN_OPTS
    };
    let model = LoadedModel::load(&reg, &path, options).unwrap();
    let head = DecisionHead::from_model(&model, HeadHome::backbone(&model))
        .unwrap()
        .unwrap();
    let tok = std::sync::Arc::new(bloomery::text::tokenizer(&model.file).unwrap());
    let cfg = RuntimeConfig {
        n_batch,
        queue_depth: 64,
        ..common::plain_runtime(64)
    };
    Runtime::start_with_head(model, Some(head), tok, cfg).unwrap()
}

/// The `i`-th distinct decision: the golden's prompt (24 tokens) with its tokens shifted by 3i
/// (no two share a prefix), its spans, all events to `events`.
fn shifted_job(g: &serde_json::Value, i: i32, events: &EventSender) -> Job {
    let base = request(g);
    Job {
        prompt: base
            .tokens
            .iter()
            .map(|&t| ((t + 3 * i) % 500) as u32)
            .collect(),
        params: GenParams::decision(),
        id_slot: None,
        embed: None,
        decide: Some(Box::new(Decision {
            questions: base.questions,
            options: base.options,
            shared: 0,
        })),
        events: events.clone(),
    }
}

type EventSender = tokio::sync::mpsc::UnboundedSender<Event>;

/// Decisions whose events share one channel, numbered in the order the scheduler took them
/// (their `Started` events).
struct Arrivals {
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    /// The number of the decision each busy slot runs.
    running: HashMap<usize, usize>,
    taken: usize,
}

impl Arrivals {
    /// The number of the next decision answered.
    fn next_answered(&mut self) -> usize {
        loop {
            match self
                .rx
                .blocking_recv()
                .expect("the runtime dropped a decision")
            {
                Event::Started { id_slot, .. } => {
                    self.running.insert(id_slot, self.taken);
                    self.taken += 1;
                }
                Event::Decided(d) => return self.running.remove(&d.id_slot).unwrap(),
                other => panic!("a decision got {other:?}"),
            }
        }
    }
}

/// Four decisions of 24 prompt tokens that come together into four free slots, passes of 16
/// rows: each pass finishes the oldest prompt first, so they are answered in the order they
/// came, and the passes stay full (96 rows in 6 passes). Before, prompts went into a pass in
/// slot order, and the free slots are taken from the highest down: the newest was answered
/// first (3, 2, 1, 0).
#[test]
fn decisions_that_come_together_are_answered_in_the_order_they_came() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let runtime = decision_runtime(dir.path(), 4, 16);
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut arrivals = Arrivals {
        rx,
        running: HashMap::new(),
        taken: 0,
    };
    let c = &runtime.shared().counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let passes = get(&c.decode_calls);
    let jobs = (0..4).map(|i| shifted_job(&g, i, &events)).collect();
    runtime
        .sender()
        .blocking_send(Submit::GenerateTogether(jobs))
        .unwrap();
    let answered: Vec<usize> = (0..4).map(|_| arrivals.next_answered()).collect();
    assert_eq!(answered, [0, 1, 2, 3], "answered in this order");
    assert_eq!(
        get(&c.decode_calls) - passes,
        6,
        "96 prompt rows in passes of 16"
    );
}

/// Four clients, each sending its next decision as soon as its answer comes (three each), into
/// four slots with passes of 16 rows (a prompt spans two): every decision is answered in the
/// order the scheduler took it, so none waits behind a later one. Before, the clients in the
/// lowest slots were served again and again (a next decision takes the slot its answer freed)
/// while the others waited: two clients' six answers came before the other two's first ones
/// (answered 3, 2, 5, 4, 7, 6, 1, 8, 0, 10, 9, 11).
#[test]
fn clients_that_send_again_at_once_are_answered_in_the_order_their_decisions_came() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let runtime = decision_runtime(dir.path(), 4, 16);
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut arrivals = Arrivals {
        rx,
        running: HashMap::new(),
        taken: 0,
    };
    const CLIENTS: i32 = 4;
    const ROUNDS: i32 = 3;
    // The client of each decision sent, in the order sent (the order the scheduler takes them).
    let mut client_of: Vec<i32> = (0..CLIENTS).collect();
    let mut sent = vec![1; CLIENTS as usize];
    let jobs = (0..CLIENTS).map(|i| shifted_job(&g, i, &events)).collect();
    runtime
        .sender()
        .blocking_send(Submit::GenerateTogether(jobs))
        .unwrap();
    let mut answered = Vec::new();
    while answered.len() < (CLIENTS * ROUNDS) as usize {
        let n = arrivals.next_answered();
        answered.push(n);
        let client = client_of[n];
        let round = &mut sent[client as usize];
        if *round < ROUNDS {
            let job = shifted_job(&g, *round * CLIENTS + client, &events);
            *round += 1;
            client_of.push(client);
            runtime
                .sender()
                .blocking_send(Submit::Generate(Box::new(job)))
                .unwrap();
        }
    }
    let in_order: Vec<usize> = (0..answered.len()).collect();
    let clients: Vec<i32> = answered.iter().map(|&n| client_of[n]).collect();
    assert_eq!(
        answered, in_order,
        "answered in this order (clients {clients:?})"
    );
}

/// The head on a device apart from the backbone's (as `--decision-head-device cpu` beside a
/// backbone on the card: the file mapped again on that device, its weights and option rows read
/// there) gives the backbone device's scores, in both forms.
#[test]
fn a_head_on_another_device_than_the_backbones_gives_the_same_scores() {
    let g = golden();
    let r = request(&g);
    let dir = tempfile::tempdir().unwrap();
    let clef = tiny("clef", dir.path());
    let reg = Registry::load(&plugin_dir()).unwrap();
    let m = LoadedModel::load(&reg, &clef, common::GOLDEN_OPTS).unwrap();
    let on_backbone = scores(
        &DecisionHead::from_model(&m, HeadHome::backbone(&m))
            .unwrap()
            .unwrap(),
        &r,
    );
    // A plugin other than the backbone's, so that a weight resolved on the backbone's device
    // would be a handle the head's device does not know.
    let other = reg
        .kernels
        .iter()
        .find(|k| k.name.starts_with("cpu-") && k.name != m.kernel_plugin())
        .unwrap_or_else(|| reg.kernels.iter().find(|k| k.name == "cpu-scalar").unwrap());
    let home = HeadHome::on_plugin(&m, other).unwrap();
    let head = DecisionHead::from_model(&m, home).unwrap().unwrap();
    assert_eq!(head.device_plugin(), other.name);
    let apart = scores(&head, &r);
    let st = write_safetensors(&clef, dir.path(), |_| {});
    let file_head = head_file::load(&m, &st, HeadHome::on_plugin(&m, other).unwrap()).unwrap();
    let apart_st = scores(&file_head, &r);
    let d = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    eprintln!(
        "head on {} beside a backbone on {}: max |d| {:.2e} (safetensors {:.2e})",
        other.name,
        m.kernel_plugin(),
        d(&apart, &on_backbone),
        d(&apart_st, &on_backbone)
    );
    assert!(
        d(&apart, &on_backbone) < 2e-6,
        "{apart:?} against {on_backbone:?}"
    );
    assert!(
        d(&apart_st, &on_backbone) < 2e-6,
        "{apart_st:?} against {on_backbone:?}"
    );
}

/// Every `(op, dtype)` of the head's graph is claimed by each CUDA bundle (so `-ngl 99` runs the
/// head on the card), for f32 and Q8_0 option rows; a bundle built without nvcc claims nothing
/// and is skipped, saying so.
#[test]
fn the_cuda_bundles_claim_every_op_of_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    let q8 = ClassTypes {
        output: DType::Q8_0,
        ..F32
    };
    for types in [F32, q8] {
        let sub = dir.path().join(format!("{}", types.output));
        std::fs::create_dir_all(&sub).unwrap();
        let clef = tiny_of("clef", &sub, types);
        let m = LoadedModel::load(&reg, &clef, common::GOLDEN_OPTS).unwrap();
        let head = DecisionHead::from_model(&m, HeadHome::backbone(&m))
            .unwrap()
            .unwrap();
        let mut checked = 0;
        for k in reg.kernels.iter().filter(|k| k.name.starts_with("cuda-")) {
            if k.capabilities.is_empty() {
                eprintln!("skipped {}: built without kernels (no nvcc)", k.name);
                continue;
            }
            let missing = head.missing_kernels(&k.capabilities).unwrap();
            assert!(missing.is_empty(), "{} lacks {missing:?}", k.name);
            checked += 1;
        }
        eprintln!(
            "output {}: {checked} CUDA bundles claim every op of the head",
            types.output
        );
    }
}
