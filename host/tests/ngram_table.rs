//! Hashed n-gram tables (`WeightClass::NgramTable`: Qwen3.8's PLE table, DeepSeek-V4.1's Engram
//! tables) gathered by the host, on the tiny `qwen4exp` and `deepseek41` files:
//!
//! - the placement plan counts the table as host memory, never the card's, and a card load
//!   (cpu-scalar standing in for the card, every expert on the host) copies no table there and
//!   gives the logits of the CPU load; a card load without host experts copies every weight but
//!   the tables;
//! - rows a prefetch gathered give the logits of rows gathered in the pass, bit for bit, and a
//!   prefetch for another token is not taken;
//! - rows read from disk (the tiering's file reader, when the host budget cannot hold the
//!   tables, through a bounded row cache) give the logits of rows read from the mapped file,
//!   bit for bit;
//! - the runtime hands each sampled token's row ids to the prefetch, and its greedy tokens are
//!   those of the model run by hand without one;
//! - `--mlock` leaves a table read from disk unlocked.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel};
use bloomery_plugin_api::model::WeightClass;
use bloomery_runtime::request::Event;
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::Runtime;
use bloomery_tiering::plan::TierRequest;
use common::{ngram_rows, plugin_dir, tiny_of, ALL_F32};

/// One slot of 64 positions, f32 K/V, 2 threads.
const OPTS: LoadOptions = LoadOptions {
    ctx_per_slot: 64,
    ..common::GOLDEN_OPTS
};

/// 24 tokens holding qwen4exp's PLE end id (270) in a run and alone, and a repeat.
fn sequence() -> Vec<i32> {
    let mut s: Vec<i32> = (0..24).map(|i| (i * 37 + 11) % 250).collect();
    (s[5], s[9], s[10], s[17]) = (270, 270, 270, s[3]);
    s
}

/// Positions `start..start + n` of `seq` in slot 0, the last an output, with their row ids.
fn rows(m: &LoadedModel, seq: &[i32], start: usize, n: usize) -> BatchInputs {
    BatchInputs {
        tokens: seq[start..start + n].to_vec(),
        positions: (start as i32..(start + n) as i32).collect(),
        slots: vec![0; n],
        output_rows: vec![n as i32 - 1],
        ngram_rows: ngram_rows(&m.spec, &seq[..start + n], start),
        logit_rows: vec![],
    }
}

/// The logits of a 4-token prompt, then of every later token fed alone; before each single
/// token's pass `ahead` chooses what to prefetch: the token's own row ids (`Some(true)`),
/// another token's (`Some(false)`) or nothing.
fn decode(m: &mut LoadedModel, seq: &[i32], ahead: Option<bool>) -> Vec<Vec<f32>> {
    let mut out = vec![m.forward(&rows(m, seq, 0, 4)).unwrap()];
    for p in 4..seq.len() {
        let batch = rows(m, seq, p, 1);
        match ahead {
            Some(true) => m.prefetch_ngram(&batch.ngram_rows),
            Some(false) => {
                let mut other = seq[..=p].to_vec();
                other[p] = (other[p] + 1) % 250;
                m.prefetch_ngram(&ngram_rows(&m.spec, &other, p));
            }
            None => {}
        }
        out.push(m.forward(&batch).unwrap());
    }
    out
}

/// The tiny file of `arch` (every class f32) in `dir`.
fn tiny(arch: &str, dir: &Path) -> PathBuf {
    tiny_of(arch, dir, ALL_F32)
}

/// Loads `path` on the CPU kernel plugin `kernel`, placed as `request` asks (a default request
/// makes no plan: every table in host RAM).
fn load(path: &Path, kernel: &str, request: &TierRequest) -> LoadedModel {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let k = reg.kernels.iter().find(|k| k.name == kernel).unwrap();
    match request.is_default() {
        true => LoadedModel::load_on(&reg, path, OPTS, k).unwrap(),
        false => LoadedModel::load_placed(&reg, path, OPTS, k, request).unwrap(),
    }
}

/// The file bytes of the model's n-gram tables.
fn table_bytes(m: &LoadedModel) -> u64 {
    m.spec
        .weights
        .iter()
        .filter(|w| w.class == WeightClass::NgramTable)
        .map(|w| m.file.tensor(w.name.as_str()).unwrap().info.size)
        .sum()
}

#[test]
fn the_ngram_table_is_planned_and_loaded_off_the_card() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen4exp", "deepseek41"] {
        let path = tiny(arch, dir.path());
        let seq = sequence();
        let mut cpu = load(&path, "cpu-avx2", &TierRequest::default());
        let want = decode(&mut cpu, &seq, None);
        let bytes = table_bytes(&cpu);
        assert!(bytes > 0, "{arch}: no n-gram table");
        // Every routed expert on the host, the scalar plugin as the card.
        let request = TierRequest {
            cpu_moe: true,
            bus_experts: Some(0),
            ..Default::default()
        };
        let mut m = common::load_on_scalar_card(&path, OPTS, &request).unwrap();
        let p = m.plan.clone().unwrap();
        // The card's dense weights are every weight but the expert stacks and the table.
        let stacks: u64 = p
            .layers
            .iter()
            .map(|l| l.expert_bytes * u64::from(l.n_expert))
            .sum();
        let all: u64 = m
            .spec
            .weights
            .iter()
            .map(|w| m.file.tensor(w.name.as_str()).unwrap().info.size)
            .sum();
        assert_eq!(p.fixed.dense, all - stacks - bytes, "{arch}: {p}");
        assert_eq!((p.ngram_tables, p.ngram_on_disk), (bytes, false), "{arch}");
        assert!(p.to_string().contains("n-gram tables"), "{arch}: {p}");
        // No card buffer holds a table; every other weight but the (host) expert stacks is in
        // one.
        let host: Vec<&String> = p.layers.iter().flat_map(|l| &l.names).collect();
        for w in m.spec.weights.clone().iter() {
            let r = m.weight_ref(w.name.as_str()).unwrap();
            if !host.contains(&&w.name.to_string()) {
                let table = w.class == WeightClass::NgramTable;
                assert_eq!(r.buffer == 0, table, "{arch}: {}", w.name);
            }
        }
        let got = decode(&mut m, &seq, None);
        let worst = got
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let scale = want.iter().flatten().fold(0f32, |a, v| a.max(v.abs()));
        assert!(
            worst <= 1e-5 * scale,
            "{arch}: card load differs by {worst}"
        );
    }
}

#[test]
fn prefetched_rows_give_the_logits_of_rows_gathered_in_the_pass() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen4exp", "deepseek41"] {
        let path = tiny(arch, dir.path());
        let seq = sequence();
        let steps = (seq.len() - 4) as u64;
        let mut runs = Vec::new();
        for ahead in [None, Some(true), Some(false)] {
            let mut m = load(&path, "cpu-avx2", &TierRequest::default());
            let logits = decode(&mut m, &seq, ahead);
            let (stats, on_disk) = m.ngram_stats().unwrap();
            assert!(!on_disk);
            assert_eq!(stats.rows, 4 + steps, "{arch} {ahead:?}");
            let taken = if ahead == Some(true) { steps } else { 0 };
            assert_eq!(stats.prefetched, taken, "{arch} {ahead:?}");
            runs.push(logits);
        }
        assert_eq!(runs[1], runs[0], "{arch}: prefetched rows");
        assert_eq!(runs[2], runs[0], "{arch}: another token's rows prefetched");
    }
}

#[test]
fn ngram_rows_read_from_disk_equal_rows_from_the_mapped_file() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen4exp", "deepseek41"] {
        let path = tiny(arch, dir.path());
        let seq = sequence();
        let mut ram = load(&path, "cpu-avx2", &TierRequest::default());
        assert_eq!(ram.ngram_stats().map(|s| s.1), Some(false));
        let want = decode(&mut ram, &seq, None);
        // A host budget that cannot hold the tables: they are read from disk.
        let short = TierRequest {
            host_budget: Some(table_bytes(&ram) - 1),
            ..Default::default()
        };
        for ahead in [None, Some(true)] {
            let mut disk = load(&path, "cpu-avx2", &short);
            assert!(disk.plan.as_ref().unwrap().ngram_on_disk);
            assert_eq!(disk.ngram_stats().map(|s| s.1), Some(true));
            let got = decode(&mut disk, &seq, ahead);
            assert_eq!(got, want, "{arch}: from disk, prefetch {ahead:?}");
            // Every row read once from the file or served by the row cache; the prompt's rows
            // again all from the cache.
            let ids = disk.spec.ngram.as_ref().unwrap().n_ids() as u64;
            let s = disk.ngram_stats().unwrap().0;
            assert!(s.disk_reads > 0, "{arch}: {s:?}");
            assert_eq!(s.disk_reads + s.cached, seq.len() as u64 * ids, "{arch}");
            disk.forward(&rows(&disk, &seq, 0, 4)).unwrap();
            let again = disk.ngram_stats().unwrap().0;
            assert_eq!(again.disk_reads, s.disk_reads, "{arch}");
            assert_eq!(again.cached, s.cached + 4 * ids, "{arch}");
        }
    }
}

/// The greedy tokens after `prompt`, `n` of them, through the runtime; then the model back.
fn generate(m: LoadedModel, prompt: &[i32], n: usize) -> (Vec<i32>, LoadedModel) {
    let tok = Arc::new(bloomery::text::tokenizer(&m.file).unwrap());
    let config = common::plain_runtime(64);
    let rt = Runtime::start(m, tok, config).unwrap();
    let params = common::generation(
        SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        n,
    );
    let prompt: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    let mut rx = rt.submit_blocking(prompt, params, Some(0)).unwrap();
    let mut got = Vec::new();
    loop {
        match rx
            .blocking_recv()
            .expect("the scheduler dropped the request")
        {
            Event::Token(piece) => got.push(piece.id as i32),
            Event::Done(_) => break,
            Event::Failed(f) => panic!("request failed: {}", f.message),
            _ => {}
        }
    }
    (got, rt.shutdown().unwrap())
}

#[test]
fn the_runtime_prefetches_each_sampled_tokens_rows() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen4exp", "deepseek41"] {
        let path = tiny(arch, dir.path());
        let seq = sequence();
        let mut m = load(&path, "cpu-avx2", &TierRequest::default());
        let vocab = m.spec.hparams.n_vocab as usize;
        let mut want = seq[..12].to_vec();
        let mut logits = m.forward(&rows(&m, &want, 0, 12)).unwrap();
        for _ in 0..10 {
            let next = (0..vocab)
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap();
            want.push(next as i32);
            logits = m.forward(&rows(&m, &want, want.len() - 1, 1)).unwrap();
        }
        let m = load(&path, "cpu-avx2", &TierRequest::default());
        let (got, m) = generate(m, &seq[..12], 10);
        assert_eq!(got, want[12..], "{arch}");
        // The prompt's pass and the 9 passes of generated tokens; each of those found its
        // token's rows fetched ahead.
        let (stats, _) = m.ngram_stats().unwrap();
        assert_eq!((stats.rows, stats.prefetched), (12 + 9, 9), "{arch}");
    }
}

/// `--mlock` holds the whole mapped file on the CPU, but not a table whose rows are read from
/// disk (that would hold in RAM what the host budget leaves on disk).
#[test]
fn mlock_leaves_a_table_read_from_disk_unlocked() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    let k = reg.kernels.iter().find(|k| k.name == "cpu-avx2").unwrap();
    let opts = LoadOptions {
        mlock: true,
        ..OPTS
    };
    // The hole's two ends round out to whole pages.
    let slack = 2 * bloomery_devices::pages::page_size() as u64;
    for arch in ["qwen4exp", "deepseek41"] {
        let path = tiny(arch, dir.path());
        let ram = LoadedModel::load_on(&reg, &path, opts, k).unwrap();
        let file: u64 = ram
            .file
            .parts()
            .iter()
            .map(|p| p.bytes().len() as u64)
            .sum();
        assert!(
            ram.locked >= file,
            "{arch}: {} of {file} locked",
            ram.locked
        );
        let tables = table_bytes(&ram);
        let short = TierRequest {
            host_budget: Some(tables - 1),
            ..Default::default()
        };
        let disk = LoadedModel::load_placed(&reg, &path, opts, k, &short).unwrap();
        assert!(disk.ngram_stats().unwrap().1);
        let most = file - tables + slack;
        assert!(
            disk.locked <= most,
            "{arch}: {} locked, at most {most}",
            disk.locked
        );
    }
}

/// A card load without host experts (`copy_weights`, the path of a GPU plugin; the CPU device
/// stands in for the card here) copies every weight but the tables, each to the bytes of the
/// file, and leaves the tables' references pointing nowhere.
#[test]
fn a_card_load_copies_every_weight_but_the_tables() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::load(&plugin_dir()).unwrap();
    let k = reg.kernels.iter().find(|k| k.name == "cpu-scalar").unwrap();
    let config = bloomery_plugin_api::kernel::DeviceConfig {
        index: 0,
        threads: 1,
        pin_threads: false,
    };
    for arch in ["qwen4exp", "deepseek41"] {
        let path = tiny(arch, dir.path());
        let m = load(&path, "cpu-avx2", &TierRequest::default());
        let card = bloomery_devices::Device::open(k, config).unwrap();
        let (buffers, refs) =
            bloomery_exec::weights::copy_weights(&card, &m.file, &m.spec).unwrap();
        assert_eq!(buffers.len(), 1, "{arch}: one allocation");
        let copied: u64 = m
            .spec
            .weights
            .iter()
            .filter(|w| w.class != WeightClass::NgramTable)
            .map(|w| m.file.tensor(w.name.as_str()).unwrap().info.size)
            .sum();
        assert!(
            buffers[0].bytes >= copied && buffers[0].bytes < copied + (1 << 20),
            "{arch}"
        );
        for (w, r) in m.spec.weights.iter().zip(&refs) {
            let t = m.file.tensor(w.name.as_str()).unwrap();
            if w.class == WeightClass::NgramTable {
                assert_eq!(r.buffer, 0, "{arch}: {}", w.name);
                continue;
            }
            assert_eq!(r.buffer, buffers[0].handle, "{arch}: {}", w.name);
            let mut got = vec![0u8; t.info.size as usize];
            card.read(r.buffer, r.offset, &mut got).unwrap();
            assert!(got == m.file.tensor_data(t).unwrap(), "{arch}: {}", w.name);
        }
    }
}
