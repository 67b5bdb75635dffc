//! The plugin's own tests: presets against the loader, hostile files, refusals by name.

use super::*;
use bloomery_plugin_api::hostile::check_hostile;
use bloomery_plugin_api::meta::{MetaEntry, MetaValue};
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::check_presets;
use bloomery_plugin_api::DType;

fn tiny(arch: &str) -> SynthPreset {
    synth::presets()
        .into_iter()
        .find(|p| p.name.as_str() == "tiny" && p.file_view(DType::F32).architecture() == Ok(arch))
        .unwrap()
}

/// The tiny file's view with `key` (under the architecture) set to `value`, or removed.
fn with_key(arch: &str, key: &str, value: Option<MetaValue>) -> ModelFileView {
    let mut view = tiny(arch).file_view(DType::F32);
    let full = format!("{arch}.{key}");
    let mut meta: Vec<MetaEntry> = view
        .metadata
        .into_iter()
        .filter(|e| e.key.as_str() != full)
        .collect();
    if let Some(v) = value {
        meta.push(MetaEntry::new(&full, v));
    }
    view.metadata = meta.into();
    view
}

fn refusal(view: &ModelFileView) -> String {
    match KdaHybrid::load(view) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_preset_loads_with_its_declared_weights() {
    check_presets(&synth::presets(), KdaHybrid::load).unwrap();
}

#[test]
fn layers_alternate_gqa_and_kda_as_head_count_kv_says() {
    let m = KdaHybrid::load(&tiny(ARCH_SOLAR).file_view(DType::F32)).unwrap();
    let kda: Vec<bool> = (0..8).map(|il| m.hp.is_kda(il)).collect();
    assert_eq!(kda, [false, true, true, true, false, true, true, true]);
    assert_eq!(m.hp.kda.beta_scale, 2.0);
    assert!(m.hp.route.bias && m.hp.route.norm && m.hp.route.scale == 1.0);
    let kimi = KdaHybrid::load(&tiny(ARCH_KIMI).file_view(DType::F32)).unwrap();
    assert_eq!(kimi.hp.kda.beta_scale, 1.0);
    assert_eq!(kimi.hp.n_dense_lead, 1);
}

#[test]
fn every_solar_key_is_required_by_name() {
    for key in [
        "expert_weights_norm",
        "rope.freq_base",
        "kda.head_dim",
        "vocab_size",
    ] {
        let e = refusal(&with_key(ARCH_SOLAR, key, None));
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn variants_not_built_are_refused_by_name() {
    let e = refusal(&with_key(
        ARCH_SOLAR,
        "kda.use_full_proj",
        Some(MetaValue::Bool(true)),
    ));
    assert!(e.contains("kda_use_full_proj"), "{e}");
    let e = refusal(&with_key(
        ARCH_SOLAR,
        "rope.dimension_count",
        Some(MetaValue::U32(64)),
    ));
    assert!(e.contains("NoPE"), "{e}");
    let e = refusal(&with_key(
        ARCH_SOLAR,
        "expert_gating_func",
        Some(MetaValue::U32(1)),
    ));
    assert!(e.contains("expert_gating_func"), "{e}");
    let mla =
        MetaValue::Array(vec![MetaValue::U32(0), MetaValue::U32(1), MetaValue::U32(0)].into());
    let e = refusal(&with_key(ARCH_KIMI, "attention.head_count_kv", Some(mla)));
    assert!(e.contains("MLA") && e.contains("layer 1"), "{e}");
    let bound = Some(MetaValue::F32(5.0));
    let e = refusal(&with_key(ARCH_KIMI, "kda.gate_lower_bound", bound));
    assert!(e.contains("gate_lower_bound"), "{e}");
}

#[test]
fn hostile_keys_and_shapes_end_in_named_errors_never_in_a_panic() {
    for arch in [ARCH_SOLAR, ARCH_KIMI] {
        let r = check_hostile(&tiny(arch), arch, KdaHybrid::load, 300, 0x5eed).unwrap();
        println!("{arch}: {r:?}");
        assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
    }
}
