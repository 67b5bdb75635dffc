//! Routed experts split between a "card" and the host: a synthetic qwen3moe loaded with some
//! experts on the primary device (here cpu-scalar standing in for the card, so CI exercises the
//! split without a GPU) and the rest computed by the host's CPU plugin gives the logits of the
//! unsplit model, and card work that does not need the host's experts (a shared expert) is queued
//! between the host's signal and their sum.

mod common;

use std::path::{Path, PathBuf};

use bloomery::synth::ClassTypes;
use bloomery_exec::BatchInputs;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_kernels_cuda::ops::{add2_norms, copy_runs};
use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::DType;
use bloomery_tiering::bus_balance::{TRIALS, WARMUP};
use bloomery_tiering::plan::TierRequest;

fn tiny(dir: &tempfile::TempDir, experts: DType) -> PathBuf {
    let types = ClassTypes {
        experts,
        attention: DType::F32,
        embedding: DType::F32,
        output: DType::F32,
        dense: DType::F32,
    };
    common::tiny_qwen3moe(dir, types)
}

/// Loads `path` with cpu-scalar as the "card" and experts placed as `request` asks.
fn try_load(path: &Path, request: &TierRequest) -> Result<LoadedModel, String> {
    let opts = LoadOptions {
        n_slots: 2,
        ctx_per_slot: 64,
        kv_type_k: DType::F32,
        kv_type_v: DType::F32,
        threads: 2,
        graphs: true,
        mlock: false,
        overrides: &[],
        check_tensors: false,
        draft_n_max: 0,
        draft_history: false,
    };
    common::load_on_scalar_card(path, opts, request)
}

fn load(path: &Path, request: &TierRequest) -> LoadedModel {
    try_load(path, request).unwrap()
}

/// Logits of a 7-token prompt on slot 0, a 40-token prompt on slot 1 (enough rows to stream
/// host experts to the card), then two single-token steps on slots 0 and 1 at once.
fn run(m: &mut LoadedModel) -> Vec<Vec<f32>> {
    let tokens = [5, 77, 300, 12, 509, 256, 1];
    let n = tokens.len() as i32;
    let long: Vec<i32> = (0..40).map(|i| (i * 37 + 11) % 509).collect();
    let mut out = vec![m
        .forward(&BatchInputs {
            tokens: long.clone(),
            positions: (0..40).collect(),
            slots: vec![1; 40],
            output_rows: (0..40).collect(),
            ngram_rows: vec![],
            logit_rows: vec![],
        })
        .unwrap()];
    out.push(
        m.forward(&BatchInputs {
            tokens: tokens.to_vec(),
            positions: (0..n).collect(),
            slots: vec![0; tokens.len()],
            output_rows: (0..n).collect(),
            ngram_rows: vec![],
            logit_rows: vec![],
        })
        .unwrap(),
    );
    for step in 0..2 {
        out.push(
            m.forward(&BatchInputs {
                tokens: vec![40 + step, 90 + step],
                positions: vec![n + step, 40 + step],
                slots: vec![0, 1],
                output_rows: vec![0, 1],
                ngram_rows: vec![],
                logit_rows: vec![],
            })
            .unwrap(),
        );
    }
    out
}

/// Every value's bits, pass after pass (to compare runs bit for bit).
fn bits(v: &[Vec<f32>]) -> Vec<u32> {
    v.iter().flatten().map(|x| x.to_bits()).collect()
}

fn max_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let mut worst = 0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len());
        let scale = y.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        let d = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        worst = worst.max(d / scale);
    }
    worst
}

fn host_experts(m: &LoadedModel) -> Vec<usize> {
    let p = m.plan.as_ref().expect("a placement plan");
    p.on_card
        .iter()
        .map(|c| c.iter().filter(|&&x| !x).count())
        .collect()
}

/// For each MoE call with host experts in a one-row pass, the card calls between the host's
/// signal (the last I32 word copied before it) and the call: they run while the host computes.
fn card_calls_during_host_experts(m: &mut LoadedModel) -> Vec<usize> {
    let calls = m.pass_calls(1, 1).unwrap();
    let signal =
        |c: &OpCall| c.op == Op::Copy && c.dst.dtype == DType::I32 && c.dst.elements() == 1;
    calls
        .iter()
        .enumerate()
        .filter(|(_, c)| matches!(c.op, Op::MoeExperts(p) if p.expert_map))
        .map(|(i, _)| i - 1 - calls[..i].iter().rposition(signal).expect("a signal"))
        .collect()
}

#[test]
fn split_experts_give_the_unsplit_logits() {
    for experts in [DType::F32, DType::Q8_0] {
        let dir = tempfile::tempdir().unwrap();
        let path = tiny(&dir, experts);
        let mut whole = load(&path, &TierRequest::default());
        assert!(whole.plan.is_none());
        let want = run(&mut whole);

        // The staging sets left empty between prompts: both host layers run split.
        let ncmoe = TierRequest {
            n_cpu_moe: Some(2),
            no_decode_staging: true,
            ..Default::default()
        };
        let mut m = load(&path, &ncmoe);
        assert_eq!(host_experts(&m), vec![8, 8, 0, 0]);
        // Nothing of a layer without a shared expert waits between the routing and the experts.
        assert_eq!(card_calls_during_host_experts(&mut m), vec![0, 0]);
        let rel = max_rel(&run(&mut m), &want);
        assert!(rel < 1e-5, "{experts}: -ncmoe 2 differs by {rel}");

        // Every host expert computed by the host's CPU plugin (no bus share).
        let cmoe = TierRequest {
            cpu_moe: true,
            bus_experts: Some(0),
            ..Default::default()
        };
        let mut m = load(&path, &cmoe);
        assert_eq!(host_experts(&m), vec![8, 8, 8, 8]);
        // The token embeddings stay in host RAM and the card reads its rows in place.
        let p = m.plan.as_ref().unwrap();
        assert!(p.tables_on_host && p.host_table_bytes() > 0, "{p}");
        assert_eq!(p.table_weights.len(), 1, "{p}");
        let all_host = run(&mut m);
        let rel = max_rel(&all_host, &want);
        assert!(rel < 1e-5, "{experts}: -cmoe differs by {rel}");
        assert_eq!(m.disk_stats(), None);
        assert_eq!(m.residency_stats().unwrap().bus, 0);

        // The card takes one (the default for k = 2) or every one of a pass's host experts,
        // reading them in place; the CPU computes the rest, and the parts add up to the unsplit
        // logits. Eight takes all of them: every host call is then the card's.
        for bus in [None, Some(8)] {
            let request = TierRequest {
                bus_experts: bus,
                ..cmoe.clone()
            };
            let mut m = load(&path, &request);
            let rel = max_rel(&run(&mut m), &want);
            assert!(
                rel < 1e-5,
                "{experts}: a bus share of {bus:?} differs by {rel}"
            );
            let s = m.residency_stats().unwrap();
            assert!(s.bus > 0 && s.bus <= s.host, "{experts}: {bus:?}: {s:?}");
            assert_eq!(bus == Some(8), s.bus == s.host, "{experts}: {bus:?}: {s:?}");
            // The calls keep the forms the CUDA bundles launch as one kernel each: before every
            // host call, the packing of its three inputs and the signal; after it, the sum of the
            // share and the host's output, the residual and the next norm.
            let calls = m.pass_calls(1, 1).unwrap();
            let hosted: Vec<usize> = (0..calls.len())
                .filter(|&i| matches!(calls[i].op, Op::MoeExperts(p) if p.expert_map))
                .collect();
            // Layers 2 and 3 wait whole in the staging sets lent to them.
            assert_eq!(hosted.len(), 2, "{experts}");
            let runs = copy_runs(&calls);
            let sums = add2_norms(&calls);
            for i in hosted {
                assert!(runs.contains(&(i - 4, 4)), "{experts}: {i} {runs:?}");
                assert!(sums.contains(&(i + 1)), "{experts}: {i} {sums:?}");
            }
        }

        // Host RAM for one layer's experts only: every host expert is read from the file into
        // an arena of 8 slots, evicted layer after layer, and the logits do not change.
        let expert = m.plan.as_ref().unwrap().layers[0].expert_bytes;
        let disk = TierRequest {
            cpu_moe: true,
            host_budget: Some(8 * expert),
            no_residency: true,
            disk_prefetch: 2,
            ..Default::default()
        };
        let mut d = load(&path, &disk);
        // Host RAM too short for the tables beside the experts: the card holds them.
        assert!(!d.plan.as_ref().unwrap().tables_on_host);
        let paged = run(&mut d);
        let rel = max_rel(&paged, &want);
        assert!(rel < 1e-5, "{experts}: the disk tier differs by {rel}");
        // The same sums in the same order as with every expert in RAM, wherever the arena put
        // each expert: the same greedy tokens.
        assert!(
            bits(&paged) == bits(&all_host),
            "{experts}: the disk tier is not bit for bit the all-in-RAM run"
        );
        // The passes that stream nothing read layers 0 and 1 (layers 2 and 3 wait in the
        // staging sets, where the first prompt left them: nothing copied back): 16 experts
        // through 8 slots, so at least 8 evictions.
        let stats = d.disk_stats().expect("a disk tier");
        assert!(
            stats.reads >= 16,
            "{stats:?}: the arena should evict across 2 layers of 8"
        );
        assert_eq!(d.lent_restores(), Some(0));
        // The card's guesses of the next layer's experts were read ahead in the two-row steps
        // (the prompts' calls hold every slot); what was read depends on the history only, not
        // on thread timing: a second load reads the same and gives the same logits.
        assert!(
            stats.prefetched > 0
                && stats.prefetched <= stats.reads
                && stats.prefetch_hits <= stats.prefetched,
            "{experts}: {stats:?}"
        );
        let mut again = load(&path, &disk);
        assert!(bits(&run(&mut again)) == bits(&paged), "{experts}");
        assert_eq!(again.disk_stats(), Some(stats), "{experts}");
        // Without the prefetch: the same logits, nothing read ahead.
        let no_prefetch = TierRequest {
            disk_prefetch: 0,
            ..disk.clone()
        };
        let mut n = load(&path, &no_prefetch);
        assert!(bits(&run(&mut n)) == bits(&paged), "{experts}");
        let s = n.disk_stats().unwrap();
        assert_eq!((s.prefetched, s.prefetch_hits), (0, 0), "{s:?}");
        eprintln!("{experts}: disk tier {stats:?}, without the prefetch {s:?}");
        // Less than one layer's experts cannot work: refused by name.
        let too_small = TierRequest {
            host_budget: Some(7 * expert),
            ..disk.clone()
        };
        let err = try_load(&path, &too_small).err().expect("refused");
        assert!(
            err.contains("host budget") && err.contains("one layer"),
            "{err}"
        );

        // A card budget that holds one layer's experts and three of another's: the last layer
        // whole, the two before it left to the staging sets between prompts, and five of the
        // first layer's experts on the host.
        let p = m.plan.as_ref().unwrap();
        // Two staging sets, which fit beside the fixed costs and so are taken first.
        let two_sets = 2 * (p.staging / p.staging_sets.max(1) as u64);
        let fixed = p.card_dense_bytes() + p.fixed.state + p.fixed.scratch + two_sets;
        let expert = p.layers[0].expert_bytes;
        let budget = TierRequest {
            gpu_budgets: vec![fixed + 11 * expert],
            ..Default::default()
        };
        // Planned for passes of 2,048 rows (a server's `-ub 2048`), the card's scratch grows by
        // the larger arenas and at least 32 KiB a row of kernel scratch, and the same budget no
        // longer holds the fixed costs: refused, naming the scratch.
        let wide = TierRequest {
            batch_rows: 2048,
            ..budget.clone()
        };
        let err = try_load(&path, &wide).err().expect("refused");
        assert!(err.contains("scratch"), "{err}");
        let scratch = |rows: u32| {
            let request = TierRequest {
                cpu_moe: true,
                batch_rows: rows,
                ..Default::default()
            };
            load(&path, &request).plan.unwrap().fixed.scratch
        };
        let grown = scratch(2048) - scratch(0);
        assert!(grown > 1536 * (32 << 10), "{grown}");
        let mut m = load(&path, &budget);
        assert_eq!(host_experts(&m), vec![5, 8, 8, 0]);
        assert_eq!(m.plan.as_ref().unwrap().lent, vec![1, 2]);
        let rel = max_rel(&run(&mut m), &want);
        assert!(rel < 1e-5, "{experts}: a partial layer differs by {rel}");
        // Residency moved experts onto the card's three slots of the first layer between steps
        // (weights copied, both maps rewritten), and the logits stayed those of the whole model.
        // The card's part, its bus share and the CPU's part summed in one layer.
        let s = m.residency_stats().unwrap();
        assert!(
            s.flips > 0 && s.card > 0 && s.host > 0 && s.bus > 0,
            "{s:?}"
        );
        let fixed = TierRequest {
            no_residency: true,
            ..budget
        };
        let mut m = load(&path, &fixed);
        let rel = max_rel(&run(&mut m), &want);
        assert!(rel < 1e-5, "{experts}: a partial layer differs by {rel}");
        assert_eq!(m.residency_stats().unwrap().flips, 0);
    }
}

#[test]
fn a_card_too_small_for_the_dense_weights_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, DType::F32);
    let request = TierRequest {
        gpu_budgets: vec![1 << 20],
        ..Default::default()
    };
    let err = try_load(&path, &request).err().expect("refused");
    assert!(
        err.contains("does not fit") && err.contains("dense weights") && err.contains("scratch"),
        "{err}"
    );
}

#[test]
fn a_hybrid_with_split_experts_gives_the_unsplit_logits() {
    // qwen35moe: DeltaNet layers keep per-sequence state next to the tiered experts; the 40-row
    // prompt streams host layers and takes the chunked recurrence, the steps the step-wise one.
    let dir = tempfile::tempdir().unwrap();
    let types = ClassTypes {
        experts: DType::Q8_0,
        attention: DType::F32,
        embedding: DType::F32,
        output: DType::F32,
        dense: DType::F32,
    };
    let path = common::tiny_of("qwen35moe", dir.path(), types);
    let want = run(&mut load(&path, &TierRequest::default()));
    for (what, request) in [
        (
            "-ncmoe 2",
            TierRequest {
                n_cpu_moe: Some(2),
                no_decode_staging: true,
                ..Default::default()
            },
        ),
        (
            "-cmoe",
            TierRequest {
                cpu_moe: true,
                ..Default::default()
            },
        ),
    ] {
        let mut m = load(&path, &request);
        assert!(host_experts(&m).iter().sum::<usize>() >= 16, "{what}");
        // The shared expert (gate, up, GLU, down) runs on the card while the host computes.
        let during = card_calls_during_host_experts(&mut m);
        assert!(
            !during.is_empty() && during.iter().all(|&n| n == 4),
            "{what}: {during:?}"
        );
        let rel = max_rel(&run(&mut m), &want);
        assert!(rel < 1e-5, "{what} differs by {rel}");
    }
}

/// Without `--bus-experts` the first one-row passes time both share sizes and keep one; with
/// it nothing is chosen at run time.
#[test]
fn the_first_one_row_passes_choose_the_bus_share() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, DType::F32);
    let decode = |m: &mut LoadedModel, passes: i32| {
        for p in 0..passes {
            m.forward(&BatchInputs {
                tokens: vec![7 + p],
                positions: vec![p],
                slots: vec![0],
                output_rows: vec![0],
                ngram_rows: vec![],
                logit_rows: vec![],
            })
            .unwrap();
        }
    };
    let auto = TierRequest {
        cpu_moe: true,
        ..Default::default()
    };
    let mut m = load(&path, &auto);
    // The warm-up passes and TRIALS timed ones of each size, less one.
    let choosing = (WARMUP + 2 * TRIALS) as i32;
    decode(&mut m, choosing - 1);
    assert_eq!(m.residency_stats().unwrap().bus_kept, None);
    decode(&mut m, 1);
    // k = 2: a quarter and three eighths both round to one.
    assert_eq!(m.residency_stats().unwrap().bus_kept, Some(1));

    let asked = TierRequest {
        bus_experts: Some(1),
        ..auto
    };
    let mut m = load(&path, &asked);
    decode(&mut m, choosing);
    assert_eq!(m.residency_stats().unwrap().bus_kept, None);
}

/// By default each staging set holds one host layer's whole stacks between prompts, and passes
/// that stream nothing compute those layers on the card: the first such pass copies them in,
/// and the prompts after it (which stream every host layer through the sets) leave them there.
#[test]
fn the_staging_sets_lent_to_decode_give_the_unsplit_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, DType::Q8_0);
    // A one-row pass on slot 0 before any prompt, then the prompts and steps of `run`.
    let passes = |m: &mut LoadedModel| {
        let mut out = vec![m
            .forward(&BatchInputs {
                tokens: vec![300],
                positions: vec![0],
                slots: vec![0],
                output_rows: vec![0],
                ngram_rows: vec![],
                logit_rows: vec![],
            })
            .unwrap()];
        out.extend(run(m));
        out
    };
    let want = passes(&mut load(&path, &TierRequest::default()));
    let cmoe = TierRequest {
        cpu_moe: true,
        ..Default::default()
    };
    let mut m = load(&path, &cmoe);
    assert_eq!(m.plan.as_ref().unwrap().lent, vec![2, 3]);
    let got = passes(&mut m);
    let rel = max_rel(&got, &want);
    assert!(rel < 1e-5, "the lent layers differ by {rel}");
    // Two layers copied in by the first pass, none after the prompts.
    assert_eq!(m.lent_restores(), Some(2));
    // The lent layers' calls read the whole stacks (no expert map), the others run split.
    let calls = m.pass_calls(1, 1).unwrap();
    let moe = |mapped: bool| {
        calls
            .iter()
            .filter(|c| matches!(c.op, Op::MoeExperts(p) if p.expert_map == mapped))
            .count()
    };
    assert_eq!((moe(true), moe(false)), (2, 2));
    // Off: every host layer runs split, and nothing is copied.
    let keep = TierRequest {
        no_decode_staging: true,
        ..cmoe
    };
    let mut m = load(&path, &keep);
    assert!(m.plan.as_ref().unwrap().lent.is_empty());
    let rel = max_rel(&passes(&mut m), &want);
    assert!(rel < 1e-5, "without lending the logits differ by {rel}");
    assert_eq!(m.lent_restores(), Some(0));
    let calls = m.pass_calls(1, 1).unwrap();
    assert_eq!(
        calls
            .iter()
            .filter(|c| matches!(c.op, Op::MoeExperts(p) if p.expert_map))
            .count(),
        4
    );
}

/// With room for one staging set only, a prompt fills it in two halves of each layer's experts:
/// two MoE calls a layer, each over the whole set through its half's map (the second summed in
/// by an add), and the set still lent to the last host layer for decode.
#[test]
fn one_staging_set_filled_in_halves_gives_the_unsplit_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, DType::Q8_0);
    let want = run(&mut load(&path, &TierRequest::default()));
    let cmoe = TierRequest {
        cpu_moe: true,
        ..Default::default()
    };
    let p = load(&path, &cmoe).plan.unwrap();
    assert_eq!((p.staging_sets, p.staging_parts()), (2, 1));
    let one_set = p.card_dense_bytes() + p.fixed.state + p.fixed.scratch + p.staging / 2;
    let tight = TierRequest {
        gpu_budgets: vec![one_set],
        ..cmoe
    };
    let mut m = load(&path, &tight);
    let p = m.plan.as_ref().unwrap();
    assert_eq!((p.staging_sets, p.staging_parts()), (1, 2));
    assert_eq!(p.lent, vec![3]);
    let rel = max_rel(&run(&mut m), &want);
    assert!(rel < 1e-5, "halves differ by {rel}");
    // A 40-row prompt: two mapped calls and one add after each layer's first.
    let calls = m.pass_calls(40, 40).unwrap();
    let mapped = calls
        .iter()
        .filter(|c| matches!(c.op, Op::MoeExperts(p) if p.expert_map))
        .count();
    assert_eq!(mapped, 8);
    let halves_summed = calls
        .windows(2)
        .filter(|w| matches!(w[0].op, Op::MoeExperts(_)) && w[1].op == Op::Add)
        .count();
    assert_eq!(halves_summed, 4);
}

/// `--mlock` locks what the host reads during a run: with every expert on the host, their
/// stacks and the token tables (not the dense weights the card holds); with the disk tier,
/// none of the experts it reads into its arena; without the flag, nothing.
#[test]
fn mlock_locks_the_host_experts_and_tables_but_not_what_the_disk_tier_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, DType::Q8_0);
    let file_len = std::fs::metadata(&path).unwrap().len();
    let opts = LoadOptions {
        ctx_per_slot: 64,
        kv_type_k: DType::F32,
        kv_type_v: DType::F32,
        threads: 2,
        ..LoadOptions::default()
    };
    let load = |r: &TierRequest, mlock: bool| {
        common::load_on_scalar_card(&path, LoadOptions { mlock, ..opts }, r).unwrap()
    };
    let cmoe = TierRequest {
        cpu_moe: true,
        ..Default::default()
    };
    let m = load(&cmoe, true);
    let p = m.plan.as_ref().unwrap();
    let host = p.host_expert_bytes() + p.host_table_bytes();
    assert!(p.tables_on_host && p.host_table_bytes() > 0, "{p}");
    // Whole pages of each stack and table: at most a page more at either end of each.
    let slack = 2 * 4096 * (4 * 3 + 1);
    assert!(
        (host..=host + slack).contains(&m.locked),
        "locked {} for {host} bytes of experts and tables (file {file_len})",
        m.locked
    );
    assert!(m.locked < file_len);
    assert_eq!(load(&cmoe, false).locked, 0);

    // Host RAM for eight experts: every host expert is read from the file into the arena, and
    // the tables go to the card, so the host reads nothing of the file in place.
    let expert = p.layers[0].expert_bytes;
    let disk = TierRequest {
        host_budget: Some(8 * expert),
        ..cmoe
    };
    let d = load(&disk, true);
    assert!(d.disk_stats().is_some());
    assert!(!d.plan.as_ref().unwrap().tables_on_host);
    assert_eq!(d.locked, 0);
}

/// Resident bytes of the mapping that holds address `addr` (`/proc/self/smaps`' `Rss` of it).
fn mapped_rss(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let range = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'));
        if let Some((lo, hi)) = range.filter(|_| !line.ends_with(':') && !line.contains(": ")) {
            let lo = usize::from_str_radix(lo, 16).unwrap_or(usize::MAX);
            let hi = usize::from_str_radix(hi, 16).unwrap_or(0);
            inside = (lo..hi).contains(&addr);
        } else if inside && line.starts_with("Rss:") {
            let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
            return kib * 1024;
        }
    }
    panic!("no mapping holds {addr:#x}")
}

/// What the host does not read stays out of the process's resident memory: the weights copied
/// to the card leave it at load, and with the disk tier the experts do too (prompts stream them
/// from the mapping and release them, calls read them into the arena). With the experts in host
/// RAM, they and the token tables are resident after the same run, and nothing else of the file
/// beyond its header.
#[test]
fn the_file_keeps_only_what_the_host_reads_in_resident_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, DType::Q8_0);
    let cmoe = TierRequest {
        cpu_moe: true,
        bus_experts: Some(0),
        ..Default::default()
    };
    let mut m = load(&path, &cmoe);
    let want = run(&mut m);
    let part = &m.file.parts()[0];
    let header = part.tensors().iter().map(|t| t.start).min().unwrap();
    // At most a page at either end of each tensor besides its own.
    let slack = 2 * 4096 * part.tensors().len() as u64;
    let p = m.plan.as_ref().unwrap();
    let (experts, tables) = (p.host_expert_bytes(), p.host_table_bytes());
    let expert = p.layers[0].expert_bytes;
    let in_ram = mapped_rss(part.bytes().as_ptr() as usize);
    assert!(
        (experts..=experts + tables + header + slack).contains(&in_ram),
        "{in_ram} of the file resident for {experts} of experts, {tables} of tables and a \
         header of {header}"
    );
    drop(m);

    let disk = TierRequest {
        host_budget: Some(8 * expert),
        ..cmoe
    };
    let mut d = load(&path, &disk);
    let paged = run(&mut d);
    assert!(max_rel(&paged, &want) < 1e-5);
    let rss = mapped_rss(d.file.parts()[0].bytes().as_ptr() as usize);
    // The tables are on the card here: what is left is the header and the pages tensors share.
    assert!(!d.plan.as_ref().unwrap().tables_on_host);
    assert!(
        rss <= header + slack,
        "{rss} of the file resident with the disk tier (header {header}, experts {experts})"
    );
}

/// Loads `path` with cpu-scalar as the main "card" and a second cpu-scalar device standing in
/// for a second card, experts placed as `request` asks.
fn load_two(path: &Path, request: &TierRequest) -> LoadedModel {
    let reg = bloomery_devices::Registry::load(&common::plugin_dir()).unwrap();
    let scalar = reg
        .kernels
        .iter()
        .find(|k| k.name == "cpu-scalar")
        .expect("the cpu-scalar plugin");
    let opts = LoadOptions {
        n_slots: 2,
        ctx_per_slot: 64,
        kv_type_k: DType::F32,
        kv_type_v: DType::F32,
        threads: 2,
        graphs: true,
        mlock: false,
        overrides: &[],
        check_tensors: false,
        draft_n_max: 0,
        draft_history: false,
    };
    let main = bloomery_tiering::cards::UsedCard {
        device: 0,
        position: 0,
        share: 0.0,
    };
    LoadedModel::load_across(&reg, path, opts, (scalar, main), Some(scalar), request).unwrap()
}

fn peer_experts(m: &LoadedModel) -> Vec<usize> {
    let p = m.plan.as_ref().expect("a placement plan");
    p.peers[0]
        .experts
        .iter()
        .map(|c| c.iter().filter(|&&x| x).count())
        .collect()
}

/// Experts across two cards (issue 50) with CPU devices standing in: the main card's part, the
/// second card's on the rows the main card's routing packs, and the host's, summed, give the
/// logits of one card holding every expert, within 1e-6 (the sum's order changes: 1.5e-7 seen).
#[test]
fn experts_on_a_second_card_give_the_one_card_logits() {
    for experts in [DType::F32, DType::Q8_0] {
        let dir = tempfile::tempdir().unwrap();
        let path = tiny(&dir, experts);
        let want = run(&mut load(&path, &TierRequest::default()));
        // Budgets past the model (one value: both cards'): every expert on the main card.
        let roomy = TierRequest {
            gpu_budgets: vec![1 << 40],
            ..Default::default()
        };
        let m = load_two(&path, &roomy);
        assert_eq!(peer_experts(&m), vec![0; 4]);
        let p = m.plan.as_ref().unwrap();
        let base = p.card_dense_bytes() + p.fixed.state + p.fixed.scratch;
        let (peer_fixed, expert) = (p.peers[0].fixed, p.layers[0].expert_bytes);
        // With host experts the token tables stay in host RAM.
        let tiered_base = base - p.fixed.tables;
        drop(m);
        // The main card holds the last layer and three of the one before it, the second card
        // all the rest: no host experts, so no staging sets.
        let two = TierRequest {
            gpu_budgets: vec![base + 11 * expert, peer_fixed + 64 * expert],
            ..Default::default()
        };
        let mut m = load_two(&path, &two);
        assert_eq!(host_experts(&m), vec![8, 8, 5, 0]);
        assert_eq!(peer_experts(&m), vec![8, 8, 5, 0]);
        assert!(!m.plan.as_ref().unwrap().has_host_experts());
        let rel = max_rel(&run(&mut m), &want);
        assert!(
            rel < 1e-6,
            "{experts}: experts on two cards differ by {rel}"
        );
        // Three ways: two staging sets on the main card, which keeps layers 1 and 2 whole on
        // the host for them; the second card takes three of layer 0's other experts.
        let two_sets = 2 * 8 * expert;
        let three = TierRequest {
            gpu_budgets: vec![
                tiered_base + two_sets + 11 * expert,
                peer_fixed + 3 * expert,
            ],
            ..Default::default()
        };
        let mut m = load_two(&path, &three);
        assert_eq!(host_experts(&m), vec![5, 8, 8, 0]);
        assert_eq!(peer_experts(&m), vec![3, 0, 0, 0]);
        assert_eq!(m.plan.as_ref().unwrap().lent, vec![1, 2]);
        let rel = max_rel(&run(&mut m), &want);
        assert!(
            rel < 1e-6,
            "{experts}: experts on two cards and the host differ by {rel}"
        );
    }
}
