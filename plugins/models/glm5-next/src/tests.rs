//! The plugin's own tests: presets against the loader, layer kinds, refusals by name, hostile
//! files, the graphs' shapes.

use super::*;
use bloomery_plugin_api::hostile::check_hostile;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::check_presets;
use bloomery_plugin_api::DType;

fn tiny() -> SynthPreset {
    synth::presets()
        .into_iter()
        .find(|p| p.name.as_str() == "tiny")
        .unwrap()
}

#[test]
fn every_preset_loads_with_its_declared_weights() {
    check_presets(&synth::presets(), Glm5Next::load).unwrap();
}

#[test]
fn hostile_keys_and_shapes_end_in_named_errors_never_in_a_panic() {
    let r = check_hostile(&tiny(), ARCH, Glm5Next::load, 300, 0x5eed).unwrap();
    println!("{r:?}");
    assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
    let _ = DType::F32;
}
