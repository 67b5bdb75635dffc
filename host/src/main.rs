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
    let (default, log) = match &cli.command {
        bloomery::cli::Command::Serve(a) => ("bloomery=info", a.log.clone()),
        _ => (
            "bloomery=warn",
            bloomery::flags::logging::LogArgs::default(),
        ),
    };
    if let Err(e) = log.init(cli.verbose, default) {
        eprintln!("error: {e:#}");
        return std::process::ExitCode::FAILURE;
    }
    match bloomery::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
