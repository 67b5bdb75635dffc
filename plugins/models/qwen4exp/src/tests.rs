//! The plugin's own tests: presets against the loader, layer kinds, the n-gram table's
//! constants and state, the fused expert stacks, the MTP-only files (`tiny-mtp`, `flash-mtp`),
//! refusals by name (the compress-ratio trap first), hostile files, and the graphs: the trunk's,
//! the MTP block's draft graph and the verify graph's row states.

use super::*;
use bloomery_plugin_api::graph::{
    BatchInput, Graph, GraphKind, TensorSource, FINAL_NORM, NEXTN_HIDDEN,
};
use bloomery_plugin_api::hostile::{check_hostile, key_sweep};
use bloomery_plugin_api::meta::{MetaValue, TensorInfo};
use bloomery_plugin_api::model::{StateKind, SynthPreset, WeightClass};
use bloomery_plugin_api::synth::check_presets;
use bloomery_plugin_api::DType;

use crate::layers::LayerKind;

fn preset(name: &str) -> SynthPreset {
    synth::presets()
        .into_iter()
        .find(|p| p.name.as_str() == name)
        .unwrap()
}

fn tiny() -> ModelFileView {
    preset("tiny").file_view(DType::F32)
}

/// `view` with `{ARCH}.{key}` set to `value`, or removed.
fn set(view: ModelFileView, key: &str, value: Option<MetaValue>) -> ModelFileView {
    view.with_entry(&format!("{ARCH}.{key}"), value)
}

fn with_key(key: &str, value: Option<MetaValue>) -> ModelFileView {
    set(tiny(), key, value)
}

fn refusal(view: &ModelFileView) -> String {
    match Qwen4Exp::load(view) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

fn i32s(v: &[i32]) -> Option<MetaValue> {
    Some(MetaValue::Array(
        v.iter().map(|&x| MetaValue::I32(x)).collect(),
    ))
}

fn u64s(v: &[u64]) -> Option<MetaValue> {
    Some(MetaValue::Array(
        v.iter().map(|&x| MetaValue::U64(x)).collect(),
    ))
}

fn names(m: &Qwen4Exp) -> Vec<String> {
    m.spec()
        .weights
        .iter()
        .map(|w| w.name.as_str().to_owned())
        .collect()
}

#[test]
fn every_preset_loads_with_its_declared_weights() {
    check_presets(&synth::presets(), Qwen4Exp::load).unwrap();
}

#[test]
fn tiny_layers_follow_the_recurrent_flags_and_the_ratios() {
    let m = Qwen4Exp::load(&tiny()).unwrap();
    let hp = m.hparams();
    let (g, q) = (LayerKind::Gdn, LayerKind::Qsa);
    assert_eq!(hp.kinds, [g, g, g, q, g, g, g, q]);
    assert_eq!((hp.lm.n_layer, hp.n_mtp, hp.mtp_only), (8, 0, false));
    assert_eq!(
        (hp.qsa.ratio, hp.qsa.n_blocks(), hp.qsa.dense_up_to()),
        (4, 4, 19)
    );
    assert_eq!(hp.rope.sections, [11, 11, 10, 0]);
    assert_eq!(hp.rope.n_dims, 64);
    assert_eq!(
        (hp.hc.n_stream, hp.hc.low_rank, hp.hc_width()),
        (4, 32, 512)
    );
    let spec = m.spec();
    assert!(spec.caps.recurrent);
    assert_eq!(spec.caps.n_mtp_layers, 0);
    // No output norm, no per-layer norms: the hyper-connection mixers replace them.
    let names = names(&m);
    assert!(!names
        .iter()
        .any(|n| n.contains("attn_norm.weight") && !n.contains("hc_")));
    assert!(!names.iter().any(|n| n == "output_norm.weight"));
    for n in [
        "output_hc_norm.weight",
        "per_layer_token_embd.weight",
        "blk.1.ple_conv1d.weight",
        "blk.3.indexer.q_proj.weight",
        "blk.7.attn_q.weight",
        "blk.0.ssm_out.weight",
        "blk.0.hc_ffn_inject.weight",
    ] {
        assert!(names.iter().any(|x| x == n), "{n}");
    }
    // The table layer's projections are on layer 1 only.
    assert_eq!(names.iter().filter(|n| n.contains("ple_key")).count(), 1);
}

/// The constants `tests/oracle/hf_qwen4exp.py`'s docstring lists for the converted tiny file
/// (head offsets and row counts, 16,896 table rows, the end id 270).
#[test]
fn tiny_ple_constants_are_the_converters() {
    let m = Qwen4Exp::load(&tiny()).unwrap();
    let p = m.hparams().ple.clone().unwrap();
    assert_eq!(
        (p.layer, p.ngram_size, p.heads_per_ngram, p.n_heads()),
        (1, 3, 8, 16)
    );
    assert_eq!(
        (p.head_dim, p.conv_kernel, p.eos, p.image_token),
        (8, 4, 270, 270)
    );
    let sizes = [
        1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049, 1051, 1061, 1063, 1069, 1087, 1091, 1093,
        1097,
    ];
    assert_eq!(p.head_sizes, sizes);
    assert_eq!(p.head_offsets[..4], [0, 1009, 2022, 3041]);
    assert_eq!(p.head_offsets[15], 15729);
    assert_eq!(p.rows, 16896);
    let mults = [
        2_175_817_888_646_129,
        31_215_934_654_987_533,
        4_449_929_463_106_639,
    ];
    assert_eq!(p.multipliers, mults);
    assert_eq!(m.weights().ple_table.as_ref().unwrap().ne, [8, 16896, 1, 1]);
}

#[test]
fn state_has_the_deltanet_the_caches_and_the_table_layers_history() {
    let m = Qwen4Exp::load(&tiny()).unwrap();
    let decls = m.spec().state;
    let row = |i: u32| (decls[i as usize].kind, decls[i as usize].row_elems);
    let Some(LayerState::Gdn {
        conv,
        ssm,
        ple_conv: Some(pc),
    }) = m.layer_state(1)
    else {
        panic!("layer 1: {:?}", m.layer_state(1));
    };
    assert_eq!(row(conv), (StateKind::Conv, 1024 * 3));
    assert_eq!(row(ssm), (StateKind::Recurrent, 128 * 128 * 4));
    // Dilation 3, kernel 4: nine rows of the 512-wide residual.
    assert_eq!(row(pc), (StateKind::Conv, 512 * 9));
    assert!(matches!(
        m.layer_state(0),
        Some(LayerState::Gdn { ple_conv: None, .. })
    ));
    let Some(LayerState::Qsa { k, v, indexer }) = m.layer_state(3) else {
        panic!("layer 3: {:?}", m.layer_state(3));
    };
    assert_eq!(row(k), (StateKind::Keys, 512));
    assert_eq!(row(v), (StateKind::Values, 512));
    assert_eq!(row(indexer), (StateKind::PooledKeys, 256));
    // Six DeltaNet layers (conv, delta rule), two attention layers (K, V, indexer), the PLE
    // convolution.
    assert_eq!(decls.len(), 6 * 2 + 2 * 3 + 1);
}

#[test]
fn fused_gate_up_experts_load() {
    let mut view = tiny();
    let mut tensors: Vec<TensorInfo> = Vec::new();
    for t in view.tensors.iter() {
        let name = t.name.as_str();
        if name.ends_with("ffn_up_exps.weight") {
            continue;
        }
        let mut t = t.clone();
        if let Some(layer) = name.strip_suffix("ffn_gate_exps.weight") {
            t.name = format!("{layer}ffn_gate_up_exps.weight").into();
            t.ne[1] *= 2;
        }
        tensors.push(t);
    }
    view.tensors = tensors.into();
    let m = Qwen4Exp::load(&view).unwrap();
    let x = &m.weights().layers[5].moe.experts;
    assert_eq!(x.gate.name, "blk.5.ffn_gate_up_exps.weight");
    assert_eq!(x.gate.ne, [128, 64, 8, 1]);
    assert!(x.up.is_none());
}

#[test]
fn the_mtp_only_file_holds_the_embeddings_the_head_and_the_block() {
    let m = Qwen4Exp::load(&preset("tiny-mtp").file_view(DType::F32)).unwrap();
    let hp = m.hparams();
    assert_eq!((hp.lm.n_layer, hp.n_mtp, hp.mtp_only), (8, 1, true));
    assert!(hp.ple.is_none());
    assert_eq!(hp.kind(8), Some(LayerKind::Qsa));
    assert_eq!(m.spec().caps.n_mtp_layers, 1);
    let names = names(&m);
    assert_eq!(names[..2], ["token_embd.weight", "output.weight"]);
    assert!(
        names[2..].iter().all(|n| n.starts_with("blk.8.")),
        "{names:?}"
    );
    for n in [
        "nextn.eh_proj",
        "nextn.hnorm",
        "nextn.hc_head_up",
        "indexer.k_norm",
    ] {
        assert!(names.contains(&format!("blk.8.{n}.weight")), "{n}");
    }
    assert!(!names.iter().any(|n| n.contains("hc_head_inject")));
    assert!((0..8).all(|il| m.layer_state(il).is_none()));
    assert!(matches!(m.layer_state(8), Some(LayerState::Qsa { .. })));
    assert_eq!(m.spec().state.len(), 3);
}

#[test]
fn an_mtp_only_file_names_its_block_at_block_count_less_one() {
    let view = preset("tiny-mtp").file_view(DType::F32);
    let e = refusal(&set(view, "block_count", Some(MetaValue::U32(10))));
    assert!(
        e.contains("qwen4exp.block_count") && e.contains("layer 9"),
        "{e}"
    );
}

/// At real widths the head sizes are the 16 primes from 20,000,000 (the first 20,000,003, by
/// a separate count) and the table has the 320,001,536 rows `tests/oracle/hf_qwen4exp.py`'s
/// docstring gives for the real model.
#[test]
fn flash_has_the_real_table() {
    let m = Qwen4Exp::load(&preset("flash").file_view(DType::F32)).unwrap();
    let p = m.hparams().ple.clone().unwrap();
    assert_eq!((p.head_dim, p.eos, p.rows), (160, 248_044, 320_001_536));
    assert_eq!(
        (p.head_sizes[0], p.head_offsets[1]),
        (20_000_003, 20_000_003)
    );
    assert_eq!(m.hparams().kinds.len(), 48);
}

#[test]
fn all_zero_compress_ratios_are_the_converters_trap_and_refused() {
    let e = refusal(&with_key("attention.compress_ratios", i32s(&[0; 8])));
    assert!(e.contains("qwen4exp.attention.compress_ratios"), "{e}");
    assert!(e.contains("trap") && e.contains("indexed_attention"), "{e}");
}

#[test]
fn compress_ratios_must_be_one_ratio_on_exactly_the_attention_layers() {
    let key = "qwen4exp.attention.compress_ratios";
    for (ratios, why) in [
        ([0, 0, 0, 4, 0, 0, 0, 8], "share one ratio"),
        ([0, 0, 0, 1, 0, 0, 0, 1], "at least 2"),
        ([0, 4, 0, 4, 0, 0, 0, 4], "layer 1 is a Gated DeltaNet"),
        ([0, 0, 0, 4, 0, 0, 0, 0], "layer 7 is an attention"),
    ] {
        let e = refusal(&with_key("attention.compress_ratios", i32s(&ratios)));
        assert!(e.contains(key) && e.contains(why), "{ratios:?}: {e}");
    }
    let e = refusal(&with_key("attention.compress_ratios", i32s(&[0, 4])));
    assert!(e.contains("2 values for 8 layers"), "{e}");
    // The budget must hold whole blocks.
    let e = refusal(&with_key(
        "attention.indexer.top_k",
        Some(MetaValue::U32(18)),
    ));
    assert!(e.contains("qwen4exp.attention.indexer.top_k"), "{e}");
}

#[test]
fn without_recurrent_flags_every_fourth_layer_is_attention() {
    let m = Qwen4Exp::load(&with_key("attention.recurrent_layers", None)).unwrap();
    assert_eq!(m.hparams().kinds[3], LayerKind::Qsa);
    let view = with_key("attention.recurrent_layers", None);
    let e = refusal(&set(
        view,
        "full_attention_interval",
        Some(MetaValue::U32(2)),
    ));
    assert!(
        e.contains("layer 1 is an attention layer with ratio 0"),
        "{e}"
    );
}

#[test]
fn the_table_keys_are_checked_by_name() {
    let cases: Vec<(&str, Option<MetaValue>, &str)> = vec![
        ("ple.layers", i32s(&[3]), "a Gated DeltaNet layer"),
        ("ple.layers", i32s(&[1, 2]), "exactly one PLE layer"),
        ("ple.layers", i32s(&[8]), "a Gated DeltaNet layer"),
        ("ple.ngram_size", Some(MetaValue::U32(1)), "2 to 8"),
        ("ple.ngram_size", Some(MetaValue::U32(9)), "2 to 8"),
        (
            "ple.heads_per_ngram",
            Some(MetaValue::U32(4)),
            "is not the hidden width",
        ),
        (
            "ple.heads_per_ngram",
            Some(MetaValue::U32(40)),
            "at most 64",
        ),
        ("ple.eos_token_id", Some(MetaValue::U32(272)), "not a token"),
        (
            "ple.image_token_id",
            Some(MetaValue::U32(300)),
            "not a token",
        ),
        ("ple.conv_kernel", Some(MetaValue::U32(1)), "at least 2"),
        ("ple.conv_kernel", Some(MetaValue::U32(3)), "ple_conv1d"),
        (
            "ple.layer_multipliers",
            u64s(&[1, 2]),
            "2 values, 3 expected",
        ),
        // Below u64's range but past i64's with token id 271.
        (
            "ple.layer_multipliers",
            u64s(&[1, 50_000_000_000_000_000, 1]),
            "exceeds 2^63",
        ),
        ("ple.head_offsets", u64s(&[0; 15]), "15 values, 16 expected"),
        (
            "embedding_length_per_layer_input",
            Some(MetaValue::U32(16)),
            "hidden width",
        ),
        ("ple.eos_token_id", None, "ple.eos_token_id"),
    ];
    for (key, value, why) in cases {
        let e = refusal(&with_key(key, value.clone()));
        assert!(e.contains(why), "{key} = {value:?}: {e}");
    }
    let mut sizes = vec![1009u64; 16];
    sizes[4] = 0;
    let e = refusal(&with_key("ple.head_vocab_sizes", u64s(&sizes)));
    assert!(e.contains("head 4"), "{e}");
    // A head range past the table's rows.
    let mut offsets: Vec<u64> = (0..16).map(|h| h * 1009).collect();
    offsets[15] = 16_000;
    let e = refusal(&with_key("ple.head_offsets", u64s(&offsets)));
    assert!(e.contains("16896 rows"), "{e}");
    // An image token id of 0 means none: the end id stands in.
    let m = Qwen4Exp::load(&with_key("ple.image_token_id", Some(MetaValue::U32(0)))).unwrap();
    assert_eq!(m.hparams().ple.as_ref().unwrap().image_token, 270);
}

#[test]
fn shapes_are_checked_against_their_tensors() {
    let cases: Vec<(&str, MetaValue, &str)> = vec![
        (
            "ssm.inner_size",
            MetaValue::U32(256),
            "is not 4 value heads",
        ),
        ("ssm.group_count", MetaValue::U32(3), "do not divide"),
        ("ssm.group_count", MetaValue::U32(4), "attn_qkv"),
        ("ssm.state_size", MetaValue::U32(64), "ssm_norm"),
        ("hyper_connection.count", MetaValue::U32(1), "at least 2"),
        (
            "hyper_connection.count",
            MetaValue::U32(2),
            "hc_attn_inject",
        ),
        (
            "hyper_connection.low_rank",
            MetaValue::U32(16),
            "hc_attn_down",
        ),
        (
            "attention.indexer.head_count",
            MetaValue::U32(2),
            "indexer.q_proj",
        ),
        (
            "attention.indexer.key_length",
            MetaValue::U32(64),
            "indexer.q_norm",
        ),
        ("rope.dimension_count", MetaValue::U32(0), "positive"),
        ("attention.head_count", MetaValue::U32(2), "attn_output"),
        (
            "expert_shared_feed_forward_length",
            MetaValue::U32(64),
            "ffn_down_shexp",
        ),
        ("block_count", MetaValue::U32(9), "tensors name 8"),
    ];
    for (key, value, why) in cases {
        let e = refusal(&with_key(key, Some(value.clone())));
        assert!(
            e.contains(&format!("qwen4exp.{key}")),
            "{key} = {value:?}: {e}"
        );
        assert!(e.contains(why), "{key} = {value:?}: {e}");
    }
    let e = refusal(&with_key("rope.dimension_sections", i32s(&[11, 11, 11, 0])));
    assert!(e.contains("fill 64"), "{e}");
    let e = refusal(&with_key("rope.dimension_count", Some(MetaValue::U32(66))));
    assert!(
        e.contains("rope.dimension_sections") && e.contains("fill 66"),
        "{e}"
    );
}

#[test]
fn every_required_key_is_refused_by_name_when_missing() {
    for e in tiny().metadata.iter() {
        let Some(key) = e.key.as_str().strip_prefix("qwen4exp.") else {
            continue;
        };
        // Optional: the flags fall back to the interval, the interval to 4, the image id to
        // the end id.
        if matches!(
            key,
            "attention.recurrent_layers" | "full_attention_interval"
        ) {
            continue;
        }
        let view = with_key(key, None);
        // Without `ple.layers` the file has no table: its tensors are then extra, and load.
        if key == "ple.layers" {
            let m = Qwen4Exp::load(&view).unwrap();
            assert!(m.hparams().ple.is_none());
            continue;
        }
        let e = refusal(&view);
        assert!(e.contains(&format!("qwen4exp.{key}")), "{key}: {e}");
    }
}

#[test]
fn hostile_files_are_refused_by_name_not_by_panic() {
    for p in ["tiny", "tiny-mtp"] {
        let p = preset(p);
        let r = check_hostile(&p, ARCH, Qwen4Exp::load, 400, 47).unwrap();
        assert!(r.cases > 400, "{r:?}");
        // The loader alone: some hostile views load (a key nothing is sized by), none panics.
        let sweep = key_sweep(&p.file_view(DType::F32), ARCH);
        let loaded = sweep
            .iter()
            .filter(|(_, v)| Qwen4Exp::load(v).is_ok())
            .count();
        assert!(
            loaded > 0 && loaded < sweep.len(),
            "{loaded} of {}",
            sweep.len()
        );
    }
}

#[test]
fn the_trunk_graph_reads_the_gathered_table_rows_and_drafting_is_refused_by_name() {
    let m = Qwen4Exp::load(&tiny()).unwrap();
    let spec = m.spec();
    let ngram = spec.ngram.as_ref().into_option().unwrap();
    assert_eq!((ngram.n_ids(), ngram.end_id), (16, 270));
    // The table is the host's to gather from: no graph reads it.
    let table = spec
        .weights
        .iter()
        .position(|w| w.name.as_str() == crate::ple::TABLE)
        .unwrap();
    assert_eq!(spec.weights[table].class, WeightClass::NgramTable);
    let shape = |kind| BatchShape {
        n_rows: 3,
        n_outputs: 1,
        kind,
    };
    let g = m.build_graph(shape(GraphKind::Main)).into_result().unwrap();
    let input = |input| {
        g.tensors
            .iter()
            .filter(|t| t.source == TensorSource::Input { input })
            .map(|t| t.ne)
            .collect::<Vec<_>>()
    };
    assert_eq!(input(BatchInput::NgramEmbd), [[8, 16, 3, 1]]);
    assert!(input(BatchInput::NgramRows).is_empty());
    let weight = TensorSource::Weight {
        index: table as u32,
    };
    assert!(g.tensors.iter().all(|t| t.source != weight));
    let e = m
        .build_graph(shape(GraphKind::Mtp))
        .into_result()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("qwen4exp file holds no MTP (nextn) block"),
        "{e}"
    );
}

/// The extents of the tensors a node writes named `name` outside any layer (views left out).
fn named(g: &Graph, name: &str) -> Vec<[u64; 4]> {
    g.tensors
        .iter()
        .filter(|t| t.name.as_str() == name && t.layer == -1)
        .filter(|t| t.source == TensorSource::Intermediate)
        .map(|t| t.ne)
        .collect()
}

#[test]
fn the_draft_graph_reads_hc_wide_rows_and_both_graphs_name_them() {
    let shape = |kind| BatchShape {
        n_rows: 5,
        n_outputs: 2,
        kind,
    };
    let hidden = |g: &Graph| -> Vec<[u64; 4]> {
        g.tensors
            .iter()
            .filter(|t| {
                t.source
                    == TensorSource::Input {
                        input: BatchInput::Hidden,
                    }
            })
            .map(|t| t.ne)
            .collect()
    };
    let trunk = Qwen4Exp::load(&tiny()).unwrap();
    let g = trunk
        .build_graph(shape(GraphKind::Main))
        .into_result()
        .unwrap();
    assert_eq!(named(&g, NEXTN_HIDDEN), [[512, 2, 1, 1]]);
    assert_eq!(named(&g, FINAL_NORM), [[128, 2, 1, 1]]);
    assert!(hidden(&g).is_empty());
    let mtp = Qwen4Exp::load(&preset("tiny-mtp").file_view(DType::F32)).unwrap();
    let g = mtp
        .build_graph(shape(GraphKind::Mtp))
        .into_result()
        .unwrap();
    assert_eq!(hidden(&g), [[512, 5, 1, 1]]);
    assert_eq!(named(&g, NEXTN_HIDDEN), [[512, 2, 1, 1]]);
    assert_eq!(named(&g, FINAL_NORM), [[128, 2, 1, 1]]);
    let logits = g.outputs.iter().find(|o| o.name.as_str() == "logits");
    assert_eq!(
        g.tensors[logits.unwrap().tensor.0 as usize].ne,
        [272, 2, 1, 1]
    );
    // The block's layer is one QSA layer of index 8, its states the block's own.
    let layers: std::collections::BTreeSet<i32> = g.tensors.iter().map(|t| t.layer).collect();
    assert_eq!(layers.into_iter().collect::<Vec<_>>(), [-1, 8]);
    let e = mtp
        .build_graph(shape(GraphKind::Main))
        .into_result()
        .unwrap_err()
        .to_string();
    assert!(e.contains("MTP-only file"), "{e}");
}

/// The verify graph writes the row states of every per-sequence state: each GDN layer's
/// convolution and delta rule, and the n-gram table layer's dilated convolution.
#[test]
fn the_verify_graph_writes_every_per_sequence_states_rows() {
    let m = Qwen4Exp::load(&tiny()).unwrap();
    let shape = BatchShape {
        n_rows: 4,
        n_outputs: 4,
        kind: GraphKind::Verify,
    };
    let g = m.build_graph(shape).into_result().unwrap();
    let mut written: Vec<u32> = g
        .tensors
        .iter()
        .filter_map(|t| match t.source {
            TensorSource::RowStates { index } => Some(index),
            _ => None,
        })
        .collect();
    written.sort_unstable();
    let spec = m.spec();
    let per_sequence: Vec<u32> = (0..spec.state.len() as u32)
        .filter(|&i| {
            matches!(
                spec.state[i as usize].kind,
                StateKind::Conv | StateKind::Recurrent
            )
        })
        .collect();
    assert_eq!(written, per_sequence);
    assert!(spec
        .state
        .iter()
        .any(|s| s.name.as_str() == "ple_conv_state_l1"));
    let main = m
        .build_graph(BatchShape {
            kind: GraphKind::Main,
            ..shape
        })
        .into_result()
        .unwrap();
    assert!(!main
        .tensors
        .iter()
        .any(|t| matches!(t.source, TensorSource::RowStates { .. })));
}

/// `flash-mtp` is the MTP-only file of `flash`: the block after its 48 trunk layers, QSA with
/// 512 experts, and a draft graph reading the 10,240-wide residual (4 streams of 2,560).
#[test]
fn flash_mtp_is_the_mtp_file_of_flash() {
    let flash = Qwen4Exp::load(&preset("flash").file_view(DType::F32)).unwrap();
    let m = Qwen4Exp::load(&preset("flash-mtp").file_view(DType::F32)).unwrap();
    let (hp, trunk) = (m.hparams(), flash.hparams());
    assert_eq!((hp.lm.n_layer, hp.n_mtp, hp.mtp_only), (48, 1, true));
    assert_eq!(
        (hp.lm.n_embd, hp.lm.n_vocab, hp.experts.n_expert),
        (trunk.lm.n_embd, trunk.lm.n_vocab, 512)
    );
    assert_eq!(hp.kind(48), Some(LayerKind::Qsa));
    let g = m
        .build_graph(BatchShape {
            n_rows: 2,
            n_outputs: 1,
            kind: GraphKind::Mtp,
        })
        .into_result()
        .unwrap();
    let hidden = TensorSource::Input {
        input: BatchInput::Hidden,
    };
    let ne: Vec<[u64; 4]> = g
        .tensors
        .iter()
        .filter(|t| t.source == hidden)
        .map(|t| t.ne)
        .collect();
    assert_eq!(ne, [[10_240, 2, 1, 1]]);
}
