//! Which layers are Gated DeltaNet and which are gated GQA over the QSA selection: the flags of
//! `attention.recurrent_layers` (or every `full_attention_interval`-th trunk layer attention,
//! as llama.cpp b11434 falls back to), with `attention.compress_ratios` naming the QSA block size
//! on exactly the attention layers.
//!
//! The all-zero `compress_ratios` trap (issue 47): transformers ≥ 5.2x renames the layer type
//! "full_attention" to "indexed_attention" and the b11434 converter then writes a ratio of 0 on
//! every layer; llama.cpp runs such a file as dense attention without a word. It is refused here
//! by name, as is any attention layer without a ratio.

use bloomery_plugin_api::hparams::ArchKeys;
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::PluginError;

/// What a layer mixes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (linear attention).
    Gdn,
    /// Gated GQA over the QSA indexer's selection.
    Qsa,
}

/// The one QSA block size of the model, from `attention.compress_ratios` (one value per layer,
/// MTP block included): every non-zero value equal, at least 2; all zero is the converter trap.
pub fn ratio(keys: &ArchKeys<'_>, n_all: u32) -> Result<u32, PluginError> {
    const KEY: &str = "attention.compress_ratios";
    let ratios = per_layer(keys, KEY, n_all)?;
    let mut ratio = 0;
    for &r in ratios.iter().filter(|&&r| r != 0) {
        keys.check(ratio == 0 || r == ratio, KEY, || {
            format!("{ratios:?}: the QSA layers must share one ratio")
        })?;
        ratio = r;
    }
    keys.check(ratio != 0, KEY, || {
        format!(
            "{ratios:?} is all zero: the converter's trap (transformers ≥ 5.2x renamed \
             \"full_attention\" to \"indexed_attention\"), which would run QSA as dense \
             attention; reconvert with the rename undone"
        )
    })?;
    keys.check(ratio >= 2, KEY, || {
        format!("{ratios:?}: a ratio of {ratio} pools nothing (at least 2)")
    })?;
    Ok(ratio)
}

/// Each layer's kind, trunk then MTP block: the MTP block must be a QSA layer, and a layer has a
/// compress ratio exactly when it is an attention layer.
pub fn read(keys: &ArchKeys<'_>, n_layer: u32, n_mtp: u32) -> Result<Vec<LayerKind>, PluginError> {
    let n_all = n_layer + n_mtp;
    let recurrent = recurrent(keys, n_layer, n_all)?;
    let ratios = per_layer(keys, "attention.compress_ratios", n_all)?;
    let mut kinds = Vec::with_capacity(n_all as usize);
    for (il, (&rec, &r)) in recurrent.iter().zip(&ratios).enumerate() {
        keys.check(rec == (r == 0), "attention.compress_ratios", || {
            let what = if rec { "a Gated DeltaNet" } else { "an attention" };
            format!("layer {il} is {what} layer with ratio {r} (ratios go on exactly the attention layers)")
        })?;
        kinds.push(if rec { LayerKind::Gdn } else { LayerKind::Qsa });
    }
    if n_mtp > 0 {
        keys.check(
            kinds.last() == Some(&LayerKind::Qsa),
            "attention.recurrent_layers",
            || {
                format!(
                    "the MTP block (layer {}) must be an attention layer",
                    n_all - 1
                )
            },
        )?;
    }
    Ok(kinds)
}

/// One recurrent flag per layer: `attention.recurrent_layers` (booleans or integers, one per
/// layer), else trunk layer `i` recurrent unless `(i + 1)` is a multiple of
/// `full_attention_interval` (default 4, positive), the MTP block never.
fn recurrent(keys: &ArchKeys<'_>, n_layer: u32, n_all: u32) -> Result<Vec<bool>, PluginError> {
    const KEY: &str = "attention.recurrent_layers";
    if keys.get(KEY).is_some() {
        return Ok(per_layer(keys, KEY, n_all)?
            .iter()
            .map(|&f| f != 0)
            .collect());
    }
    let interval = keys.positive_or("full_attention_interval", 4)?;
    Ok((0..n_all)
        .map(|i| i < n_layer && !(i + 1).is_multiple_of(interval))
        .collect())
}

/// An array of exactly `n_all` non-negative integers (or booleans) under `name`.
fn per_layer(keys: &ArchKeys<'_>, name: &str, n_all: u32) -> Result<Vec<u32>, PluginError> {
    let Some(MetaValue::Array(items)) = keys.get(name) else {
        return Err(keys.bad(name, "an array of one value per layer"));
    };
    keys.check(items.len() == n_all as usize, name, || {
        format!("{} values for {n_all} layers", items.len())
    })?;
    keys.u32_array_or_empty(name)
}
