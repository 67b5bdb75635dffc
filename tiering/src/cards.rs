//! Routed experts across several cards of one host: which cards are used (llama.cpp's `-dev`,
//! `-sm none`), which is the main one (`-mg`: dense weights, KV cache, the hottest experts), each
//! card's budget (`--gpu-budget A,B`) and share of the experts (`-ts`), and the experts each card
//! after the main one takes once the main card has been planned ([`fill_peers`]).

use crate::moe_layer::{gib, MoeLayer, PlanError};

/// How the cards are asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CardRequest {
    /// `-dev`: the device indices of the cards to use, in order (`None`: every card found).
    pub devices: Option<Vec<u32>>,
    /// `-mg`: the position, among the cards used, of the main card.
    pub main: u32,
    /// `-ts`: each used card's share of the experts placed on cards, in the order of the cards
    /// used (empty or all zero: the main card fills first, then the others in order).
    pub split: Vec<f32>,
    /// `-sm none`: the main card only.
    pub main_only: bool,
}

impl CardRequest {
    /// The cards planned on, main card first, out of the `found` devices of the kernel plugin.
    /// A named error when `-dev` or `-mg` names a card that is not there or `-ts` gives more
    /// shares than cards.
    pub fn cards(&self, found: u32) -> Result<Vec<UsedCard>, String> {
        let used: Vec<u32> = match &self.devices {
            Some(d) => d.clone(),
            None => (0..found.max(1)).collect(),
        };
        if let Some(d) = used.iter().find(|&&d| d >= found.max(1)) {
            return Err(format!(
                "-dev: device {d} is not there ({} found)",
                found.max(1)
            ));
        }
        if self.main as usize >= used.len() {
            return Err(format!(
                "-mg {}: only {} card{} in use",
                self.main,
                used.len(),
                if used.len() == 1 { "" } else { "s" }
            ));
        }
        if self.split.len() > used.len() {
            return Err(format!(
                "-ts gives {} shares for {} card{} in use",
                self.split.len(),
                used.len(),
                if used.len() == 1 { "" } else { "s" }
            ));
        }
        let card = |position: usize| UsedCard {
            device: used[position],
            position,
            share: self.split.get(position).copied().unwrap_or(0.0),
        };
        let main = self.main as usize;
        let mut out = vec![card(main)];
        if !self.main_only {
            out.extend((0..used.len()).filter(|&i| i != main).map(card));
        }
        Ok(out)
    }

    /// Whether the request names several cards itself (`-dev A,B`, or `-ts` with shares for
    /// two cards or more), not only by finding them.
    pub fn asks_for_several(&self) -> bool {
        !self.main_only
            && (self.devices.as_ref().is_some_and(|d| d.len() > 1)
                || self.split.iter().filter(|&&s| s > 0.0).count() > 1)
    }
}

/// A card in use: its device index, its position among the cards in use (as `-ts` and
/// `--gpu-budget A,B` count them) and its `-ts` share (0 without `-ts`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UsedCard {
    /// Device index of the kernel plugin.
    pub device: u32,
    /// Position among the cards in use.
    pub position: usize,
    /// `-ts` share.
    pub share: f32,
}

/// One card a plan places on: its name (`CUDA1`), its budget and its `-ts` share.
#[derive(Clone, Debug, PartialEq)]
pub struct CardBudget {
    /// Name shown in the plan and in errors.
    pub name: String,
    /// Bytes to plan with.
    pub budget: u64,
    /// Share of the experts placed on cards (0 for all cards: no `-ts`).
    pub share: f32,
}

/// A card after the main one and the routed experts it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerCard {
    /// Its name.
    pub name: String,
    /// The budget planned with.
    pub budget: u64,
    /// What it holds besides experts: the expert calls' inputs, outputs and kernel scratch.
    pub fixed: u64,
    /// Per layer, per expert: held here.
    pub experts: Vec<Vec<bool>>,
}

impl PeerCard {
    /// Bytes of routed experts held here.
    pub fn expert_bytes(&self, layers: &[MoeLayer]) -> u64 {
        layers
            .iter()
            .zip(&self.experts)
            .map(|(l, e)| e.iter().filter(|&&x| x).count() as u64 * l.expert_bytes)
            .sum()
    }
}

/// Each card's cap on expert bytes under `-ts` (`u64::MAX` for all without it): its share of
/// `all` expert bytes, rounded up to whole experts of the largest size `unit`, so that the caps
/// together hold every expert.
pub fn share_caps(cards: &[CardBudget], all: u64, unit: u64) -> Vec<u64> {
    let total: f64 = cards.iter().map(|c| f64::from(c.share.max(0.0))).sum();
    cards
        .iter()
        .map(|c| {
            if total <= 0.0 {
                return u64::MAX;
            }
            let want = (all as f64 * f64::from(c.share.max(0.0)) / total).ceil() as u64;
            want.div_ceil(unit.max(1)) * unit.max(1)
        })
        .collect()
}

/// Places experts on the cards after the main one (`peers`, each with its cap from
/// [`share_caps`]), each holding `peer_fixed` bytes besides: of the experts that `on_main`
/// leaves and `open` allows (per layer), from the last layer back, each card in turn takes
/// whole experts while its budget and cap hold them. Layers `whole` must end up on cards
/// whole (placed by hand on the card); one left partly on the host is a named error.
pub fn fill_peers(
    layers: &[MoeLayer],
    on_main: &[Vec<bool>],
    open: &[bool],
    whole: &[bool],
    peers: &[(CardBudget, u64)],
    peer_fixed: u64,
) -> Result<Vec<PeerCard>, PlanError> {
    let mut taken: Vec<Vec<bool>> = on_main.to_vec();
    let mut out = Vec::with_capacity(peers.len());
    for (card, cap) in peers {
        let Some(mut room) = card.budget.checked_sub(peer_fixed) else {
            return Err(PlanError(format!(
                "card {} has a budget of {}, below the {} its expert calls need (inputs, \
                 outputs and kernel scratch)",
                card.name,
                gib(card.budget),
                gib(peer_fixed)
            )));
        };
        room = room.min(*cap);
        let mut experts: Vec<Vec<bool>> = layers
            .iter()
            .map(|l| vec![false; l.n_expert as usize])
            .collect();
        for (i, l) in layers.iter().enumerate().rev() {
            if !open[i] {
                continue;
            }
            for e in 0..l.n_expert as usize {
                if !taken[i][e] && l.expert_bytes <= room {
                    room -= l.expert_bytes;
                    taken[i][e] = true;
                    experts[i][e] = true;
                }
            }
        }
        out.push(PeerCard {
            name: card.name.clone(),
            budget: card.budget,
            fixed: peer_fixed,
            experts,
        });
    }
    if let Some(i) = (0..layers.len()).find(|&i| whole[i] && taken[i].iter().any(|&t| !t)) {
        return Err(PlanError(format!(
            "the experts placed on the cards ({}) do not fit on them whole",
            layers[i].names.join(", ")
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_mg_ts_and_sm_none_pick_the_cards_main_first() {
        let pick = |r: &CardRequest, found| -> Vec<(u32, usize, f32)> {
            let cards = r.cards(found).unwrap();
            cards
                .iter()
                .map(|c| (c.device, c.position, c.share))
                .collect()
        };
        let any = CardRequest::default();
        assert_eq!(pick(&any, 2), vec![(0, 0, 0.0), (1, 1, 0.0)]);
        // No device reported (a CPU plugin): the one device 0.
        assert_eq!(pick(&any, 0), vec![(0, 0, 0.0)]);
        let mg = CardRequest {
            main: 1,
            split: vec![3.0, 1.0],
            ..Default::default()
        };
        assert_eq!(pick(&mg, 2), vec![(1, 1, 1.0), (0, 0, 3.0)]);
        let dev = CardRequest {
            devices: Some(vec![2, 0]),
            ..Default::default()
        };
        assert_eq!(pick(&dev, 3), vec![(2, 0, 0.0), (0, 1, 0.0)]);
        let none = CardRequest {
            main: 1,
            main_only: true,
            ..Default::default()
        };
        assert_eq!(pick(&none, 2), vec![(1, 1, 0.0)]);
        assert!(!none.asks_for_several());
        assert!(dev.asks_for_several() && mg.asks_for_several() && !any.asks_for_several());
        let e = dev.cards(2).unwrap_err();
        assert!(e.contains("device 2 is not there"), "{e}");
        let e = CardRequest {
            main: 2,
            ..Default::default()
        }
        .cards(2)
        .unwrap_err();
        assert!(e.starts_with("-mg 2"), "{e}");
        let e = CardRequest {
            split: vec![1.0, 1.0, 1.0],
            ..Default::default()
        }
        .cards(2)
        .unwrap_err();
        assert!(e.starts_with("-ts gives 3 shares for 2 cards"), "{e}");
    }

    fn card(name: &str, budget: u64, share: f32) -> CardBudget {
        CardBudget {
            name: name.into(),
            budget,
            share,
        }
    }

    #[test]
    fn shares_cap_each_card_in_whole_experts_and_cover_them_all() {
        let cards = [card("a", 0, 3.0), card("b", 0, 1.0)];
        // 1,000 bytes of experts of 100: 750 and 250, rounded up to 800 and 300.
        assert_eq!(share_caps(&cards, 1000, 100), vec![800, 300]);
        let no_ts = [card("a", 0, 0.0), card("b", 0, 0.0)];
        assert_eq!(share_caps(&no_ts, 1000, 100), vec![u64::MAX; 2]);
        // A zero share takes nothing.
        let zero = [card("a", 0, 1.0), card("b", 0, 0.0)];
        assert_eq!(share_caps(&zero, 1000, 100), vec![1000, 0]);
    }
}
