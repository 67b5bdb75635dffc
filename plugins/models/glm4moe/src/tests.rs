//! The plugin's loader on its presets and on files they are edited into: every preset loads with
//! exactly its declared weights, hostile keys end in named errors, the MTP layers are skipped
//! whether the file holds their weights or not, and each dialect's optional tensors and router
//! settings are read from the file.

use bloomery_plugin_api::graph::{BatchShape, GraphKind};
use bloomery_plugin_api::hostile::check_hostile;
use bloomery_plugin_api::meta::{MetaEntry, MetaValue, ModelFileView, TensorInfo};
use bloomery_plugin_api::model::{ModelInstance, SynthPreset};
use bloomery_plugin_api::op::Gating;
use bloomery_plugin_api::synth::check_presets;
use bloomery_plugin_api::{DType, PluginError};

use super::*;

fn preset(name: &str) -> SynthPreset {
    synth::presets()
        .into_iter()
        .find(|p| p.name.as_str() == name)
        .unwrap()
}

fn view(name: &str) -> ModelFileView {
    preset(name).file_view(DType::F32)
}

fn load(v: &ModelFileView) -> Result<KvModel<Glm4Moe>, PluginError> {
    KvModel::<Glm4Moe>::load(v)
}

fn set(v: &mut ModelFileView, key: &str, value: MetaValue) {
    let key = format!("{ARCH}.{key}");
    v.metadata.retain(|e| e.key.as_str() != key);
    v.metadata.push(MetaEntry::new(&key, value));
}

fn declared(m: &KvModel<Glm4Moe>) -> Vec<String> {
    m.spec()
        .weights
        .iter()
        .map(|w| w.name.to_string())
        .collect()
}

#[test]
fn every_preset_loads_with_its_declared_weights() {
    check_presets(&synth::presets(), KvModel::<Glm4Moe>::load).unwrap();
}

#[test]
fn hostile_keys_and_shapes_end_in_named_errors_never_in_a_panic() {
    for name in ["tiny", "tiny-solar"] {
        let r = check_hostile(&preset(name), ARCH, KvModel::<Glm4Moe>::load, 300, 0x5eed).unwrap();
        println!("{ARCH} {name}: {r:?}");
        assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
    }
}

#[test]
fn the_glm_dialect_reads_biases_qk_norm_partial_rotary_dense_lead_and_scale() {
    let m = load(&view("tiny")).unwrap();
    let hp = &m.hp;
    assert_eq!((hp.lm.n_layer, hp.n_mtp, hp.n_dense_lead), (4, 1, 1));
    assert_eq!(m.spec().caps.n_mtp_layers, 1);
    assert_eq!(m.rope.n_dims, 32, "rope.dimension_count of a 64-wide head");
    let r = hp.router;
    assert_eq!(
        (r.gating, r.bias, r.norm, r.scale),
        (Gating::Sigmoid, true, true, 2.5)
    );
    let names = declared(&m);
    for t in [
        "blk.1.attn_q.bias",
        "blk.3.attn_v.bias",
        "blk.2.attn_k_norm.weight",
    ] {
        assert!(names.iter().any(|n| n == t), "{t} declared");
    }
    assert!(names.iter().any(|n| n == "blk.0.ffn_down.weight"));
    assert!(!names.iter().any(|n| n.starts_with("blk.0.ffn_gate_inp")));
    assert!(names.iter().any(|n| n == "blk.1.exp_probs_b.bias"));
    assert!(
        !names.iter().any(|n| n.starts_with("blk.4.")),
        "MTP layer declared"
    );
}

#[test]
fn the_solar_dialect_has_no_biases_or_qk_norm_and_rotates_what_the_file_says() {
    let mut v = view("tiny-solar");
    let m = load(&v).unwrap();
    assert_eq!((m.hp.n_dense_lead, m.hp.n_mtp, m.rope.n_dims), (0, 0, 64));
    assert_eq!(m.hp.router.scale, 1.0);
    let names = declared(&m);
    assert!(!names
        .iter()
        .any(|n| n.contains(".bias") && !n.contains("exp_probs_b")));
    assert!(!names
        .iter()
        .any(|n| n.contains("attn_q_norm") || n.contains("attn_k_norm")));
    // A converter run without `partial_rotary_factor` writes half the head: followed, as
    // llama.cpp follows it.
    set(&mut v, "rope.dimension_count", MetaValue::U32(32));
    assert_eq!(load(&v).unwrap().rope.n_dims, 32);
}

/// The tensors of an MTP layer `blk.{il}.*` as the converter writes them for a GLM file.
fn mtp_tensors(il: u32, e: u64, v: &ModelFileView) -> Vec<TensorInfo> {
    let like = |suffix: &str| {
        let t = v.first_layer_tensor(suffix).unwrap();
        TensorInfo {
            name: format!("blk.{il}.{suffix}").into(),
            ..t.clone()
        }
    };
    let mut out: Vec<TensorInfo> = ["attn_norm.weight", "attn_q.weight", "ffn_gate_inp.weight"]
        .into_iter()
        .map(like)
        .collect();
    out.push(TensorInfo {
        name: format!("blk.{il}.nextn.eh_proj.weight").into(),
        dtype: DType::F32,
        n_dims: 2,
        ne: [2 * e, e, 1, 1],
    });
    out
}

#[test]
fn mtp_layers_are_skipped_whether_or_not_the_file_holds_them() {
    let trunk_only = view("tiny");
    let mut with_mtp = trunk_only.clone();
    let extra = mtp_tensors(4, 256, &trunk_only);
    with_mtp.tensors.extend(extra);
    for v in [&trunk_only, &with_mtp] {
        let m = load(v).unwrap();
        assert_eq!(m.hp.lm.n_layer, 4);
        assert!(!declared(&m).iter().any(|n| n.starts_with("blk.4.")));
        let shape = BatchShape {
            n_rows: 3,
            n_outputs: 1,
            kind: GraphKind::Main,
        };
        let g = m.build_graph(shape).into_result().unwrap();
        assert!(!g.nodes.is_empty());
    }
    let mut all_mtp = trunk_only.clone();
    set(&mut all_mtp, "nextn_predict_layers", MetaValue::U32(5));
    let e = load(&all_mtp).err().unwrap().to_string();
    assert!(e.contains("glm4moe.nextn_predict_layers"), "{e}");
}

#[test]
fn missing_and_contradicted_keys_are_named() {
    let mut v = view("tiny");
    v.metadata
        .retain(|e| e.key.as_str() != "glm4moe.expert_shared_count");
    let e = load(&v).err().unwrap().to_string();
    assert!(e.contains("glm4moe.expert_shared_count"), "{e}");

    let mut v = view("tiny");
    set(&mut v, "expert_shared_count", MetaValue::U32(2));
    let e = load(&v).err().unwrap().to_string();
    assert!(
        e.contains("glm4moe.expert_shared_count") && e.contains("ffn_down_shexp"),
        "{e}"
    );

    let mut v = view("tiny");
    set(&mut v, "leading_dense_block_count", MetaValue::U32(4));
    let e = load(&v).err().unwrap().to_string();
    assert!(e.contains("glm4moe.leading_dense_block_count"), "{e}");

    let mut v = view("tiny");
    set(&mut v, "expert_gating_func", MetaValue::U32(7));
    let e = load(&v).err().unwrap().to_string();
    assert!(e.contains("glm4moe.expert_gating_func"), "{e}");

    let mut v = view("tiny");
    let sections = MetaValue::Array([8u32, 12, 12, 0].map(MetaValue::U32).to_vec().into());
    set(&mut v, "rope.dimension_sections", sections);
    let e = load(&v).err().unwrap().to_string();
    assert!(e.contains("glm4moe.rope.dimension_sections"), "{e}");
}

#[test]
fn a_file_without_the_optional_router_keys_routes_as_llama_cpp_does() {
    let mut v = view("tiny-solar");
    v.metadata.retain(|e| {
        !matches!(
            e.key.as_str(),
            "glm4moe.expert_gating_func"
                | "glm4moe.expert_weights_norm"
                | "glm4moe.expert_weights_scale"
        )
    });
    let r = load(&v).unwrap().hp.router;
    // No gating key: sigmoid; no norm key: the chosen weights are not renormalised.
    assert_eq!((r.gating, r.norm, r.scale), (Gating::Sigmoid, false, 1.0));
}
