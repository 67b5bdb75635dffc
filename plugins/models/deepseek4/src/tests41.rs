//! Tests of the `deepseek41` loader: the tiny preset's layout (sources, Engram sites, the n-gram
//! spec), refusals by name (every Engram key, a table shorter than its offsets, counts that
//! disagree, ratios and sources V4.1 has not, the candidate keys), hostile files, and the
//! graph.

use super::*;
use bloomery_plugin_api::hostile::check_hostile;
use bloomery_plugin_api::meta::{MetaValue, TensorInfo};
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::DType;

use crate::layers::Ratio;

fn preset() -> SynthPreset {
    synth41::tiny()
}

fn tiny() -> ModelFileView {
    preset().file_view(DType::F32)
}

/// `view` with `deepseek41.{key}` set to `value`, or removed.
fn set(view: ModelFileView, key: &str, value: Option<MetaValue>) -> ModelFileView {
    view.with_entry(&format!("{ARCH41}.{key}"), value)
}

/// `view` with its tensors changed by `f`.
fn tensors(mut view: ModelFileView, f: impl FnOnce(&mut Vec<TensorInfo>)) -> ModelFileView {
    let mut t = view.tensors.to_vec();
    f(&mut t);
    view.tensors = t.into();
    view
}

/// `view` without the tensors named `names`.
fn without(view: ModelFileView, names: &[&str]) -> ModelFileView {
    tensors(view, |t| t.retain(|t| !names.contains(&t.name.as_str())))
}

fn refusal(view: &ModelFileView) -> String {
    match Deepseek4::load(view) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

fn u64s(v: &[u64]) -> Option<MetaValue> {
    Some(MetaValue::Array(
        v.iter().map(|&x| MetaValue::U64(x)).collect(),
    ))
}

#[test]
fn tiny_loads_with_the_seed_map_sources_and_engram_sites() {
    let m = Deepseek4::load(&tiny()).unwrap();
    let hp = m.hparams();
    let (w, two, one) = (Ratio::Window, Ratio::Two, Ratio::One);
    assert_eq!(hp.ratios, [w, w, two, two, two, one, one, one, one]);
    assert_eq!((hp.n_hash, hp.lm.eps), (0, 1e-20));
    let v = hp.v41.as_ref().unwrap();
    let n = None;
    assert_eq!(
        v.comp_source,
        [
            n,
            n,
            Some(2),
            Some(2),
            Some(4),
            Some(5),
            Some(5),
            Some(5),
            Some(5)
        ]
    );
    assert_eq!(
        v.index_source,
        [
            n,
            n,
            Some(2),
            Some(2),
            Some(4),
            Some(5),
            Some(5),
            Some(7),
            Some(7)
        ]
    );
    let e = &v.engram;
    assert_eq!(
        (e.layers.as_slice(), e.ngram_size, e.heads),
        (&[1, 4][..], 4, 2)
    );
    assert_eq!(
        (e.row_width, e.pad_id, e.rows.as_slice()),
        (16, 7, &[252, 410][..])
    );
    assert_eq!(e.offsets[6..], [0, 59, 120, 187, 258, 331]);
    let spec = m.spec();
    assert_eq!(spec.architecture.as_str(), ARCH41);
    let ngram = spec.ngram.clone().into_option().unwrap();
    assert_eq!(
        (ngram.tables, ngram.n_ids(), ngram.cut_at_end),
        (2, 12, false)
    );
    let has = |name: &str| spec.weights.iter().any(|w| w.name.as_str() == name);
    for il in 0..9u32 {
        let t = |s: &str| has(&format!("blk.{il}.{s}"));
        let source = [2, 4, 5].contains(&il);
        assert_eq!(t("attn_compressor_kv.weight"), source, "{il}");
        // No score projection at ratio 1 (layer 5), no position bias at all.
        assert_eq!(t("attn_compressor_gate.weight"), [2, 4].contains(&il));
        assert!(!t("attn_compressor_ape.weight"));
        assert_eq!(
            t("indexer.attn_k.weight") && t("indexer.k_norm.weight"),
            source
        );
        assert_eq!(t("indexer.attn_q_b.weight"), [2, 4, 5, 7].contains(&il));
        assert_eq!(t("engram_wkv.weight"), [1, 4].contains(&il));
        assert_eq!(
            t("engram_q.weight") && t("engram_k.weight"),
            [1, 4].contains(&il)
        );
        assert!(!t("indexer_compressor_kv.weight") && !t("ffn_gate_tid2eid.weight"));
        assert!(t("exp_probs_b.bias") && t("hc_ffn_fn.weight"));
    }
    assert!(!has("output_hc_fn.weight") && has("output.weight"));
    // Row ids of each site land in that site's own heads' ranges.
    let mut ids = Vec::new();
    ngram.extend_rows(&[], &[5, 300, 7, 7, 1], &mut ids);
    for (i, &id) in ids.iter().enumerate() {
        let k = i % 12;
        let (o, p) = (ngram.head_offsets[k], ngram.head_sizes[k]);
        assert!((o..o + p).contains(&(id as u64)), "id {i}: {id}");
    }
    // State: compressed rows on the three compressor sources only.
    let comp: Vec<u32> = (0..9)
        .filter(|&il| m.layer_state(il).unwrap().compressor.is_some())
        .collect();
    assert_eq!(comp, [2, 4, 5]);
}

/// The graph builds; its draft (non-main) graph is refused by name, and its compressor
/// sources store their index keys (`Compress` in its `Store` form) while the layers between read
/// the picks of the last index layer (one `CompSelect` per index layer: 2, 4, 5, 7).
#[test]
fn the_deepseek41_graph_builds_with_one_selection_per_index_layer() {
    let m = Deepseek4::load(&tiny()).unwrap();
    let shape = |kind| BatchShape {
        n_rows: 4,
        n_outputs: 1,
        kind,
    };
    let g = m
        .build_graph(shape(bloomery_plugin_api::graph::GraphKind::Main))
        .into_result()
        .unwrap();
    let layers_of = |name: &str| -> Vec<i32> {
        g.nodes
            .iter()
            .map(|n| &g.tensors[n.dst.0 as usize])
            .filter(|t| t.name.as_str() == name)
            .map(|t| t.layer)
            .collect()
    };
    assert_eq!(layers_of("indexer_sel_idx"), [2, 4, 5, 7]);
    assert_eq!(layers_of("cache_comp_plain"), [2, 4, 5]);
    assert_eq!(layers_of("engram_out"), [1, 4]);
    let e = m
        .build_graph(shape(bloomery_plugin_api::graph::GraphKind::Mtp))
        .into_result()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("deepseek41"), "{e}");
}

#[test]
fn every_engram_key_is_refused_by_name_when_missing() {
    // The plan's list (docs/deepseek41-plan.md, "GGUF keys"), not the loader's own.
    let keys = [
        "engram.head_count",
        "engram.max_ngram_size",
        "engram.key_length",
        "engram.multipliers",
        "engram.primes",
        "engram.offsets",
        "engram.token_map",
        "engram.pad_id",
    ];
    for key in keys {
        let e = refusal(&set(tiny(), key, None));
        assert!(
            e.contains(&format!("{ARCH41}.{key}")) && e.contains("missing"),
            "{key}: {e}"
        );
    }
}

#[test]
fn a_table_shorter_than_its_offsets_is_refused_by_name() {
    // The last head of site 1 ends at row 410, the table's length: one row less is refused.
    let short = tensors(tiny(), |t| {
        let t = t
            .iter_mut()
            .find(|t| t.name.as_str() == "blk.4.engram_embd.weight")
            .unwrap();
        t.ne[1] -= 1;
    });
    let e = refusal(&short);
    assert!(
        e.contains("deepseek41.engram.offsets")
            && e.contains("layer 4: head 5")
            && e.contains("blk.4.engram_embd.weight")
            && e.contains("409 rows"),
        "{e}"
    );
    // An offset moved past the table's end, the table as it was.
    let mut offsets: Vec<u64> = [0, 31, 68, 109, 152, 199, 0, 59, 120, 187, 258, 331].into();
    offsets[2] = 300;
    let e = refusal(&set(tiny(), "engram.offsets", u64s(&offsets)));
    assert!(
        e.contains("layer 1: head 2") && e.contains("252 rows"),
        "{e}"
    );
}

#[test]
fn engram_counts_and_sites_that_disagree_are_refused_by_name() {
    let cases: Vec<(&str, Option<MetaValue>, &str)> = vec![
        ("engram.primes", u64s(&[31; 11]), "11 values, 12 expected"),
        ("engram.multipliers", u64s(&[3; 9]), "9 values, 8 expected"),
        (
            "engram.token_map",
            u64s(&[1; 319]),
            "319 values, 320 expected",
        ),
        ("engram.max_ngram_size", Some(MetaValue::U32(9)), "2 to 8"),
        ("engram.key_length", Some(MetaValue::U32(8)), "engram_embd"),
        (
            "engram.layer_ids",
            Some(MetaValue::Array(vec![MetaValue::U32(1)].into())),
            "[1, 4]",
        ),
        (
            "engram.multipliers",
            u64s(&[1 << 62, 3, 5, 7, 9, 11, 13, 15]),
            "int64",
        ),
        ("engram.rows", u64s(&[252, 409]), "have [252, 410] rows"),
        (
            "engram.compressed_vocab_size",
            Some(MetaValue::U32(210)),
            "holds the id 210",
        ),
        (
            "engram.encoding",
            Some(MetaValue::String("e4m3_e8m0_32_row264".into())),
            "e4m3_e8m0_32_row264: a row encoding",
        ),
    ];
    for (key, value, why) in cases {
        let e = refusal(&set(tiny(), key, value));
        assert!(
            e.contains(&format!("{ARCH41}.{key}")) && e.contains(why),
            "{key}: {e}"
        );
    }
    // The published headers' optional keys, when they agree.
    let view = set(tiny(), "engram.rows", u64s(&[252, 410]));
    let view = set(
        view,
        "engram.compressed_vocab_size",
        Some(MetaValue::U32(211)),
    );
    assert!(Deepseek4::load(&view).is_ok());
    let none = without(
        tiny(),
        &["blk.1.engram_embd.weight", "blk.4.engram_embd.weight"],
    );
    let e = refusal(&set(none, "engram.layer_ids", None));
    assert!(e.contains("engram_embd") && e.contains("no layer"), "{e}");
}

#[test]
fn ratios_sources_and_candidate_keys_v41_has_not_are_refused_by_name() {
    let ratios = |r: u32| {
        let v = [0, 0, 2, 2, 2, r, 1, 1, 1].map(MetaValue::U32);
        set(
            tiny(),
            "attention.compress_ratios",
            Some(MetaValue::Array(v.to_vec().into())),
        )
    };
    for bad in [4, 128, 3] {
        let e = refusal(&ratios(bad));
        assert!(
            e.contains("deepseek41.attention.compress_ratios")
                && e.contains(&format!("layer 5: ratio {bad}"))
                && e.contains("0, 2 and 1"),
            "{e}"
        );
    }
    // Layer 5 at ratio 2 reads source 4; layers 6-8 at ratio 1 then read a ratio-2 source.
    let e = refusal(&ratios(2));
    assert!(
        e.contains("layer 6: ratio 1 reads") && e.contains("layer 5 of ratio 2"),
        "{e}"
    );
    // Layer 2 without its compressor: layers 2 and 3 have no source.
    let comp = ["kv", "gate", "norm"].map(|t| format!("blk.2.attn_compressor_{t}.weight"));
    let e = refusal(&without(tiny(), &comp.each_ref().map(String::as_str)));
    assert!(
        e.contains("layer 2") && e.contains("no compressor source"),
        "{e}"
    );
    // A source on a window-only layer.
    let extra = tensors(tiny(), |t| {
        let mut c = t
            .iter()
            .find(|t| t.name.as_str() == "blk.2.attn_compressor_kv.weight")
            .unwrap()
            .clone();
        c.name = "blk.0.attn_compressor_kv.weight".into();
        t.push(c);
    });
    let e = refusal(&extra);
    assert!(e.contains("layer 0") && e.contains("window-only"), "{e}");
    // A source without its partner tensors, or without its indexer.
    for t in ["attn_compressor_gate", "indexer.attn_k", "indexer.k_norm"] {
        let name = format!("blk.4.{t}.weight");
        let e = refusal(&without(tiny(), &[&name]));
        assert!(e.contains(&name), "{e}");
    }
    let e = refusal(&without(tiny(), &["blk.4.indexer.attn_q_b.weight"]));
    assert!(
        e.contains("layer 4: a compressor source without its indexer"),
        "{e}"
    );
    // A ratio-1 source loads with or without a score projection (a softmax over one position).
    let mut gated = tiny();
    let mut t = gated.tensors.to_vec();
    let mut g = t
        .iter()
        .find(|t| t.name.as_str() == "blk.4.attn_compressor_gate.weight")
        .unwrap()
        .clone();
    g.name = "blk.5.attn_compressor_gate.weight".into();
    t.push(g.clone());
    gated.tensors = t.clone().into();
    assert!(Deepseek4::load(&gated).is_ok());
    // A compressor position bias, which the V4.1 math read here has not.
    g.name = "blk.5.attn_compressor_ape.weight".into();
    t.push(g);
    gated.tensors = t.into();
    let e = refusal(&gated);
    assert!(
        e.contains("blk.5.attn_compressor_ape.weight") && e.contains("position bias"),
        "{e}"
    );
    let e = refusal(&set(
        tiny(),
        "attention.candidate_block_count",
        Some(MetaValue::U32(2048)),
    ));
    assert!(
        e.contains("deepseek41.attention.candidate_block_count") && e.contains("candidate mask"),
        "{e}"
    );
}

#[test]
fn hostile_deepseek41_files_are_refused_by_name_not_by_panic() {
    let r = check_hostile(&preset(), ARCH41, Deepseek4::load, 400, 41).unwrap();
    assert!(r.cases > 400, "{r:?}");
}
