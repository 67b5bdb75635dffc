//! The chunked form of the delta rule with one decay per (head, key dim) (Kimi Delta Attention).
//!
//! With `a_t = exp(g_t)` the row's decay vector (`[dk]`), `R(u, w) = a_u ⊙ … ⊙ a_{w+1}` the decay
//! from row `w` to row `u` (`R(u, u) = 1`), `Γ_u = R(u, −1)` the decay from the chunk's start
//! through row `u` and `S0` the state at the chunk's start:
//!
//! - `δ_u = β_u(v_u − S0ᵀ(Γ_u⊙k_u)) − Σ_{w<u} β_u·(k_u·(R(u,w)⊙k_w))·δ_w` (forward substitution);
//! - `out_u = scale·(S0ᵀ(Γ_u⊙q_u) + Σ_{w≤u} (q_u·(R(u,w)⊙k_w))·δ_w)`;
//! - next state `S = Γ_c⊙S0 + Σ_u (R(c−1,u)⊙k_u)·δ_uᵀ` (`Γ_c` scales the rows of `S0`).
//!
//! The decays are never factored as `Γ_u / Γ_w` (which overflows once a chunk's decay passes
//! `e^{-88}`, and an unbounded KDA gate gets there in one row): `R(u, w)⊙k_w` is carried from `w`
//! down the chunk, one product by `a_u` per row, so every factor stays in `[0, 1]` and a decay
//! that underflows leaves the exact limit, zero. The per-head form (`delta_rule_chunk.rs`) keeps
//! its scalar `exp(difference)`s.

use super::chunk::{block, padded, L, R};
use super::{dot, grown, out_row, qkv, DeltaRuleInputs, DeltaRuleParams, Part};
use crate::ops::SharedMut;

/// Rows `rows` (at most [`super::CHUNK`], one sequence) of one task's part, from and into its
/// state columns `s`, writing their outputs.
pub(super) fn chunk(
    x: &DeltaRuleInputs<'_>,
    p: &DeltaRuleParams,
    part: Part,
    rows: std::ops::Range<usize>,
    s: &mut [f32],
    o: &SharedMut<'_>,
    scratch: &mut Vec<f32>,
) {
    let (dk, dv, hv, h) = (p.dk, part.w, p.n_head_v, part.h);
    let (t0, c) = (rows.start, rows.len());
    let (cp, dkp) = (padded(c), padded(dk));
    let sizes = [
        c,
        c * dk,
        dk,
        dk * 2 * cp,
        dv * 2 * cp,
        c * cp,
        c * cp,
        c * dv,
        c * dkp,
        dk,
    ];
    let mut buf = grown(scratch, sizes.iter().sum());
    let mut take = |n: usize| {
        let (head, rest) = std::mem::take(&mut buf).split_at_mut(n);
        buf = rest;
        head
    };
    let (beta, decay, gamma) = (take(c), take(c * dk), take(dk));
    let (kq_t, sp) = (take(dk * 2 * cp), take(dv * 2 * cp));
    let (kk, qk, delta, kd, zeros) = (
        take(c * cp),
        take(c * cp),
        take(c * dv),
        take(c * dkp),
        take(dk),
    );
    zeros.fill(0.0);
    kq_t.fill(0.0);
    kd.fill(0.0);
    // Per-row decays, and [Γ⊙K Γ⊙Q] transposed (`[dk, 2·cp]`: column u holds Γ_u⊙k_u, column
    // cp + u holds Γ_u⊙q_u), Γ carried as a running product.
    gamma.fill(1.0);
    for u in 0..c {
        let t = t0 + u;
        beta[u] = p.beta_scale * x.beta[t * hv + h];
        let g = &x.gate[(t * hv + h) * dk..][..dk];
        let a = &mut decay[u * dk..][..dk];
        a.iter_mut().zip(g).for_each(|(a, &g)| *a = g.exp());
        let [q, k, _] = qkv(x, p, part, t);
        for i in 0..dk {
            gamma[i] *= a[i];
            kq_t[i * 2 * cp + u] = gamma[i] * k[i];
            kq_t[i * 2 * cp + cp + u] = gamma[i] * q[i];
        }
    }
    // sp = S0ᵀ[Γ⊙K Γ⊙Q], `[dv, 2·cp]`.
    for j0 in (0..dv).step_by(R) {
        let st: [&[f32]; R] =
            std::array::from_fn(|r| s.get((j0 + r) * dk..(j0 + r + 1) * dk).unwrap_or(zeros));
        for col in (0..2 * cp).step_by(L) {
            let b = block(dk, |i| st.map(|row| row[i]), &kq_t[col..], 2 * cp);
            for (r, vals) in b.iter().enumerate().take(dv - j0) {
                sp[(j0 + r) * 2 * cp + col..][..L].copy_from_slice(vals);
            }
        }
    }
    // Pairs: for each w, rk = R(u, w)⊙k_w walks down the chunk; kk[u][w] = β_u·k_u·rk (u > w)
    // and qk[u][w] = q_u·rk (u ≥ w). At the chunk's last row rk is the state update's key.
    for w in 0..c {
        let [_, kw, _] = qkv(x, p, part, t0 + w);
        let rk = &mut kd[w * dkp..][..dk];
        rk.copy_from_slice(kw);
        for u in w..c {
            if u > w {
                let a = &decay[u * dk..][..dk];
                rk.iter_mut().zip(a).for_each(|(r, &a)| *r *= a);
            }
            let [qu, ku, _] = qkv(x, p, part, t0 + u);
            kk[u * cp + w] = beta[u] * dot(ku, rk);
            qk[u * cp + w] = dot(qu, rk);
        }
    }
    // δ_u = β_u(v_u − S0ᵀ(Γ_u⊙k_u)) − Σ_{w<u} kk[u][w]·δ_w.
    for u in 0..c {
        let [_, _, v] = qkv(x, p, part, t0 + u);
        let (done, cur) = delta.split_at_mut(u * dv);
        let du = &mut cur[..dv];
        for (j, d) in du.iter_mut().enumerate() {
            *d = beta[u] * (v[j] - sp[j * 2 * cp + u]);
        }
        for (w, dw) in done.chunks_exact(dv).enumerate() {
            let l = kk[u * cp + w];
            du.iter_mut().zip(dw).for_each(|(d, &dw)| *d -= l * dw);
        }
    }
    // out_u = scale·(S0ᵀ(Γ_u⊙q_u) + Σ_{w≤u} qk[u][w]·δ_w).
    for u in 0..c {
        // SAFETY: this task's part, and no other slice of the row is alive.
        let y = unsafe { out_row(o, p, part, t0 + u) };
        for (j, y) in y.iter_mut().enumerate() {
            *y = sp[j * 2 * cp + cp + u];
        }
        for (w, dw) in delta.chunks_exact(dv).take(u + 1).enumerate() {
            let a = qk[u * cp + w];
            y.iter_mut().zip(dw).for_each(|(y, &d)| *y += a * d);
        }
        y.iter_mut().for_each(|y| *y *= p.scale);
    }
    // Next state: S ← Γ_c⊙S0 + Σ_u kd_u·δ_uᵀ, kd_u = R(c−1, u)⊙k_u (`[c, dkp]`).
    for j0 in (0..dv).step_by(R) {
        let n = R.min(dv - j0);
        let at =
            |u: usize| std::array::from_fn(|r| if r < n { delta[u * dv + j0 + r] } else { 0.0 });
        for col in (0..dkp).step_by(L) {
            let b = block(c, at, &kd[col..], dkp);
            let width = L.min(dk - col);
            for (r, vals) in b.iter().enumerate().take(n) {
                let row = &mut s[(j0 + r) * dk + col..][..width];
                let gs = &gamma[col..][..width];
                for ((sv, &bv), &g) in row.iter_mut().zip(vals).zip(gs) {
                    *sv = g * *sv + bv;
                }
            }
        }
    }
}
