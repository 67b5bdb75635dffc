//! The plugin's own tests: presets against the loader, the per-layer layout and state, refusals
//! by name (every required key, the ratios and indexer widths llama.cpp b11434 cannot run),
//! hostile files, and the graph's refusal.

use super::*;
use bloomery_plugin_api::graph::GraphKind;
use bloomery_plugin_api::hostile::{check_hostile, key_sweep};
use bloomery_plugin_api::meta::{MetaValue, TensorInfo};
use bloomery_plugin_api::model::{StateKind, SynthPreset, WeightClass};
use bloomery_plugin_api::synth::check_presets;
use bloomery_plugin_api::DType;

use crate::layers::Ratio;

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
    match Deepseek4::load(view) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

fn i32s(v: &[i32]) -> Option<MetaValue> {
    Some(MetaValue::Array(
        v.iter().map(|&x| MetaValue::I32(x)).collect(),
    ))
}

fn u32(v: u32) -> Option<MetaValue> {
    Some(MetaValue::U32(v))
}

/// `view` without the tensors whose names end in `suffix`.
fn without(mut view: ModelFileView, suffix: &str) -> ModelFileView {
    let kept: Vec<TensorInfo> = view
        .tensors
        .into_iter()
        .filter(|t| !t.name.as_str().ends_with(suffix))
        .collect();
    view.tensors = kept.into();
    view
}

#[test]
fn every_preset_loads_with_its_declared_weights() {
    check_presets(&synth::presets(), Deepseek4::load).unwrap();
}

#[test]
fn tiny_layers_follow_the_ratios_and_the_hash_layer_count() {
    let m = Deepseek4::load(&tiny()).unwrap();
    let hp = m.hparams();
    let (w, f, h) = (Ratio::Window, Ratio::Four, Ratio::OneTwentyEight);
    assert_eq!(hp.ratios, [w, w, f, h, f, h]);
    assert_eq!((hp.lm.n_layer, hp.n_hash, hp.n_ff_shexp), (6, 3, 32));
    assert_eq!(
        (hp.attn.head_dim, hp.attn.q_lora, hp.attn.window),
        (128, 32, 128)
    );
    assert_eq!(
        (hp.indexer.n_head, hp.indexer.head_dim, hp.indexer.top_k),
        (16, 64, 8)
    );
    assert_eq!((hp.rope.offset, hp.rope.indexer_offset), (112, 48));
    assert_eq!(hp.rope.window.freq_base, 1e4);
    assert_eq!(
        (hp.rope.window.ext_factor, hp.rope.window.freq_scale),
        (0.0, 1.0)
    );
    let c = hp.rope.compressed;
    assert_eq!(
        (c.freq_base, c.freq_scale, c.ext_factor),
        (160_000.0, 1.0 / 16.0, 1.0)
    );
    assert!((c.attn_factor - 1.0 / (1.0 + 0.1 * 16f32.ln())).abs() < 1e-7);
    assert_eq!((hp.route.scale, hp.route.norm, hp.route.k), (1.5, true, 6));
    assert_eq!(hp.clamp_exp, [2.0; 6]);
    let spec = m.spec();
    let class = |name: &str| {
        let d = spec.weights.iter().find(|w| w.name.as_str() == name);
        d.map(|d| d.class)
    };
    for il in 0..6u32 {
        let has = |t: &str| class(&format!("blk.{il}.{t}")).is_some();
        let r = hp.ratios[il as usize];
        assert_eq!(has("attn_compressor_kv.weight"), r != w, "layer {il}");
        assert_eq!(has("indexer.proj.weight"), r == f, "layer {il}");
        assert_eq!(has("indexer_compressor_ape.weight"), r == f, "layer {il}");
        assert_eq!(has("ffn_gate_tid2eid.weight"), il < 3, "layer {il}");
        assert_eq!(has("exp_probs_b.bias"), il >= 3, "layer {il}");
        assert!(has("hc_ffn_scale.weight") && has("attn_output_a.weight"));
    }
    assert_eq!(
        class("blk.0.ffn_gate_tid2eid.weight"),
        Some(WeightClass::Index)
    );
    assert!(class("output_hc_fn.weight").is_some() && class("output.weight").is_some());
    // Compressor widths: two series on ratio 4, one on ratio 128.
    let p = preset("tiny");
    let ne = |name: &str| {
        p.tensors
            .iter()
            .find(|t| t.name.as_str() == name)
            .unwrap()
            .ne
    };
    assert_eq!(ne("blk.2.attn_compressor_kv.weight"), [64, 256, 1, 1]);
    assert_eq!(ne("blk.3.attn_compressor_kv.weight"), [64, 128, 1, 1]);
    assert_eq!(ne("blk.3.attn_compressor_ape.weight"), [128, 128, 1, 1]);
    assert_eq!(ne("blk.2.ffn_gate_tid2eid.weight"), [6, 320, 1, 1]);
    assert_eq!(ne("blk.0.attn_output_a.weight"), [256, 64, 1, 1]);
}

#[test]
fn state_follows_the_ratios() {
    let m = Deepseek4::load(&tiny()).unwrap();
    let spec = m.spec();
    let find = |name: &str| spec.state.iter().find(|s| s.name.as_str() == name).cloned();
    for il in 0..6 {
        let ring = find(&format!("cache_ring_l{il}")).unwrap();
        assert_eq!(
            (ring.kind, ring.row_elems, ring.window, ring.block),
            (StateKind::Latent, 128, 128, 1)
        );
    }
    let comp = |il: u32| {
        let raw = find(&format!("cache_comp_raw_l{il}")).map(|s| (s.row_elems, s.block));
        let rows = find(&format!("cache_comp_l{il}")).map(|s| (s.row_elems, s.block));
        (raw, rows)
    };
    assert_eq!(comp(0), (None, None));
    assert_eq!(comp(2), (Some((2 * 2 * 128, 1)), Some((128, 4))));
    assert_eq!(comp(3), (Some((2 * 128, 1)), Some((128, 128))));
    let index = find("cache_index_l4").unwrap();
    assert_eq!(
        (index.kind, index.row_elems, index.block),
        (StateKind::PooledKeys, 64, 4)
    );
    assert_eq!(find("cache_index_raw_l4").unwrap().row_elems, 2 * 2 * 64);
    assert!(find("cache_index_l3").is_none());
    assert_eq!(spec.state.len(), 6 + 4 * 2 + 2 * 2);
    let s = m.layer_state(2).unwrap();
    assert!(s.compressor.is_some() && s.indexer.is_some());
}

/// The keys llama.cpp b11434 reads for `deepseek4` without a default, and those whose default
/// would change the model.
const REQUIRED: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.q_lora_rank",
    "attention.sliding_window",
    "attention.output_group_count",
    "attention.output_lora_rank",
    "attention.compress_ratios",
    "attention.compress_rope_freq_base",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
    "attention.indexer.top_k",
    "rope.dimension_count",
    "rope.freq_base",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_count",
    "expert_weights_scale",
    "expert_weights_norm",
    "expert_gating_func",
    "swiglu_clamp_exp",
    "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations",
    "hyper_connection.epsilon",
    "hash_layer_count",
];

#[test]
fn every_required_key_is_refused_by_name_when_missing() {
    for key in REQUIRED {
        let e = refusal(&with_key(key, None));
        assert!(e.contains(&format!("{ARCH}.{key}")), "{key}: {e}");
    }
}

#[test]
fn ratios_llama_cpp_refuses_are_refused_by_name() {
    for bad in [1, 2, 8, 64, 256] {
        let e = refusal(&with_key(
            "attention.compress_ratios",
            i32s(&[0, 0, 4, bad, 4, 128]),
        ));
        assert!(
            e.contains("deepseek4.attention.compress_ratios")
                && e.contains(&format!("layer 3: ratio {bad}"))
                && e.contains("0, 4 and 128"),
            "{e}"
        );
    }
    let e = refusal(&with_key("attention.compress_ratios", i32s(&[0, 0, 4])));
    assert!(e.contains("3 values for 6 layers"), "{e}");
    // Longer than block_count: llama.cpp reads the first block_count values.
    let long = with_key(
        "attention.compress_ratios",
        i32s(&[0, 0, 4, 128, 4, 128, 7]),
    );
    assert!(Deepseek4::load(&long).is_ok());
}

#[test]
fn indexer_widths_llama_cpp_crashes_on_are_refused_by_name() {
    // The tensors that carry the width go, so that the value itself is judged.
    let view = without(tiny(), "indexer_compressor_norm.weight");
    let key = "attention.indexer.key_length";
    let e = refusal(&set(view.clone(), key, u32(96)));
    assert!(e.contains(key) && e.contains("multiple of 64"), "{e}");
    let e = refusal(&set(view, key, u32(128)));
    assert!(e.contains(key) && e.contains("SIGFPE"), "{e}");
}

#[test]
fn variants_not_built_and_contradictions_are_refused_by_name() {
    let cases: Vec<(&str, Option<MetaValue>, &str)> = vec![
        ("expert_gating_func", u32(2), "sqrtsoftplus"),
        ("expert_group_count", u32(4), "groups"),
        ("hyper_connection.count", u32(8), "only 4"),
        ("hyper_connection.sinkhorn_iterations", u32(0), "1 to 1000"),
        ("attention.head_count_kv", u32(2), "one latent row"),
        ("attention.value_length", u32(64), "equals key_length"),
        ("attention.output_group_count", u32(3), "do not divide"),
        ("embedding_length_out", u32(64), "4 streams of 64"),
        ("vocab_size", u32(321), "320 rows"),
        ("rope.dimension_count", u32(80), "indexer head 64"),
        ("rope.freq_base", Some(MetaValue::F32(0.5)), "θ > 1"),
        (
            "expert_weights_scale",
            Some(MetaValue::F32(-1.0)),
            "positive",
        ),
        (
            "swiglu_clamp_exp",
            Some(MetaValue::Array(vec![].into())),
            "0 values",
        ),
        (
            "rope.scaling.type",
            Some(MetaValue::String("longrope".into())),
            "longrope",
        ),
    ];
    for (key, value, why) in cases {
        let e = refusal(&with_key(key, value));
        assert!(
            e.contains(&format!("{ARCH}.{key}")) && e.contains(why),
            "{key}: {e}"
        );
    }
    // An MTP block in the file is refused; a count without its tensors is ignored, as in
    // llama.cpp.
    let mut view = with_key("nextn_predict_layers", u32(1));
    assert!(Deepseek4::load(&view).is_ok());
    let mut tensors = view.tensors.to_vec();
    tensors.push(TensorInfo {
        name: "blk.5.nextn.eh_proj.weight".into(),
        dtype: DType::F32,
        n_dims: 2,
        ne: [128, 64, 1, 1],
    });
    view.tensors = tensors.into();
    let e = refusal(&view);
    assert!(
        e.contains("nextn_predict_layers") && e.contains("MTP"),
        "{e}"
    );
}

#[test]
fn the_hash_table_must_be_i32_and_no_other_tensor_may_be() {
    let retype = |name: &str, dtype: DType| {
        let mut view = tiny();
        let mut tensors = view.tensors.to_vec();
        tensors
            .iter_mut()
            .filter(|t| t.name.as_str() == name)
            .for_each(|t| t.dtype = dtype);
        view.tensors = tensors.into();
        refusal(&view)
    };
    let e = retype("blk.1.ffn_gate_tid2eid.weight", DType::F32);
    assert!(
        e.contains("blk.1.ffn_gate_tid2eid.weight") && e.contains("I32"),
        "{e}"
    );
    let e = retype("blk.1.ffn_gate_inp.weight", DType::I32);
    assert!(
        e.contains("blk.1.ffn_gate_inp.weight") && e.contains("I32"),
        "{e}"
    );
    let e = retype("blk.1.hc_attn_base.weight", DType::F16);
    assert!(
        e.contains("blk.1.hc_attn_base.weight") && e.contains("F32"),
        "{e}"
    );
}

/// The main graph builds over ABI 13's ops (one Compress per compressor, one CompSelect and a
/// two-source Attention per ratio-4 layer, an i32 gather per hash layer); the MTP graph is
/// refused by name.
#[test]
fn the_main_graph_builds_and_the_mtp_graph_is_refused_by_name() {
    use bloomery_plugin_api::op::{Op, OpKind};
    let m = Deepseek4::load(&tiny()).unwrap();
    let shape = |kind| BatchShape {
        n_rows: 4,
        n_outputs: 1,
        kind,
    };
    let g = m.build_graph(shape(GraphKind::Main)).into_result().unwrap();
    let count = |k: OpKind| g.nodes.iter().filter(|n| n.op.kind() == k).count();
    let hp = m.hparams();
    let n_four = hp.ratios.iter().filter(|&&r| r == Ratio::Four).count();
    let n_comp = hp.ratios.iter().filter(|&&r| r != Ratio::Window).count();
    assert_eq!(count(OpKind::Compress), n_comp + n_four);
    assert_eq!(count(OpKind::CompSelect), n_four);
    let comp_attn = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Attention(p) if p.comp > 0))
        .count();
    assert_eq!(comp_attn, n_comp);
    let e = m
        .build_graph(shape(GraphKind::Mtp))
        .into_result()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("deepseek4") && e.contains("Mtp"), "{e}");
}

#[test]
fn hostile_files_are_refused_by_name_not_by_panic() {
    let p = preset("tiny");
    let r = check_hostile(&p, ARCH, Deepseek4::load, 400, 49).unwrap();
    assert!(r.cases > 400, "{r:?}");
    let sweep = key_sweep(&p.file_view(DType::F32), ARCH);
    let loaded = sweep
        .iter()
        .filter(|(_, v)| Deepseek4::load(v).is_ok())
        .count();
    assert!(
        loaded > 0 && loaded < sweep.len(),
        "{loaded} of {}",
        sweep.len()
    );
}
