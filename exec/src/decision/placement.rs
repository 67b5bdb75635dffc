//! Where a decision head runs (`--decision-head-device cpu|gpu`): on the backbone's device by
//! default, or on a device of the other class, which then maps the model file itself (a head on
//! the CPU beside a backbone on the card reads its weights and the option rows of `output.weight`
//! from the mapped file, zero copy; the backbone's final-norm rows reach it through the host,
//! as they reach a head on the card).

use std::fmt;
use std::sync::Arc;

use bloomery_devices::{Buffer, Device, KernelPluginFile, Registry};
use bloomery_gguf::GgufModel;
use bloomery_plugin_api::kernel::{DeviceClass, DeviceConfig};
use bloomery_plugin_api::tensor::TensorRef;

use super::{device_err, DecisionError};
use crate::model::LoadedModel;
use crate::weights::weight_tensor;

/// Where a decision head runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadDevice {
    /// The CPU (the best CPU kernel plugin).
    Cpu,
    /// The card (the best GPU kernel plugin, the backbone's).
    Gpu,
}

impl HeadDevice {
    /// Reads `cpu` or `gpu`; the message names what was given.
    pub fn parse(s: &str) -> Result<HeadDevice, String> {
        match s {
            "cpu" => Ok(HeadDevice::Cpu),
            "gpu" => Ok(HeadDevice::Gpu),
            other => Err(format!(
                "--decision-head-device {other}: expected cpu or gpu"
            )),
        }
    }

    /// The device class of kernel plugins that run it.
    pub fn class(self) -> DeviceClass {
        match self {
            HeadDevice::Cpu => DeviceClass::Cpu,
            HeadDevice::Gpu => DeviceClass::Gpu,
        }
    }

    /// Where the head runs beside a backbone on `backbone`: `asked`, or the backbone's own
    /// device when nothing was asked. A head on the card over a backbone on the CPU is refused
    /// by name (the card's device is not open then).
    pub fn choose(asked: Option<HeadDevice>, backbone: DeviceClass) -> Result<HeadDevice, String> {
        let own = if backbone == DeviceClass::Gpu {
            HeadDevice::Gpu
        } else {
            HeadDevice::Cpu
        };
        match asked {
            None => Ok(own),
            Some(HeadDevice::Gpu) if own == HeadDevice::Cpu => Err(
                "--decision-head-device gpu: the backbone runs on the CPU; load it on the card \
                 (-ngl 99) to run the head there"
                    .into(),
            ),
            Some(d) => Ok(d),
        }
    }
}

impl fmt::Display for HeadDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HeadDevice::Cpu => "cpu",
            HeadDevice::Gpu => "gpu",
        })
    }
}

/// The device a head runs on, and the model file mapped on it when that is not the backbone's
/// device. Field order is drop order: the buffers go before the mapping they view.
pub struct HeadHome {
    /// The file's parts mapped on `device` (empty on the backbone's own device).
    parts: Vec<Buffer>,
    /// The device the head's graph runs on.
    pub device: Arc<Device>,
    /// The head's own mapping of the model file (on another device than the backbone's).
    file: Option<GgufModel>,
}

impl HeadHome {
    /// The device for a head of `model` running `on` that device class: the backbone's own
    /// when it is of that class, else the best kernel plugin of the class with the model file
    /// mapped on it.
    pub fn open(
        reg: &Registry,
        model: &LoadedModel,
        on: HeadDevice,
    ) -> Result<HeadHome, DecisionError> {
        let backbone_class = reg
            .kernels
            .iter()
            .find(|k| k.name == model.kernel_plugin())
            .map(|k| k.probe.class);
        if backbone_class == Some(on.class()) {
            return Ok(HeadHome::backbone(model));
        }
        let kernel = reg
            .best_kernel(on.class())
            .map_err(|e| DecisionError::Device {
                context: format!("opening a device for the decision head ({on})"),
                message: e.to_string(),
            })?;
        HeadHome::on_plugin(model, kernel)
    }

    /// The backbone's own device.
    pub fn backbone(model: &LoadedModel) -> HeadHome {
        HeadHome {
            parts: Vec::new(),
            device: Arc::clone(&model.device),
            file: None,
        }
    }

    /// A device of `kernel`, apart from the backbone's, with the model file mapped again and
    /// each part mapped on the device (zero copy on the CPU).
    pub fn on_plugin(
        model: &LoadedModel,
        kernel: &KernelPluginFile,
    ) -> Result<HeadHome, DecisionError> {
        let device = Device::open(
            kernel,
            DeviceConfig {
                index: 0,
                threads: model.options.threads,
                // The backbone's device may hold pinned workers of its own.
                pin_threads: false,
            },
        )
        .map_err(device_err("opening the decision head's device"))?;
        let path = model.file.parts()[0].path().to_path_buf();
        let file = GgufModel::open(&path).map_err(|e| DecisionError::Load {
            source_name: path.display().to_string(),
            message: format!("mapping it for the decision head: {e}"),
        })?;
        let mut parts = Vec::new();
        for part in file.parts() {
            let bytes = part.bytes();
            // SAFETY: the mapping is `file`, kept in this HeadHome and dropped after the buffers
            // (field order); it is read-only and never written.
            let buf = unsafe { device.map_host(bytes.as_ptr(), bytes.len() as u64) }
                .map_err(device_err("mapping the model file for the decision head"))?;
            parts.push(buf);
        }
        tracing::info!(
            "decision head on {} (the backbone runs on {})",
            device.plugin,
            model.kernel_plugin()
        );
        Ok(HeadHome {
            parts,
            device,
            file: Some(file),
        })
    }

    /// The tensor of `model`'s weight `name` on this device: the backbone's own resolved
    /// weight, or the file's tensor in this device's mapping.
    pub(crate) fn weight(
        &self,
        model: &LoadedModel,
        name: &str,
    ) -> Result<Option<TensorRef>, DecisionError> {
        let Some(file) = &self.file else {
            return Ok(model.weight_ref(name));
        };
        if model.weight_ref(name).is_none() {
            return Ok(None);
        }
        let (t, ne, nb) =
            weight_tensor(file, &model.spec, name).map_err(|e| DecisionError::Load {
                source_name: "decision head".into(),
                message: e.to_string(),
            })?;
        Ok(Some(TensorRef {
            buffer: self.parts[t.part].handle,
            offset: t.info.start,
            dtype: t.info.dtype,
            ne,
            nb,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_follows_the_backbone_unless_asked_and_never_goes_to_an_unopened_card() {
        use DeviceClass::{Cpu, Gpu};
        assert_eq!(HeadDevice::choose(None, Gpu), Ok(HeadDevice::Gpu));
        assert_eq!(HeadDevice::choose(None, Cpu), Ok(HeadDevice::Cpu));
        assert_eq!(
            HeadDevice::choose(Some(HeadDevice::Cpu), Gpu),
            Ok(HeadDevice::Cpu)
        );
        assert_eq!(
            HeadDevice::choose(Some(HeadDevice::Cpu), Cpu),
            Ok(HeadDevice::Cpu)
        );
        let e = HeadDevice::choose(Some(HeadDevice::Gpu), Cpu).unwrap_err();
        assert!(e.contains("--decision-head-device gpu"), "{e}");
        assert_eq!(HeadDevice::parse("gpu"), Ok(HeadDevice::Gpu));
        assert!(HeadDevice::parse("cuda").unwrap_err().contains("cuda"));
    }
}
