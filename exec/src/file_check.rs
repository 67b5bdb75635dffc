//! What the host checks of a file's hyperparameters against the tensors it holds before a model
//! plugin reads them: a plugin sizes its tables by them (a layer count of 2^31 − 1 asks for
//! terabytes before any tensor is looked at), and an allocation that fails inside a plugin ends
//! the process. A value the file's own tensors contradict is refused by name instead.

use bloomery_gguf::{check_tensor_data as check_data, GgufModel};

use crate::error::ModelError;

/// Layers the file's tensors name: one more than the largest `N` of a `blk.N.…` tensor (the
/// GGUF naming every architecture follows), or 0 without any.
fn layers_named(file: &GgufModel) -> u64 {
    file.tensors()
        .iter()
        .filter_map(|t| {
            let rest = t.info.name.strip_prefix("blk.")?;
            let (n, _) = rest.split_once('.')?;
            n.parse::<u64>().ok()
        })
        .max()
        .map_or(0, |n| n + 1)
}

/// Refuses a file whose `<arch>.block_count` exceeds the layers its tensors name and the MTP
/// layers it counts (`<arch>.nextn_predict_layers`: a file converted without its MTP weights
/// keeps them in the count, and llama.cpp loads it; the plugin checks its main layers against
/// the tensors).
pub fn check_hyperparameters(file: &GgufModel, arch: &str, shown: &str) -> Result<(), ModelError> {
    let key = format!("{arch}.block_count");
    let Some(declared) = file.metadata().get(&key).and_then(|v| v.as_uint()) else {
        // Absent or not an integer: the plugin names it.
        return Ok(());
    };
    let mtp_key = format!("{arch}.nextn_predict_layers");
    let mtp = file.metadata().get(&mtp_key).and_then(|v| v.as_uint());
    let named = layers_named(file);
    if declared > named.saturating_add(mtp.unwrap_or(0)) {
        return Err(ModelError::Hyperparameter {
            path: shown.to_owned(),
            key,
            value: declared,
            why: format!(
                "the file's tensors name {named} layers (blk.0 to blk.{})",
                named.saturating_sub(1)
            ),
        });
    }
    Ok(())
}

/// Checks every tensor's data as llama.cpp's `--check-tensors` does (no NaN or infinite value,
/// no such block scale), on up to `threads` threads (0: one per core); the first bad tensor in
/// file order is refused by name.
pub fn check_tensor_data(file: &GgufModel, shown: &str, threads: u32) -> Result<(), ModelError> {
    let tensors = file.tensors();
    let n = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t as usize,
    }
    .clamp(1, tensors.len().max(1));
    let first_bad = |i: usize| -> Result<Option<ModelError>, ModelError> {
        let t = &tensors[i];
        let data = file.tensor_data(t)?;
        Ok(check_data(t.info.dtype, data).err().map(|f| {
            let quantized = t.info.dtype.layout().is_some_and(|l| l.block > 1);
            ModelError::TensorData {
                path: shown.to_owned(),
                tensor: t.info.name.clone(),
                what: f.what,
                at: format!(
                    "{} {}",
                    if quantized { "block" } else { "element" },
                    f.index
                ),
            }
        }))
    };
    // Each thread takes every n-th tensor; the earliest fault in file order wins.
    let found: Vec<Result<Option<(usize, ModelError)>, ModelError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|k| {
                s.spawn(move || {
                    for i in (k..tensors.len()).step_by(n) {
                        if let Some(e) = first_bad(i)? {
                            return Ok(Some((i, e)));
                        }
                    }
                    Ok(None)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Ok(None)))
            .collect()
    });
    let mut worst: Option<(usize, ModelError)> = None;
    for r in found {
        if let Some((i, e)) = r? {
            if worst.as_ref().is_none_or(|(j, _)| i < *j) {
                worst = Some((i, e));
            }
        }
    }
    worst.map_or(Ok(()), |(_, e)| Err(e))
}
