//! llama-server's log flags (`--log-disable`, `--log-file`, `--log-colors`, `-lv`,
//! `--log-prefix`, `--log-timestamps`) and the subscriber they set up.

use std::path::PathBuf;

use clap::Args;
use tracing_subscriber::fmt::writer::MakeWriterExt;

/// How the server logs.
#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// No log output at all.
    #[arg(long = "log-disable")]
    pub log_disable: bool,
    /// Also write the log to this file (without colours).
    #[arg(long = "log-file", value_name = "FNAME", env = "LLAMA_ARG_LOG_FILE")]
    pub log_file: Option<PathBuf>,
    /// Coloured log lines: on, off, or auto (only when stderr is a terminal).
    #[arg(long = "log-colors", value_name = "on|off|auto", default_value = "auto", num_args = 0..=1, default_missing_value = "on", env = "LLAMA_ARG_LOG_COLORS")]
    pub log_colors: String,
    /// Verbosity threshold as llama-server counts it: 0-1 errors, 2 warnings, 3 information,
    /// 4 and above debugging.
    #[arg(
        long = "verbosity",
        visible_alias = "log-verbosity",
        value_name = "N",
        allow_negative_numbers = true,
        env = "LLAMA_ARG_LOG_VERBOSITY"
    )]
    pub verbosity: Option<i32>,
    /// Each line starts with its level (the default).
    #[arg(long = "log-prefix", overrides_with = "no_log_prefix", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_LOG_PREFIX")]
    pub log_prefix: bool,
    /// Lines without their level.
    #[arg(long = "no-log-prefix", overrides_with = "log_prefix")]
    pub no_log_prefix: bool,
    /// Each line starts with its time (the default).
    #[arg(long = "log-timestamps", overrides_with = "no_log_timestamps", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "LLAMA_ARG_LOG_TIMESTAMPS")]
    pub log_timestamps: bool,
    /// Lines without their time.
    #[arg(long = "no-log-timestamps", overrides_with = "log_timestamps")]
    pub no_log_timestamps: bool,
}

impl Default for LogArgs {
    /// The flags' defaults (what commands without them log with).
    fn default() -> Self {
        LogArgs {
            log_disable: false,
            log_file: None,
            log_colors: "auto".into(),
            verbosity: None,
            log_prefix: true,
            no_log_prefix: false,
            log_timestamps: true,
            no_log_timestamps: false,
        }
    }
}

impl LogArgs {
    /// The `bloomery=…` filter: `-v` is debugging, `-lv` llama-server's threshold, else
    /// `default`.
    fn filter(&self, verbose: bool, default: &'static str) -> &'static str {
        match (self.log_disable, verbose, self.verbosity) {
            (true, _, _) => "off",
            (_, true, _) => "bloomery=debug",
            (_, _, Some(n)) if n <= 1 => "bloomery=error",
            (_, _, Some(2)) => "bloomery=warn",
            (_, _, Some(3)) => "bloomery=info",
            (_, _, Some(_)) => "bloomery=debug",
            (_, _, None) => default,
        }
    }

    /// Refuses a `--log-colors` value llama-server refuses.
    pub fn validate(&self) -> anyhow::Result<()> {
        if ![
            "on", "off", "auto", "true", "false", "1", "0", "enabled", "disabled",
        ]
        .contains(&self.log_colors.as_str())
        {
            anyhow::bail!(
                "--log-colors {:?}: expected on, off or auto",
                self.log_colors
            );
        }
        Ok(())
    }

    /// Whether stderr gets colours: `--log-colors on`, or `auto` (the default) when stderr is
    /// a terminal.
    pub fn colors(&self) -> bool {
        match self.log_colors.as_str() {
            "on" | "true" | "1" | "enabled" => true,
            "off" | "false" | "0" | "disabled" => false,
            _ => std::io::IsTerminal::is_terminal(&std::io::stderr()),
        }
    }

    /// Sets up the process's log subscriber (`RUST_LOG` overrides the level); `default` is the
    /// filter without `-v` or `-lv`.
    pub fn init(&self, verbose: bool, default: &'static str) -> anyhow::Result<()> {
        self.validate()?;
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(self.filter(verbose, default)));
        let colors = self.colors();
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_level(self.log_prefix && !self.no_log_prefix);
        let timestamps = self.log_timestamps && !self.no_log_timestamps;
        match &self.log_file {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| anyhow::anyhow!("--log-file {}: {e}", path.display()))?;
                let writer = std::io::stderr.and(std::sync::Mutex::new(file));
                // One format for both: a file gets no colour codes.
                let b = builder.with_ansi(false).with_writer(writer);
                if timestamps {
                    b.init()
                } else {
                    b.without_time().init()
                }
            }
            None => {
                let b = builder.with_ansi(colors).with_writer(std::io::stderr);
                if timestamps {
                    b.init()
                } else {
                    b.without_time().init()
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::LogArgs;

    #[test]
    fn verbosity_maps_to_levels_as_llama_server_counts_them() {
        let lv = |n| LogArgs {
            verbosity: Some(n),
            ..LogArgs::default()
        };
        assert_eq!(lv(1).filter(false, "bloomery=info"), "bloomery=error");
        assert_eq!(lv(2).filter(false, "bloomery=info"), "bloomery=warn");
        assert_eq!(lv(3).filter(false, "bloomery=warn"), "bloomery=info");
        assert_eq!(lv(5).filter(false, "bloomery=info"), "bloomery=debug");
        assert_eq!(lv(1).filter(true, "bloomery=info"), "bloomery=debug");
        let off = LogArgs {
            log_disable: true,
            ..LogArgs::default()
        };
        assert_eq!(off.filter(true, "bloomery=info"), "off");
        assert_eq!(
            LogArgs::default().filter(false, "bloomery=warn"),
            "bloomery=warn"
        );
    }
}
