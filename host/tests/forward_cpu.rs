//! End-to-end forward passes of a synthetic qwen3moe on the CPU plugins: batching invariants.

mod common;

use common::{plugin_dir, tiny_qwen3moe as tiny};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_exec::BatchInputs;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_plugin_api::DType;

const F32: ClassTypes = ClassTypes {
    experts: DType::F32,
    attention: DType::F32,
    embedding: DType::F32,
    output: DType::F32,
    dense: DType::F32,
};

fn load(path: &std::path::Path, n_slots: u32) -> LoadedModel {
    let reg = Registry::load(&plugin_dir()).unwrap();
    let opts = LoadOptions {
        n_slots,
        ctx_per_slot: 64,
        kv_type_k: DType::F32,
        kv_type_v: DType::F32,
        threads: 2,
        graphs: true,
        mlock: false,
        overrides: &[],
        check_tensors: false,
        draft_n_max: 0,
        draft_history: false,
    };
    LoadedModel::load(&reg, path, opts).unwrap()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn a_batched_prompt_equals_token_by_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, F32);
    let tokens = [5, 77, 300, 12, 509, 256, 1];
    let n = tokens.len();
    let mut m = load(&path, 1);
    let batch = BatchInputs {
        tokens: tokens.to_vec(),
        positions: (0..n as i32).collect(),
        slots: vec![0; n],
        output_rows: (0..n as i32).collect(),
        ngram_rows: vec![],
        logit_rows: vec![],
    };
    let all = m.forward(&batch).unwrap();
    let vocab = m.spec.hparams.n_vocab as usize;
    assert_eq!(all.len(), vocab * n);
    let mut m2 = load(&path, 1);
    for (i, &t) in tokens.iter().enumerate() {
        let one = m2
            .forward(&BatchInputs {
                tokens: vec![t],
                positions: vec![i as i32],
                slots: vec![0],
                output_rows: vec![0],
                ngram_rows: vec![],
                logit_rows: vec![],
            })
            .unwrap();
        let rel = max_rel(&one, &all[i * vocab..(i + 1) * vocab]);
        assert!(rel < 1e-5, "position {i}: rel {rel}");
    }
}

#[test]
fn sequences_in_one_batch_equal_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, F32);
    let a = [3, 4, 5, 6];
    let b = [400, 401, 17];
    let mut both = load(&path, 2);
    let batch = BatchInputs {
        tokens: a.iter().chain(&b).copied().collect(),
        positions: vec![0, 1, 2, 3, 0, 1, 2],
        slots: vec![0, 0, 0, 0, 1, 1, 1],
        output_rows: vec![3, 6],
        ngram_rows: vec![],
        logit_rows: vec![],
    };
    let out = both.forward(&batch).unwrap();
    let vocab = both.spec.hparams.n_vocab as usize;
    for (seq, want_row) in [(&a[..], 0usize), (&b[..], 1)] {
        let mut alone = load(&path, 1);
        let n = seq.len();
        let logits = alone
            .forward(&BatchInputs {
                tokens: seq.to_vec(),
                positions: (0..n as i32).collect(),
                slots: vec![0; n],
                output_rows: vec![n as i32 - 1],
                ngram_rows: vec![],
                logit_rows: vec![],
            })
            .unwrap();
        let rel = max_rel(&out[want_row * vocab..(want_row + 1) * vocab], &logits);
        assert!(rel < 1e-5, "sequence {want_row}: rel {rel}");
    }
}

#[test]
fn a_position_past_the_context_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(&dir, F32);
    let mut m = load(&path, 1);
    let e = m
        .forward(&BatchInputs {
            tokens: vec![1],
            positions: vec![64],
            slots: vec![0],
            output_rows: vec![0],
            ngram_rows: vec![],
            logit_rows: vec![],
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the context of 64"), "{e}");
}

/// Rewrites a file with each layer's `ffn_gate_exps` and `ffn_up_exps` fused into one
/// `ffn_gate_up_exps` stack (gate rows first in each expert, as llama.cpp's converter writes them).
fn fuse_gate_up(src: &std::path::Path, dst: &std::path::Path) {
    use bloomery_gguf::{GgufModel, GgufWriter};
    let m = GgufModel::open(src).unwrap();
    let mut w = GgufWriter::new();
    for e in m.metadata().entries() {
        w.set(&e.key, e.value.clone()).unwrap();
    }
    let mut plan: Vec<(String, Vec<String>)> = Vec::new();
    for t in m.tensors() {
        let name = &t.info.name;
        if name.ends_with("ffn_up_exps.weight") {
            continue;
        }
        if let Some(prefix) = name.strip_suffix("ffn_gate_exps.weight") {
            let mut shape = t.info.shape.clone();
            shape[1] *= 2;
            let fused = format!("{prefix}ffn_gate_up_exps.weight");
            w.add_tensor(&fused, t.info.dtype, &shape).unwrap();
            plan.push((
                fused,
                vec![name.clone(), format!("{prefix}ffn_up_exps.weight")],
            ));
        } else {
            w.add_tensor(name, t.info.dtype, &t.info.shape).unwrap();
            plan.push((name.clone(), vec![name.clone()]));
        }
    }
    let mut i = 0;
    w.write_file(dst, |_, sink| {
        let (_, parts) = &plan[i];
        i += 1;
        if parts.len() == 1 {
            return std::io::Write::write_all(sink, m.data(&parts[0]).unwrap());
        }
        let (g, u) = (m.data(&parts[0]).unwrap(), m.data(&parts[1]).unwrap());
        let t = m.tensor(&parts[0]).unwrap();
        let per_expert = g.len() / t.info.shape[2] as usize;
        for e in 0..t.info.shape[2] as usize {
            std::io::Write::write_all(sink, &g[e * per_expert..(e + 1) * per_expert])?;
            std::io::Write::write_all(sink, &u[e * per_expert..(e + 1) * per_expert])?;
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn fused_gate_up_stacks_equal_separate_ones() {
    let dir = tempfile::tempdir().unwrap();
    let types = ClassTypes {
        experts: DType::Q4_K,
        ..F32
    };
    let separate = tiny(&dir, types);
    let fused = dir.path().join("fused.gguf");
    fuse_gate_up(&separate, &fused);
    let batch = BatchInputs {
        tokens: vec![9, 99, 199, 299],
        positions: vec![0, 1, 2, 3],
        slots: vec![0; 4],
        output_rows: vec![0, 1, 2, 3],
        ngram_rows: vec![],
        logit_rows: vec![],
    };
    let a = load(&separate, 1).forward(&batch).unwrap();
    let b = load(&fused, 1).forward(&batch).unwrap();
    assert!(max_rel(&b, &a) < 1e-6, "rel {}", max_rel(&b, &a));
}
