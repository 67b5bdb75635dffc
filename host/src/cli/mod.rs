//! The command line: global options and one module per subcommand.

mod bench;
pub mod completion;
pub mod help;
mod info;
mod opcheck;
mod plan;
mod plugins;
mod run;
mod synth;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// bloomery: an inference engine for mixture-of-experts models, built for offloading.
///
/// Routed experts live on the GPU, in host RAM or on NVMe, and the experts the routing calls
/// most move onto the card while it runs. `serve` is a drop-in llama-server (the same HTTP API,
/// GGUF files and flag spellings); `bench` measures as llama-bench does; model architectures
/// and kernel bundles are plugins chosen at startup by probing the machine.
#[derive(Parser, Debug)]
#[command(name = "bloomery", version)]
pub struct Cli {
    /// Folder of model and kernel plugins (default: `plugins` beside the executable). Repeat it
    /// to load plugins from several folders (e.g. one built outside this project); where two
    /// serve the same architecture, the folder named first wins.
    #[arg(long, global = true, value_name = "DIR")]
    pub plugin_dir: Vec<PathBuf>,

    /// Verbose logs (and full plugin-loader reports).
    #[arg(short, long, visible_alias = "log-verbose", global = true)]
    pub verbose: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List every plugin: name, kind, ABI version, what it serves, whether it can run here.
    Plugins,
    /// Describe a model file: metadata, tensors, and which plugins serve it.
    Info {
        /// The GGUF file (the first part of a split model).
        #[arg(short = 'm', long = "model", value_name = "FILE")]
        model: PathBuf,
    },
    /// Write a random-weight model of an architecture's preset shape.
    Synth(synth::SynthArgs),
    /// Generate text from a prompt, streaming it to stdout (llama.cpp's spellings).
    // As llama.cpp's tools, a flag given twice takes its last value (lists keep every value).
    #[command(args_override_self = true)]
    Run(Box<run::RunArgs>),
    /// Measure prompt and generation speed, like llama-bench.
    #[command(args_override_self = true)]
    Bench(Box<bench::BenchArgs>),
    /// Check every op a kernel plugin claims against the cpu-scalar reference on random inputs.
    Opcheck(opcheck::OpcheckArgs),
    /// Show where a model's weights would live (card, host RAM) under given budgets.
    Plan(Box<plan::PlanArgs>),
    /// Serve the model over HTTP as llama-server does (same routes, flags and shapes).
    // A flag given twice takes its last value, as llama-server reads a command line (a list
    // flag such as --override-kv keeps every value).
    #[command(version, disable_help_flag = true, args_override_self = true)]
    Serve(Box<crate::flags::serve::ServeArgs>),
}

impl Cli {
    /// The plugin folders in force, in the order given.
    pub fn plugin_dirs(&self) -> Vec<PathBuf> {
        if !self.plugin_dir.is_empty() {
            return self.plugin_dir.clone();
        }
        vec![std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("plugins")))
            .unwrap_or_else(|| PathBuf::from("plugins"))]
    }
}

/// Runs the parsed command line.
pub fn run(mut cli: Cli) -> anyhow::Result<()> {
    // -hf and -mu fetch the model before anything loads it, as llama-server fetches before it
    // listens.
    let hub = match &cli.command {
        Command::Run(a) => Some(&a.hub),
        Command::Bench(a) => Some(&a.hub),
        Command::Serve(a) => Some(&a.hub),
        _ => None,
    };
    if let Some(h) = hub.filter(|h| h.cache_list) {
        return h.print_cache_list();
    }
    if let Command::Serve(a) = &cli.command {
        if a.completion_bash {
            print!("{}", completion::bash());
            return Ok(());
        }
    }
    match &mut cli.command {
        Command::Run(a) => a.model = a.hub.model_file(a.model_arg.as_deref())?,
        Command::Bench(a) => a.model = a.hub.model_file(a.model_arg.as_deref())?,
        Command::Serve(a) => a.model = a.hub.model_file(a.model_arg.as_deref())?,
        _ => {}
    }
    match &cli.command {
        Command::Plugins => plugins::run(&cli),
        Command::Info { model } => info::run(&cli, model),
        Command::Synth(a) => synth::run(&cli, a),
        Command::Run(a) => run::run(&cli, a),
        Command::Bench(a) => bench::run(&cli, a),
        Command::Opcheck(a) => opcheck::run(&cli, a),
        Command::Plan(a) => plan::run(&cli, a),
        Command::Serve(a) => crate::server::serve(&cli.plugin_dirs(), a, cli.verbose),
    }
}

#[cfg(test)]
mod tests {
    use super::{Cli, Command};
    use clap::Parser;

    #[test]
    fn a_serve_flag_given_twice_takes_its_last_value_and_lists_keep_every_value() {
        let cli = Cli::try_parse_from([
            "bloomery",
            "serve",
            "-m",
            "a.gguf",
            "--port",
            "1",
            "--override-kv",
            "a=int:1",
            "-m",
            "b.gguf",
            "--port",
            "2",
            "--override-kv",
            "b=int:2",
        ])
        .unwrap();
        let Command::Serve(a) = cli.command else {
            panic!("parsed as {:?}", cli.command)
        };
        assert_eq!(a.port, 2);
        assert_eq!(a.model_arg.as_deref(), Some(std::path::Path::new("b.gguf")));
        assert_eq!(a.metadata.override_kv, ["a=int:1", "b=int:2"]);
    }
}
