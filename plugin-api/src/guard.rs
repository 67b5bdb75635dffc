//! The model plugin's export boundary: no panic unwinds into the host (an `extern "C"` function
//! that unwinds aborts the whole process). [`export_model_plugin!`](crate::export_model_plugin)
//! runs the loader under [`catch`] and wraps the loaded model in [`Guarded`], so a panic becomes
//! [`PluginError::Panicked`] naming the plugin, the entry point and the panic's message.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::std_types::RResult;

use crate::graph::{BatchShape, Graph};
use crate::model::{ModelInstance, ModelSpec};
use crate::PluginError;

/// Runs `f`; a panic inside it becomes [`PluginError::Panicked`] naming `plugin` and `entry`.
pub fn catch<T>(
    plugin: &str,
    entry: &str,
    f: impl FnOnce() -> Result<T, PluginError>,
) -> Result<T, PluginError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let text = panic_text(payload.as_ref());
        Err(PluginError::Panicked {
            plugin: plugin.into(),
            message: format!("in `{entry}`: {text}").into(),
        })
    })
}

/// The text a panic carries (`panic!` with a literal or a format string), or a placeholder.
pub(crate) fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// A loaded model whose entry points cannot unwind: its spec is taken once at load (under
/// [`catch`]) and handed out as a copy; each graph is built under [`catch`].
pub struct Guarded<M> {
    plugin: &'static str,
    model: M,
    spec: ModelSpec,
}

impl<M: ModelInstance> Guarded<M> {
    /// Wraps `model` of the plugin `plugin`, taking its spec now.
    pub fn new(plugin: &'static str, model: M) -> Result<Self, PluginError> {
        let spec = catch(plugin, "spec", || Ok(model.spec()))?;
        Ok(Guarded {
            plugin,
            model,
            spec,
        })
    }
}

impl<M: ModelInstance> ModelInstance for Guarded<M> {
    fn spec(&self) -> ModelSpec {
        self.spec.clone()
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        catch(self.plugin, "build_graph", || {
            self.model.build_graph(shape).into_result()
        })
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_naming_the_plugin_the_entry_and_the_message() {
        let e = catch::<()>("qwen3moe", "load", || {
            let width = std::hint::black_box(u32::MAX);
            Err(PluginError::invalid(format!(
                "{}",
                width.checked_mul(2).expect("the width fits")
            )))
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin `qwen3moe` panicked in `load`: the width fits"
        );
        let e = catch::<()>("gemma3", "build_graph", || panic!("{} heads", 3)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin `gemma3` panicked in `build_graph`: 3 heads"
        );
        assert_eq!(catch("x", "load", || Ok(5)), Ok(5));
    }
}
