//! The `bloomery` command.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = match bloomery::flags::command_line(std::env::args_os().collect(), |v| {
        std::env::var(v).ok()
    }) {
        Ok(args) => args,
        Err(refused) => {
            eprintln!("error: {refused}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let cli = bloomery::cli::Cli::parse_from(args);
    let serving = matches!(cli.command, bloomery::cli::Command::Serve(_));
    let filter = match (cli.verbose, serving) {
        (true, _) => "bloomery=debug",
        (false, true) => "bloomery=info",
        (false, false) => "bloomery=warn",
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
