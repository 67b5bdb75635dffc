//! The `bloomery` command.

use clap::FromArgMatches;

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
    let matches = bloomery::cli::help::command().get_matches_from(args);
    let cli = match bloomery::cli::Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
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
    // Model loads show their progress (a bar on a terminal, lines otherwise), unless logging
    // is off altogether.
    if !log.log_disable {
        bloomery::progress::LoadProgress::install(log.colors());
    }
    match bloomery::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
