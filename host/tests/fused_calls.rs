//! The qwen35 graphs, as planned for a pass, keep the calls the CUDA bundles launch as fewer
//! kernels in the form those kernels take: each Gated DeltaNet mixer's decode step
//! (`bloomery_kernels_cuda::ops::gdn_steps`, two launches instead of thirteen) and each
//! sigmoid-gated shared expert's sum (`gated_adds`, one instead of four), and in decode passes
//! each shared expert with its routed experts (`shared_moes`: the shared expert a slot of the
//! routed kernels, its gated sum in their down kernel). A reordered graph or a
//! memory plan that lets a skipped result be read later would silently fall back to the separate
//! launches. Checked on the calls the CPU device receives, which are the calls any kernel plugin
//! receives.

mod common;

use common::{plugin_dir, tiny_of};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_kernels_cuda::ops::{gated_adds, gdn_steps, shared_moes};
use bloomery_plugin_api::DType;

/// DeltaNet layers of the tiny presets (three of their four layers).
const GDN_LAYERS: usize = 3;
/// Layers of the tiny presets.
const LAYERS: usize = 4;

fn load(arch: &str, dir: &tempfile::TempDir, dense: DType) -> LoadedModel {
    load_typed(arch, dir, DType::F32, dense)
}

fn load_typed(arch: &str, dir: &tempfile::TempDir, experts: DType, dense: DType) -> LoadedModel {
    let types = ClassTypes {
        experts,
        attention: dense,
        embedding: DType::F32,
        output: DType::F32,
        dense,
    };
    let path = tiny_of(arch, dir.path(), types);
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = LoadOptions {
        n_slots: 4,
        ctx_per_slot: 128,
        kv_type_k: DType::F32,
        kv_type_v: DType::F32,
        threads: 2,
        graphs: false,
        mlock: false,
        overrides: &[],
        check_tensors: false,
        draft_n_max: 0,
        draft_history: false,
    };
    LoadedModel::load(&reg, &path, opts).unwrap()
}

#[test]
fn every_gdn_layer_of_a_decode_pass_is_one_fused_step() {
    for arch in ["qwen35moe", "qwen35"] {
        for (dense, copy_only) in [(DType::F32, false), (DType::Q8_0, true)] {
            let dir = tempfile::tempdir().unwrap();
            let mut m = load(arch, &dir, dense);
            for rows in [1, 3, 4, 63] {
                let calls = m.pass_calls(rows, rows).unwrap();
                let steps = gdn_steps(&calls);
                assert_eq!(
                    steps.len(),
                    GDN_LAYERS,
                    "{arch} {dense} {rows} rows: {steps:?}"
                );
                // β's and α's F32 products join the step, and with a quantized output product
                // only the result's Q8_1 copy is written.
                assert!(
                    steps.iter().all(|&(_, n, c)| n == 17 && c == copy_only),
                    "{arch} {dense} {rows} rows: {steps:?}"
                );
            }
            // A prompt of 64 rows may be one segment: the chunked rule takes it, unfused.
            assert!(gdn_steps(&m.pass_calls(64, 1).unwrap()).is_empty());
        }
    }
}

#[test]
fn every_shared_expert_sum_is_one_kernel() {
    for (arch, sums) in [("qwen35moe", LAYERS), ("qwen35", 0)] {
        let dir = tempfile::tempdir().unwrap();
        let mut m = load(arch, &dir, DType::Q8_0);
        for rows in [1, 4, 100] {
            let found = gated_adds(&m.pass_calls(rows, 1).unwrap());
            assert_eq!(found.len(), sums, "{arch} {rows} rows: {found:?}");
        }
    }
}

#[test]
fn every_decode_shared_expert_joins_its_routed_experts() {
    for experts in [DType::Q8_0, DType::Q4_K] {
        for (arch, layers) in [("qwen35moe", LAYERS), ("qwen35", 0)] {
            let dir = tempfile::tempdir().unwrap();
            let mut m = load_typed(arch, &dir, experts, DType::Q8_0);
            for rows in [1, 4, 15] {
                let found = shared_moes(&m.pass_calls(rows, rows).unwrap());
                assert_eq!(
                    found.len(),
                    layers,
                    "{arch} {experts} {rows} rows: {found:?}"
                );
            }
            // A prompt for the tiled products keeps the calls apart, but for its last layer,
            // which runs only the output row.
            let found = shared_moes(&m.pass_calls(16, 1).unwrap());
            assert_eq!(found.len(), layers.min(1), "{arch} {experts}: {found:?}");
        }
    }
    // F32 stacks have no pair form.
    let dir = tempfile::tempdir().unwrap();
    let mut m = load("qwen35moe", &dir, DType::Q8_0);
    assert!(shared_moes(&m.pass_calls(1, 1).unwrap()).is_empty());
}
