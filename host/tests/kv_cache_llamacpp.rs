//! Greedy continuations of the tiny qwen3moe file under quantized K/V caches against llama.cpp's
//! (`fixtures/kv_cache/qwen3moe_tiny_llamacpp.json`, made by llama-cpp-python 0.3.36 and checked
//! with llama.cpp b11434's `llama-completion`: fixtures/kv_cache/PROVENANCE.md): every K/V type
//! pair of the fixture gives llama.cpp's 24 token ids on the CPU. q4_0 is where llama.cpp's
//! Walsh-Hadamard rotation of a quantized cache decides the first token.

mod common;

use std::path::Path;

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::{BatchInputs, LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;

/// A cache type by its `-ctk`/`-ctv` name.
fn cache_type(name: &str) -> DType {
    match name {
        "f16" => DType::F16,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "q5_1" => DType::Q5_1,
        "iq4_nl" => DType::IQ4_NL,
        other => panic!("no cache type {other} in this test"),
    }
}

/// The first of the largest logits.
fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as i32
}

/// `n` greedy tokens after `prompt`: the prompt in one pass, then one token a pass.
fn greedy(m: &mut LoadedModel, prompt: &[i32], n: usize) -> Vec<i32> {
    let vocab = m.spec.hparams.n_vocab as usize;
    let pass = |m: &mut LoadedModel, tokens: Vec<i32>, at: i32| {
        let rows = tokens.len() as i32;
        let logits = m
            .forward(&BatchInputs {
                tokens,
                positions: (at..at + rows).collect(),
                slots: vec![0; rows as usize],
                output_rows: vec![rows - 1],
                ngram_rows: vec![],
                logit_rows: vec![],
            })
            .unwrap();
        argmax(&logits[logits.len() - vocab..])
    };
    let mut out = vec![pass(m, prompt.to_vec(), 0)];
    while out.len() < n {
        let at = (prompt.len() + out.len() - 1) as i32;
        let next = pass(m, vec![out[out.len() - 1]], at);
        out.push(next);
    }
    out
}

#[test]
fn quantized_caches_give_llama_cpp_greedy_text() {
    let fixture: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/kv_cache/qwen3moe_tiny_llamacpp.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f32s = ClassTypes {
        experts: DType::F32,
        attention: DType::F32,
        embedding: DType::F32,
        output: DType::F32,
        dense: DType::F32,
    };
    let path = common::tiny_qwen3moe(&dir, f32s);
    let reg = Registry::load(&common::plugin_dir()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<i32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap() as i32)
            .collect()
    };
    let mut differ = Vec::new();
    for (pair, want) in fixture.as_object().unwrap() {
        let (k, v) = pair.split_once('/').unwrap();
        let opts = LoadOptions {
            n_slots: 1,
            ctx_per_slot: 64,
            kv_type_k: cache_type(k),
            kv_type_v: cache_type(v),
            threads: 2,
            graphs: true,
            mlock: false,
            overrides: &[],
            check_tensors: false,
            draft_n_max: 0,
            draft_history: false,
        };
        let mut m = LoadedModel::load(&reg, &path, opts).unwrap();
        let (prompt, want) = (ids(&want["prompt_ids"]), ids(&want["ids"]));
        let got = greedy(&mut m, &prompt, want.len());
        eprintln!("{pair}: {got:?}");
        if got != want {
            differ.push(format!("{pair}: ours {got:?}, llama.cpp {want:?}"));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}
