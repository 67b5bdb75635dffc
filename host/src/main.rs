//! The `bloomery` command.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = bloomery::cli::Cli::parse();
    let filter = if cli.verbose {
        "bloomery=debug"
    } else {
        "bloomery=warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    match bloomery::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
