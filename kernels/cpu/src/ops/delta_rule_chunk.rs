//! The chunked form of the delta rule (the formulas are in the parent module's docs). Per chunk of
//! `c` rows of one sequence and head, three products carry most of the work: `S0ᵀ[K Q]`, the
//! decayed `[K; Q]·Kᵀ` pairs and the state update `Δᵀ·K`, each written as 4×8 register blocks that
//! the compiler vectorises; the triangular solve and the outputs are row updates over `dv`.

use super::{grown, out_row, qkv, DeltaRuleInputs, DeltaRuleParams, Part};
use crate::ops::SharedMut;

/// Rows of a register block.
pub(super) const R: usize = 4;
/// Columns of a register block.
pub(super) const L: usize = 8;

/// `acc[r][l] = Σ_{t<n} a(t)[r]·b[t·stride + l]`: one 4×8 block of a product whose left factor
/// comes column by column (`a(t)` holds the block's four rows of column `t`) and whose right
/// factor is the first eight values of rows of `b`.
#[inline(always)]
pub(super) fn block(
    n: usize,
    a: impl Fn(usize) -> [f32; R],
    b: &[f32],
    stride: usize,
) -> [[f32; L]; R] {
    let mut acc = [[0f32; L]; R];
    for t in 0..n {
        let mut bv = [0f32; L];
        bv.copy_from_slice(&b[t * stride..][..L]);
        let av = a(t);
        for r in 0..R {
            for l in 0..L {
                acc[r][l] += av[r] * bv[l];
            }
        }
    }
    acc
}

/// `n` rounded up to whole register-block columns.
pub(super) fn padded(n: usize) -> usize {
    n.div_ceil(L) * L
}

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
        c,
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
    let (gc, beta) = (take(c), take(c));
    let (kq_t, sp) = (take(dk * 2 * cp), take(dv * 2 * cp));
    let (kk, qk, delta, kd, zeros) = (
        take(c * cp),
        take(c * cp),
        take(c * dv),
        take(c * dkp),
        take(dk),
    );
    let mut acc = 0f32;
    for u in 0..c {
        acc += x.gate[(t0 + u) * hv + h];
        gc[u] = acc;
        beta[u] = p.beta_scale * x.beta[(t0 + u) * hv + h];
    }
    // [K Q] transposed, `[dk, 2·cp]`: column u holds k_u, column cp + u holds q_u.
    kq_t.fill(0.0);
    zeros.fill(0.0);
    for u in 0..c {
        let [q, k, _] = qkv(x, p, part, t0 + u);
        for i in 0..dk {
            kq_t[i * 2 * cp + u] = k[i];
            kq_t[i * 2 * cp + cp + u] = q[i];
        }
    }
    // sp = S0ᵀ[K Q], `[dv, 2·cp]`: S0ᵀk_u in column u, S0ᵀq_u in column cp + u.
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
    // Pairs: kk[u][w] = k_u·k_w and qk[u][w] = q_u·k_w for w ≤ u (blocks above the diagonal are
    // skipped), then decayed: kk into the solve's β_u·(γ_u/γ_w)·k_u·k_w, qk into (γ_u/γ_w)·q_u·k_w.
    for u0 in (0..2 * c).step_by(R) {
        let rows: [(usize, bool); R] = std::array::from_fn(|r| ((u0 + r) % c, u0 + r < c));
        let qkvs: [[&[f32]; 3]; R] = std::array::from_fn(|r| qkv(x, p, part, t0 + rows[r].0));
        let src: [&[f32]; R] = std::array::from_fn(|r| match u0 + r < 2 * c {
            true if rows[r].1 => qkvs[r][1],
            true => qkvs[r][0],
            false => zeros,
        });
        let last = rows.iter().map(|r| r.0).max().unwrap_or(0);
        for col in (0..=last).step_by(L) {
            let b = block(dk, |i| src.map(|row| row[i]), &kq_t[col..], 2 * cp);
            for (r, vals) in b.iter().enumerate().take(2 * c - u0) {
                let (u, is_k) = rows[r];
                let dst = if is_k { &mut kk[..] } else { &mut qk[..] };
                dst[u * cp + col..][..L].copy_from_slice(vals);
            }
        }
    }
    for u in 0..c {
        for w in 0..=u {
            let decay = (gc[u] - gc[w]).exp();
            kk[u * cp + w] *= beta[u] * decay;
            qk[u * cp + w] *= decay;
        }
    }
    // δ_u = β_u(v_u − γ_u·S0ᵀk_u) − Σ_{w<u} kk[u][w]·δ_w, by forward substitution.
    for u in 0..c {
        let [_, _, v] = qkv(x, p, part, t0 + u);
        let gu = gc[u].exp();
        let (done, cur) = delta.split_at_mut(u * dv);
        let du = &mut cur[..dv];
        for (j, d) in du.iter_mut().enumerate() {
            *d = beta[u] * (v[j] - gu * sp[j * 2 * cp + u]);
        }
        for (w, dw) in done.chunks_exact(dv).enumerate() {
            let l = kk[u * cp + w];
            du.iter_mut().zip(dw).for_each(|(d, &dw)| *d -= l * dw);
        }
    }
    // out_u = scale·(γ_u·S0ᵀq_u + Σ_{w≤u} qk[u][w]·δ_w).
    for u in 0..c {
        // SAFETY: this task's part, and no other slice of the row is alive.
        let y = unsafe { out_row(o, p, part, t0 + u) };
        let gu = gc[u].exp();
        for (j, y) in y.iter_mut().enumerate() {
            *y = gu * sp[j * 2 * cp + cp + u];
        }
        for (w, dw) in delta.chunks_exact(dv).take(u + 1).enumerate() {
            let a = qk[u * cp + w];
            y.iter_mut().zip(dw).for_each(|(y, &d)| *y += a * d);
        }
        y.iter_mut().for_each(|y| *y *= p.scale);
    }
    // Next state: S ← γ_c·S0 + Σ_u (γ_c/γ_u)·k_u·δ_uᵀ, with kd_u = (γ_c/γ_u)·k_u (`[c, dkp]`).
    let last = gc[c - 1];
    kd.fill(0.0);
    for u in 0..c {
        let [_, k, _] = qkv(x, p, part, t0 + u);
        let e = (last - gc[u]).exp();
        for (d, &k) in kd[u * dkp..][..dk].iter_mut().zip(k) {
            *d = e * k;
        }
    }
    let g = last.exp();
    for j0 in (0..dv).step_by(R) {
        let n = R.min(dv - j0);
        let at =
            |u: usize| std::array::from_fn(|r| if r < n { delta[u * dv + j0 + r] } else { 0.0 });
        for col in (0..dkp).step_by(L) {
            let b = block(c, at, &kd[col..], dkp);
            let width = L.min(dk - col);
            for (r, vals) in b.iter().enumerate().take(n) {
                let row = &mut s[(j0 + r) * dk + col..][..width];
                for (sv, &bv) in row.iter_mut().zip(vals) {
                    *sv = g * *sv + bv;
                }
            }
        }
    }
}
