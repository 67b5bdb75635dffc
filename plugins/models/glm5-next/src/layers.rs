//! Which kind each layer is: `attention.head_count_kv[l]` 0 marks a KDA layer, 1 an MLA layer;
//! `attention.indexer.types[l]` says whether an MLA layer runs its own indexer (full) or reuses
//! the selection of the previous full MLA layer (shared). The NextN layer is MLA with a full
//! indexer (llama.cpp b11434 `glm5-next.cpp`).

use bloomery_plugin_api::hparams::ArchKeys;
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::PluginError;

/// One layer's mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Kimi Delta Attention.
    Kda,
    /// NoPE latent attention over the indexer's selection.
    Mla {
        /// The layer runs its own indexer (else it reuses the previous full layer's selection).
        full_indexer: bool,
    },
}

/// Reads the kinds of `n_layer` trunk layers and `n_mtp` NextN layers after them.
pub fn read(keys: &ArchKeys<'_>, n_layer: u32, n_mtp: u32) -> Result<Vec<LayerKind>, PluginError> {
    const KV: &str = "attention.head_count_kv";
    const TYPES: &str = "attention.indexer.types";
    let n_all = n_layer + n_mtp;
    let kv = match keys.get(KV) {
        Some(MetaValue::Array(_)) => {
            let v = keys.u32_array_or_empty(KV)?;
            keys.check(v.len() == n_all as usize, KV, || {
                format!("{} values for {n_all} layers", v.len())
            })?;
            v
        }
        _ => vec![keys.u32(KV)?; n_all as usize],
    };
    let types = keys.u32_array_or_empty(TYPES)?;
    keys.check(
        types.is_empty() || types.len() == n_layer as usize || types.len() == n_all as usize,
        TYPES,
        || format!("{} flags for {n_layer} trunk layers", types.len()),
    )?;
    let mut kinds = Vec::with_capacity(kv.len());
    let mut full_before = false;
    for (il, &n) in kv.iter().enumerate() {
        let nextn = il >= n_layer as usize;
        let kind = match n {
            0 if !nextn => LayerKind::Kda,
            1 => {
                let full = nextn || types.get(il).is_none_or(|&t| t != 0);
                keys.check(full || full_before, TYPES, || {
                    format!("layer {il}: a shared indexer with no full-indexer MLA layer before it")
                })?;
                full_before |= full;
                LayerKind::Mla { full_indexer: full }
            }
            _ => {
                return Err(keys.bad(
                    KV,
                    format!(
                        "layer {il}: {n} KV heads (0 marks a KDA layer, 1 an MLA layer; the \
                         NextN layer is MLA)"
                    ),
                ))
            }
        };
        kinds.push(kind);
    }
    Ok(kinds)
}
