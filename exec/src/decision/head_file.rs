//! A decision head from `joint_head.safetensors` and its `joint_head_config.json` (the form
//! Cloudflare publishes beside a `qwen35` backbone): tensors renamed and split as llama.cpp's
//! converter does (`conversion/clef.py`), the three learned scalars transformed into
//! `decision.scales`, every tensor checked by name and shape as the `clef` form's are, then
//! uploaded in f32 to the head's device.

use std::path::Path;

use bloomery_plugin_api::decision::weights::{
    declare, gguf_name, refuse_extra, split_in_proj, transform_scales, SCALAR_NAMES,
};
use bloomery_plugin_api::decision::{HeadHParams, TORCH_LAYER_NORM_EPS};
use bloomery_plugin_api::meta::{ModelFileView, TensorInfo};
use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::DType;
use safetensors::{Dtype, SafeTensors};

use super::placement::HeadHome;
use super::{device_err, DecisionError, DecisionHead};
use crate::model::LoadedModel;

/// The config file read beside the safetensors file.
pub const CONFIG_NAME: &str = "joint_head_config.json";

/// One tensor renamed to its GGUF name: extents (ne0 first) and f32 values.
struct Named {
    name: String,
    ne: [u64; 4],
    n_dims: u32,
    values: Vec<f32>,
}

/// Loads the head in `path` (its config `joint_head_config.json` beside it) for `model`, to run
/// on `home`.
pub fn load(
    model: &LoadedModel,
    path: &Path,
    home: HeadHome,
) -> Result<DecisionHead, DecisionError> {
    let shown = path.display().to_string();
    let err = |message: String| DecisionError::Load {
        source_name: shown.clone(),
        message,
    };
    let config_path = path.with_file_name(CONFIG_NAME);
    let config = std::fs::read(&config_path)
        .map_err(|e| err(format!("reading {}: {e}", config_path.display())))?;
    let config: serde_json::Value = serde_json::from_slice(&config)
        .map_err(|e| err(format!("{}: {e}", config_path.display())))?;
    let count = |key: &str| -> Result<u32, DecisionError> {
        config
            .get(key)
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| err(format!("{CONFIG_NAME}: `{key}` must be a whole number")))
    };
    let (n_routing, n_joint, n_head) =
        (count("routing_layers")?, count("layers")?, count("heads")?);

    let bytes = std::fs::read(path).map_err(|e| err(format!("reading it: {e}")))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| err(format!("not safetensors: {e}")))?;
    let mut named = Vec::new();
    let mut scalars = [None; 3];
    let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    names.sort();
    for name in &names {
        let t = st.tensor(name).map_err(|e| err(format!("`{name}`: {e}")))?;
        let values = to_f32(t.dtype(), t.data()).map_err(|m| err(format!("`{name}`: {m}")))?;
        if let Some(i) = SCALAR_NAMES.iter().position(|s| *s == name.as_str()) {
            if values.len() != 1 {
                return Err(err(format!(
                    "`{name}` has {} values, expected 1",
                    values.len()
                )));
            }
            scalars[i] = Some(f64::from(values[0]));
            continue;
        }
        let shape = t.shape();
        if shape.is_empty() || shape.len() > 4 {
            return Err(err(format!("`{name}` has shape {shape:?}")));
        }
        let mut ne = [1u64; 4];
        for (d, &x) in shape.iter().rev().enumerate() {
            ne[d] = x as u64;
        }
        let n_dims = shape.len() as u32;
        if let Some(parts) = split_in_proj(name, n_routing) {
            // Thirds along torch's first axis: ggml's last used one.
            let axis = n_dims as usize - 1;
            if ne[axis] % 3 != 0 {
                return Err(err(format!(
                    "`{name}` of shape {shape:?} does not split in three"
                )));
            }
            let third = values.len() / 3;
            let mut part_ne = ne;
            part_ne[axis] /= 3;
            for (i, part) in parts.into_iter().enumerate() {
                named.push(Named {
                    name: part,
                    ne: part_ne,
                    n_dims,
                    values: values[i * third..(i + 1) * third].to_vec(),
                });
            }
            continue;
        }
        let gguf = gguf_name(name, n_routing)
            .ok_or_else(|| err(format!("`{name}` is not a tensor of a Clef joint head")))?;
        named.push(Named {
            name: gguf,
            ne,
            n_dims,
            values,
        });
    }
    let mut raw = [0f64; 3];
    for (i, s) in scalars.iter().enumerate() {
        raw[i] = s.ok_or_else(|| err(format!("no scalar `{}`", SCALAR_NAMES[i])))?;
    }
    let scales = transform_scales(raw);
    named.push(Named {
        name: "decision.scales".into(),
        ne: [3, 1, 1, 1],
        n_dims: 1,
        values: scales.to_vec(),
    });

    let view = ModelFileView {
        metadata: Default::default(),
        tensors: named
            .iter()
            .map(|n| TensorInfo {
                name: n.name.as_str().into(),
                dtype: DType::F32,
                n_dims: n.n_dims,
                ne: n.ne,
            })
            .collect(),
    };
    let hp = HeadHParams::from_counts(
        &view,
        model.spec.hparams.n_embd,
        n_routing,
        n_joint,
        n_head,
        TORCH_LAYER_NORM_EPS,
    )
    .map_err(err)?;
    let mut table = WeightTable::new(&view);
    let weights = declare(&mut table, &hp).map_err(|e| err(e.to_string()))?;
    let decls = table.decls();
    let declared: Vec<&str> = decls.iter().map(|d| d.name.as_str()).collect();
    refuse_extra(&view, &declared).map_err(|e| err(e.to_string()))?;

    // Every declared tensor, in declaration order, in one device buffer.
    let mut offsets = Vec::new();
    let mut total = 0u64;
    for name in &declared {
        let n = named
            .iter()
            .find(|t| t.name == *name)
            .ok_or_else(|| err(format!("no `{name}`")))?;
        offsets.push(total);
        total += (n.values.len() as u64 * 4).div_ceil(64) * 64;
    }
    let buffer = home
        .device
        .alloc(total.max(64))
        .map_err(device_err("allocating the head's weights"))?;
    let mut bound = Vec::new();
    for (name, offset) in declared.iter().zip(offsets) {
        let n = named
            .iter()
            .find(|t| t.name == *name)
            .ok_or_else(|| err(format!("no `{name}`")))?;
        let data: Vec<u8> = n.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        home.device
            .write(&buffer, offset, &data)
            .map_err(device_err("uploading the head's weights"))?;
        let nb = TensorRef::contiguous_strides(DType::F32, n.ne)
            .ok_or_else(|| err(format!("`{name}`: no layout for {:?}", n.ne)))?;
        bound.push(TensorRef {
            buffer: buffer.handle,
            offset,
            dtype: DType::F32,
            ne: n.ne,
            nb,
        });
    }
    DecisionHead::assemble(model, home, hp, weights, scales, bound, Some(buffer), shown)
}

/// The values of a safetensors tensor as f32 (F32, F16 and BF16 tensors).
fn to_f32(dtype: Dtype, data: &[u8]) -> Result<Vec<f32>, String> {
    let pairs = || {
        data.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    Ok(match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => pairs().map(|b| half::f16::from_bits(b).to_f32()).collect(),
        Dtype::BF16 => pairs().map(|b| half::bf16::from_bits(b).to_f32()).collect(),
        other => return Err(format!("type {other:?} (F32, F16 or BF16 expected)")),
    })
}
