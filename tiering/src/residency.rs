//! Adaptive residency: the engine counts which routed experts each layer with host experts calls,
//! and between steps moves the hottest host expert into the card slot of its coldest card expert
//! when it has been called clearly more often. Decisions depend only on the routing history (and
//! ties break on the lowest expert id), so the same requests give the same placement.

/// Counts fade by this factor per step, so the placement follows what is called now.
const DECAY: f32 = 0.98;

/// A host expert must be called this much more than the card expert it replaces (ratio, then
/// margin), so two experts of similar heat do not swap back and forth.
const HYSTERESIS: (f32, f32) = (1.25, 1.0);

/// The routing state of one layer with host experts.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerResidency {
    /// Faded call counts per expert.
    pub counts: Vec<f32>,
    /// Card slot of each expert, or -1 (the card's expert map).
    pub slot_of: Vec<i32>,
    /// Expert in each card slot.
    pub expert_in: Vec<u32>,
}

impl LayerResidency {
    /// A layer whose card slots hold `on_card` (in slot order) out of `n_expert` experts.
    pub fn new(n_expert: usize, on_card: &[u32]) -> Self {
        let mut slot_of = vec![-1; n_expert];
        for (s, &e) in on_card.iter().enumerate() {
            slot_of[e as usize] = s as i32;
        }
        LayerResidency {
            counts: vec![0.0; n_expert],
            slot_of,
            expert_in: on_card.to_vec(),
        }
    }

    /// The host's expert map: the expert's own index where it is off the card, else -1.
    pub fn host_map(&self) -> Vec<i32> {
        self.slot_of
            .iter()
            .enumerate()
            .map(|(e, &s)| if s < 0 { e as i32 } else { -1 })
            .collect()
    }
}

/// A move decided between steps: `incoming` takes card slot `slot` of layer `layer` from
/// `outgoing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flip {
    /// Index among the layers with host experts.
    pub layer: usize,
    /// The card slot.
    pub slot: u32,
    /// The host expert moving onto the card.
    pub incoming: u32,
    /// The card expert moving to the host.
    pub outgoing: u32,
}

/// Routing counts and placements of every layer with host experts.
#[derive(Clone, Debug, PartialEq)]
pub struct Residency {
    /// Moves are made (off: the plan's placement stays, for repeatable output).
    pub enabled: bool,
    /// Per layer with host experts.
    pub layers: Vec<LayerResidency>,
    /// Routed calls served by card experts in these layers.
    pub card_calls: u64,
    /// Routed calls served by host experts in these layers.
    pub host_calls: u64,
    /// Of `host_calls`, those the card computed by reading the expert over the bus.
    pub bus_calls: u64,
    /// Moves made.
    pub flips: u64,
    recorded: bool,
}

impl Residency {
    /// Counting starts at zero for these layers.
    pub fn new(layers: Vec<LayerResidency>, enabled: bool) -> Self {
        Residency {
            enabled,
            layers,
            card_calls: 0,
            host_calls: 0,
            bus_calls: 0,
            flips: 0,
            recorded: false,
        }
    }

    /// Counts one pass's routed expert ids of layer `layer`.
    pub fn record(&mut self, layer: usize, ids: &[i32]) {
        let Some(l) = self.layers.get_mut(layer) else {
            return;
        };
        for &id in ids {
            let Some(e) = usize::try_from(id).ok().filter(|&e| e < l.counts.len()) else {
                continue;
            };
            l.counts[e] += 1.0;
            if l.slot_of[e] >= 0 {
                self.card_calls += 1;
            } else {
                self.host_calls += 1;
            }
        }
        self.recorded = true;
    }

    /// Decides at most `max` moves (one per layer) from the counts since the last step, applies
    /// them to the placement and fades the counts. Nothing when off or nothing was recorded.
    pub fn step(&mut self, max: usize) -> Vec<Flip> {
        let mut flips = Vec::new();
        if !self.enabled || !std::mem::take(&mut self.recorded) {
            return flips;
        }
        for (li, l) in self.layers.iter_mut().enumerate() {
            if flips.len() < max && !l.expert_in.is_empty() {
                let hot = (0..l.counts.len()).filter(|&e| l.slot_of[e] < 0).fold(
                    None,
                    |best: Option<usize>, e| match best {
                        Some(b) if l.counts[b] >= l.counts[e] => Some(b),
                        _ => Some(e),
                    },
                );
                let cold = (0..l.expert_in.len()).fold(None, |best: Option<usize>, s| {
                    let c = |s: usize| l.counts[l.expert_in[s] as usize];
                    match best {
                        Some(b) if c(b) <= c(s) => Some(b),
                        _ => Some(s),
                    }
                });
                if let (Some(h), Some(s)) = (hot, cold) {
                    let out = l.expert_in[s] as usize;
                    if l.counts[h] > l.counts[out] * HYSTERESIS.0 + HYSTERESIS.1 {
                        l.slot_of[out] = -1;
                        l.slot_of[h] = s as i32;
                        l.expert_in[s] = h as u32;
                        flips.push(Flip {
                            layer: li,
                            slot: s as u32,
                            incoming: h as u32,
                            outgoing: out as u32,
                        });
                    }
                }
            }
            l.counts.iter_mut().for_each(|c| *c *= DECAY);
        }
        self.flips += flips.len() as u64;
        flips
    }

    /// Forgets the counts and statistics (the placement stays).
    pub fn reset(&mut self) {
        for l in &mut self.layers {
            l.counts.fill(0.0);
        }
        self.card_calls = 0;
        self.host_calls = 0;
        self.bus_calls = 0;
        self.flips = 0;
        self.recorded = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(r: &mut Residency, steps: usize) -> Vec<Flip> {
        let mut all = Vec::new();
        for i in 0..steps {
            // Expert 5 is called every step, expert 6 every other step, the rest rarely.
            let ids = [5, if i % 2 == 0 { 6 } else { (i % 8) as i32 }];
            r.record(0, &ids);
            all.extend(r.step(4));
        }
        all
    }

    #[test]
    fn hot_host_experts_move_onto_the_card_deterministically() {
        let fresh = || Residency::new(vec![LayerResidency::new(8, &[0, 1])], true);
        let mut a = fresh();
        let flips = history(&mut a, 40);
        assert!(flips.len() >= 2, "{flips:?}");
        assert!(a.layers[0].slot_of[5] >= 0 && a.layers[0].slot_of[6] >= 0);
        assert_eq!(a.layers[0].expert_in.len(), 2);
        // Maps stay consistent: a slot's expert points back at it; the host map is the rest.
        for (s, &e) in a.layers[0].expert_in.iter().enumerate() {
            assert_eq!(a.layers[0].slot_of[e as usize], s as i32);
        }
        let host = a.layers[0].host_map();
        assert_eq!(host.iter().filter(|&&m| m >= 0).count(), 6);
        // The same history gives the same moves and placement.
        let mut b = fresh();
        assert_eq!(history(&mut b, 40), flips);
        assert_eq!(b, a);
        assert!(a.card_calls > 0 && a.host_calls > 0);
    }

    #[test]
    fn off_means_no_moves_and_reset_forgets() {
        let mut r = Residency::new(vec![LayerResidency::new(8, &[0, 1])], false);
        assert!(history(&mut r, 20).is_empty());
        assert_eq!(r.layers[0].expert_in, vec![0, 1]);
        r.reset();
        assert_eq!(r.card_calls + r.host_calls, 0);
        assert!(r.layers[0].counts.iter().all(|&c| c == 0.0));
    }

    #[test]
    fn similar_heat_does_not_swap_back_and_forth() {
        let mut r = Residency::new(vec![LayerResidency::new(4, &[0])], true);
        let mut flips = 0;
        for i in 0..50 {
            r.record(0, &[i % 2]);
            flips += r.step(4).len();
        }
        assert_eq!(flips, 0);
    }
}
