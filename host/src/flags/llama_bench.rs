//! llama-bench's flags that `bloomery bench` does not take, refused by name before clap parses
//! (clap would read an unknown `-mg` as `-m g`, or `-nkvo` as `-n kvo`).

use std::ffi::OsString;

use super::llama_server::Refusal;

const POOL: &str = "the worker pool pins one thread per core itself (-t sets the count)";
const MAPPED: &str = "the model is always mapped";

/// llama-bench b11434's flags (`tools/llama-bench/llama-bench.cpp`) that bloomery's bench does
/// not take, and why.
const REFUSED: &[(&[&str], &str)] = &[
    (
        &["-oe", "--output-err"],
        "a second output on stderr is not implemented",
    ),
    (&["--numa"], "NUMA placement is not implemented"),
    (&["--prio"], "bloomery does not set the process priority"),
    (&["--list-devices"], "`bloomery plugins` lists the devices"),
    (
        &["-fitt", "--fit-target", "-fitc", "--fit-ctx"],
        "the placement plan takes --gpu-budget instead",
    ),
    (&["-rpc", "--rpc"], "RPC devices are not supported"),
    (&["-C", "--cpu-mask", "--cpu-strict", "--poll"], POOL),
    (
        &["-nkvo", "--no-kv-offload"],
        "the cache always lives with the model's layers",
    ),
    (&["-lm", "--load-mode", "-lzm", "--lazy-mode"], MAPPED),
    (
        &["-embd", "--embeddings"],
        "bench times generation passes only (embeddings are served by `serve --embeddings`)",
    ),
    (
        &["-nopo", "--no-op-offload", "--no-host", "--repack"],
        "these ggml buffer options do not apply",
    ),
];

/// Refuses the first of `args` (after `bench`) that is a llama-bench flag bloomery does not
/// take, in one line naming it and why.
pub fn screen(args: &[OsString]) -> Result<(), Refusal> {
    for a in args.iter().filter_map(|a| a.to_str()) {
        let flag = a.split_once('=').map_or(a, |(f, _)| f);
        if let Some((_, why)) = REFUSED.iter().find(|(names, _)| names.contains(&flag)) {
            return Err(Refusal(format!(
                "{flag}: not supported by bloomery bench: {why}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_bench_flags_bloomery_does_not_take_are_named() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(screen(&args(&["-m", "x.gguf", "-p", "512", "-ngl", "-1"])).is_ok());
        assert!(screen(&args(&["-m", "x.gguf", "-mg", "1", "-ts", "3/1"])).is_ok());
        let e = screen(&args(&["-m", "x.gguf", "-rpc", "host:1"])).unwrap_err();
        assert_eq!(
            e.0,
            "-rpc: not supported by bloomery bench: RPC devices are not supported"
        );
        let e = screen(&args(&["--numa=distribute"])).unwrap_err();
        assert!(e.0.starts_with("--numa: not supported"), "{}", e.0);
    }
}
