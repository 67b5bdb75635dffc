//! The PLE n-gram table's hyperparameters (`ple.*`, `embedding_length_per_layer_input`), as
//! llama.cpp b11434 reads them: one layer (0-based, a Gated DeltaNet layer of the trunk), `n`-gram
//! sizes 2 to `ngram_size` with `heads_per_ngram` heads each, the hash constants (one multiplier
//! per context token, one offset and one prime row count per head), the end id that stands for a
//! missing or reset predecessor, and the dilated convolution's taps. A file without `ple.layers`
//! (an MTP file) has no table.

use bloomery_plugin_api::hparams::{ArchKeys, LmHParams};
use bloomery_plugin_api::ngram::{NgramSpec, MAX_NGRAM};
use bloomery_plugin_api::PluginError;

use crate::layers::LayerKind;

/// The most heads llama.cpp accepts (`LLAMA_MAX_PLE_HEADS`).
const MAX_HEADS: u32 = 64;
/// Rows of the table are addressed as `i32` by llama.cpp's gather: every head's range ends below.
const MAX_ROW: u64 = i32::MAX as u64;

/// The table's GGUF name.
pub const TABLE: &str = "per_layer_token_embd.weight";

/// The n-gram table layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Ple {
    /// The layer it is added before the attention mixer of (`ple.layers`, one entry, 0-based).
    pub layer: u32,
    /// Longest n-gram (`ple.ngram_size`, 2 to 8): context tokens read are `ngram_size − 1`.
    pub ngram_size: u32,
    /// Heads per n-gram size (`ple.heads_per_ngram`).
    pub heads_per_ngram: u32,
    /// One head's row width (`embedding_length_per_layer_input`); all heads' rows side by side
    /// are `n_embd` wide.
    pub head_dim: u32,
    /// Taps of the dilated causal convolution (`ple.conv_kernel`); its dilation is `ngram_size`.
    pub conv_kernel: u32,
    /// The end id (`ple.eos_token_id`): a missing predecessor, and every one at or before this
    /// token, hashes as it.
    pub eos: u32,
    /// The id an embedding input hashes as (`ple.image_token_id`; the end id when absent or 0).
    pub image_token: u32,
    /// One multiplier per context position (`ple.layer_multipliers`, `ngram_size` values).
    pub multipliers: Vec<u64>,
    /// Each head's first row (`ple.head_offsets`).
    pub head_offsets: Vec<u64>,
    /// Each head's row count, the hash modulus (`ple.head_vocab_sizes`, positive).
    pub head_sizes: Vec<u64>,
    /// Rows of `per_layer_token_embd` (the file's, at least every head's range end; a synthetic
    /// file's: the largest range end padded up to a multiple of 128, as the converter pads).
    pub rows: u64,
}

impl Ple {
    /// Heads: `(ngram_size − 1) · heads_per_ngram`.
    pub fn n_heads(&self) -> u32 {
        (self.ngram_size - 1) * self.heads_per_ngram
    }

    /// The row-id constants the host hashes with ([`bloomery_plugin_api::ngram`]).
    pub fn spec(&self) -> NgramSpec {
        NgramSpec {
            ngram_size: self.ngram_size,
            heads_per_ngram: self.heads_per_ngram,
            end_id: self.eos,
            cut_at_end: true,
            tables: 1,
            token_map: Default::default(),
            multipliers: self.multipliers.clone().into(),
            head_sizes: self.head_sizes.clone().into(),
            head_offsets: self.head_offsets.clone().into(),
        }
    }

    /// Rows of the convolution history: `(conv_kernel − 1) · ngram_size` (the dilation).
    pub fn conv_history(&self) -> u64 {
        u64::from(self.conv_kernel - 1) * u64::from(self.ngram_size)
    }
}

/// Reads the table's keys when `ple.layers` is present (else `None`).
pub fn read(
    keys: &ArchKeys<'_>,
    lm: &LmHParams,
    kinds: &[LayerKind],
    n_stream: u32,
) -> Result<Option<Ple>, PluginError> {
    if keys.get("ple.layers").is_none() {
        return Ok(None);
    }
    let layers = keys.u32_array_or_empty("ple.layers")?;
    let layer = match layers[..] {
        [l] => l,
        _ => return Err(keys.bad("ple.layers", format!("{layers:?}: exactly one PLE layer"))),
    };
    keys.check(
        layer < lm.n_layer && kinds.get(layer as usize) == Some(&LayerKind::Gdn),
        "ple.layers",
        || {
            format!(
                "layer {layer}: a Gated DeltaNet layer of the {} trunk layers",
                lm.n_layer
            )
        },
    )?;
    let ngram_size = keys.u32("ple.ngram_size")?;
    keys.check(
        (2..=MAX_NGRAM).contains(&ngram_size),
        "ple.ngram_size",
        || format!("{ngram_size} (2 to {MAX_NGRAM})"),
    )?;
    let heads_per_ngram = keys.positive("ple.heads_per_ngram")?;
    let n_heads = u64::from(ngram_size - 1) * u64::from(heads_per_ngram);
    keys.check(
        n_heads <= u64::from(MAX_HEADS),
        "ple.heads_per_ngram",
        || format!("{heads_per_ngram} per n-gram size make {n_heads} heads (at most {MAX_HEADS})"),
    )?;
    let head_dim = keys.positive("embedding_length_per_layer_input")?;
    keys.check(
        n_heads * u64::from(head_dim) == u64::from(lm.n_embd),
        "embedding_length_per_layer_input",
        || {
            format!(
                "{n_heads} heads × {head_dim} is not the hidden width {}",
                lm.n_embd
            )
        },
    )?;
    let conv_kernel = keys.u32("ple.conv_kernel")?;
    keys.check(conv_kernel >= 2, "ple.conv_kernel", || {
        format!("{conv_kernel} taps (at least 2)")
    })?;
    keys.carried_by("ple.conv_kernel", conv_kernel, "ple_conv1d.weight", 0)?;
    let eos = token(keys, "ple.eos_token_id", lm.n_vocab)?;
    let image_token = match keys.get("ple.image_token_id") {
        None => eos,
        Some(_) => match token(keys, "ple.image_token_id", lm.n_vocab)? {
            0 => eos,
            t => t,
        },
    };
    let multipliers = keys.u64_array("ple.layer_multipliers", ngram_size as usize)?;
    // transformers draws each multiplier below 2^63 / vocab, so no product with a token id
    // wraps as i64 (where its remainder and llama.cpp's u64 one would part).
    let top = u64::from(lm.n_vocab - 1);
    keys.check(
        multipliers
            .iter()
            .all(|&m| m.checked_mul(top).is_some_and(|p| p <= i64::MAX as u64)),
        "ple.layer_multipliers",
        || format!("{multipliers:?}: a product with token id {top} exceeds 2^63 − 1"),
    )?;
    let head_offsets = keys.u64_array("ple.head_offsets", n_heads as usize)?;
    let head_sizes = keys.u64_array("ple.head_vocab_sizes", n_heads as usize)?;
    let mut end = 0;
    for (h, (&o, &s)) in head_offsets.iter().zip(&head_sizes).enumerate() {
        let e = o.checked_add(s).filter(|&e| s > 0 && e <= MAX_ROW);
        let e = e.ok_or_else(|| {
            keys.bad(
                "ple.head_vocab_sizes",
                format!("head {h}: rows {o} + {s} (a positive count ending at most at {MAX_ROW})"),
            )
        })?;
        end = end.max(e);
    }
    let rows = match keys.view().tensor(TABLE) {
        Some(t) => {
            keys.check(t.ne[1] >= end, "ple.head_vocab_sizes", || {
                format!(
                    "head ranges end at row {end}, but `{TABLE}` has {} rows",
                    t.ne[1]
                )
            })?;
            t.ne[1]
        }
        None => end.div_ceil(128) * 128,
    };
    let width = u64::from(n_stream) * u64::from(lm.n_embd);
    let t = keys.view().first_layer_tensor("ple_key.weight");
    keys.agrees(
        "hyper_connection.count",
        u64::from(n_stream),
        Some(width),
        t,
        1,
    )?;
    Ok(Some(Ple {
        layer,
        ngram_size,
        heads_per_ngram,
        head_dim,
        conv_kernel,
        eos,
        image_token,
        multipliers,
        head_offsets,
        head_sizes,
        rows,
    }))
}

/// A token id under `name`, below the vocabulary size.
fn token(keys: &ArchKeys<'_>, name: &str, n_vocab: u32) -> Result<u32, PluginError> {
    let t = keys.u32(name)?;
    keys.check(t < n_vocab, name, || {
        format!("{t} is not a token of the {n_vocab}-token vocabulary")
    })?;
    Ok(t)
}
