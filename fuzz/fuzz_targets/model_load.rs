//! Fuzz target: the model plugins' loaders over arbitrary GGUF headers. The input is a header
//! (`bloomery_gguf::parse_prefix`, tensor data left out, so the seeds are the tiny synth files'
//! headers); whatever it declares goes, as the host's file view, to the plugin that serves its
//! `general.architecture`, loaded from `target/debug/plugins` as the host loads it. A loader must
//! refuse with a named error or give a model whose spec and graphs build: a panic caught at the
//! plugin's boundary (`PluginError::Panicked`) is a crash here, and an abort or an allocation
//! past libFuzzer's `-malloc_limit_mb` is one anyway.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use bloomery_devices::Registry;
use bloomery_plugin_api::graph::{BatchShape, GraphKind};
use bloomery_plugin_api::PluginError;
use libfuzzer_sys::fuzz_target;

/// The plugins `cargo xtask plugins` gathers.
fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/plugins");
        Registry::load(&dir).expect("the plugins: run `cargo xtask plugins` first")
    })
}

/// A named error is fine; a caught panic is the crash this target looks for.
fn named(r: Result<(), PluginError>) {
    if let Err(e @ PluginError::Panicked { .. }) = r {
        panic!("{e}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(h) = bloomery_gguf::parse_prefix(data, 1 << 40, "fuzz.gguf") else {
        return;
    };
    let view = bloomery_exec::view::header_view(&h.metadata, h.tensors.iter());
    let Ok(arch) = view.architecture() else {
        return;
    };
    let Ok(plugin) = registry().model_for(arch) else {
        return;
    };
    let m = match plugin.module.load()(&view).into_result() {
        Ok(m) => m,
        Err(e) => return named(Err(e)),
    };
    let _ = m.spec();
    for (n_rows, n_outputs) in [(1, 1), (3, 1)] {
        let shape = BatchShape {
            n_rows,
            n_outputs,
            kind: GraphKind::Main,
        };
        named(m.build_graph(shape).into_result().map(drop));
    }
});
