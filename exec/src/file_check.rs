//! What the host checks of a file's hyperparameters against the tensors it holds before a model
//! plugin reads them: a plugin sizes its tables by them (a layer count of 2^31 − 1 asks for
//! terabytes before any tensor is looked at), and an allocation that fails inside a plugin ends
//! the process. A value the file's own tensors contradict is refused by name instead.

use bloomery_gguf::GgufModel;

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
