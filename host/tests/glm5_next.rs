//! GLM-5.3 (`glm5-next`) through the host: the real-width preset cut to the speed depth
//! (too big to write here) keeps its NextN layer and loads in the plugin.

mod common;

use common::plugin_dir;

use bloomery_devices::Registry;
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::DType;

/// `synth --arch glm5-next --preset flash --layers 12` (issue 46's speed file): GLM-5.3-Flash's
/// widths, layers 0–2 dense, MLA at 3, 7 and 11, the rest KDA, 288 experts a layer, and the NextN
/// layer after them, renumbered 12.
#[test]
fn the_flash_preset_cut_to_12_layers_keeps_its_nextn_layer() {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let plugin = reg.model_for("glm5-next").unwrap();
    let presets = plugin.module.synth_presets()();
    let full = presets.iter().find(|p| p.name.as_str() == "flash").unwrap();
    let p = bloomery::synth::depth::first_layers(full, 12).unwrap();
    let meta = |k: &str| {
        let e = p.metadata.iter().find(|e| e.key.as_str() == k);
        e.unwrap_or_else(|| panic!("no {k}")).value.clone()
    };
    assert_eq!(meta("glm5-next.block_count").as_u64(), Some(13));
    assert_eq!(meta("glm5-next.nextn_predict_layers").as_u64(), Some(1));
    let kv: Vec<u64> = match meta("glm5-next.attention.head_count_kv") {
        MetaValue::Array(v) => v.iter().map(|x| x.as_u64().unwrap()).collect(),
        v => panic!("head_count_kv {v:?}"),
    };
    assert_eq!(kv, [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1]);
    match meta("glm5-next.swiglu_clamp_exp") {
        MetaValue::Array(v) => assert_eq!(v.len(), 13),
        v => panic!("swiglu_clamp_exp {v:?}"),
    }
    let has = |il: u32, t: &str| {
        let name = format!("blk.{il}.{t}.weight");
        p.tensors.iter().any(|x| x.name.as_str() == name)
    };
    for il in 0..12 {
        let mla = il % 4 == 3;
        assert_eq!(has(il, "attn_kv_a_mqa"), mla, "layer {il}");
        assert_eq!(has(il, "indexer.attn_k"), mla, "layer {il}");
        assert_eq!(has(il, "ssm_f_a"), !mla, "layer {il}");
        assert_eq!(has(il, "ffn_gate"), il < 3, "layer {il}");
        assert_eq!(has(il, "ffn_gate_exps"), il >= 3, "layer {il}");
        assert!(has(il, "hc_attn_fn"), "layer {il}");
    }
    for t in [
        "nextn.eh_proj",
        "attn_kv_a_mqa",
        "indexer.attn_k",
        "ffn_gate_exps",
    ] {
        assert!(has(12, t), "{t}");
    }
    assert!(!has(12, "hc_attn_fn"));
    assert!(!p.tensors.iter().any(|x| x.name.starts_with("blk.13.")));
    let gate = p
        .tensors
        .iter()
        .find(|x| x.name.as_str() == "blk.3.ffn_gate_exps.weight");
    assert_eq!(gate.unwrap().ne, [4096, 2048, 288, 1]);
    // The plugin reads the cut file as 12 trunk layers and the NextN layer.
    let m = plugin.module.load()(&p.file_view(DType::F32))
        .into_result()
        .unwrap();
    let spec = m.spec();
    assert_eq!((spec.hparams.n_layer, spec.caps.n_mtp_layers), (12, 1));
    assert!(spec
        .weights
        .iter()
        .any(|w| w.name.as_str() == "blk.12.nextn.eh_proj.weight"));
}
