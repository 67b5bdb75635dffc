//! Progress on stderr: an indicatif bar when stderr is a terminal, plain lines at most every few
//! seconds (and at the end) when it is not, so a log file or a pipe gets readable text without
//! control codes. Used by model loads (the exec crate's [`LoadObserver`]), `synth` and
//! `bench --progress`.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bloomery_exec::progress::{LoadObserver, LoadStage};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Seconds between two plain lines of one task.
const LINE_EVERY: Duration = Duration::from_secs(2);

/// What a task counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, shown in MiB or GiB.
    Bytes,
    /// Steps, shown as `n/total`.
    Steps,
}

/// Whether progress is drawn as a bar: stderr is a terminal.
pub fn on_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// A byte count as a line shows it.
pub fn bytes(n: u64) -> String {
    let x = n as f64;
    if n >= 1 << 30 {
        format!("{:.2} GiB", x / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", x / (1u64 << 20) as f64)
    }
}

/// One task's progress.
pub struct Progress {
    what: String,
    unit: Unit,
    total: u64,
    done: u64,
    bar: Option<ProgressBar>,
    /// When the last plain line went out (None: none yet), and the count it gave.
    last_line: Option<(Instant, u64)>,
    /// The step in progress (bench: `prompt run 2/5`).
    step: String,
}

impl Progress {
    /// A task named `what` of `total` units: a bar when `bar` (stderr is a terminal), coloured
    /// when `colors`; plain lines otherwise.
    pub fn new(what: &str, total: u64, unit: Unit, bar: bool, colors: bool) -> Progress {
        let bar = bar.then(|| {
            let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = match (unit, colors) {
                (Unit::Bytes, true) => "{prefix:.bold} [{bar:32.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
                (Unit::Bytes, false) => "{prefix} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
                (Unit::Steps, true) => "{prefix:.bold} [{bar:32.green/white}] {pos}/{len} {msg}",
                (Unit::Steps, false) => "{prefix} [{bar:32}] {pos}/{len} {msg}",
            };
            if let Ok(s) = ProgressStyle::with_template(style) {
                pb.set_style(s.progress_chars("=> "));
            }
            pb.set_prefix(what.to_owned());
            pb
        });
        Progress {
            what: what.to_owned(),
            unit,
            total,
            done: 0,
            bar,
            last_line: None,
            step: String::new(),
        }
    }

    /// The plain line of the current state.
    fn line(&self) -> String {
        let amount = match self.unit {
            Unit::Bytes => format!("{} of {}", bytes(self.done), bytes(self.total)),
            Unit::Steps => format!("{}/{}", self.done, self.total),
        };
        match self.step.is_empty() {
            true => format!("{}: {amount}", self.what),
            false => format!("{}: {amount}: {}", self.what, self.step),
        }
    }

    /// Units done so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Writes the plain line of the current state.
    fn print(&mut self) {
        self.last_line = Some((Instant::now(), self.done));
        eprintln!("{}", self.line());
    }

    /// Counts `n` more units done. Plain lines of a byte count go out every few seconds; a
    /// task of steps prints its lines from [`Progress::step`].
    pub fn inc(&mut self, n: u64) {
        self.done += n;
        match &self.bar {
            Some(b) => b.inc(n),
            None if self.unit == Unit::Bytes
                && self
                    .last_line
                    .is_none_or(|(t, _)| t.elapsed() >= LINE_EVERY) =>
            {
                self.print()
            }
            None => {}
        }
    }

    /// Names the step in progress; a plain line says it at once (steps are few and slow).
    pub fn step(&mut self, step: String) {
        self.step = step;
        match &self.bar {
            Some(b) => b.set_message(self.step.clone()),
            None => self.print(),
        }
    }

    /// Ends the task: the bar is cleared, or a last plain line says where a byte count got to
    /// (unless the last line said it already).
    pub fn finish(mut self) {
        match &self.bar {
            Some(b) => b.finish_and_clear(),
            None => {
                if self.unit == Unit::Bytes && self.last_line.is_none_or(|(_, d)| d != self.done) {
                    self.print();
                }
            }
        }
    }
}

/// Shows each model load's stages: one task per stage while it runs.
pub struct LoadProgress {
    bar: bool,
    colors: bool,
    current: Mutex<Option<Progress>>,
}

impl LoadProgress {
    /// Load progress drawn as bars when `bar`, coloured when `colors`.
    pub fn new(bar: bool, colors: bool) -> LoadProgress {
        LoadProgress {
            bar,
            colors,
            current: Mutex::new(None),
        }
    }

    /// Installs load progress for the process (bars when stderr is a terminal).
    pub fn install(colors: bool) {
        bloomery_exec::progress::observe_loads(Box::new(LoadProgress::new(on_terminal(), colors)));
    }
}

impl LoadObserver for LoadProgress {
    fn begin(&self, stage: LoadStage, total: u64) {
        if total == 0 {
            return;
        }
        let p = Progress::new(
            &format!("model load: {}", stage.verb()),
            total,
            Unit::Bytes,
            self.bar,
            self.colors,
        );
        if let Ok(mut c) = self.current.lock() {
            *c = Some(p);
        }
    }

    fn advance(&self, _stage: LoadStage, n: u64) {
        if let Ok(mut c) = self.current.lock() {
            if let Some(p) = c.as_mut() {
                p.inc(n);
            }
        }
    }

    fn end(&self, _stage: LoadStage) {
        if let Ok(mut c) = self.current.lock() {
            if let Some(p) = c.take() {
                p.finish();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_say_the_task_the_amount_and_the_step() {
        let mut p = Progress::new("model load: pinned", 3 << 20, Unit::Bytes, false, false);
        p.done = 1 << 20;
        assert_eq!(p.line(), "model load: pinned: 1.00 MiB of 3.00 MiB");
        let mut s = Progress::new("bench", 12, Unit::Steps, false, false);
        s.done = 5;
        s.step = "benchmark 2/4: prompt run 1/3".into();
        assert_eq!(s.line(), "bench: 5/12: benchmark 2/4: prompt run 1/3");
        assert_eq!(bytes(3 << 30), "3.00 GiB");
    }
}
