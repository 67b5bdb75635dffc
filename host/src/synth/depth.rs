//! `bloomery synth --layers N`: a preset cut to its first `N` layers, for measuring a model at its
//! real widths with fewer layers than it has. Works on any plugin's preset by GGUF convention:
//! tensors `blk.{i}.*` with `i >= N` are dropped, `{arch}.block_count` loses as many layers (MTP
//! layers a preset counts without writing their weights stay counted), and every per-layer array
//! key (as long as the old `block_count`) keeps the entries of the layers that remain. MTP layers
//! a preset writes (the last `{arch}.nextn_predict_layers` of `block_count`, all named by its
//! tensors) stay too, renumbered to follow the first `N`.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::model::SynthPreset;

/// The layer index of a tensor named `blk.{i}.…`.
fn layer_of(name: &str) -> Option<u64> {
    let (n, _) = name.strip_prefix("blk.")?.split_once('.')?;
    n.parse().ok()
}

/// The value of the preset's key ending in `suffix` (`.block_count`), as an integer.
fn key_ending(preset: &SynthPreset, suffix: &str) -> Option<u64> {
    preset
        .metadata
        .iter()
        .find(|e| e.key.as_str().ends_with(suffix))
        .and_then(|e| e.value.as_u64())
}

/// `preset` with only its first `n` layers (and the MTP layers it writes); an error names what
/// does not fit (no layers named, `n` of 0 or above the trunk layers the preset writes, no
/// `block_count` key).
pub fn first_layers(preset: &SynthPreset, n: u64) -> Result<SynthPreset, String> {
    let named = preset
        .tensors
        .iter()
        .filter_map(|t| layer_of(&t.name))
        .max()
        .map_or(0, |i| i + 1);
    let count = key_ending(preset, ".block_count")
        .ok_or_else(|| format!("preset `{}` has no block_count", preset.name))?;
    let n_mtp = key_ending(preset, ".nextn_predict_layers").unwrap_or(0);
    // MTP layers the preset writes come after the trunk's: kept, renumbered after the cut.
    let written_mtp = if named == count && n_mtp < named {
        n_mtp
    } else {
        0
    };
    let trunk = named - written_mtp;
    if n == 0 || n > trunk {
        return Err(format!(
            "--layers {n}: preset `{}` writes {trunk} layers (1 to {trunk})",
            preset.name
        ));
    }
    let (dropped, extra) = (trunk - n, count.saturating_sub(named));
    let keep = |len: u64| (0..len).filter(move |&i| i < n || i >= trunk);
    let metadata = preset
        .metadata
        .iter()
        .map(|e| {
            let mut e = e.clone();
            match &e.value {
                _ if e.key.as_str().ends_with(".block_count") => {
                    e.value = MetaValue::U32((count - dropped) as u32);
                }
                MetaValue::Array(items) if items.len() as u64 == count && extra < count => {
                    let kept: RVec<MetaValue> =
                        keep(count).map(|i| items[i as usize].clone()).collect();
                    e.value = MetaValue::Array(kept);
                }
                _ => {}
            }
            e
        })
        .collect();
    let tensors = preset
        .tensors
        .iter()
        .filter_map(|t| match layer_of(&t.name) {
            None => Some(t.clone()),
            Some(i) if i < n => Some(t.clone()),
            Some(i) if i >= trunk => {
                let (_, rest) = t.name.strip_prefix("blk.")?.split_once('.')?;
                let mut t = t.clone();
                t.name = format!("blk.{}.{rest}", i - dropped).into();
                Some(t)
            }
            Some(_) => None,
        })
        .collect();
    Ok(SynthPreset {
        name: format!("{}-{n}l", preset.name).into(),
        description: format!("{} (first {n} layers)", preset.description).into(),
        metadata,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::meta::MetaEntry;
    use bloomery_plugin_api::model::{SynthTensor, WeightClass};

    fn preset(count: u32, named: u64) -> SynthPreset {
        let mut tensors = vec![SynthTensor::new(
            "token_embd.weight".into(),
            WeightClass::Embedding,
            &[4, 8],
        )];
        for i in 0..named {
            tensors.push(SynthTensor::new(
                format!("blk.{i}.attn_norm.weight"),
                WeightClass::Norm,
                &[4],
            ));
        }
        let per_layer: RVec<MetaValue> = (0..count).map(MetaValue::U32).collect();
        SynthPreset {
            name: "p".into(),
            description: "d".into(),
            metadata: vec![
                MetaEntry::new("a.block_count", MetaValue::U32(count)),
                MetaEntry::new("a.head_count_kv", MetaValue::Array(per_layer)),
            ]
            .into(),
            tensors: tensors.into(),
        }
    }

    #[test]
    fn layers_past_n_go_with_their_per_layer_entries_and_mtp_layers_stay_counted() {
        // 6 layers written, one more counted (an MTP layer without weights).
        let p = first_layers(&preset(7, 6), 2).unwrap();
        assert_eq!(p.metadata[0].value, MetaValue::U32(3));
        let kept: Vec<MetaValue> = [0, 1, 6].map(MetaValue::U32).to_vec();
        assert_eq!(p.metadata[1].value, MetaValue::Array(kept.into()));
        let names: Vec<&str> = p.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "token_embd.weight",
                "blk.0.attn_norm.weight",
                "blk.1.attn_norm.weight"
            ]
        );
        assert_eq!(first_layers(&preset(6, 6), 6).unwrap().tensors.len(), 7);
    }

    #[test]
    fn mtp_layers_the_preset_writes_stay_renumbered_after_the_cut() {
        // 5 trunk layers and one MTP layer, all written.
        let mut p = preset(6, 6);
        let mut meta = p.metadata.to_vec();
        meta.push(MetaEntry::new("a.nextn_predict_layers", MetaValue::U32(1)));
        p.metadata = meta.into();
        let cut = first_layers(&p, 2).unwrap();
        assert_eq!(cut.metadata[0].value, MetaValue::U32(3));
        let kept: Vec<MetaValue> = [0, 1, 5].map(MetaValue::U32).to_vec();
        assert_eq!(cut.metadata[1].value, MetaValue::Array(kept.into()));
        let names: Vec<&str> = cut.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "token_embd.weight",
                "blk.0.attn_norm.weight",
                "blk.1.attn_norm.weight",
                "blk.2.attn_norm.weight"
            ]
        );
        let e = first_layers(&p, 6).unwrap_err();
        assert!(e.contains("1 to 5"), "{e}");
    }

    #[test]
    fn a_depth_the_preset_cannot_give_is_refused_by_name() {
        for n in [0, 7] {
            let e = first_layers(&preset(6, 6), n).unwrap_err();
            assert!(e.contains("--layers") && e.contains("1 to 6"), "{e}");
        }
    }
}
