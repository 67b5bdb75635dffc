//! MoE routing: from router logits to the top-k expert ids and their weights, in the order of
//! llama.cpp's `build_moe_ffn`: score = gating(logits); a selection copy gets the optional bias;
//! optional group stage; top-k on the selection copy; weights = unbiased scores of the chosen
//! experts; optional renormalisation; optional scale.
//!
//! **Ties**: the lower expert id wins (and the lower group index when ranking groups). A NaN score
//! ranks as `-inf`. The chosen ids are written best first. Nothing allocates.

use super::{check_len, mul_dims, whole_rows, OpError};

/// The gating function (GGUF `expert_gating_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// 1: softmax over all experts' logits.
    Softmax,
    /// 2: `sigmoid(logit)` per expert.
    Sigmoid,
    /// 3: select on the raw logits, then the weights are the softmax over the k chosen logits.
    SoftmaxSelected,
    /// 4: `sqrt(softplus(logit))` per expert (DeepSeek-V4).
    SqrtSoftplus,
}

impl Gating {
    /// The function for a GGUF `expert_gating_func` value (1..=4), `None` for anything else.
    pub fn from_gguf(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::Softmax),
            2 => Some(Self::Sigmoid),
            3 => Some(Self::SoftmaxSelected),
            4 => Some(Self::SqrtSoftplus),
            _ => None,
        }
    }
}

/// Renormalisation of the chosen weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Renorm {
    /// Keep the weights as they are.
    Off,
    /// Divide by `sum + epsilon` (DeepSeek-V4 / Solar: `epsilon` 1e-20; 0 for plain division).
    SumPlus(f32),
    /// Divide by `max(sum, min)` (llama.cpp's `ggml_clamp(sum, 6.1e-5, inf)` form).
    SumAtLeast(f32),
}

/// Group-limited routing (DeepSeek-V3 `n_group` / `topk_group`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    /// Number of groups of consecutive experts; divides `n_expert`; at most 64.
    pub n_group: usize,
    /// Groups kept, ranked by the sum of each group's top-2 biased scores.
    pub topk_group: usize,
}

/// The routing of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterParams<'a> {
    /// Number of experts (row length of the logits).
    pub n_expert: usize,
    /// Experts chosen per row.
    pub k: usize,
    /// Gating function.
    pub gating: Gating,
    /// `[n_expert]` selection bias (`exp_probs_b`), added to a copy used only for choosing.
    pub bias: Option<&'a [f32]>,
    /// Optional group stage.
    pub groups: Option<Groups>,
    /// Renormalisation of the chosen weights.
    pub renorm: Renorm,
    /// Final factor on the weights (`expert_weights_scale`; 1 for none).
    pub scale: f32,
}

/// Routes every row of `logits`, `[n_expert, n_rows]` f32, writing `ids`, `[k, n_rows]` i32 (best
/// first, lower id winning ties), and `weights`, `[k, n_rows]` f32. No allocation.
pub fn route(
    logits: &[f32],
    p: &RouterParams,
    ids: &mut [i32],
    weights: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "route";
    let n_rows = whole_rows(OP, "logits", logits.len(), p.n_expert)?;
    check_len(OP, "ids", ids.len(), mul_dims(OP, p.k, n_rows)?)?;
    check_len(OP, "weights", weights.len(), p.k * n_rows)?;
    if let Some(b) = p.bias {
        check_len(OP, "bias", b.len(), p.n_expert)?;
    }
    let eligible = eligible_count(p)?;
    if p.k > eligible || i32::try_from(p.n_expert).is_err() {
        let what = format!(
            "k {} exceeds the {eligible} experts that can be chosen",
            p.k
        );
        return Err(OpError::Parameter { op: OP, what });
    }
    if p.k == 0 {
        return Ok(());
    }
    for ((row, ids), w) in logits
        .chunks_exact(p.n_expert)
        .zip(ids.chunks_exact_mut(p.k))
        .zip(weights.chunks_exact_mut(p.k))
    {
        route_row(row, p, ids, w);
    }
    Ok(())
}

/// The number of experts the group stage leaves, after checking the group parameters.
fn eligible_count(p: &RouterParams) -> Result<usize, OpError> {
    let Some(g) = p.groups else {
        return Ok(p.n_expert);
    };
    let ok = g.n_group > 0
        && g.n_group <= 64
        && p.n_expert.is_multiple_of(g.n_group)
        && g.topk_group > 0
        && g.topk_group <= g.n_group;
    if !ok {
        let what = format!(
            "groups {} / topk_group {} must satisfy 0 < topk_group <= n_group <= 64, n_group | n_expert {}",
            g.n_group, g.topk_group, p.n_expert
        );
        return Err(OpError::Parameter { op: "route", what });
    }
    Ok(g.topk_group * (p.n_expert / g.n_group))
}

/// The unbiased score of each expert of one row.
struct Scores<'a> {
    logits: &'a [f32],
    gating: Gating,
    max: f32,
    inv_sum: f32,
}

impl Scores<'_> {
    fn new(logits: &[f32], gating: Gating) -> Scores<'_> {
        let (mut max, mut inv_sum) = (0.0, 1.0);
        if gating == Gating::Softmax {
            max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
            inv_sum = (1.0 / sum) as f32;
        }
        Scores {
            logits,
            gating,
            max,
            inv_sum,
        }
    }

    fn get(&self, e: usize) -> f32 {
        let l = self.logits[e];
        match self.gating {
            Gating::Softmax => (l - self.max).exp() * self.inv_sum,
            Gating::Sigmoid => super::sigmoid_f32(l),
            Gating::SoftmaxSelected => l,
            Gating::SqrtSoftplus => (l.max(0.0) + (-l.abs()).exp().ln_1p()).sqrt(),
        }
    }
}

/// `true` when (key `a`, id `ia`) ranks before (key `b`, id `ib`): higher key, then lower id.
fn before(a: f32, ia: usize, b: f32, ib: usize) -> bool {
    a > b || (a == b && ia < ib)
}

fn route_row(logits: &[f32], p: &RouterParams, ids: &mut [i32], w: &mut [f32]) {
    let scores = Scores::new(logits, p.gating);
    let key = |e: usize| {
        let s = scores.get(e) + p.bias.map_or(0.0, |b| b[e]);
        if s.is_nan() {
            f32::NEG_INFINITY
        } else {
            s
        }
    };
    let (kept, group_size) = match p.groups {
        Some(g) => (kept_groups(p.n_expert, g, &key), p.n_expert / g.n_group),
        None => (u64::MAX, p.n_expert),
    };
    let mut prev: Option<(f32, usize)> = None;
    for slot in ids.iter_mut() {
        let mut best: Option<(f32, usize)> = None;
        for e in 0..p.n_expert {
            if kept & (1u64 << ((e / group_size) % 64)) == 0 {
                continue;
            }
            let k = key(e);
            if prev.is_some_and(|(pk, pe)| !before(pk, pe, k, e)) {
                continue; // already chosen, or ranks above a chosen one
            }
            if best.is_none_or(|(bk, be)| before(k, e, bk, be)) {
                best = Some((k, e));
            }
        }
        // `route` checked k <= the eligible count, so a best exists; e < n_expert fits in i32.
        let (bk, be) = best.unwrap_or((f32::NEG_INFINITY, 0));
        *slot = be as i32;
        prev = Some((bk, be));
    }
    for (wi, &id) in w.iter_mut().zip(ids.iter()) {
        *wi = scores.get(id as usize);
    }
    if p.gating == Gating::SoftmaxSelected {
        let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        super::softmax::softmax_shifted(w, max);
    }
    let sum: f64 = w.iter().map(|&v| f64::from(v)).sum();
    let denom = match p.renorm {
        Renorm::Off => 1.0,
        Renorm::SumPlus(eps) => sum + f64::from(eps),
        Renorm::SumAtLeast(min) => sum.max(f64::from(min)),
    };
    let factor = (f64::from(p.scale) / denom) as f32;
    w.iter_mut().for_each(|v| *v *= factor);
}

/// Bit `g` set for each kept group: the `topk_group` groups with the highest sum of their top-2
/// keys (top-1 for groups of one), the lower group index winning ties.
fn kept_groups(n_expert: usize, g: Groups, key: &impl Fn(usize) -> f32) -> u64 {
    let size = n_expert / g.n_group;
    let group_score = |gi: usize| {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for e in gi * size..(gi + 1) * size {
            let k = key(e);
            if k > a {
                b = a;
                a = k;
            } else if k > b {
                b = k;
            }
        }
        if size == 1 {
            a
        } else {
            a + b
        }
    };
    let mut kept = 0u64;
    for gi in 0..g.n_group {
        let s = group_score(gi);
        let beaten_by = (0..g.n_group)
            .filter(|&h| h != gi && before(group_score(h), h, s, gi))
            .count();
        if beaten_by < g.topk_group {
            kept |= 1 << gi;
        }
    }
    kept
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;
