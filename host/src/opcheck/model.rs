//! End-to-end checks of a model file on a kernel plugin against the CPU: the logits of prompts,
//! mixed batches and decode steps, graph replay against op-by-op launches, and a prompt with every
//! routed expert streamed from the host.

use bloomery_plugin_api::DType;

use super::{relative, worst, Outcome};

/// What an f16 K/V cache adds to a model check's tolerance: a summation-order difference in K or V
/// can flip an f16 rounding (measured 2e-5 between the two CPU plugins), so 1e-4 in all at the
/// default 1e-5. Added rather than multiplied, so that the looser tolerance of a file with
/// quantized weights (their activations' rounding, e.g. 1e-1) does not grow tenfold with it.
const F16_CACHE_ALLOWANCE: f64 = 9e-5;

/// The tolerance of a model check with a `kv` cache, `tol` being the f32 cache's.
fn cache_tol(kv: DType, tol: f64) -> f64 {
    if kv == DType::F16 {
        tol + F16_CACHE_ALLOWANCE
    } else {
        tol
    }
}

/// End to end: the logits of a model file on `kernel` against the best CPU plugin, for a
/// 20-token prompt (a batch long enough for a GPU plugin's batched kernels; ids past a small
/// vocabulary wrap into it, as GLM-5.3's tiny file has 272) in one batch (every row an output) in
/// slot 0, the same prompt in slot 1 alongside one decode step of slot 0, then four decode steps
/// of both slots (two rows each). `tol` bounds ‖Δ‖/‖ref‖ per pass with an f32 cache; an f16 cache
/// gets `F16_CACHE_ALLOWANCE` more (`cache_tol`).
pub fn check_model(
    reg: &bloomery_devices::Registry,
    path: &std::path::Path,
    kernel: &bloomery_devices::KernelPluginFile,
    tol: f64,
) -> Vec<Outcome> {
    use bloomery_exec::BatchInputs;
    use bloomery_exec::{LoadOptions, LoadedModel};
    let prompt: Vec<i32> = vec![
        5, 77, 300, 12, 509, 256, 1, 40, 41, 42, 7, 9, 100, 200, 301, 88, 17, 63, 150, 222,
    ];
    let n = prompt.len() as i32;
    let passes: Vec<(String, BatchInputs)> = {
        let mut v = vec![(
            "prompt, every row".to_owned(),
            BatchInputs {
                tokens: prompt.clone(),
                positions: (0..n).collect(),
                slots: vec![0; prompt.len()],
                output_rows: (0..n).collect(),
                ngram_rows: vec![],
                logit_rows: vec![],
            },
        )];
        let mut mixed = BatchInputs {
            tokens: vec![3],
            positions: vec![n],
            slots: vec![0],
            output_rows: vec![0],
            ngram_rows: vec![],
            logit_rows: vec![],
        };
        mixed.tokens.extend(&prompt);
        mixed.positions.extend(0..n);
        mixed.slots.extend(std::iter::repeat_n(1, prompt.len()));
        mixed.output_rows.push(n);
        v.push(("decode slot 0 + prompt slot 1".to_owned(), mixed));
        for s in 0..4 {
            v.push((
                format!("decode step {}", s + 2),
                BatchInputs {
                    tokens: vec![11 + s, 13 + s],
                    positions: vec![n + 1 + s, n + s],
                    slots: vec![0, 1],
                    output_rows: vec![0, 1],
                    ngram_rows: vec![],
                    logit_rows: vec![],
                },
            ));
        }
        v
    };
    let mut outcomes = Vec::new();
    for kv in [DType::F32, DType::F16] {
        let tol = cache_tol(kv, tol);
        // A context of 256: DeepSeek-V4's raw compressor rows must hold the 128 positions a
        // ratio-128 row reads (at 64 its Compress refuses every pass by name).
        let opts = LoadOptions {
            n_slots: 2,
            ctx_per_slot: 256,
            kv_type_k: kv,
            kv_type_v: kv,
            threads: 0,
            graphs: true,
            mlock: false,
            overrides: &[],
            check_tensors: false,
            draft_n_max: 0,
            draft_history: false,
        };
        let what = |p: &str| format!("model {} ({kv} cache): {p}", path.display());
        let eager_opts = LoadOptions {
            graphs: false,
            ..opts
        };
        let loaded = LoadedModel::load(reg, path, opts).and_then(|cpu| {
            Ok((
                cpu,
                LoadedModel::load_on(reg, path, opts, kernel)?,
                LoadedModel::load_on(reg, path, eager_opts, kernel)?,
            ))
        });
        let (mut cpu, mut dev, mut eager) = match loaded {
            Ok(pair) => pair,
            Err(e) => {
                outcomes.push(Outcome {
                    what: what("load"),
                    rel: f64::NAN,
                    tol,
                    error: Some(e.to_string()),
                    worst: None,
                });
                continue;
            }
        };
        let n_vocab = cpu.spec.hparams.n_vocab.max(1) as i32;
        let ngram = cpu.spec.ngram.clone().into_option();
        let mut record = Vec::new();
        for (name, batch) in &passes {
            let batch = &with_ngram_rows(in_vocab(batch, n_vocab), ngram.as_ref(), &mut record);
            let r = cpu
                .forward(batch)
                .and_then(|want| Ok((dev.forward(batch)?, want)));
            // A shape's second pass is captured into a device graph and later ones replay it:
            // the same pass launched op by op must give the same bits.
            let replayed = match (&r, eager.forward(batch)) {
                (Ok((got, _)), Ok(by_op)) => Outcome {
                    what: what(&format!("{name}: graph replay vs op by op, bit for bit")),
                    rel: if got
                        .iter()
                        .map(|v| v.to_bits())
                        .eq(by_op.iter().map(|v| v.to_bits()))
                    {
                        0.0
                    } else {
                        relative(got, &by_op).max(f64::MIN_POSITIVE)
                    },
                    tol: 0.0,
                    error: None,
                    worst: worst(got, &by_op),
                },
                (_, Err(e)) => Outcome {
                    what: what(&format!("{name}: op by op")),
                    rel: f64::NAN,
                    tol: 0.0,
                    error: Some(e.to_string()),
                    worst: None,
                },
                (Err(_), _) => Outcome {
                    what: what(&format!("{name}: op by op")),
                    rel: 0.0,
                    tol: 0.0,
                    error: Some("the graph pass failed".into()),
                    worst: None,
                },
            };
            outcomes.push(match r {
                Ok((got, want)) => Outcome {
                    what: what(name),
                    rel: relative(&got, &want),
                    tol,
                    error: None,
                    worst: worst(&got, &want),
                },
                Err(e) => Outcome {
                    what: what(name),
                    rel: f64::NAN,
                    tol,
                    error: Some(e.to_string()),
                    worst: None,
                },
            });
            outcomes.push(replayed);
        }
        outcomes.push(streamed_prompt(reg, path, opts, kernel, &mut dev, &what));
    }
    outcomes
}

/// `batch` with each token id taken modulo `n_vocab`.
fn in_vocab(batch: &bloomery_exec::BatchInputs, n_vocab: i32) -> bloomery_exec::BatchInputs {
    bloomery_exec::BatchInputs {
        tokens: batch.tokens.iter().map(|t| t % n_vocab).collect(),
        ..batch.clone()
    }
}

/// `batch` with the hashed n-gram row ids of a model that declares them (`ngram`), each row's
/// from the tokens before it in its slot, as the runtime fills them: `record` holds each slot's
/// tokens by position across the passes of one sequence of checks.
fn with_ngram_rows(
    mut batch: bloomery_exec::BatchInputs,
    ngram: Option<&bloomery_plugin_api::ngram::NgramSpec>,
    record: &mut Vec<Vec<u32>>,
) -> bloomery_exec::BatchInputs {
    let Some(spec) = ngram else {
        return batch;
    };
    batch.ngram_rows.clear();
    for ((&tok, &pos), &slot) in batch.tokens.iter().zip(&batch.positions).zip(&batch.slots) {
        let (slot, pos) = (slot as usize, pos as usize);
        if record.len() <= slot {
            record.resize(slot + 1, Vec::new());
        }
        let seq = &mut record[slot];
        seq.resize(pos, 0);
        spec.extend_rows(seq, &[tok as u32], &mut batch.ngram_rows);
        seq.push(tok as u32);
    }
    batch
}

/// Every routed expert on the host (`-cmoe`): a prompt long enough to stream each layer's stacks
/// through the card's staging sets runs the card's own products on the copies, so its logits
/// must equal the unsplit card's bit for bit, op by op and replayed from device graphs; a copy
/// that overwrote a set still in use, or a call that ran before its copy, would show.
fn streamed_prompt(
    reg: &bloomery_devices::Registry,
    path: &std::path::Path,
    opts: bloomery_exec::LoadOptions,
    kernel: &bloomery_devices::KernelPluginFile,
    dev: &mut bloomery_exec::LoadedModel,
    what: &dyn Fn(&str) -> String,
) -> Outcome {
    use bloomery_exec::BatchInputs;
    use bloomery_tiering::plan::TierRequest;
    let rows = 2 * bloomery_tiering::STREAM_MIN_ROWS as i32;
    let n_vocab = dev.spec.hparams.n_vocab.clamp(1, 500) as i32;
    let batch = with_ngram_rows(
        BatchInputs {
            tokens: (0..rows).map(|i| (i * 37 + 11) % n_vocab).collect(),
            positions: (0..rows).collect(),
            slots: vec![0; rows as usize],
            output_rows: (0..rows).collect(),
            ngram_rows: vec![],
            logit_rows: vec![],
        },
        dev.spec.ngram.as_ref().into_option(),
        &mut Vec::new(),
    );
    let name = what(&format!(
        "{rows}-row prompt with every expert on the host (streamed) vs on the card, bit for bit"
    ));
    let cmoe = TierRequest {
        cpu_moe: true,
        ..Default::default()
    };
    let r = bloomery_exec::LoadedModel::load_placed(reg, path, opts, kernel, &cmoe)
        .map_err(|e| e.to_string())
        .and_then(|mut split| {
            // Three passes: eager, captured and replayed (each segment's device graph is taken
            // on its second pass); all must give the unsplit card's logits.
            let mut got = Vec::new();
            for _ in 0..3 {
                got.extend(split.forward(&batch).map_err(|e| e.to_string())?);
            }
            let want = dev.forward(&batch).map_err(|e| e.to_string())?.repeat(3);
            Ok((got, want))
        });
    match r {
        Ok((got, want)) => Outcome {
            rel: if got
                .iter()
                .map(|v| v.to_bits())
                .eq(want.iter().map(|v| v.to_bits()))
            {
                0.0
            } else {
                relative(&got, &want).max(f64::MIN_POSITIVE)
            },
            worst: worst(&got, &want),
            what: name,
            tol: 0.0,
            error: None,
        },
        Err(e) => Outcome {
            what: name,
            rel: f64::NAN,
            tol: 0.0,
            error: Some(e),
            worst: None,
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_ids_wrap_into_a_small_vocabulary() {
        let batch = bloomery_exec::BatchInputs {
            tokens: vec![5, 271, 272, 509],
            positions: vec![0, 1, 2, 3],
            slots: vec![0; 4],
            output_rows: vec![3],
            ngram_rows: vec![],
            logit_rows: vec![],
        };
        let fit = super::in_vocab(&batch, 272);
        assert_eq!(fit.tokens, [5, 271, 0, 237]);
        assert_eq!(
            (fit.positions, fit.output_rows),
            (batch.positions, batch.output_rows)
        );
    }

    #[test]
    fn an_f16_cache_adds_to_the_model_tolerance_without_scaling_it() {
        use super::{cache_tol, DType};
        assert_eq!(cache_tol(DType::F32, 1e-5), 1e-5);
        assert!((cache_tol(DType::F16, 1e-5) - 1e-4).abs() < 1e-12);
        // A quantized file's 1e-1 stays near 1e-1 (it was 1.0: a check that could hardly fail).
        assert!(cache_tol(DType::F16, 1e-1) < 0.101);
    }
}
