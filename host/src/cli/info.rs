//! `bloomery info -m FILE`: what a model file holds and which plugins serve it.

use std::fmt::Write as _;
use std::path::Path;

use bloomery_gguf::{Array, GgufModel, Value};
use bloomery_plugin_api::graph::{BatchShape, GraphKind};
use bloomery_plugin_api::kernel::DeviceClass;

use super::Cli;
use bloomery_devices::Registry;
use bloomery_exec::instantiate;
use bloomery_exec::support::missing_kernels;

/// Prints the report.
pub fn run(cli: &Cli, model: &Path) -> anyhow::Result<()> {
    let file = GgufModel::open(model)?;
    let reg = Registry::load_all(&cli.plugin_dirs());
    let mut out = String::new();
    describe_file(&mut out, model, &file);
    for w in rotary_warnings(&file) {
        let _ = writeln!(out, "\nwarning: {w}");
    }
    match reg {
        Ok(reg) => describe_support(&mut out, &reg, &file),
        Err(e) => {
            let _ = writeln!(out, "\nplugins: {e}");
        }
    }
    print!("{out}");
    Ok(())
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn short_value(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() > 80 => {
            format!("{:?}… ({} bytes)", &s[..s.floor_char_boundary(60)], s.len())
        }
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => short_array(a),
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        Value::Bool(x) => x.to_string(),
    }
}

fn short_array(a: &Array) -> String {
    let n = a.len();
    let head = |items: Vec<String>| {
        let more = if n > items.len() { ", …" } else { "" };
        format!(
            "[{}{more}] ({n} × {})",
            items.join(", "),
            a.elem_type().name()
        )
    };
    match a {
        Array::String(v) => head(v.iter().take(4).map(|s| format!("{s:?}")).collect()),
        Array::U32(v) => head(v.iter().take(8).map(|x| x.to_string()).collect()),
        Array::I32(v) => head(v.iter().take(8).map(|x| x.to_string()).collect()),
        Array::F32(v) => head(v.iter().take(8).map(|x| x.to_string()).collect()),
        Array::Bool(v) => head(v.iter().take(8).map(|x| x.to_string()).collect()),
        _ => head(Vec::new()),
    }
}

fn describe_file(out: &mut String, path: &Path, file: &GgufModel) {
    let parts = file.parts();
    let total: u64 = parts.iter().map(|p| p.bytes().len() as u64).sum();
    let _ = writeln!(
        out,
        "file: {} ({}, {} part(s))",
        path.display(),
        human(total),
        parts.len()
    );
    if let Some(p) = parts.first() {
        let h = p.header();
        let _ = writeln!(out, "GGUF version {}, alignment {}", h.version, h.alignment);
    }
    let _ = writeln!(out, "\nmetadata ({} keys):", file.metadata().len());
    for e in file.metadata().entries() {
        let _ = writeln!(out, "  {:<48} {}", e.key, short_value(&e.value));
    }
    let _ = writeln!(out, "\ntensors ({}):", file.tensors().len());
    let mut by_type: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for t in file.tensors() {
        let shape: Vec<String> = t.info.shape.iter().map(|x| x.to_string()).collect();
        let _ = writeln!(
            out,
            "  {:<40} {:<8} [{}] {}",
            t.info.name,
            t.info.dtype.to_string(),
            shape.join(", "),
            human(t.info.size)
        );
        let e = by_type.entry(t.info.dtype.to_string()).or_default();
        e.0 += 1;
        e.1 += t.info.size;
    }
    let _ = writeln!(out, "\nbytes by type:");
    for (t, (n, b)) in by_type {
        let _ = writeln!(out, "  {t:<8} {n:>5} tensors  {}", human(b));
    }
}

/// Warnings about a file whose keys look converted wrongly. A `solar-open` vocabulary (Solar-Open,
/// architecture `glm4moe`) whose `rope.dimension_count` is below the head width was most likely
/// converted without `partial_rotary_factor` in its config: llama.cpp's converter then writes half
/// the head, and the file is run as written (as llama.cpp runs it), unlike transformers, which
/// rotates the whole head.
fn rotary_warnings(file: &GgufModel) -> Vec<String> {
    let meta = file.metadata();
    let (Ok(arch), Ok("solar-open")) = (
        meta.get_str("general.architecture"),
        meta.get_str("tokenizer.ggml.pre"),
    ) else {
        return Vec::new();
    };
    let key = |k: &str| format!("{arch}.{k}");
    let uint = |k: &str| meta.get_uint(&key(k)).ok();
    let head_dim = uint("attention.key_length").or_else(|| {
        let (e, h) = (uint("embedding_length")?, uint("attention.head_count")?);
        e.checked_div(h)
    });
    match (uint("rope.dimension_count"), head_dim) {
        (Some(rot), Some(hd)) if rot < hd => vec![format!(
            "`{}` is {rot}, below the head width {hd}, with a `solar-open` vocabulary: Solar-Open \
             rotates the whole head, so this file was probably converted without \
             `partial_rotary_factor: 1.0` in its config; it runs as written, rotating {rot} of \
             {hd} dims (as llama.cpp does), and its outputs will differ from the released model's",
            key("rope.dimension_count")
        )],
        _ => Vec::new(),
    }
}

fn describe_support(out: &mut String, reg: &Registry, file: &GgufModel) {
    let _ = writeln!(out, "\nplugins ({}):", reg.folders());
    let arch = match file.metadata().get_str("general.architecture") {
        Ok(a) => a.to_owned(),
        Err(e) => {
            let _ = writeln!(out, "  no architecture: {e}");
            return;
        }
    };
    let plugin = match reg.model_for(&arch) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(out, "  model: {e}");
            return;
        }
    };
    let shown = file.parts()[0].path().display().to_string();
    let instance = match instantiate(plugin, file, &arch, &shown) {
        Ok(i) => i,
        Err(e) => {
            let _ = writeln!(out, "  model: `{}` refuses the file: {e}", plugin.name);
            return;
        }
    };
    let spec = instance.spec();
    let h = &spec.hparams;
    let _ = writeln!(out, "  model: `{}` serves `{arch}`", plugin.name);
    let _ = writeln!(
        out,
        "    layers {}, hidden {}, vocab {}, context {}, heads {}/{} x {}, experts {} (top-{}, ff {}), dense ff {}",
        h.n_layer,
        h.n_embd,
        h.n_vocab,
        h.n_ctx_train,
        h.n_head,
        h.n_head_kv,
        h.head_dim,
        h.n_expert,
        h.n_expert_used,
        h.n_ff_exp,
        h.n_ff
    );
    let _ = writeln!(
        out,
        "    {} weights, {} state buffers per slot",
        spec.weights.len(),
        spec.state.len()
    );
    let shape = BatchShape {
        n_rows: 1,
        n_outputs: 1,
        kind: GraphKind::Main,
    };
    let graph = match instance.build_graph(shape).into_result() {
        Ok(g) => g,
        Err(e) => {
            let _ = writeln!(out, "    graph: {e}");
            return;
        }
    };
    for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
        let label = if class == DeviceClass::Cpu {
            "cpu"
        } else {
            "gpu"
        };
        match reg.best_kernel(class) {
            Ok(k) => {
                let missing = missing_kernels(&graph, &k.capabilities);
                if missing.is_empty() {
                    let _ = writeln!(
                        out,
                        "  {label}: `{}` implements every op of the graph",
                        k.name
                    );
                } else {
                    let _ = writeln!(out, "  {label}: `{}` lacks:", k.name);
                    for m in missing {
                        let _ = writeln!(out, "    - {m}");
                    }
                }
            }
            Err(e) => {
                let _ = writeln!(out, "  {label}: {e}");
            }
        }
    }
}
