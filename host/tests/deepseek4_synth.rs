//! DeepSeek-V4-Flash (`deepseek4`) through the host: `synth --arch deepseek4 --preset tiny`
//! writes the hash-routing tables as I32 rows of distinct expert ids, and the written file loads
//! in the plugin across the ABI, whose graph builds; the real-width `flash` preset
//! cut to a few layers keeps its per-layer keys and loads. `synth --arch deepseek41 --preset
//! tiny` writes V4.1's 9-layer map whose file loads (its Engram constants declared to the host
//! as the n-gram spec) and whose graph builds.

mod common;

use common::plugin_dir;

use bloomery::synth::{self, ClassTypes};
use bloomery_devices::Registry;
use bloomery_gguf::GgufModel;
use bloomery_plugin_api::graph::{BatchShape, GraphKind};
use bloomery_plugin_api::DType;

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

#[test]
fn the_tiny_file_holds_i32_hash_tables_and_loads_in_the_plugin() {
    let reg = Registry::load(&plugin_dir()).expect("plugin folder (cargo xtask plugins)");
    let plugin = reg.model_for("deepseek4").unwrap();
    let presets = plugin.module.synth_presets()();
    let preset = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deepseek4.gguf");
    synth::write(preset, F32, 7, &path).unwrap();
    let file = GgufModel::open(&path).unwrap();
    let mut seen = [false; 16];
    for il in 0..6 {
        let name = format!("blk.{il}.ffn_gate_tid2eid.weight");
        let Some(t) = file.tensor(&name) else {
            assert!(il >= 3, "{name} missing");
            continue;
        };
        assert!(il < 3, "{name} on a router layer");
        assert_eq!(
            (t.info.dtype, t.info.shape.as_slice()),
            (DType::I32, &[6, 320][..])
        );
        let ids: Vec<i32> = file
            .tensor_data(t)
            .unwrap()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        for row in ids.chunks_exact(6) {
            let mut r = row.to_vec();
            r.sort_unstable();
            r.dedup();
            assert_eq!(r.len(), 6, "{name}: {row:?} repeats an expert");
            for &e in row {
                assert!((0..16).contains(&e), "{name}: expert {e}");
                seen[e as usize] = true;
            }
        }
    }
    assert!(seen.iter().all(|&s| s), "every expert drawn: {seen:?}");
    let bias = file.tensor("blk.3.exp_probs_b.bias").unwrap();
    assert_eq!(bias.info.dtype, DType::F32);
    let m = bloomery_exec::instantiate(plugin, &file, "deepseek4", "tiny").unwrap();
    let spec = m.spec();
    assert_eq!(spec.weights.len(), preset.tensors.len());
    assert_eq!(spec.state.len(), 6 + 4 * 2 + 2 * 2);
    let shape = BatchShape {
        n_rows: 3,
        n_outputs: 1,
        kind: GraphKind::Main,
    };
    // The graph builds across the ABI (its numbers: deepseek4_golden.rs).
    let g = m.build_graph(shape).into_result().unwrap();
    assert!(g.outputs.iter().any(|o| o.name.as_str() == "logits"));
}

/// The written `deepseek41` file keeps its u64 Engram constants and its two tables, loads across
/// the ABI with the n-gram spec the keys give, and its graph builds.
#[test]
fn the_tiny_deepseek41_file_loads_with_its_engram_spec_and_its_graph_builds() {
    let reg = Registry::load(&plugin_dir()).expect("plugin folder (cargo xtask plugins)");
    let plugin = reg.model_for("deepseek41").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("deepseek41", dir.path(), F32);
    let file = GgufModel::open(&path).unwrap();
    let u64s = |k: &str| -> Vec<u64> {
        match file.metadata().get_array(&format!("deepseek41.engram.{k}")) {
            Ok(bloomery_gguf::Array::U64(v)) => v.clone(),
            v => panic!("{k}: {v:?}"),
        }
    };
    let (mult, primes, offsets) = (u64s("multipliers"), u64s("primes"), u64s("offsets"));
    assert_eq!(
        (mult.len(), primes.len(), u64s("token_map").len()),
        (8, 12, 320)
    );
    for (il, rows) in [(1, 252), (4, 410)] {
        let t = file
            .tensor(&format!("blk.{il}.engram_embd.weight"))
            .unwrap();
        assert_eq!(t.info.shape.as_slice(), &[16, rows][..]);
    }
    let m = bloomery_exec::instantiate(plugin, &file, "deepseek41", "tiny").unwrap();
    let spec = m.spec();
    let ngram = spec.ngram.clone().into_option().expect("the Engram spec");
    assert_eq!(ngram.multipliers.to_vec(), mult);
    assert_eq!(ngram.head_sizes.to_vec(), primes);
    assert_eq!(ngram.head_offsets.to_vec(), offsets);
    assert_eq!((ngram.tables, ngram.end_id, ngram.token_map[1]), (2, 7, 37));
    let shape = BatchShape {
        n_rows: 3,
        n_outputs: 1,
        kind: GraphKind::Main,
    };
    // The graph builds across the ABI (its numbers: deepseek41_golden.rs).
    let g = m.build_graph(shape).into_result().unwrap();
    assert!(g.outputs.iter().any(|o| o.name.as_str() == "logits"));
}

/// The Engram row ids the host computes from the loaded spec equal those of an integer numpy
/// reference that reads the written file's keys (`tests/oracle/numpy_deepseek41_ids.py`, from
/// DeepSeek's Engram reference; fixture `fixtures/deepseek41/engram_ids.json`) at every position
/// of both sites, hashed at once and in chunks: the keys' layout, site after site.
#[test]
fn the_tiny_deepseek41_engram_row_ids_match_numpy() {
    let reg = Registry::load(&plugin_dir()).expect("plugin folder (cargo xtask plugins)");
    let plugin = reg.model_for("deepseek41").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("deepseek41", dir.path(), F32);
    let file = GgufModel::open(&path).unwrap();
    let m = bloomery_exec::instantiate(plugin, &file, "deepseek41", "tiny").unwrap();
    let ngram = m.spec().ngram.into_option().expect("the Engram spec");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/deepseek41/engram_ids.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let ints = |v: &serde_json::Value| -> Vec<i64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    };
    let tokens: Vec<u32> = ints(&golden["tokens"]).iter().map(|&t| t as u32).collect();
    let want: Vec<i32> = golden["ids"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| ints(row).into_iter().map(|x| x as i32))
        .collect();
    assert_eq!(want.len(), tokens.len() * 12);
    let mut whole = Vec::new();
    ngram.extend_rows(&[], &tokens, &mut whole);
    assert_eq!(whole, want);
    let mut parts = Vec::new();
    let mut at = 0;
    for end in [1, 5, 9, tokens.len()] {
        ngram.extend_rows(&tokens[..at], &tokens[at..end], &mut parts);
        at = end;
    }
    assert_eq!(parts, want);
}

#[test]
fn the_flash_preset_cut_to_four_layers_keeps_its_ratios_and_loads() {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let plugin = reg.model_for("deepseek4").unwrap();
    let presets = plugin.module.synth_presets()();
    let full = presets.iter().find(|p| p.name.as_str() == "flash").unwrap();
    let p = bloomery::synth::depth::first_layers(full, 4).unwrap();
    let meta = |k: &str| {
        let e = p.metadata.iter().find(|e| e.key.as_str() == k);
        e.unwrap_or_else(|| panic!("no {k}")).value.clone()
    };
    assert_eq!(meta("deepseek4.block_count").as_u64(), Some(4));
    let ratios = meta("deepseek4.attention.compress_ratios");
    let ratios: Vec<u64> = match ratios {
        bloomery_plugin_api::meta::MetaValue::Array(v) => {
            v.iter().map(|x| x.as_u64().unwrap()).collect()
        }
        v => panic!("compress_ratios {v:?}"),
    };
    assert_eq!(ratios, [0, 0, 4, 128]);
    let has = |t: &str| p.tensors.iter().any(|x| x.name.as_str() == t);
    assert!(has("blk.2.ffn_gate_tid2eid.weight") && has("blk.3.exp_probs_b.bias"));
    assert!(has("blk.2.indexer.attn_q_b.weight") && !has("blk.3.indexer.attn_q_b.weight"));
    assert!(!p.tensors.iter().any(|x| x.name.starts_with("blk.4.")));
    let q_b = p
        .tensors
        .iter()
        .find(|x| x.name.as_str() == "blk.0.attn_q_b.weight");
    assert_eq!(q_b.unwrap().ne, [1024, 64 * 512, 1, 1]);
    let loaded = plugin.module.load()(&p.file_view(DType::F32)).into_result();
    let m = loaded.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.spec().weights.len(), p.tensors.len());
}

/// The CUDA bundles claim every `(op, dtype)` pair of both tiny files' graphs (V4 and V4.1),
/// decode and prompt shapes (so that `-ngl 99` places them on the card rather than refusing them
/// at load); what a kernel refuses at run time is the op checks' part (`bloomery opcheck`,
/// scripts/gpu-check.sh).
#[test]
fn the_cuda_bundles_claim_every_op_of_the_tiny_graph() {
    let reg = Registry::load(&plugin_dir()).expect("plugin folder (cargo xtask plugins)");
    let dir = tempfile::tempdir().unwrap();
    let mut graphs = Vec::new();
    for arch in ["deepseek4", "deepseek41"] {
        let plugin = reg.model_for(arch).unwrap();
        let path = common::tiny_of(arch, dir.path(), F32);
        let file = GgufModel::open(&path).unwrap();
        let m = bloomery_exec::instantiate(plugin, &file, arch, "tiny").unwrap();
        for (n_rows, n_outputs) in [(1, 1), (20, 20), (3, 1)] {
            let shape = BatchShape {
                n_rows,
                n_outputs,
                kind: GraphKind::Main,
            };
            graphs.push(m.build_graph(shape).into_result().unwrap());
        }
    }
    let mut checked = 0;
    for k in reg.kernels.iter().filter(|k| k.name.starts_with("cuda-")) {
        if k.capabilities.is_empty() {
            eprintln!("skipped {}: built without kernels (no nvcc)", k.name);
            continue;
        }
        for g in &graphs {
            let missing = bloomery_exec::support::missing_kernels(g, &k.capabilities);
            assert!(missing.is_empty(), "{} lacks {missing:?}", k.name);
        }
        checked += 1;
    }
    assert!(
        checked > 0,
        "no CUDA bundle with kernels in {} (cargo xtask plugins builds them)",
        plugin_dir().display()
    );
}

/// Experts on the host give the logits of experts on the device (the best CPU plugin as both):
/// within 1e-6 of their norm for a layer hosted in decode (8 rows, the host's products summed in
/// another order), bit for bit streamed in a prompt (64 rows, the same products on copies). The
/// plugin declares each layer's stacks as gate, down, up, and the tier once kept them in that
/// order while the MoE call names them gate, up, down (every hosted product swapped up and down:
/// 0.07 apart).
#[test]
fn experts_on_the_host_give_the_device_logits() {
    use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel};
    use bloomery_tiering::plan::TierRequest;
    let reg = Registry::load(&plugin_dir()).expect("plugin folder (cargo xtask plugins)");
    let dir = tempfile::tempdir().unwrap();
    let path = common::tiny_of("deepseek4", dir.path(), F32);
    let kernel = reg
        .best_kernel(bloomery_plugin_api::kernel::DeviceClass::Cpu)
        .unwrap();
    // The compressed rows read 128 positions: a context of 256.
    let opts = LoadOptions {
        ctx_per_slot: 256,
        ..common::GOLDEN_OPTS
    };
    for (rows, tol) in [(8, 1e-6), (64, 0.0)] {
        let batch = BatchInputs {
            tokens: (0..rows).map(|i| (i * 37 + 11) % 320).collect(),
            positions: (0..rows).collect(),
            slots: vec![0; rows as usize],
            output_rows: (0..rows).collect(),
            ngram_rows: vec![],
            logit_rows: vec![],
        };
        let mut dev = LoadedModel::load_on(&reg, &path, opts, kernel).unwrap();
        let want = dev.forward(&batch).unwrap();
        let cmoe = TierRequest {
            cpu_moe: true,
            ..Default::default()
        };
        let mut split = LoadedModel::load_placed(&reg, &path, opts, kernel, &cmoe).unwrap();
        let got = split.forward(&batch).unwrap();
        let norm =
            |v: &mut dyn Iterator<Item = f32>| v.map(|x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        let rel =
            norm(&mut got.iter().zip(&want).map(|(a, b)| a - b)) / norm(&mut want.iter().copied());
        eprintln!("{rows} rows: experts on the host {rel:.2e} from the device's");
        assert!(
            rel <= tol,
            "{rows} rows: experts on the host {rel:.2e} from the device's"
        );
    }
}
