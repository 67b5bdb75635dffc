//! The drafting gate (issue 48, item 6): drafting stays on only while it pays. Each slot keeps a
//! gate per drafter of its chain (`--spec-type ngram-simple,draft-mtp` has two), so an n-gram
//! drafter whose drafts cost no draft passes stays on where the MTP block's drafts do not pay.
//! A gate keeps running averages of what its drafter's steps cost (the draft passes and the
//! verify pass) and how many tokens they keep, and of what a plain one-row step costs; its
//! drafter is left out while kept tokens per second with it fall below one token per plain
//! step's time, and consulted again when they rise above it. While on, a plain step now and then
//! refreshes the plain figure; while off, a drafting step now and then refreshes the drafting
//! figures, so drafting comes back where it pays again. The gate only chooses whether a step
//! drafts: a draft never changes what the slot generates, so output is the same whichever way
//! it goes.
//!
//! Costs come through [`StepCosts`]: the wall clock when serving ([`WallClock`]), a model of
//! the step in tests, so that the gate's choices are deterministic there.

/// What one slot's generation step ran, as a [`StepCosts`] prices it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    /// Rows of the target pass that carried the step (every slot's).
    pub rows: usize,
    /// Tokens the slot drafted for this step (0: a plain step).
    pub drafted: usize,
}

/// Prices a slot's generation step for the gate.
pub trait StepCosts: Send {
    /// Seconds the gate counts for a step of `shape` that took `measured` seconds on the wall
    /// clock (its draft passes, its target pass and what follows the pass).
    fn seconds(&mut self, shape: StepShape, measured: f64) -> f64;
}

/// The wall clock: a step costs what it took.
pub struct WallClock;

impl StepCosts for WallClock {
    fn seconds(&mut self, _: StepShape, measured: f64) -> f64 {
        measured
    }
}

/// Weight of the newest step in each running average.
const ALPHA: f64 = 0.25;
/// Samples of each kind before the gate decides anything.
const MIN_SAMPLES: u32 = 3;
/// While drafting is on: drafting steps between plain probes.
const PLAIN_PROBE_EVERY: u32 = 32;
/// The same until the plain figure has its [`MIN_SAMPLES`].
const PLAIN_PROBE_FIRST: u32 = 2;
/// While drafting is off: plain steps before the first drafting probe. Each probe that finds
/// drafting still does not pay doubles the wait, up to [`DRAFT_PROBE_MAX`], so a slot where
/// drafting never pays spends ever less on probing (a drafting step can cost several plain
/// ones); a probe that would pay by its own figures brings the wait back here.
const DRAFT_PROBE_EVERY: u32 = 16;
/// The longest wait between drafting probes.
const DRAFT_PROBE_MAX: u32 = 256;

/// A running average: the first sample, then each sample weighted [`ALPHA`].
#[derive(Clone, Copy, Debug, Default)]
struct Average {
    value: f64,
    n: u32,
}

impl Average {
    fn add(&mut self, x: f64) {
        self.value = match self.n {
            0 => x,
            _ => self.value + ALPHA * (x - self.value),
        };
        self.n = self.n.saturating_add(1);
    }
}

/// What the gate did with a step: whether drafting turned off or on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// Drafting turned off.
    Off,
    /// Drafting turned back on.
    On,
}

/// One slot's gate for one drafter.
#[derive(Clone, Debug)]
pub struct Gate {
    /// The drafter's type, as `--spec-type` names it.
    drafter: &'static str,
    on: bool,
    /// Seconds of a plain step.
    plain: Average,
    /// Seconds of a drafting step.
    drafting: Average,
    /// Tokens a drafting step keeps (its drafts accepted and the target's own).
    kept: Average,
    /// Steps since the last probe.
    since: u32,
    /// While off: plain steps between drafting probes now.
    probe_every: u32,
    switches: u64,
}

/// What `/slots` shows of a slot's gate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GateView {
    /// The drafter's type, as `--spec-type` names it.
    pub drafter: &'static str,
    /// Whether the slot consults the drafter (probes aside).
    pub on: bool,
    /// Times drafting turned off or on.
    pub switches: u64,
    /// Seconds of a plain step (running average), once measured.
    pub plain_s: Option<f64>,
    /// Seconds of a drafting step, once measured.
    pub drafting_s: Option<f64>,
    /// Tokens a drafting step keeps, once measured.
    pub kept: Option<f64>,
}

impl Gate {
    /// A gate for `drafter` (its `--spec-type` name) with drafting on and nothing measured.
    pub fn new(drafter: &'static str) -> Gate {
        Gate {
            drafter,
            on: true,
            plain: Average::default(),
            drafting: Average::default(),
            kept: Average::default(),
            since: 0,
            probe_every: DRAFT_PROBE_EVERY,
            switches: 0,
        }
    }

    /// Whether the slot's next step drafts: while on, all but the plain probes; while off, only
    /// the drafting probes.
    pub fn drafts_next(&self) -> bool {
        match self.on {
            true => {
                let every = match self.plain.n < MIN_SAMPLES {
                    true => PLAIN_PROBE_FIRST,
                    false => PLAIN_PROBE_EVERY,
                };
                self.since < every
            }
            false => self.since >= self.probe_every,
        }
    }

    /// Whether the slot's next step should read its rows for the MTP block: always while on;
    /// while off, only within `window` steps of its next drafting probe (the block takes in at
    /// most the rows of those steps then, and misses the positions before them).
    pub fn rows_wanted(&self, window: u32) -> bool {
        self.on || self.since + window >= self.probe_every
    }

    /// Records a plain step of `seconds`.
    pub fn plain(&mut self, seconds: f64) -> Option<Switch> {
        self.plain.add(seconds);
        self.since = match self.on {
            true => 0,
            false => self.since + 1,
        };
        self.decide()
    }

    /// Records a drafting step of `seconds` that kept `kept` tokens.
    pub fn drafted(&mut self, seconds: f64, kept: usize) -> Option<Switch> {
        if !self.on {
            // A probe: back off while drafting keeps not paying, probe soon again when this
            // step alone would have paid.
            self.probe_every = match kept as f64 * self.plain.value >= seconds {
                true => DRAFT_PROBE_EVERY,
                false => (self.probe_every * 2).min(DRAFT_PROBE_MAX),
            };
        }
        self.drafting.add(seconds);
        self.kept.add(kept as f64);
        self.since = match self.on {
            true => self.since + 1,
            false => 0,
        };
        self.decide()
    }

    /// Whether drafting pays: kept tokens per second drafting against tokens per second
    /// without (None until each figure has its samples).
    fn pays(&self) -> Option<bool> {
        if self.plain.n < MIN_SAMPLES || self.drafting.n < MIN_SAMPLES {
            return None;
        }
        Some(self.kept.value * self.plain.value >= self.drafting.value)
    }

    fn decide(&mut self) -> Option<Switch> {
        let pays = self.pays()?;
        if pays == self.on {
            return None;
        }
        self.on = pays;
        self.since = 0;
        self.probe_every = DRAFT_PROBE_EVERY;
        self.switches += 1;
        Some(if pays { Switch::On } else { Switch::Off })
    }

    /// The figures behind the gate's last choice, for the log line and `/slots`.
    pub fn view(&self) -> GateView {
        let some = |a: Average| (a.n > 0).then_some(a.value);
        GateView {
            drafter: self.drafter,
            on: self.on,
            switches: self.switches,
            plain_s: some(self.plain),
            drafting_s: some(self.drafting),
            kept: some(self.kept),
        }
    }

    /// The log line of a switch of slot `slot`'s gate.
    pub fn describe(&self, slot: usize, switch: Switch) -> String {
        let rate = self.kept.value / self.drafting.value.max(f64::MIN_POSITIVE);
        let plain = 1.0 / self.plain.value.max(f64::MIN_POSITIVE);
        let what = match switch {
            Switch::Off => "off: it does not pay",
            Switch::On => "back on: it pays",
        };
        format!(
            "slot {slot}: drafting with {} {what} ({:.2} tokens kept per drafting step of \
             {:.2} ms = {rate:.1} tokens/s; a plain step {:.2} ms = {plain:.1} tokens/s)",
            self.drafter,
            self.kept.value,
            self.drafting.value * 1e3,
            self.plain.value * 1e3,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{Gate, Switch};

    /// Runs `steps` steps through `gate`: a plain step costs `plain` seconds, a drafting step
    /// `drafting` seconds and keeps `kept` tokens. Gives the switches and the drafting steps.
    fn run(
        gate: &mut Gate,
        steps: usize,
        plain: f64,
        drafting: f64,
        kept: usize,
    ) -> (Vec<Switch>, usize) {
        let (mut switches, mut n) = (Vec::new(), 0);
        for _ in 0..steps {
            let s = match gate.drafts_next() {
                true => {
                    n += 1;
                    gate.drafted(drafting, kept)
                }
                false => gate.plain(plain),
            };
            switches.extend(s);
        }
        (switches, n)
    }

    #[test]
    fn drafting_turns_off_when_it_costs_more_than_it_keeps() {
        // A drafting step of 3 ms keeps 2 tokens: 667 tokens/s, against 1,000 plain.
        let mut g = Gate::new("draft-mtp");
        let (switches, drafting) = run(&mut g, 200, 1e-3, 3e-3, 2);
        assert_eq!(switches, [Switch::Off]);
        assert!(!g.view().on);
        // Only the probes draft once it is off: after 16 plain steps, then 32, 64, ...
        assert!(drafting < 30, "{drafting} drafting steps of 200");
        assert!(g.describe(0, Switch::Off).contains("2.00 tokens kept"));
    }

    #[test]
    fn probes_back_off_while_drafting_keeps_not_paying() {
        // Nothing accepted (random weights): a drafting step of 7 ms keeps 1 token against
        // 2.7 ms plain. Over 4,000 steps the probes wait 16, 32, ... up to 256 steps.
        let mut g = Gate::new("draft-mtp");
        let (switches, drafting) = run(&mut g, 4_000, 2.7e-3, 7e-3, 1);
        assert_eq!(switches, [Switch::Off]);
        // Warm-up (before the first decision) and about 20 probes, not one in 17 (235).
        assert!(drafting <= 30, "{drafting} drafting steps of 4,000");
    }

    #[test]
    fn drafting_stays_on_while_it_pays() {
        // 3 ms for 4 tokens: 1,333 tokens/s, against 1,000 plain.
        let mut g = Gate::new("draft-mtp");
        let (switches, drafting) = run(&mut g, 200, 1e-3, 3e-3, 4);
        assert_eq!(switches, []);
        assert!(g.view().on);
        // Plain probes: two at first, then one in PLAIN_PROBE_EVERY + 1.
        assert!(drafting > 180, "{drafting} drafting steps of 200");
    }

    #[test]
    fn drafting_comes_back_when_the_probes_find_it_pays_again() {
        let mut g = Gate::new("draft-mtp");
        assert_eq!(run(&mut g, 100, 1e-3, 3e-3, 1).0, [Switch::Off]);
        // Acceptance rises: the drafting probes see 4 tokens a step.
        let (switches, _) = run(&mut g, 400, 1e-3, 3e-3, 4);
        assert_eq!(switches, [Switch::On]);
        assert_eq!(g.view().switches, 2);
        // The break-even point counts as paying: 3 tokens in 3 plain steps' time.
        let mut g = Gate::new("draft-mtp");
        assert_eq!(run(&mut g, 200, 0.25, 0.75, 3).0, []);
    }

    /// While off, a slot reads its rows only in the `window` steps before each drafting probe
    /// and the probe's own step (whose rows the block needs if the probe turns drafting on);
    /// while on, every step.
    #[test]
    fn rows_are_wanted_only_in_the_window_before_a_probe() {
        let mut g = Gate::new("draft-mtp");
        assert!(g.rows_wanted(0));
        assert_eq!(run(&mut g, 100, 2.7e-3, 7e-3, 1).0, [Switch::Off]);
        let (mut reads, mut probes) = (Vec::new(), Vec::new());
        for i in 0..2_000 {
            reads.push(g.rows_wanted(8));
            match g.drafts_next() {
                true => {
                    probes.push(i);
                    g.drafted(7e-3, 1);
                }
                false => {
                    g.plain(2.7e-3);
                }
            }
        }
        assert!(probes.len() > 5, "{probes:?}");
        for &p in probes.iter().filter(|&&p| p >= 8) {
            assert!(reads[p - 8..=p].iter().all(|&r| r), "probe at {p}");
        }
        // Nothing else reads (the first window may start before these steps, the last 8 steps
        // may be the window of a probe to come).
        let n = reads.iter().filter(|&&r| r).count();
        let want = 9 * probes.len();
        assert!(
            n + 8 >= want && n <= want + 8,
            "{n} reads, {} probes",
            probes.len()
        );
    }
}
