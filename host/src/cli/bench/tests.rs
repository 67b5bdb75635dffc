//! The run's tests as llama-bench lists them, and the refusals of what bloomery does not do.

use clap::Parser;

use super::*;

fn args(extra: &[&str]) -> BenchArgs {
    let mut argv = vec!["bloomery", "bench", "-m", "x.gguf"];
    argv.extend_from_slice(extra);
    let argv = crate::flags::short::expand_short_flags(argv.iter().map(std::ffi::OsString::from));
    match crate::cli::Cli::parse_from(argv).command {
        crate::cli::Command::Bench(a) => *a,
        _ => unreachable!("a bench command line"),
    }
}

fn names(a: &BenchArgs) -> anyhow::Result<Vec<String>> {
    Ok(instances(a, 48, false)?
        .iter()
        .map(|i| {
            format!(
                "{:?} d{} ngl{} t{}",
                i.test, i.depth, i.setup.ngl, i.setup.threads
            )
        })
        .collect())
}

#[test]
fn every_combination_runs_in_llama_benchs_order() {
    let a = args(&[
        "-p", "16,32", "-n", "8", "-pg", "4,2", "-d", "0,64", "-t", "1-2", "-ngl", "0",
    ]);
    let got = names(&a).unwrap();
    assert_eq!(got.len(), 2 * 2 * 4);
    assert_eq!(
        got[..5],
        [
            "Prompt(16) d0 ngl0 t1",
            "Prompt(32) d0 ngl0 t1",
            "Generate(8) d0 ngl0 t1",
            "PromptGenerate(4, 2) d0 ngl0 t1",
            "Prompt(16) d64 ngl0 t1",
        ]
    );
    assert_eq!(got[8], "Prompt(16) d0 ngl0 t2");
    // Room for the longest: the pg test after 64 tokens of context.
    let all = instances(&a, 48, false).unwrap();
    assert_eq!(
        all.iter().map(|i| positions(&i.test, i.depth)).max(),
        Some(64 + 32 + 1)
    );
}

#[test]
fn what_bloomery_does_not_do_is_refused_by_name() {
    let refused = |extra: &[&str], what: &str| {
        let e = instances(&args(extra), 48, false).unwrap_err().to_string();
        assert!(e.contains(what), "{extra:?}: {e}");
    };
    refused(
        &["-ctk", "bf16"],
        "-ctk bf16: bf16 caches are not implemented",
    );
    refused(&["-ctv", "q9_0"], "-ctv q9_0: unsupported cache type");
    refused(&["-fa", "off"], "-fa off: not supported");
    refused(&["-ngl", "20"], "-ngl 20: not supported");
    refused(&["-b", "0"], "-b 0");
    refused(&["-p", "1-4*1"], "does not advance");
    refused(&["-pg", "512"], "-pg \"512\"");
    let ok = instances(
        &args(&[
            "-ngl", "-1,0,99", "-fa", "on,auto", "-ctk", "f32", "-ctv", "q8_0",
        ]),
        48,
        false,
    )
    .unwrap();
    assert_eq!(ok.len(), 3 * 2 * 2);
    assert!(ok[0].setup.gpu && !ok[4].setup.gpu && ok[8].setup.gpu);
    assert_eq!(ok[0].setup.kv_type_k, DType::F32);
    assert_eq!(ok[0].setup.kv_type_v, DType::Q8_0);
}
