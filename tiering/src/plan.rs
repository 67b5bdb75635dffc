//! The placement plan made at load: dense weights, the state and the activation scratch on the
//! card, then each routed expert on the card or in host RAM. llama.cpp's `-cmoe`, `-ncmoe N` and
//! `-ot REGEX=CPU` choose host experts by hand; without them the card takes as many experts as its
//! budget holds, whole layers from the last one back (the host keeps the first layers' experts, as
//! `-ncmoe` does), then the leading experts of one more layer.

use std::fmt;

use regex::Regex;

use crate::cards::{fill_peers, share_caps, CardBudget, CardRequest, PeerCard};
use crate::moe_layer::gib;
pub use crate::moe_layer::{MoeLayer, PlanError};

/// What the model needs besides routed experts, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedCosts {
    /// Every weight that is not a routed-expert stack.
    pub dense: u64,
    /// State buffers of every slot (KV cache).
    pub state: u64,
    /// What draft decoding keeps on the card besides (0 when not drafting): the rollback copy
    /// of every slot's per-sequence state and the verify passes' per-row states. Planned as
    /// fixed, so a card short of room holds fewer experts rather than drafting less.
    pub drafting: u64,
    /// Activations and kernel scratch for the largest batch.
    pub scratch: u64,
    /// Bytes of `dense` that only row gathers read (token embeddings, see
    /// [`super::gathered_tables`]). When experts live on the host these stay in page-locked
    /// host RAM and the card reads its few rows a pass in place, as llama.cpp keeps its input
    /// embeddings on the CPU.
    pub tables: u64,
}

/// How the user asked for experts to be placed.
#[derive(Clone, Debug, Default)]
pub struct TierRequest {
    /// `-cmoe`: every routed expert in host RAM.
    pub cpu_moe: bool,
    /// `-ncmoe N`: the experts of blocks `0..N` in host RAM.
    pub n_cpu_moe: Option<u32>,
    /// `-ot REGEX=BUFFER,…` in order; the first pattern a stack's name matches decides.
    pub overrides: Vec<(Regex, Buffer)>,
    /// `--gpu-budget A,B`: each card's bytes to plan with instead of its free memory (one
    /// value: every card's; empty: free memory).
    pub gpu_budgets: Vec<u64>,
    /// `-dev`, `-mg`, `-ts`, `-sm`: the cards used and how experts are shared among them.
    pub cards: CardRequest,
    /// `--host-budget`: host bytes to plan with instead of MemAvailable.
    pub host_budget: Option<u64>,
    /// `--no-residency`: keep the plan's placement (no moves from routing counts).
    pub no_residency: bool,
    /// `--disk-prefetch N`: with the disk tier, read ahead each row's N likeliest experts of the
    /// next layer (0: read only what a call asks for).
    pub disk_prefetch: u32,
    /// `--bus-experts N`: of a decode step's host experts, how many per layer the card computes
    /// by reading their weights in place over the bus while the CPU computes the rest (`None`:
    /// sizes chosen at run time, see [`bus_candidates`]; `Some(0)`: none).
    pub bus_experts: Option<u32>,
    /// `--no-decode-staging`: the staging sets hold nothing between prompts (by default each
    /// keeps one host layer's whole stacks, which passes that stream nothing then compute on
    /// the card: [`Plan::lent`]).
    pub no_decode_staging: bool,
    /// The most rows one pass evaluates (a prompt batch: the server's `-ub`, `bench`'s `-p`);
    /// the card's activations and kernel scratch are planned for it. 0:
    /// [`DEFAULT_BATCH_ROWS`].
    pub batch_rows: u32,
}

/// Rows of a prompt batch by default: llama-server's `-ub`. `run` and `bench`'s depth fill
/// evaluate long prompts in batches of this size, which the plan assumes unless told otherwise.
pub const DEFAULT_BATCH_ROWS: u32 = 512;

/// Of every `k` host experts a pass routes to (one row's), how many the card may compute by
/// reading them over the bus: `--bus-experts n` (at most `k`) twice, or the two sizes the first
/// decode passes choose between (`bus_balance`): a quarter and three eighths of `k`, rounded to
/// nearest (2 and 3 of 8). Measured on the H200's host (docs/performance.md, "the bus share"):
/// the card reads page-locked memory in place at 30–46 GB/s beside the CPU's 60–100, and which
/// of the two sizes balances them best differed between models and calls.
pub fn bus_candidates(asked: Option<u32>, k: u32) -> [u32; 2] {
    match asked {
        Some(n) => [n.min(k); 2],
        None => [(k + 2) / 4, (3 * k + 4) / 8],
    }
}

/// Where `-ot` sends tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// Host RAM (`CPU`).
    Host,
    /// The card (`CUDA0`, `GPU`, …).
    Card,
}

impl TierRequest {
    /// Whether anything asks for host experts or budgets.
    pub fn is_default(&self) -> bool {
        !self.places_by_hand() && self.gpu_budgets.is_empty() && self.host_budget.is_none()
    }

    /// The budget asked for the card at position `i` of `--gpu-budget A,B` (one value: every
    /// card's), if any.
    pub fn gpu_budget(&self, i: usize) -> Option<u64> {
        match self.gpu_budgets.as_slice() {
            [one] => Some(*one),
            many => many.get(i).copied(),
        }
    }

    /// Whether `-cmoe`, `-ncmoe` or `-ot` place experts by hand (the planner then fills nothing
    /// itself: every layer not sent to the host goes to the card whole).
    pub fn places_by_hand(&self) -> bool {
        self.cpu_moe || self.n_cpu_moe.is_some() || !self.overrides.is_empty()
    }

    /// Parses llama.cpp's `-ot` value: `REGEX=BUFFER` pairs separated by commas.
    pub fn parse_overrides(spec: &str) -> Result<Vec<(Regex, Buffer)>, String> {
        let mut out = Vec::new();
        for item in spec.split(',').filter(|s| !s.is_empty()) {
            let (pat, buf) = item
                .rsplit_once('=')
                .ok_or_else(|| format!("-ot {item:?}: expected REGEX=BUFFER"))?;
            let re = Regex::new(pat).map_err(|e| format!("-ot {pat:?}: {e}"))?;
            let b = buf.to_ascii_uppercase();
            let buffer = if b == "CPU" {
                Buffer::Host
            } else if b.starts_with("CUDA") || b == "GPU" {
                Buffer::Card
            } else {
                return Err(format!(
                    "-ot {item:?}: unknown buffer {buf:?} (CPU, CUDA0 or GPU)"
                ));
            };
            out.push((re, buffer));
        }
        Ok(out)
    }
}

/// Parses a size such as `24G`, `6.5GiB`, `512M` or a plain byte count.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("size {s:?}: expected a number with K, M, G or T"))?;
    let mult = match unit.trim().to_ascii_uppercase().trim_end_matches("IB") {
        "" | "B" => 1u64,
        "K" | "KB" => 1 << 10,
        "M" | "MB" => 1 << 20,
        "G" | "GB" => 1 << 30,
        "T" | "TB" => 1 << 40,
        _ => return Err(format!("size {s:?}: unknown unit {unit:?}")),
    };
    Ok((v * mult as f64) as u64)
}

/// Where each routed expert lives.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The MoE layers, in graph order.
    pub layers: Vec<MoeLayer>,
    /// Per layer, per expert: on the (main) card.
    pub on_card: Vec<Vec<bool>>,
    /// The cards after the main one and the experts each holds (empty with one card).
    pub peers: Vec<PeerCard>,
    /// What the card holds besides experts.
    pub fixed: FixedCosts,
    /// Card buffers a prompt streams a host layer's experts into (0 when every expert is on
    /// the card): one set, or two when they fit beside the fixed costs, so that the next
    /// layer's copy overlaps this layer's calls.
    pub staging: u64,
    /// Sets of staging buffers in `staging` (0, 1 or 2).
    pub staging_sets: usize,
    /// Layers (indices in `layers`, none with card experts) whose whole stacks the staging sets
    /// hold between prompts, one a set: passes that stream nothing (decode) compute them on the
    /// card from there. A prompt streams every layer with host experts in order, each into set
    /// (its rank among them) mod `staging_sets`, so a set lent to the last layer streamed into
    /// it still holds that layer when the prompt ends.
    pub lent: Vec<usize>,
    /// The (main) card's budget planned with.
    pub card_budget: u64,
    /// The main card's name.
    pub card_name: String,
    /// The host budget planned with.
    pub host_budget: u64,
    /// Whether the gather-only tables (`fixed.tables`) stay in host RAM, read in place by the
    /// card, rather than on it: when experts live on the host and the host budget holds the
    /// tables beside them.
    pub tables_on_host: bool,
    /// Weight indices of those tables (set by the loader's planning, which reads the graph).
    pub table_weights: Vec<usize>,
    /// Bytes of the hashed n-gram tables (weights of class `NgramTable`: Qwen3.8's PLE table,
    /// DeepSeek-V4.1's Engram tables), never on a card: the host gathers each pass's rows from
    /// host RAM, or from disk when [`Plan::ngram_on_disk`] (set by the loader's planning).
    pub ngram_tables: u64,
    /// Whether the n-gram tables are read from disk: the host budget left beside the host
    /// experts and the token tables cannot hold them.
    pub ngram_on_disk: bool,
}

/// The least the n-gram tables' disk reader caches of their rows (more when the host budget
/// leaves more beside the host experts and token tables).
pub const NGRAM_CACHE_MIN: u64 = 64 << 20;

/// The staging set of `sets` a prompt streams tier layer `layer` (its rank among the layers with
/// host experts) into: prompts stream every tier layer in order, taking turns over the sets, so
/// the last layer streamed into a set is the last of its rank mod `sets`.
pub fn stream_set(layer: usize, sets: usize) -> usize {
    layer % sets.max(1)
}

/// The layers lent a staging set ([`Plan::lent`]) for `sets` sets: for each set, the last layer
/// with host experts a prompt streams into it ([`super::stream_set`] of its rank among those
/// layers), when that layer has no card experts.
fn lent_layers(on_card: &[Vec<bool>], sets: usize) -> Vec<usize> {
    let tiered: Vec<usize> = (0..on_card.len())
        .filter(|&i| on_card[i].iter().any(|&c| !c))
        .collect();
    let mut decided = vec![false; sets];
    let mut lent = Vec::new();
    for (rank, &i) in tiered.iter().enumerate().rev() {
        let Some(seen) = decided.get_mut(stream_set(rank, sets)) else {
            break;
        };
        if !std::mem::replace(seen, true) && on_card[i].iter().all(|&c| !c) {
            lent.push(i);
        }
    }
    lent.sort_unstable();
    lent
}

/// What [`Plan::across`] places with besides the layers: the fixed costs, the main card's and
/// the host's budgets, the main card's `-ts` cap, the other cards with theirs and what each of
/// them holds besides experts, and the request.
struct Placing<'a> {
    fixed: FixedCosts,
    card_name: &'a str,
    card_budget: u64,
    host_budget: u64,
    main_cap: u64,
    peers: &'a [(CardBudget, u64)],
    peer_fixed: u64,
    request: &'a TierRequest,
}

impl Plan {
    /// Places every routed expert for `request` on `cards` (the main card first: it holds the
    /// dense weights, the state and the scratch; each other card holds `peer_fixed` bytes for
    /// its expert calls), host RAM and disk. The main card takes experts as it would alone
    /// (whole layers from the last one back; under `-ts` up to its share), then each other card
    /// in turn takes what is left, from the last layer back, within its budget and share; the
    /// rest stays on the host. With host experts the main card keeps staging sets for prompts
    /// and the gather-only tables stay in host RAM when the host budget holds them beside the
    /// host experts (else, with the disk tier, on the card).
    pub fn across(
        layers: Vec<MoeLayer>,
        fixed: FixedCosts,
        cards: &[CardBudget],
        peer_fixed: u64,
        host_budget: u64,
        request: &TierRequest,
    ) -> Result<Plan, PlanError> {
        let Some(main) = cards.first() else {
            return Err(PlanError("no card to plan on".into()));
        };
        let all_experts: u64 = layers
            .iter()
            .map(|l| l.expert_bytes * u64::from(l.n_expert))
            .sum();
        let unit = layers.iter().map(|l| l.expert_bytes).max().unwrap_or(1);
        let caps = share_caps(cards, all_experts, unit);
        let peers: Vec<(CardBudget, u64)> = cards[1..]
            .iter()
            .cloned()
            .zip(caps[1..].iter().copied())
            .collect();
        let ctx = Placing {
            fixed,
            card_name: &main.name,
            card_budget: main.budget,
            host_budget,
            main_cap: caps[0],
            peers: &peers,
            peer_fixed,
            request,
        };
        let pins_host = request.cpu_moe
            || request.n_cpu_moe.is_some_and(|n| n > 0)
            || request.overrides.iter().any(|(_, b)| *b == Buffer::Host);
        if !pins_host {
            // When the cards hold every expert, no staging sets are needed.
            if let Ok(p) = ctx.place(layers.clone(), (false, false)) {
                if !p.has_host_experts() {
                    return Ok(p);
                }
            }
        }
        if fixed.tables > 0 {
            let on_host = ctx.place(layers.clone(), (true, true))?;
            if on_host.host_expert_bytes() + fixed.tables <= host_budget {
                return Ok(on_host);
            }
            // Host RAM is short: the tables go to the card unless only the host holds them.
            return Ok(ctx.place(layers, (true, false)).unwrap_or(on_host));
        }
        ctx.place(layers, (true, false))
    }
}

impl Placing<'_> {
    /// The plan with `tables_on_host` decided; `tiered`: whether any expert must live on the
    /// host (the main card then keeps staging sets).
    fn place(
        &self,
        layers: Vec<MoeLayer>,
        (tiered, tables_on_host): (bool, bool),
    ) -> Result<Plan, PlanError> {
        let (fixed, request, card_budget) = (self.fixed, self.request, self.card_budget);
        let dense = match tables_on_host {
            true => fixed.dense - fixed.tables.min(fixed.dense),
            false => fixed.dense,
        };
        let base = dense + fixed.state + fixed.drafting + fixed.scratch;
        // Host experts need card room to stream one layer's stacks for prompts.
        let staging = if tiered {
            layers
                .iter()
                .map(|l| l.expert_bytes * u64::from(l.n_expert))
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        let needed = base + staging;
        let drafting = match fixed.drafting {
            0 => String::new(),
            d => format!(" + drafting state {}", gib(d)),
        };
        let terms = format!(
            "dense weights {} + KV/state {}{drafting} + scratch {} + expert staging {} = {} on \
             the card",
            gib(dense),
            gib(fixed.state),
            gib(fixed.scratch),
            gib(staging),
            gib(needed)
        );
        if needed > card_budget {
            return Err(PlanError(format!(
                "{terms}, over its budget of {}",
                gib(card_budget)
            )));
        }
        // None: the planner decides; Some(b): the request pins the layer.
        let pinned: Vec<Option<Buffer>> = layers
            .iter()
            .map(|l| {
                if request.cpu_moe || request.n_cpu_moe.is_some_and(|n| l.block < n) {
                    return Some(Buffer::Host);
                }
                request
                    .overrides
                    .iter()
                    .find(|(re, _)| l.names.iter().any(|n| re.is_match(n)))
                    .map(|(_, b)| *b)
            })
            .collect();
        let by_hand = request.places_by_hand();
        let mut on_card: Vec<Vec<bool>> = layers
            .iter()
            .map(|l| vec![false; l.n_expert as usize])
            .collect();
        // A second staging set lets a prompt copy the next layer while this one runs (about a
        // third faster with every expert on the host); it is taken whenever it fits, before
        // experts are placed, at the cost of one layer's worth of card experts. A lone set is
        // filled in two parts, so that one half's copy overlaps the other half's call.
        let staging_sets = match staging {
            0 => 0,
            s if needed + s <= card_budget => 2,
            _ => 1,
        };
        let mut room = (card_budget - base - staging * staging_sets as u64).min(self.main_cap);
        // Pinned layers first (those that do not fit go to the other cards when there are
        // any), then (when nothing was asked by hand) the rest from the last layer back, whole
        // layers while they fit, then one whole host layer for each staging set to hold between
        // prompts (the last layers streamed, see `lent`), then the leading experts of one more.
        let card_layer =
            |i: usize| pinned[i] == Some(Buffer::Card) || (by_hand && pinned[i].is_none());
        for (i, l) in layers.iter().enumerate() {
            if card_layer(i) {
                let all = l.expert_bytes * u64::from(l.n_expert);
                if all > room {
                    if !self.peers.is_empty() {
                        continue;
                    }
                    return Err(PlanError(format!(
                        "{terms}, and the experts placed on it ({}) need {} more than its \
                         budget of {} holds",
                        l.names.join(", "),
                        gib(all - room),
                        gib(card_budget)
                    )));
                }
                room -= all;
                on_card[i].fill(true);
            }
        }
        let sets_lent = match request.no_decode_staging {
            true => 0,
            false => staging_sets,
        };
        // Layers kept whole on the host for the staging sets: the other cards leave them.
        let mut kept = vec![false; layers.len()];
        if !by_hand {
            let mut to_lend = sets_lent;
            for (i, l) in layers.iter().enumerate().rev() {
                if pinned[i].is_some() {
                    continue;
                }
                let fit = (room / l.expert_bytes.max(1)).min(u64::from(l.n_expert)) as usize;
                if fit < l.n_expert as usize && to_lend > 0 {
                    to_lend -= 1;
                    kept[i] = true;
                    continue;
                }
                on_card[i][..fit].fill(true);
                room -= fit as u64 * l.expert_bytes;
            }
        }
        let open: Vec<bool> = (0..layers.len())
            .map(|i| pinned[i] != Some(Buffer::Host) && !kept[i])
            .collect();
        let whole: Vec<bool> = (0..layers.len()).map(card_layer).collect();
        let peers = fill_peers(
            &layers,
            &on_card,
            &open,
            &whole,
            self.peers,
            self.peer_fixed,
        )?;
        let mut on_any = on_card.clone();
        for p in &peers {
            for (a, e) in on_any.iter_mut().zip(&p.experts) {
                a.iter_mut().zip(e).for_each(|(a, &e)| *a |= e);
            }
        }
        Ok(Plan {
            lent: lent_layers(&on_any, sets_lent),
            layers,
            on_card,
            peers,
            fixed,
            staging: staging * staging_sets as u64,
            staging_sets,
            card_budget,
            card_name: self.card_name.to_owned(),
            host_budget: self.host_budget,
            tables_on_host,
            table_weights: Vec::new(),
            ngram_tables: 0,
            ngram_on_disk: false,
        })
    }
}

impl Plan {
    /// Parts each streamed layer's experts are copied and computed in: 2 with one set (the
    /// copy of one half overlaps the call over the other), else 1.
    pub fn staging_parts(&self) -> usize {
        if self.staging_sets == 1 {
            2
        } else {
            1
        }
    }

    /// Bytes of dense weights on the card (less the tables left in host RAM).
    pub fn card_dense_bytes(&self) -> u64 {
        match self.tables_on_host {
            true => self.fixed.dense - self.fixed.tables.min(self.fixed.dense),
            false => self.fixed.dense,
        }
    }

    /// Decides where the n-gram tables of `bytes` live: in host RAM when the host budget
    /// holds them beside the host experts and the token tables left there, else on disk.
    pub fn place_ngram_tables(&mut self, bytes: u64) {
        let used = self.host_expert_bytes() + self.host_table_bytes();
        self.ngram_tables = bytes;
        self.ngram_on_disk = bytes > 0 && used.saturating_add(bytes) > self.host_budget;
    }

    /// With the n-gram tables on disk, the bytes of rows their reader caches: what the host
    /// budget leaves beside the host experts and token tables, at least [`NGRAM_CACHE_MIN`].
    pub fn ngram_disk_cache(&self) -> Option<u64> {
        let used = self.host_expert_bytes() + self.host_table_bytes();
        self.ngram_on_disk
            .then(|| self.host_budget.saturating_sub(used).max(NGRAM_CACHE_MIN))
    }

    /// Bytes of the gather-only tables left in host RAM.
    pub fn host_table_bytes(&self) -> u64 {
        match self.tables_on_host {
            true => self.fixed.tables,
            false => 0,
        }
    }

    /// Bytes of routed experts on the (main) card.
    pub fn card_expert_bytes(&self) -> u64 {
        self.bytes_where(|l, e| self.on_card[l][e])
    }

    /// Bytes of routed experts in host RAM (on no card).
    pub fn host_expert_bytes(&self) -> u64 {
        self.bytes_where(|l, e| self.on_host(l, e))
    }

    /// Whether expert `e` of layer `l` lives on no card.
    pub fn on_host(&self, l: usize, e: usize) -> bool {
        !self.on_card[l][e] && !self.peers.iter().any(|p| p.experts[l][e])
    }

    /// Bytes of the experts (layer, expert) for which `pick` holds.
    fn bytes_where(&self, pick: impl Fn(usize, usize) -> bool) -> u64 {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                (0..l.n_expert as usize).filter(|&e| pick(i, e)).count() as u64 * l.expert_bytes
            })
            .sum()
    }

    /// Whether any expert lives in host RAM.
    pub fn has_host_experts(&self) -> bool {
        (0..self.layers.len()).any(|l| (0..self.on_card[l].len()).any(|e| self.on_host(l, e)))
    }

    /// Whether any card after the main one holds experts.
    pub fn has_peer_experts(&self) -> bool {
        self.peers
            .iter()
            .any(|p| p.experts.iter().flatten().any(|&x| x))
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dense = self.card_dense_bytes();
        let card =
            dense + self.fixed.state + self.fixed.drafting + self.fixed.scratch + self.staging;
        match self.peers.is_empty() {
            true => writeln!(f, "card budget {}:", gib(self.card_budget))?,
            false => writeln!(
                f,
                "main card {} budget {}:",
                self.card_name,
                gib(self.card_budget)
            )?,
        }
        writeln!(f, "  dense weights   {}", gib(dense))?;
        writeln!(f, "  KV cache/state  {}", gib(self.fixed.state))?;
        if self.fixed.drafting > 0 {
            writeln!(f, "  drafting state  {}", gib(self.fixed.drafting))?;
        }
        writeln!(f, "  scratch         {}", gib(self.fixed.scratch))?;
        let lent: Vec<String> = self
            .lent
            .iter()
            .map(|&i| format!("blk.{}", self.layers[i].block))
            .collect();
        writeln!(
            f,
            "  expert staging  {} ({} set{}{}{})",
            gib(self.staging),
            self.staging_sets,
            if self.staging_sets == 1 { "" } else { "s" },
            match self.staging_parts() {
                0 | 1 => String::new(),
                n => format!(", filled in {n} parts"),
            },
            match lent.is_empty() {
                true => String::new(),
                false => format!(
                    "; between prompts holding the experts of {} for decode",
                    lent.join(", ")
                ),
            }
        )?;
        writeln!(f, "  routed experts  {}", gib(self.card_expert_bytes()))?;
        writeln!(
            f,
            "  total           {}",
            gib(card + self.card_expert_bytes())
        )?;
        let host = self.host_expert_bytes();
        if self.tables_on_host {
            writeln!(
                f,
                "host budget {}: token tables {} (page-locked, read in place by the card)",
                gib(self.host_budget),
                gib(self.fixed.tables)
            )?;
        }
        writeln!(
            f,
            "host budget {}: routed experts {}{}",
            gib(self.host_budget),
            gib(host),
            if host > self.host_budget {
                " (over the budget: read from disk into an arena of the budget)"
            } else {
                ""
            }
        )?;
        if self.ngram_tables > 0 {
            writeln!(
                f,
                "host budget {}: n-gram tables {} ({}; never on the card)",
                gib(self.host_budget),
                gib(self.ngram_tables),
                match self.ngram_on_disk {
                    true => "over what the budget leaves: each pass's rows read from disk",
                    false => "each pass's rows gathered from host RAM",
                }
            )?;
        }
        for p in &self.peers {
            writeln!(
                f,
                "card {} budget {}: expert calls' buffers {}, routed experts {}",
                p.name,
                gib(p.budget),
                gib(p.fixed),
                gib(p.expert_bytes(&self.layers))
            )?;
        }
        match self.peers.is_empty() {
            true => writeln!(f, "experts on the card per layer:")?,
            false => writeln!(f, "experts on the main card (and on the others) per layer:")?,
        }
        for (i, (l, c)) in self.layers.iter().zip(&self.on_card).enumerate() {
            let n = c.iter().filter(|&&x| x).count();
            let note = match self.lent.contains(&i) {
                true => " (all in a staging set between prompts)",
                false => "",
            };
            let peers: String = self
                .peers
                .iter()
                .map(|p| {
                    let k = p.experts[i].iter().filter(|&&x| x).count();
                    format!(", {} {k}", p.name)
                })
                .collect();
            writeln!(
                f,
                "  blk.{:<3} {n:>4} / {}{peers}{note}",
                l.block, l.n_expert
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan on one card of `card_budget`.
    fn make(
        layers: Vec<MoeLayer>,
        fixed: FixedCosts,
        card_budget: u64,
        host_budget: u64,
        request: &TierRequest,
    ) -> Result<Plan, PlanError> {
        let card = CardBudget {
            name: "CUDA0".into(),
            budget: card_budget,
            share: 0.0,
        };
        Plan::across(layers, fixed, &[card], 0, host_budget, request)
    }

    fn layers(n: u32, n_expert: u32, bytes: u64) -> Vec<MoeLayer> {
        (0..n)
            .map(|b| MoeLayer {
                block: b,
                stacks: vec![],
                names: vec![format!("blk.{b}.ffn_gate_exps.weight")],
                n_expert,
                expert_bytes: bytes,
            })
            .collect()
    }

    const FIXED: FixedCosts = FixedCosts {
        dense: 1000,
        state: 200,
        drafting: 0,
        scratch: 100,
        tables: 0,
    };

    fn on_card_counts(p: &Plan) -> Vec<usize> {
        p.on_card
            .iter()
            .map(|c| c.iter().filter(|&&x| x).count())
            .collect()
    }

    #[test]
    fn fills_the_card_from_the_last_layer_back() {
        let keep = TierRequest {
            no_decode_staging: true,
            ..Default::default()
        };
        // 1,300 fixed and two staging sets of 400; 700 left = 1 whole layer of 4×100 and 3
        // experts of one more.
        let p = make(layers(4, 4, 100), FIXED, 2800, 1 << 30, &keep).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 3, 4]);
        assert_eq!((p.staging, p.staging_sets, p.staging_parts()), (800, 2, 1));
        assert_eq!(p.card_expert_bytes(), 700);
        assert_eq!(p.host_expert_bytes(), 900);
        assert!(p.lent.is_empty());
        // Room for one set only: the card keeps only it, and experts in what is left.
        let p = make(layers(4, 4, 100), FIXED, 2000, 1 << 30, &keep).unwrap();
        assert_eq!((p.staging, p.staging_sets, p.staging_parts()), (400, 1, 2));
        assert_eq!(on_card_counts(&p), vec![0, 0, 0, 3]);
        assert_eq!(p.card_expert_bytes(), 300);
        assert_eq!(p.host_expert_bytes(), 1300);
        // Everything fits: no host experts.
        let all = make(layers(4, 4, 100), FIXED, 2900, 0, &TierRequest::default()).unwrap();
        assert!(!all.has_host_experts());
        assert_eq!(all.staging, 0);
        assert!(all.lent.is_empty());
    }

    /// Draft decoding's state is a fixed cost: a card short of room holds fewer experts, the
    /// plan shows it, and a card that cannot hold it with the rest names it.
    #[test]
    fn the_drafting_state_takes_card_room_from_the_experts() {
        let keep = TierRequest {
            no_decode_staging: true,
            ..Default::default()
        };
        let drafting = FixedCosts {
            drafting: 200,
            ..FIXED
        };
        // As in the test above, 700 left for experts without drafting, 500 with it.
        let without = make(layers(4, 4, 100), FIXED, 2800, 1 << 30, &keep).unwrap();
        let with = make(layers(4, 4, 100), drafting, 2800, 1 << 30, &keep).unwrap();
        assert_eq!(
            (without.card_expert_bytes(), with.card_expert_bytes()),
            (700, 500)
        );
        assert_eq!(on_card_counts(&with), vec![0, 0, 1, 4]);
        assert!(with.to_string().contains("drafting state"), "{with}");
        assert!(!without.to_string().contains("drafting state"), "{without}");
        let e = make(layers(2, 4, 100), drafting, 1400, 0, &keep)
            .unwrap_err()
            .to_string();
        assert!(e.contains("+ drafting state 0.0 MiB +"), "{e}");
    }

    #[test]
    fn the_staging_sets_hold_the_last_host_layers_between_prompts() {
        // As above, but the two layers after the card's whole ones stay on the host for the two
        // staging sets to hold, and the partial layer comes before them: the lent layers are
        // the last a prompt streams into their sets (ranks 1 and 2 of the host layers 0, 1, 2).
        let p = make(layers(4, 4, 100), FIXED, 2800, 1 << 30, &Default::default()).unwrap();
        assert_eq!(on_card_counts(&p), vec![3, 0, 0, 4]);
        assert_eq!(p.lent, vec![1, 2]);
        let text = p.to_string();
        assert!(
            text.contains("holding the experts of blk.1, blk.2"),
            "{text}"
        );
        // One set: one layer lent, the last with host experts.
        let p = make(layers(4, 4, 100), FIXED, 2000, 1 << 30, &Default::default()).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 3, 0]);
        assert_eq!(p.lent, vec![3]);
        // By hand: the last layers sent to the host.
        let cmoe = TierRequest {
            cpu_moe: true,
            ..Default::default()
        };
        let p = make(layers(3, 4, 100), FIXED, 1 << 20, 1 << 20, &cmoe).unwrap();
        assert_eq!(p.lent, vec![1, 2]);
        let ot = TierRequest {
            overrides: TierRequest::parse_overrides(r"blk\.1\.ffn_.*_exps=CPU").unwrap(),
            ..Default::default()
        };
        let p = make(layers(3, 4, 100), FIXED, 1 << 20, 1 << 20, &ot).unwrap();
        assert_eq!(p.lent, vec![1]);
        // A layer with card experts is never lent, and a set goes only to the last layer
        // streamed into it (an earlier one would be overwritten by every prompt): with host
        // layers 0–3 (ranks 0–3) and layer 3 partial, set 1 is not lent and layer 2 takes set 0.
        let mut on_card = vec![vec![false; 4]; 5];
        on_card[3][0] = true;
        on_card[4] = vec![true; 4];
        assert_eq!(lent_layers(&on_card, 2), vec![2]);
        assert_eq!(lent_layers(&on_card, 1), Vec::<usize>::new());
        assert_eq!(lent_layers(&on_card, 0), Vec::<usize>::new());
        on_card[3][0] = false;
        assert_eq!(lent_layers(&on_card, 2), vec![2, 3]);
        assert_eq!(lent_layers(&on_card, 1), vec![3]);
    }

    #[test]
    fn token_tables_stay_in_host_ram_beside_host_experts() {
        let fixed = FixedCosts {
            tables: 300,
            ..FIXED
        };
        // Staging sets not lent, so that every freed byte shows as card experts.
        let keep = TierRequest {
            no_decode_staging: true,
            ..Default::default()
        };
        // Everything fits: the card keeps the tables.
        let all = make(layers(4, 4, 100), fixed, 2900, 1 << 30, &keep).unwrap();
        assert!(!all.has_host_experts() && !all.tables_on_host);
        assert_eq!(all.card_dense_bytes(), 1000);
        // Experts on the host: the tables' 300 bytes go to 3 more card experts (1,000 after 700
        // dense, 300 state and scratch and two staging sets of 400).
        let p = make(layers(4, 4, 100), fixed, 2800, 1 << 30, &keep).unwrap();
        assert!(p.tables_on_host);
        assert_eq!(on_card_counts(&p), vec![0, 2, 4, 4]);
        assert_eq!((p.card_dense_bytes(), p.host_table_bytes()), (700, 300));
        assert!(p.to_string().contains("token tables"), "{p}");
        // A host budget that holds the 600 bytes of host experts but not the tables beside them:
        // the card keeps the tables and 3 fewer experts.
        let p = make(layers(4, 4, 100), fixed, 2800, 700, &keep).unwrap();
        assert!(!p.tables_on_host);
        assert_eq!(on_card_counts(&p), vec![0, 0, 3, 4]);
        // -cmoe: every expert on the host, and the tables with them.
        let cmoe = TierRequest {
            cpu_moe: true,
            ..Default::default()
        };
        let p = make(layers(4, 4, 100), fixed, 1 << 20, 1 << 20, &cmoe).unwrap();
        assert!(p.tables_on_host);
    }

    #[test]
    fn llama_cpp_flags_pin_layers() {
        let big = 1 << 20;
        let cmoe = TierRequest {
            cpu_moe: true,
            ..Default::default()
        };
        let p = make(layers(3, 4, 100), FIXED, big, big, &cmoe).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 0]);
        // Room to spare: two staging sets, so prompts overlap copies with calls.
        assert_eq!((p.staging, p.staging_sets, p.staging_parts()), (800, 2, 1));
        // Room for exactly one set: one.
        let p = make(layers(3, 4, 100), FIXED, 1300 + 400, big, &cmoe).unwrap();
        assert_eq!((p.staging, p.staging_sets, p.staging_parts()), (400, 1, 2));
        let p = make(layers(3, 4, 100), FIXED, 1300 + 800, big, &cmoe).unwrap();
        assert_eq!((p.staging, p.staging_sets, p.staging_parts()), (800, 2, 1));
        let ncmoe = TierRequest {
            n_cpu_moe: Some(2),
            ..Default::default()
        };
        let p = make(layers(3, 4, 100), FIXED, big, big, &ncmoe).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 4]);
        let ot = TierRequest {
            overrides: TierRequest::parse_overrides(r"blk\.1\.ffn_.*_exps=CPU").unwrap(),
            ..Default::default()
        };
        let p = make(layers(3, 4, 100), FIXED, big, big, &ot).unwrap();
        assert_eq!(on_card_counts(&p), vec![4, 0, 4]);
    }

    #[test]
    fn refusals_name_every_term() {
        let e = make(layers(2, 4, 100), FIXED, 1200, 0, &TierRequest::default())
            .unwrap_err()
            .to_string();
        for term in ["dense weights", "KV/state", "scratch", "staging", "budget"] {
            assert!(e.contains(term), "{e}");
        }
        // By hand, layers left to the card must fit whole.
        let ncmoe = TierRequest {
            n_cpu_moe: Some(1),
            ..Default::default()
        };
        let e = make(layers(2, 4, 100), FIXED, 1900, 0, &ncmoe)
            .unwrap_err()
            .to_string();
        assert!(e.contains("blk.1.ffn_gate_exps.weight"), "{e}");
    }

    /// The plan on a main card of `main` bytes and a second card (`CUDA1`) of `peer` bytes, of
    /// which 50 are its expert calls' buffers, with `-ts` shares `ts` (zeros: none).
    fn two(main: u64, peer: u64, ts: [f32; 2], request: &TierRequest) -> Result<Plan, PlanError> {
        let cards = [
            CardBudget {
                name: "CUDA0".into(),
                budget: main,
                share: ts[0],
            },
            CardBudget {
                name: "CUDA1".into(),
                budget: peer,
                share: ts[1],
            },
        ];
        Plan::across(layers(4, 4, 100), FIXED, &cards, 50, 1 << 30, request)
    }

    fn peer_counts(p: &Plan) -> Vec<usize> {
        p.peers[0]
            .experts
            .iter()
            .map(|c| c.iter().filter(|&&x| x).count())
            .collect()
    }

    #[test]
    fn a_second_card_takes_what_the_main_card_leaves_from_the_last_layer_back() {
        // The main card keeps 700 of experts after its 1,300 fixed; the second card's 900 after
        // its 50 hold the other 900: no host experts, so no staging sets.
        let p = two(2000, 950, [0.0; 2], &TierRequest::default()).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 3, 4]);
        assert_eq!(peer_counts(&p), vec![4, 4, 1, 0]);
        assert!(p.peers[0].experts[2][3] && !p.on_card[2][3]);
        assert_eq!((p.staging, p.host_expert_bytes()), (0, 0));
        assert!(!p.has_host_experts() && p.has_peer_experts());
        assert_eq!(p.peers[0].expert_bytes(&p.layers), 900);
        let text = p.to_string();
        assert!(text.contains("main card CUDA0 budget"), "{text}");
        assert!(text.contains("\ncard CUDA1 budget"), "{text}");
        assert!(text.contains("blk.2      3 / 4, CUDA1 1"), "{text}");
        // A second card too small for its expert calls is named.
        let e = two(2000, 40, [0.0; 2], &TierRequest::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("card CUDA1 has a budget of"), "{e}");
        // 100 short (1,300 and 200 of room): experts stay on the host, so the main card keeps
        // staging sets (two of 400 in 2,600) and lends them layers 1 and 2, which the second
        // card leaves.
        let p = two(2600, 250, [0.0; 2], &TierRequest::default()).unwrap();
        assert_eq!(on_card_counts(&p), vec![1, 0, 0, 4]);
        assert_eq!(peer_counts(&p), vec![2, 0, 0, 0]);
        assert_eq!((p.lent.clone(), p.host_expert_bytes()), (vec![1, 2], 900));
        // Without lending, the second card takes the partial layer's rest and more.
        let keep = TierRequest {
            no_decode_staging: true,
            ..Default::default()
        };
        let p = two(2600, 250, [0.0; 2], &keep).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 1, 4]);
        assert_eq!(peer_counts(&p), vec![0, 0, 2, 0]);
        assert_eq!(p.host_expert_bytes(), 900);
    }

    #[test]
    fn tensor_split_shares_the_experts_between_the_cards() {
        let big = 1 << 20;
        let none = TierRequest::default();
        // Room for all on the main card, but -ts 1,1 gives each card half.
        let p = two(big, big, [1.0, 1.0], &none).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 4, 4]);
        assert_eq!(peer_counts(&p), vec![4, 4, 0, 0]);
        let p = two(big, big, [3.0, 1.0], &none).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 4, 4, 4]);
        assert_eq!(peer_counts(&p), vec![4, 0, 0, 0]);
        // A zero share: nothing on the second card.
        let p = two(big, big, [1.0, 0.0], &none).unwrap();
        assert_eq!(peer_counts(&p), vec![0; 4]);
        assert!(!p.has_host_experts());
        // A share the card's budget cannot hold: the rest goes to the host (the main card
        // keeping its share, and staging sets).
        let keep = TierRequest {
            no_decode_staging: true,
            ..Default::default()
        };
        let p = two(big, 350, [1.0, 1.0], &keep).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 4, 4]);
        assert_eq!(peer_counts(&p), vec![0, 3, 0, 0]);
        assert_eq!((p.host_expert_bytes(), p.staging_sets), (500, 2));
        // A main card short of its share (one staging set of 400 and 100 of experts in 1,800):
        // the second card still takes only its half, and the host the rest.
        let p = two(1800, big, [1.0, 1.0], &keep).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 0, 0, 1]);
        assert_eq!(peer_counts(&p), vec![0, 1, 4, 3]);
        assert_eq!((p.host_expert_bytes(), p.staging_sets), (700, 1));
    }

    #[test]
    fn layers_placed_on_the_cards_by_hand_spill_whole_onto_the_second_card() {
        // -ncmoe 1: layer 0 on the host, the others on the cards whole. The main card (two
        // staging sets of 400 in 2,500) has room for one layer; the second card takes two.
        let ncmoe = TierRequest {
            n_cpu_moe: Some(1),
            ..Default::default()
        };
        let p = two(2500, 850, [0.0; 2], &ncmoe).unwrap();
        assert_eq!(on_card_counts(&p), vec![0, 4, 0, 0]);
        assert_eq!(peer_counts(&p), vec![0, 0, 4, 4]);
        assert_eq!(p.lent, vec![0]);
        // 100 short, a layer would be split: refused by name.
        let e = two(2500, 750, [0.0; 2], &ncmoe).unwrap_err().to_string();
        assert!(e.contains("blk.2.ffn_gate_exps.weight"), "{e}");
    }

    #[test]
    fn the_bus_share_sizes_are_a_quarter_and_three_eighths_or_as_asked() {
        assert_eq!(bus_candidates(None, 8), [2, 3]);
        assert_eq!(bus_candidates(None, 2), [1, 1]);
        assert_eq!(bus_candidates(None, 1), [0, 0]);
        assert_eq!(bus_candidates(Some(0), 8), [0, 0]);
        assert_eq!(bus_candidates(Some(12), 8), [8, 8]);
    }

    #[test]
    fn sizes_and_overrides_parse() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("6.5GiB").unwrap(), 6_979_321_856);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert!(parse_size("3 parsecs").is_err());
        assert_eq!(gib(u64::MAX), "unlimited");
        assert_eq!(gib(3 << 20), "3.0 MiB");
        let o = TierRequest::parse_overrides("exps=CPU,attn=CUDA0").unwrap();
        assert_eq!(o.len(), 2);
        assert_eq!(o[1].1, Buffer::Card);
        assert!(TierRequest::parse_overrides("exps=TPU").is_err());
        assert!(TierRequest::parse_overrides("exps").is_err());
    }
}
