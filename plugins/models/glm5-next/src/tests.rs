//! The plugin's own tests: presets against the loader, layer kinds and state, refusals by name,
//! hostile files, and the graphs' structure (llama.cpp b11434's order and shapes; the numbers
//! come when the kernels do, against the references' goldens in `host/tests`).

use super::*;
use bloomery_plugin_api::builders::LmInputs;
use bloomery_plugin_api::graph::{BatchInput, GraphBuilder, Node, TensorSource};
use bloomery_plugin_api::hostile::check_hostile;
use bloomery_plugin_api::meta::{MetaEntry, MetaValue};
use bloomery_plugin_api::model::{StateKind, SynthPreset};
use bloomery_plugin_api::op::{KPoolMode, KPoolParams, Op, OpKind};
use bloomery_plugin_api::synth::check_presets;
use bloomery_plugin_api::DType;

use crate::layers::LayerKind;

fn tiny() -> SynthPreset {
    synth::presets()
        .into_iter()
        .find(|p| p.name.as_str() == "tiny")
        .unwrap()
}

/// The tiny file's view with `{ARCH}.{key}` set to `value`, or removed.
fn with_key(key: &str, value: Option<MetaValue>) -> ModelFileView {
    let mut view = tiny().file_view(DType::F32);
    let full = format!("{ARCH}.{key}");
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

fn load(view: &ModelFileView) -> Glm5Next {
    Glm5Next::load(view).unwrap()
}

fn refusal(view: &ModelFileView) -> String {
    match Glm5Next::load(view) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

fn u32s(v: &[u32]) -> Option<MetaValue> {
    Some(MetaValue::Array(
        v.iter().map(|&x| MetaValue::U32(x)).collect(),
    ))
}

fn graph(m: &Glm5Next, n_rows: u32, n_outputs: u32) -> Graph {
    let shape = BatchShape {
        n_rows,
        n_outputs,
        kind: GraphKind::Main,
    };
    m.build_graph(shape).into_result().unwrap()
}

fn nodes(g: &Graph, kind: OpKind) -> Vec<&Node> {
    g.nodes.iter().filter(|n| n.op.kind() == kind).collect()
}

fn name(g: &Graph, t: bloomery_plugin_api::graph::TensorId) -> &str {
    g.tensors[t.0 as usize].name.as_str()
}

fn ne(g: &Graph, t: bloomery_plugin_api::graph::TensorId) -> [u64; 4] {
    g.tensors[t.0 as usize].ne
}

fn layer_of(g: &Graph, n: &Node) -> i32 {
    g.tensors[n.dst.0 as usize].layer
}

/// The state index a tensor reads, when it is host-owned state.
fn state_of(g: &Graph, t: bloomery_plugin_api::graph::TensorId) -> Option<u32> {
    match g.tensors[t.0 as usize].source {
        TensorSource::State { index } => Some(index),
        _ => None,
    }
}

#[test]
fn every_preset_loads_with_its_declared_weights() {
    check_presets(&synth::presets(), Glm5Next::load).unwrap();
}

#[test]
fn layers_follow_head_count_kv_and_the_nextn_layer_is_mla_with_a_full_indexer() {
    let m = load(&tiny().file_view(DType::F32));
    let (kda, mla) = (LayerKind::Kda, LayerKind::Mla { full_indexer: true });
    let want = [kda, kda, kda, mla, kda, kda, kda, mla, mla];
    assert_eq!(m.hp.kinds, want);
    assert_eq!((m.hp.lm.n_layer, m.hp.n_mtp, m.hp.n_dense_lead), (8, 1, 1));
    let spec = m.spec();
    assert!(spec.caps.recurrent);
    assert_eq!(spec.caps.n_mtp_layers, 1);
    assert_eq!(spec.hparams.n_layer, 8);
    let names: Vec<&str> = spec.weights.iter().map(|w| w.name.as_str()).collect();
    for n in [
        "blk.8.nextn.eh_proj.weight",
        "blk.8.indexer.attn_k.weight",
        "blk.8.ffn_gate_exps.weight",
        "blk.7.hc_ffn_fn.weight",
        "blk.0.ffn_gate.weight",
    ] {
        assert!(names.contains(&n), "{n}");
    }
    // The NextN layer has no hyper-connections and always routed experts.
    assert!(!names.iter().any(|n| n.starts_with("blk.8.hc_")));
    assert!(!names.contains(&"blk.8.ffn_gate.weight"));
    assert_eq!(m.hp.route.scale, 2.5);
    assert!(m.hp.route.bias && m.hp.route.norm);
    assert_eq!(m.hp.indexer.n_sel(), 8 + 3);
}

#[test]
fn state_rows_match_the_layer_kinds() {
    let m = load(&tiny().file_view(DType::F32));
    let spec = m.spec();
    let find = |name: &str| spec.state.iter().find(|s| s.name.as_str() == name).cloned();
    for il in [3, 7, 8] {
        let l = find(&format!("cache_latent_l{il}")).unwrap();
        assert_eq!((l.kind, l.row_elems, l.layer), (StateKind::Latent, 512, il));
        let i = find(&format!("cache_indexer_l{il}")).unwrap();
        assert_eq!(
            (i.kind, i.row_elems, i.block),
            (StateKind::PooledKeys, 3 * 128, 1)
        );
        assert!(find(&format!("ssm_state_l{il}")).is_none());
    }
    for il in [0, 1, 2, 4, 5, 6] {
        let r = find(&format!("ssm_state_l{il}")).unwrap();
        assert_eq!((r.kind, r.row_elems), (StateKind::Recurrent, 32 * 32 * 4));
        let c = find(&format!("conv_v_l{il}")).unwrap();
        assert_eq!((c.kind, c.row_elems), (StateKind::Conv, 128 * 3));
        assert!(find(&format!("cache_latent_l{il}")).is_none());
    }
    assert_eq!(spec.state.len(), 6 * 4 + 3 * 2);
}

/// The keys llama.cpp b11434 reads for `glm5-next` without a default (`load_arch_hparams` and
/// the common ones it needs), and the indexer's LayerNorm ε, which it would leave at 0.
const REQUIRED: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "attention.key_length_mla",
    "attention.value_length_mla",
    "attention.q_lora_rank",
    "attention.kv_lora_rank",
    "ssm.conv_kernel",
    "kda.head_dim",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_count",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
    "attention.indexer.top_k",
    "attention.indexer.kpool",
    "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations",
    "hyper_connection.epsilon",
];

#[test]
fn every_required_key_is_refused_by_name_when_missing() {
    for key in REQUIRED {
        let e = refusal(&with_key(key, None));
        assert!(e.contains(&format!("{ARCH}.{key}")), "{key}: {e}");
    }
}

#[test]
fn variants_not_built_and_contradictions_are_refused_by_name() {
    let cases: Vec<(&str, Option<MetaValue>, &str)> = vec![
        ("rope.dimension_count", Some(MetaValue::U32(64)), "NoPE"),
        ("hyper_connection.count", Some(MetaValue::U32(8)), "only 4"),
        (
            "hyper_connection.sinkhorn_iterations",
            Some(MetaValue::U32(0)),
            "1 to 1000",
        ),
        ("nextn_predict_layers", Some(MetaValue::U32(2)), "0 or 1"),
        ("expert_gating_func", Some(MetaValue::U32(1)), "sigmoid"),
        ("expert_group_count", Some(MetaValue::U32(4)), "groups"),
        (
            "attention.indexer.kpool",
            Some(MetaValue::U32(1)),
            "at least 2",
        ),
        (
            "attention.indexer.top_k",
            Some(MetaValue::U32(10)),
            "multiple of kpool",
        ),
        (
            "attention.key_length",
            Some(MetaValue::U32(256)),
            "latent row",
        ),
        (
            "attention.kv_lora_rank",
            Some(MetaValue::U32(256)),
            "attn_kv_a_mqa",
        ),
        (
            "attention.key_length_mla",
            Some(MetaValue::U32(32)),
            "attn_k_b",
        ),
        (
            "attention.indexer.key_length",
            Some(MetaValue::U32(64)),
            "indexer.attn_k",
        ),
        (
            "attention.head_count_kv",
            u32s(&[0, 0, 0, 2, 0, 0, 0, 1, 1]),
            "layer 3: 2 KV heads",
        ),
        (
            "attention.head_count_kv",
            u32s(&[0, 0, 0, 1, 0, 0, 0, 1, 0]),
            "layer 8: 0 KV heads",
        ),
        (
            "attention.head_count_kv",
            u32s(&[0, 1]),
            "2 values for 9 layers",
        ),
        (
            "attention.indexer.types",
            u32s(&[1, 1, 1, 0, 1, 1, 1, 1]),
            "layer 3: a shared indexer with no full-indexer MLA layer before it",
        ),
        ("swiglu_clamp_exp", Some(MetaValue::F32(f32::NAN)), "NaN"),
        ("swiglu_clamp_shexp", u32s(&[1, 2]), "2 values for 9 layers"),
    ];
    for (key, value, want) in cases {
        let e = refusal(&with_key(key, value));
        assert!(
            e.contains(&format!("{ARCH}.")) && e.contains(want),
            "{key}: {e}"
        );
    }
}

#[test]
fn ik_llamas_spelling_loads_the_same_model() {
    let mut v = tiny().file_view(DType::F32);
    let meta: Vec<MetaEntry> = v
        .metadata
        .iter()
        .map(|e| match e.key.as_str() {
            "general.architecture" => MetaEntry::new(&e.key, MetaValue::String(ARCH_IK.into())),
            k => MetaEntry::new(&k.replacen(ARCH, ARCH_IK, 1), e.value.clone()),
        })
        .collect();
    v.metadata = meta.into();
    let m = load(&v);
    assert_eq!(m.spec().architecture.as_str(), ARCH_IK);
    assert_eq!(m.hp.kinds, load(&tiny().file_view(DType::F32)).hp.kinds);
}

#[test]
fn a_file_without_the_nextn_tensors_loads_its_trunk_alone() {
    let mut v = tiny().file_view(DType::F32);
    v.tensors.retain(|t| !t.name.starts_with("blk.8."));
    let m = load(&v);
    let spec = m.spec();
    assert_eq!(spec.caps.n_mtp_layers, 0);
    assert!(m.weights.nextn.is_none());
    assert!(!spec.state.iter().any(|s| s.layer == 8));
    assert!(!graph(&m, 3, 1).nodes.is_empty());
    // No draft graph: refused by name.
    let shape = BatchShape {
        n_rows: 1,
        n_outputs: 1,
        kind: GraphKind::Mtp,
    };
    let e = m.build_graph(shape).into_result().unwrap_err().to_string();
    assert!(e.contains("NextN"), "{e}");
}

#[test]
fn the_trunk_graph_follows_llama_cpps_order_and_shapes() {
    let m = load(&tiny().file_view(DType::F32));
    let g = graph(&m, 5, 2);
    let count = |k| nodes(&g, k).len();
    // Two mixers per layer; the final mean is one more StreamMix.
    assert_eq!(count(OpKind::Sinkhorn), 16);
    assert_eq!(count(OpKind::StreamUpdate), 16);
    assert_eq!(count(OpKind::StreamMix), 17);
    assert_eq!(count(OpKind::DeltaRule), 6);
    assert_eq!(count(OpKind::KPoolSelect), 2);
    let s = &nodes(&g, OpKind::Sinkhorn)[0];
    assert_eq!(
        s.op,
        Op::Sinkhorn {
            iters: 20,
            eps: 1e-6
        }
    );
    assert_eq!(ne(&g, s.dst), [4, 4, 5, 1]);
    // Layer 0 in order: the flat streams' RMS norm without weight, the mixes, pre into the
    // block, attn_norm, ..., the post update; then the same around ffn_norm.
    let order: Vec<&str> = g
        .nodes
        .iter()
        .filter(|n| layer_of(&g, n) == 0)
        .map(|n| name(&g, n.dst))
        .filter(|n| {
            matches!(
                *n,
                "hc_flat_norm"
                    | "hc_mixes"
                    | "hc_attn_pre"
                    | "attn_norm"
                    | "kda_out"
                    | "hc_attn_post"
                    | "hc_ffn_pre"
                    | "ffn_norm"
                    | "ffn_down"
                    | "l_out_post"
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            "hc_flat_norm",
            "hc_mixes",
            "hc_attn_pre",
            "attn_norm",
            "kda_out",
            "hc_attn_post",
            "hc_flat_norm",
            "hc_mixes",
            "hc_ffn_pre",
            "ffn_norm",
            "ffn_down",
            "l_out_post"
        ]
    );
    let flat = g
        .nodes
        .iter()
        .find(|n| name(&g, n.dst) == "hc_flat_norm")
        .unwrap();
    assert_eq!((flat.srcs.len(), ne(&g, flat.dst)), (1, [4 * 128, 5, 1, 1]));
    let mix = g
        .nodes
        .iter()
        .find(|n| name(&g, n.dst) == "hc_mixes")
        .unwrap();
    assert_eq!(ne(&g, mix.dst), [24, 5, 1, 1]);
    let up = &nodes(&g, OpKind::StreamUpdate)[0];
    let src_names: Vec<&str> = up.srcs.iter().map(|&t| name(&g, t)).collect();
    assert_eq!(src_names, ["hc_init", "hc_comb", "hc_post", "kda_out"]);
    assert_eq!(ne(&g, up.dst), [128, 4, 5, 1]);
    // The latent attention: K = V from one 512-wide row, over the indexer's selection, the
    // logits scaled by 1/sqrt(key_length_mla).
    let attn = nodes(&g, OpKind::Attention);
    assert_eq!(attn.len(), 2);
    for a in &attn {
        let Op::Attention(p) = a.op else {
            unreachable!()
        };
        assert_eq!((p.n_head, p.n_head_kv, p.dk, p.dv), (4, 1, 512, 512));
        assert!(p.v_from_k && p.selected && !p.sinks && p.window == 0);
        assert_eq!(p.scale, 1.0 / 8.0);
        assert_eq!(a.srcs.len(), 6);
        assert_eq!(a.srcs[1], a.srcs[2]);
        assert_eq!(name(&g, a.srcs[5]), "indexer_sel_idx");
        assert_eq!(ne(&g, a.srcs[0]), [512, 4, 5, 1]);
    }
    let heads: Vec<[u64; 4]> = g
        .nodes
        .iter()
        .filter(|n| n.op == Op::MatMul && ne(&g, n.srcs[0])[2] > 1)
        .map(|n| ne(&g, n.dst))
        .collect();
    assert_eq!(heads, [[512, 4, 5, 1], [64, 4, 5, 1]].repeat(2));
    let sel = &nodes(&g, OpKind::KPoolSelect)[0];
    let p = KPoolParams {
        n_head: 4,
        head_dim: 128,
        kpool: 4,
        n_top: 2,
        tail: true,
        mode: KPoolMode::SoftmaxGate,
    };
    assert_eq!(sel.op, Op::KPoolSelect(p));
    assert_eq!(g.tensors[sel.dst.0 as usize].dtype, DType::I32);
    assert_eq!(ne(&g, sel.dst), [11, 5, 1, 1]);
    let shapes: Vec<[u64; 4]> = sel.srcs.iter().map(|&t| ne(&g, t)).collect();
    assert_eq!(shapes[..2], [[128, 4, 5, 1], [4, 5, 1, 1]]);
    assert_eq!(shapes[3], [128, 4, 1, 1]);
    // The rows are stored before the selection reads them.
    let at = |n: &Node| g.nodes.iter().position(|x| std::ptr::eq(x, n)).unwrap();
    let cache = state_of(&g, sel.srcs[2]).unwrap();
    let store = g
        .nodes
        .iter()
        .find(|n| matches!(n.op, Op::CacheStore { .. }) && state_of(&g, n.dst) == Some(cache))
        .unwrap();
    assert!(at(store) < at(sel));
    assert_eq!(ne(&g, store.srcs[0]), [3 * 128, 5, 1, 1]);
    let logits = &g.outputs[0];
    assert_eq!(
        (logits.name.as_str(), ne(&g, logits.tensor)),
        ("logits", [272, 2, 1, 1])
    );
}

#[test]
fn a_shared_indexer_layer_reuses_the_previous_full_layers_selection() {
    let m = load(&with_key(
        "attention.indexer.types",
        u32s(&[1, 1, 1, 1, 1, 1, 1, 0]),
    ));
    assert_eq!(
        m.hp.kinds[7],
        LayerKind::Mla {
            full_indexer: false
        }
    );
    let spec = m.spec();
    assert!(!spec
        .weights
        .iter()
        .any(|w| w.name.starts_with("blk.7.indexer")));
    assert!(!spec
        .state
        .iter()
        .any(|s| s.name.as_str() == "cache_indexer_l7"));
    let g = graph(&m, 3, 1);
    let sel = nodes(&g, OpKind::KPoolSelect);
    assert_eq!(sel.len(), 1);
    assert_eq!(layer_of(&g, sel[0]), 3);
    let attn = nodes(&g, OpKind::Attention);
    assert_eq!(layer_of(&g, attn[1]), 7);
    assert_eq!(attn[1].srcs[5], sel[0].dst);
}

#[test]
fn swiglu_clamps_follow_the_per_layer_keys_dense_layers_taking_the_shared_experts() {
    let f32s = |v: Vec<f32>| {
        Some(MetaValue::Array(
            v.into_iter().map(MetaValue::F32).collect(),
        ))
    };
    let mut v = with_key(
        "swiglu_clamp_exp",
        f32s((1..=9).map(|i| i as f32).collect()),
    );
    let shexp: Vec<f32> = (11..=19).map(|i| i as f32).collect();
    let meta = MetaEntry::new(&format!("{ARCH}.swiglu_clamp_shexp"), f32s(shexp).unwrap());
    v.metadata = v
        .metadata
        .into_iter()
        .filter(|e| !e.key.ends_with("swiglu_clamp_shexp"))
        .chain([meta])
        .collect();
    let m = load(&v);
    let g = graph(&m, 2, 1);
    let glu = |il: i32, n: &str| {
        g.nodes
            .iter()
            .find(|x| layer_of(&g, x) == il && name(&g, x.dst) == n)
            .map(|x| x.op)
            .unwrap()
    };
    let limit = |op: Op| match op {
        Op::Glu { limit, .. } => limit,
        Op::MoeExperts(p) => p.limit,
        _ => unreachable!(),
    };
    assert_eq!(limit(glu(0, "ffn_swiglu")), 11.0);
    assert_eq!(limit(glu(1, "ffn_moe_out")), 2.0);
    assert_eq!(limit(glu(1, "ffn_shexp_swiglu")), 12.0);
    // Without swiglu_clamp_shexp the shared expert takes the experts' clamp.
    let m = load(&with_key("swiglu_clamp_shexp", None));
    assert_eq!(m.hp.clamp_shexp, m.hp.clamp_exp);
    assert_eq!(m.hp.clamp_exp, [0.5; 9]);
}

#[test]
fn the_nextn_head_runs_its_own_layer_over_the_trunks_hidden_state() {
    let m = load(&tiny().file_view(DType::F32));
    let mm = m.model(GraphKind::Main);
    let mut g = GraphBuilder::new();
    let shape = BatchShape {
        n_rows: 4,
        n_outputs: 1,
        kind: GraphKind::Main,
    };
    let (mean, inp): (_, LmInputs) = graph::trunk(&mm, &mut g, shape).unwrap();
    let norm = g.w(&m.weights.trunk.globals.output_norm).unwrap();
    let h = g
        .rms_norm("h_nextn", mean, Some(norm), m.hp.lm.eps)
        .unwrap();
    let logits = nextn::draft_head(&mm, &mut g, h, inp.tokens, &inp).unwrap();
    g.output("logits", logits);
    let g = g.finish();
    assert_eq!(ne(&g, logits), [272, 1, 1, 1]);
    // [enorm(e); hnorm(h)], e first, into eh_proj.
    let cat = g
        .nodes
        .iter()
        .find(|n| name(&g, n.dst) == "mtp_concat")
        .unwrap();
    let parts: Vec<&str> = cat.srcs.iter().map(|&t| name(&g, t)).collect();
    assert_eq!(parts, ["mtp_enorm", "mtp_hnorm"]);
    assert_eq!(ne(&g, cat.dst), [256, 4, 1, 1]);
    // Its own MLA and indexer over layer 8's state; no hyper-connections in the layer.
    let l8: Vec<&Node> = g.nodes.iter().filter(|n| layer_of(&g, n) == 8).collect();
    assert!(!l8
        .iter()
        .any(|n| matches!(n.op.kind(), OpKind::Sinkhorn | OpKind::StreamMix)));
    let own = |n: &str| spec_index(&m, n);
    let attn = l8
        .iter()
        .find(|n| n.op.kind() == OpKind::Attention)
        .unwrap();
    assert_eq!(state_of(&g, attn.srcs[1]), Some(own("cache_latent_l8")));
    let sel = l8
        .iter()
        .find(|n| n.op.kind() == OpKind::KPoolSelect)
        .unwrap();
    assert_eq!(state_of(&g, sel.srcs[2]), Some(own("cache_indexer_l8")));
    assert_eq!(attn.srcs[5], sel.dst);
    // The head: shared_head_norm and shared_head_head of layer 8.
    let head = g.nodes.iter().find(|n| n.dst == logits).unwrap();
    match g.tensors[head.srcs[0].0 as usize].source {
        TensorSource::Weight { index } => {
            let w = &m.spec().weights[index as usize];
            assert_eq!(w.name.as_str(), "blk.8.nextn.shared_head_head.weight");
        }
        s => panic!("{s:?}"),
    }
    // The host's draft graph: the same head over the hidden rows of a batch input.
    let shape = BatchShape {
        n_rows: 3,
        n_outputs: 1,
        kind: GraphKind::Mtp,
    };
    let d = m.build_graph(shape).into_result().unwrap();
    let hidden = d
        .tensors
        .iter()
        .position(|t| {
            t.source
                == TensorSource::Input {
                    input: BatchInput::Hidden,
                }
        })
        .unwrap();
    assert_eq!(d.tensors[hidden].ne, [128, 3, 1, 1]);
    assert_eq!(d.tensors[hidden].dtype, DType::F32);
    let hnorm = d
        .nodes
        .iter()
        .find(|n| name(&d, n.dst) == "mtp_hnorm")
        .unwrap();
    assert_eq!(hnorm.srcs[0].0 as usize, hidden);
    assert_eq!(ne(&d, d.outputs[0].tensor), [272, 1, 1, 1]);
}

fn spec_index(m: &Glm5Next, state: &str) -> u32 {
    m.spec()
        .state
        .iter()
        .position(|s| s.name.as_str() == state)
        .unwrap() as u32
}

#[test]
fn hostile_keys_and_shapes_end_in_named_errors_never_in_a_panic() {
    let r = check_hostile(&tiny(), ARCH, Glm5Next::load, 300, 0x5eed).unwrap();
    println!("{r:?}");
    assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
}
