//! How many of a decode pass's host experts the card reads over the bus (the bus share): fixed
//! by `--bus-experts N`, or chosen while the engine runs. The best size depends on the host: the
//! CPU's and the card's reads share the host's memory, and how they split it differs between
//! machines (on the H200's host 2 of 8 won for the 30B-A3B file and 3 of 8 for the
//! 35B-A3B hybrid, docs/performance.md). Without `--bus-experts`, the first one-row decode passes
//! alternate between two sizes and time themselves; after [`TRIALS`] timed passes of each, the
//! size whose median pass was shorter is kept for the life of the process, so later requests
//! compute the same experts in the same place.

use std::time::Duration;

use super::plan::bus_candidates;

/// One-row passes run before timing starts (graph capture, cold caches).
pub const WARMUP: usize = 2;

/// Timed passes of each size before one is chosen. With 6 the 6.3 GB card's decode kept the
/// slower size in 2 of 5 runs (tg64 83 against 91–95); with 16 in none of 5
/// (docs/performance.md, 2026-12-03). 32 passes take about a third of a second.
pub const TRIALS: usize = 16;

/// The bus share's size: asked for, being chosen, or chosen.
#[derive(Debug)]
pub struct BusBalance {
    /// `--bus-experts` as asked.
    asked: Option<u32>,
    /// One-row passes seen.
    passes: usize,
    /// Timed passes per candidate (see [`bus_candidates`]).
    times: [Vec<Duration>; 2],
    /// The candidate kept, once chosen.
    chosen: Option<usize>,
    /// The size kept when the passes chose it (not when asked for).
    kept: Option<usize>,
}

impl BusBalance {
    /// `--bus-experts` as asked (`None`: choose at run time).
    pub fn new(asked: Option<u32>) -> Self {
        BusBalance {
            asked,
            passes: 0,
            times: [Vec::new(), Vec::new()],
            chosen: asked.map(|_| 0),
            kept: None,
        }
    }

    /// Which candidate the next pass uses: the chosen one, else the two in turn.
    pub fn choice(&self) -> usize {
        self.chosen.unwrap_or(self.passes % 2)
    }

    /// Experts of every `k` host experts the card takes with candidate `choice`.
    pub fn count(&self, choice: usize, k: u32) -> usize {
        bus_candidates(self.asked, k)[choice.min(1)] as usize
    }

    /// The size the timed passes kept (`None` while choosing, or when it was asked for).
    pub fn kept(&self) -> Option<usize> {
        self.kept
    }

    /// Records a one-row pass that used candidate `choice` of `sizes` (the layers' sizes for
    /// their `k`) and took `elapsed`; once both have [`TRIALS`] timed passes, keeps the one with
    /// the shorter median (the smaller share on a tie) and logs it. Returns the medians when
    /// this pass made the choice.
    pub fn record(
        &mut self,
        choice: usize,
        elapsed: Duration,
        (sizes, k): ([usize; 2], usize),
    ) -> Option<[Duration; 2]> {
        if self.chosen.is_some() {
            return None;
        }
        self.passes += 1;
        if self.passes <= WARMUP {
            return None;
        }
        let times = &mut self.times[choice.min(1)];
        if times.len() < TRIALS {
            times.push(elapsed);
        }
        if self.times.iter().any(|t| t.len() < TRIALS) {
            return None;
        }
        let medians = self.times.clone().map(|mut t| {
            t.sort();
            t[TRIALS / 2]
        });
        let kept = usize::from(medians[1] < medians[0]);
        self.chosen = Some(kept);
        self.kept = Some(sizes[kept]);
        tracing::info!(
            "bus share: the card reads {} of every {k} host experts of a decode pass (median \
             pass {:.2} ms, against {:.2} ms with {})",
            sizes[kept],
            medians[kept].as_secs_f64() * 1e3,
            medians[1 - kept].as_secs_f64() * 1e3,
            sizes[1 - kept],
        );
        Some(medians)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// Runs passes (choice, then the time the closure gives for it) until a choice is made.
    fn calibrate(b: &mut BusBalance, time: impl Fn(usize, usize) -> Duration) -> usize {
        for pass in 0..100 {
            let c = b.choice();
            if b.record(c, time(c, pass), ([2, 3], 8)).is_some() {
                return pass + 1;
            }
        }
        panic!("no choice after 100 passes");
    }

    #[test]
    fn the_size_whose_median_pass_is_shorter_is_kept() {
        // Candidate 1 is faster but has one slow outlier (a graph capture, say).
        let mut b = BusBalance::new(None);
        let passes = calibrate(&mut b, |c, pass| match (c, pass) {
            (1, 3) => ms(40),
            (1, _) => ms(13),
            _ => ms(14),
        });
        assert_eq!(passes, WARMUP + 2 * TRIALS);
        assert_eq!((b.choice(), b.kept()), (1, Some(3)));
        assert_eq!((b.count(b.choice(), 8), b.count(0, 8)), (3, 2));
        // Kept from then on, whatever later passes take.
        assert_eq!(b.record(0, ms(1), ([2, 3], 8)), None);
        assert_eq!(b.choice(), 1);

        let mut b = BusBalance::new(None);
        calibrate(&mut b, |c, _| ms(if c == 0 { 12 } else { 13 }));
        assert_eq!((b.kept(), b.count(b.choice(), 8)), (Some(2), 2));
    }

    #[test]
    fn the_passes_alternate_until_chosen_and_warmup_is_not_timed() {
        let mut b = BusBalance::new(None);
        let mut seen = Vec::new();
        // The warm-up passes are slow for the candidate that would otherwise win.
        calibrate(&mut b, |c, pass| match (c, pass < WARMUP) {
            (0, true) => ms(100),
            (0, false) => ms(10),
            _ => ms(11),
        });
        assert_eq!(b.kept(), Some(2));
        for pass in 0..4 {
            let mut fresh = BusBalance::new(None);
            for _ in 0..pass {
                fresh.record(fresh.choice(), ms(1), ([2, 3], 8));
            }
            seen.push(fresh.choice());
        }
        assert_eq!(seen, [0, 1, 0, 1]);
    }

    #[test]
    fn an_asked_size_is_fixed_and_capped_at_k() {
        let mut b = BusBalance::new(Some(5));
        assert_eq!((b.choice(), b.kept()), (0, None));
        assert_eq!(b.record(0, ms(1), ([2, 3], 8)), None);
        assert_eq!((b.count(b.choice(), 8), b.count(b.choice(), 4)), (5, 4));
        let auto = BusBalance::new(None);
        assert_eq!(BusBalance::new(Some(0)).count(1, 8), 0);
        assert_eq!((auto.count(0, 8), auto.count(1, 8)), (2, 3));
        assert_eq!((auto.count(0, 1), auto.count(1, 1)), (0, 0));
    }
}
