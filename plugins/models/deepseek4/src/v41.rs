//! What a `deepseek41` file (DeepSeek-V4.1-Flash) adds to the `deepseek4` hyperparameters
//! (`docs/deepseek41-plan.md`): which layers are compressor and index sources and which source
//! each compressed layer reads, the optional candidate-mask keys (refused), and the Engram
//! ([`crate::engram`]).
//!
//! The sources are read from the tensors, the plan's **Choice** (no key in the seed's list names
//! them): a layer carrying `attn_compressor_kv` compresses rows, one carrying `indexer.attn_q_b`
//! picks them; a compressed layer without them reads the nearest source below it. A compressor
//! source is always an index source (it makes the index keys of its rows: the plan's source S6).

use bloomery_plugin_api::hparams::ArchKeys;
use bloomery_plugin_api::PluginError;

use crate::engram::Engram;
use crate::layers::Ratio;

/// The tensor that makes a layer a compressor source.
pub const COMPRESSOR_TENSOR: &str = "attn_compressor_kv.weight";
/// The tensor that makes a layer an index source.
pub const INDEX_TENSOR: &str = "indexer.attn_q_b.weight";
/// The prefix of the two-level candidate mask's keys, which no source here explains.
const CANDIDATE_PREFIX: &str = "attention.candidate_";

/// The V4.1 part of the hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct V41 {
    /// Per layer: the layer whose compressed rows it reads (itself on a source; `None` on a
    /// window-only layer).
    pub comp_source: Vec<Option<u32>>,
    /// Per layer: the layer whose indexer picks its compressed rows (itself on an index layer;
    /// `None` on a window-only layer).
    pub index_source: Vec<Option<u32>>,
    /// The Engram sites and hash constants.
    pub engram: Engram,
}

impl V41 {
    /// Whether layer `il` compresses rows (its cache is read by its group).
    pub fn is_comp_source(&self, il: u32) -> bool {
        self.comp_source.get(il as usize) == Some(&Some(il))
    }

    /// Whether layer `il` runs an indexer (its picks are read by the layers after it).
    pub fn is_index_source(&self, il: u32) -> bool {
        self.index_source.get(il as usize) == Some(&Some(il))
    }
}

/// Reads the sources from the tensors and refuses the candidate-mask keys by name.
pub fn read(keys: &ArchKeys<'_>, ratios: &[Ratio], engram: Engram) -> Result<V41, PluginError> {
    if let Some(e) = keys.view().metadata.iter().find(|e| {
        e.key
            .as_str()
            .strip_prefix(&keys.key(""))
            .is_some_and(|k| k.starts_with(CANDIDATE_PREFIX))
    }) {
        return Err(PluginError::invalid(format!(
            "`{}`: the two-level candidate mask is not supported (no source here gives its \
             math; docs/deepseek41-plan.md)",
            e.key
        )));
    }
    let has = |il: usize, t: &str| keys.view().tensor(&format!("blk.{il}.{t}")).is_some();
    let comp_source = sources(ratios, |il| has(il, COMPRESSOR_TENSOR), "compressor")?;
    let index_source = sources(ratios, |il| has(il, INDEX_TENSOR), "index")?;
    for il in 0..ratios.len() as u32 {
        if comp_source[il as usize] == Some(il) && index_source[il as usize] != Some(il) {
            return Err(PluginError::invalid(format!(
                "deepseek41 layer {il}: a compressor source without its indexer \
                 (`blk.{il}.{INDEX_TENSOR}`): a source makes the index keys of its rows"
            )));
        }
    }
    Ok(V41 {
        comp_source,
        index_source,
        engram,
    })
}

/// Per layer, the source it reads: itself when `is_source`, else the nearest source below with
/// the same ratio. A source on a window-only layer, or a compressed layer with no source below,
/// is refused by name.
fn sources(
    ratios: &[Ratio],
    is_source: impl Fn(usize) -> bool,
    what: &str,
) -> Result<Vec<Option<u32>>, PluginError> {
    let mut last: Option<u32> = None;
    let mut out = Vec::with_capacity(ratios.len());
    for (il, &r) in ratios.iter().enumerate() {
        let src = is_source(il);
        if r == Ratio::Window {
            if src {
                return Err(PluginError::invalid(format!(
                    "deepseek41 layer {il}: a {what} source on a window-only layer (ratio 0)"
                )));
            }
            out.push(None);
            continue;
        }
        if src {
            last = Some(il as u32);
        }
        let s = last.ok_or_else(|| {
            PluginError::invalid(format!(
                "deepseek41 layer {il}: compressed (ratio {}) with no {what} source at or below \
                 it",
                r.positions()
            ))
        })?;
        if ratios[s as usize] != r {
            return Err(PluginError::invalid(format!(
                "deepseek41 layer {il}: ratio {} reads the {what} source layer {s} of ratio {}",
                r.positions(),
                ratios[s as usize].positions()
            )));
        }
        out.push(Some(s));
    }
    Ok(out)
}
