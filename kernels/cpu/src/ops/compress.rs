//! DeepSeek-V4's compressed rows: the compressor that pools every `ratio` positions of a sequence
//! into one normed, roped row ([`compress`], the ABI's `Op::Compress`), and the indexer that picks
//! the compressed rows each query row attends ([`comp_select`], `Op::CompSelect`). Facts from
//! transformers 5.24 `DeepseekV4CSACompressor`, `DeepseekV4HCACompressor` and
//! `DeepseekV4Indexer`, which llama.cpp b11434 `deepseek4.cpp` matches (docs/deepseek4-plan.md).

use super::rope::{rope, RopeParams};
use super::{check_len, mul_dims, OpError, SharedMut};
use crate::linear::Parallel;

const OP: &str = "compress";

/// The extents of a [`compress`] call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressShape {
    /// Positions per compressed row (`R`).
    pub ratio: usize,
    /// Two overlapped series: inputs `2·width` wide, row `j` also pools window `j − 1`.
    pub overlap: bool,
    /// Width of a compressed row.
    pub width: usize,
    /// Rows of the raw state per slot (a ring over positions).
    pub len_raw: usize,
    /// Rows of the compressed cache per slot.
    pub len_comp: usize,
    /// Sequence slots of both caches.
    pub n_slots: usize,
}

impl CompressShape {
    /// Width of one position's kv (and score) input: `2·width` with `overlap`, else `width`.
    pub fn series_width(&self) -> usize {
        if self.overlap {
            2 * self.width
        } else {
            self.width
        }
    }

    /// Positions a compressed row reads: `2·ratio` with `overlap`, else `ratio`.
    pub fn span(&self) -> usize {
        if self.overlap {
            2 * self.ratio
        } else {
            self.ratio
        }
    }
}

/// The inputs of a [`compress`] call (f32 unless said).
pub struct CompressInputs<'a> {
    /// Projected kv, `[series_width, rows]`.
    pub kv: &'a [f32],
    /// Projected scores, `[series_width, rows]` (without the position bias).
    pub score: &'a [f32],
    /// Position bias, `[series_width, ratio]`.
    pub ape: &'a [f32],
    /// RMS norm weight, `[width]`.
    pub norm: &'a [f32],
    /// Each row's slot.
    pub slots: &'a [u32],
    /// Each row's position.
    pub positions: &'a [i32],
    /// ε of the RMS norm.
    pub eps: f32,
    /// The compressed row's rope (at position `j·ratio`).
    pub rope: RopeParams,
}

/// Writes every compressed row that a row of this call completes into `comp` (`[width, len_comp,
/// n_slots]`, row `j` at `j`), and then each row's `[kv | score]` into `raw` (`[2·series_width,
/// len_raw, n_slots]`, at `position % len_raw`). See the ABI's `Op::Compress` for the formula.
/// Positions of the window(s) a completed row reads that are not rows of this call (of the same
/// slot, positions consecutive) are read from `raw`. A bad slot, position or a completed row
/// beyond `len_comp` is refused before anything is written.
pub fn compress(
    x: &CompressInputs<'_>,
    s: &CompressShape,
    raw: &mut [f32],
    comp: &mut [f32],
) -> Result<(), OpError> {
    let (sw, w) = (s.series_width(), s.width);
    check_pool(x, s, raw.len(), Some(comp.len()))?;
    let (raw_row, raw_slot, comp_slot) = (2 * sw, 2 * sw * s.len_raw, w * s.len_comp);
    pool(x, s, raw, &mut |_, j, slot, row| {
        rope(row, w, 1, &[(j * s.ratio) as i32], &x.rope)?;
        let at = slot * comp_slot + j * w;
        comp[at..at + w].copy_from_slice(row);
        Ok(())
    })?;
    for (r, (&slot, &p)) in x.slots.iter().zip(x.positions).enumerate() {
        let i = slot as usize * raw_slot + (p as usize % s.len_raw) * raw_row;
        raw[i..i + sw].copy_from_slice(&x.kv[r * sw..(r + 1) * sw]);
        raw[i + sw..i + 2 * sw].copy_from_slice(&x.score[r * sw..(r + 1) * sw]);
    }
    Ok(())
}

/// The rows [`compress`] would write, normed but not roped, one per call row into `out`
/// (`[width, rows]`): column `r` the row that row `r` completes, zeros for a row that completes
/// none (the ABI's `CompressForm::Plain`). `raw` is only read.
pub fn compress_plain(
    x: &CompressInputs<'_>,
    s: &CompressShape,
    raw: &[f32],
    out: &mut [f32],
) -> Result<(), OpError> {
    let w = s.width;
    check_pool(x, s, raw.len(), None)?;
    check_len(OP, "out", out.len(), mul_dims(OP, w, x.positions.len())?)?;
    out.fill(0.0);
    pool(x, s, raw, &mut |r, _, _, row| {
        out[r * w..(r + 1) * w].copy_from_slice(row);
        Ok(())
    })
}

/// Checks a pooling call's inputs and states (`raw_len` values of raw, `comp_len` of a cache it
/// writes): lengths, slots, positions and, with a cache, every completed row inside it.
fn check_pool(
    x: &CompressInputs<'_>,
    s: &CompressShape,
    raw_len: usize,
    comp_len: Option<usize>,
) -> Result<(), OpError> {
    let (sw, w, rows) = (s.series_width(), s.width, x.positions.len());
    if s.ratio == 0 || w == 0 {
        return Err(OpError::Parameter {
            op: OP,
            what: format!("ratio {} and width {w} must be positive", s.ratio),
        });
    }
    if s.len_raw < s.span() {
        return Err(OpError::Parameter {
            op: OP,
            what: format!(
                "a raw state of {} rows cannot hold the {} positions a compressed row reads",
                s.len_raw,
                s.span()
            ),
        });
    }
    check_len(OP, "kv", x.kv.len(), mul_dims(OP, sw, rows)?)?;
    check_len(OP, "score", x.score.len(), mul_dims(OP, sw, rows)?)?;
    check_len(OP, "ape", x.ape.len(), mul_dims(OP, sw, s.ratio)?)?;
    check_len(OP, "norm", x.norm.len(), w)?;
    let raw_slot = mul_dims(OP, 2 * sw, s.len_raw)?;
    check_len(OP, "raw", raw_len, mul_dims(OP, raw_slot, s.n_slots)?)?;
    let len_comp = match comp_len {
        Some(n) => {
            check_len(
                OP,
                "comp",
                n,
                mul_dims(OP, mul_dims(OP, w, s.len_comp)?, s.n_slots)?,
            )?;
            s.len_comp
        }
        None => usize::MAX,
    };
    check_rows(x.slots, x.positions, s.ratio, s.n_slots, len_comp)
}

/// Every row's slot below `n_slots`, its position not negative, and (every row being checked
/// before any is written) each row it completes below `len_comp`.
fn check_rows(
    slots: &[u32],
    positions: &[i32],
    ratio: usize,
    n_slots: usize,
    len_comp: usize,
) -> Result<(), OpError> {
    check_len(OP, "slots", slots.len(), positions.len())?;
    for (&slot, &p) in slots.iter().zip(positions) {
        if slot as usize >= n_slots {
            return Err(OpError::Index {
                op: OP,
                what: "slot",
                index: i64::from(slot),
                bound: n_slots,
            });
        }
        if p < 0 {
            return Err(OpError::Index {
                op: OP,
                what: "position",
                index: i64::from(p),
                bound: usize::MAX,
            });
        }
        let p = p as usize;
        if (p + 1).is_multiple_of(ratio) && p / ratio >= len_comp {
            return Err(OpError::Index {
                op: OP,
                what: "compressed row",
                index: (p / ratio) as i64,
                bound: len_comp,
            });
        }
    }
    Ok(())
}

/// What [`pool`] hands each row to: (call row, compressed row `j`, slot, the row).
type Emit<'a> = dyn FnMut(usize, usize, usize, &mut [f32]) -> Result<(), OpError> + 'a;

/// Pools, norms and hands to `emit` (call row, compressed row `j`, slot, the row) every row
/// that a row of this (checked) call completes, before its rope.
fn pool(
    x: &CompressInputs<'_>,
    s: &CompressShape,
    raw: &[f32],
    emit: &mut Emit<'_>,
) -> Result<(), OpError> {
    let (sw, w, rows) = (s.series_width(), s.width, x.positions.len());
    let (raw_row, raw_slot) = (2 * sw, 2 * sw * s.len_raw);
    let mut pooled = vec![0.0f32; w];
    for r in 0..rows {
        let p = x.positions[r] as usize;
        if !(p + 1).is_multiple_of(s.ratio) {
            continue;
        }
        let j = p / s.ratio;
        let slot = x.slots[r] as usize;
        // The slots of the row: (position, offset into the series, bias row).
        let first = j * s.ratio;
        let mut taps: Vec<(usize, usize, usize)> = Vec::with_capacity(s.span());
        if s.overlap && j > 0 {
            taps.extend((0..s.ratio).map(|t| (first - s.ratio + t, 0, t)));
        }
        let own = if s.overlap { w } else { 0 };
        taps.extend((0..s.ratio).map(|t| (first + t, own, t)));
        // Each tap's [kv | score] row of series_width values each.
        let rows_of: Vec<(&[f32], &[f32])> = taps
            .iter()
            .map(|&(q, _, _)| {
                let back = p - q;
                let here = r >= back
                    && x.slots[r - back] as usize == slot
                    && x.positions[r - back] as usize == q;
                if here {
                    let i = (r - back) * sw;
                    (&x.kv[i..i + sw], &x.score[i..i + sw])
                } else {
                    let i = slot * raw_slot + (q % s.len_raw) * raw_row;
                    (&raw[i..i + sw], &raw[i + sw..i + 2 * sw])
                }
            })
            .collect();
        for (d, out) in pooled.iter_mut().enumerate() {
            let logit = |k: usize| {
                let (_, o, t) = taps[k];
                rows_of[k].1[o + d] + x.ape[t * sw + o + d]
            };
            let max = (0..taps.len()).map(logit).fold(f32::NEG_INFINITY, f32::max);
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for (k, &(_, o, _)) in taps.iter().enumerate() {
                let e = f64::from((logit(k) - max).exp());
                den += e;
                num += e * f64::from(rows_of[k].0[o + d]);
            }
            *out = (num / den) as f32;
        }
        norm_row(&mut pooled, x.norm, x.eps);
        emit(r, j, slot, &mut pooled)?;
    }
    Ok(())
}

/// `row ← RmsNorm(row, eps)·norm` (the squares summed in f64).
fn norm_row(row: &mut [f32], norm: &[f32], eps: f32) {
    let ms = row
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        / row.len() as f64;
    let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
    for (v, &g) in row.iter_mut().zip(norm) {
        *v = *v * inv * g;
    }
}

/// The inputs of a [`comp_store`] call.
pub struct CompStoreInputs<'a> {
    /// Each call row's unpooled row, `[width, rows]`.
    pub x: &'a [f32],
    /// RMS norm weight, `[width]`.
    pub norm: &'a [f32],
    /// Each row's slot.
    pub slots: &'a [u32],
    /// Each row's position.
    pub positions: &'a [i32],
    /// ε of the RMS norm.
    pub eps: f32,
    /// The stored row's rope (at position `j·ratio`).
    pub rope: RopeParams,
}

/// Each call row at position `p` completing compressed row `j = p / ratio` writes
/// `rope(RmsNorm(x_r)·norm)` (at position `j·ratio`) at row `j` of its slot of `comp`
/// (`[width, len_comp, n_slots]`; the ABI's `CompressForm::Store`); other rows write nothing.
/// Every row is checked before any is written.
pub fn comp_store(
    x: &CompStoreInputs<'_>,
    s: &CompressShape,
    comp: &mut [f32],
) -> Result<(), OpError> {
    let (w, rows) = (s.width, x.positions.len());
    if s.ratio == 0 || w == 0 || s.overlap {
        return Err(OpError::Parameter {
            op: OP,
            what: format!(
                "a stored row needs a positive ratio ({}) and width ({w}) and no overlap",
                s.ratio
            ),
        });
    }
    check_len(OP, "x", x.x.len(), mul_dims(OP, w, rows)?)?;
    check_len(OP, "norm", x.norm.len(), w)?;
    let comp_slot = mul_dims(OP, w, s.len_comp)?;
    check_len(OP, "comp", comp.len(), mul_dims(OP, comp_slot, s.n_slots)?)?;
    check_rows(x.slots, x.positions, s.ratio, s.n_slots, s.len_comp)?;
    let mut row = vec![0.0f32; w];
    for r in 0..rows {
        let p = x.positions[r] as usize;
        if !(p + 1).is_multiple_of(s.ratio) {
            continue;
        }
        let j = p / s.ratio;
        row.copy_from_slice(&x.x[r * w..(r + 1) * w]);
        norm_row(&mut row, x.norm, x.eps);
        rope(&mut row, w, 1, &[(j * s.ratio) as i32], &x.rope)?;
        let at = x.slots[r] as usize * comp_slot + j * w;
        comp[at..at + w].copy_from_slice(&row);
    }
    Ok(())
}

/// The extents of a [`comp_select`] call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompSelectShape {
    /// Indexer heads.
    pub n_head: usize,
    /// Indexer head width (the key width).
    pub head_dim: usize,
    /// Positions per compressed row.
    pub ratio: usize,
    /// Rows kept per query row.
    pub top_k: usize,
    /// Rows of the key cache per slot.
    pub len: usize,
    /// Sequence slots of the key cache.
    pub n_slots: usize,
}

/// For each row at position `p`, the `min(top_k, visible)` compressed rows `j < (p + 1) / ratio`
/// with the best `Σ_h w[h]·relu(q_h·key_j)`, by descending score (ties: lower row), then −1, into
/// `out` `[top_k, rows]`. `q` is `[head_dim, n_head, rows]`, `w` `[n_head, rows]`, `keys`
/// `[head_dim, len, n_slots]`. Every row is checked before any is scored; the rows are spread
/// over `par`'s workers.
#[allow(clippy::too_many_arguments)]
pub fn comp_select(
    par: &dyn Parallel,
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    slots: &[u32],
    positions: &[i32],
    s: &CompSelectShape,
    out: &mut [i32],
) -> Result<(), OpError> {
    const SEL: &str = "comp_select";
    let rows = positions.len();
    let (dh, nh) = (s.head_dim, s.n_head);
    if s.ratio == 0 {
        return Err(OpError::Parameter {
            op: SEL,
            what: "ratio 0".into(),
        });
    }
    check_len(
        SEL,
        "q",
        q.len(),
        mul_dims(SEL, mul_dims(SEL, dh, nh)?, rows)?,
    )?;
    check_len(SEL, "w", w.len(), mul_dims(SEL, nh, rows)?)?;
    let slot_len = mul_dims(SEL, dh, s.len)?;
    check_len(SEL, "keys", keys.len(), mul_dims(SEL, slot_len, s.n_slots)?)?;
    check_len(SEL, "slots", slots.len(), rows)?;
    check_len(SEL, "out", out.len(), mul_dims(SEL, s.top_k, rows)?)?;
    let mut visible = Vec::with_capacity(rows);
    for (&slot, &pos) in slots.iter().zip(positions) {
        if slot as usize >= s.n_slots {
            return Err(OpError::Index {
                op: SEL,
                what: "slot",
                index: i64::from(slot),
                bound: s.n_slots,
            });
        }
        let p = usize::try_from(pos).map_err(|_| OpError::Index {
            op: SEL,
            what: "position",
            index: i64::from(pos),
            bound: usize::MAX,
        })?;
        let v = (p + 1) / s.ratio;
        if v > s.len {
            return Err(OpError::Index {
                op: SEL,
                what: "visible compressed rows",
                index: v as i64,
                bound: s.len,
            });
        }
        visible.push(v);
    }
    let shared = SharedMut::new(out);
    par.for_each(rows, &|r| {
        let slot = slots[r] as usize;
        let qr = &q[r * dh * nh..(r + 1) * dh * nh];
        let mut scored: Vec<(f32, usize)> = (0..visible[r])
            .map(|j| {
                let key = &keys[slot * slot_len + j * dh..slot * slot_len + (j + 1) * dh];
                let score: f32 = qr
                    .chunks_exact(dh)
                    .zip(&w[r * nh..(r + 1) * nh])
                    .map(|(qh, &wh)| {
                        let dot: f32 = qh.iter().zip(key).map(|(a, b)| a * b).sum();
                        wh * dot.max(0.0)
                    })
                    .sum();
                (score, j)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        // SAFETY: task `r` writes only row `r` of `out`, disjoint from every other task's.
        let dst = unsafe { shared.part(r * s.top_k, s.top_k) };
        for (i, o) in dst.iter_mut().enumerate() {
            *o = scored.get(i).map_or(-1, |&(_, j)| j as i32);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rope::RopeMode;

    /// A row beyond the compressed cache is refused before the rows before it are written.
    #[test]
    fn a_row_beyond_the_cache_is_refused_before_any_write() {
        let s = CompressShape {
            ratio: 2,
            overlap: false,
            width: 2,
            len_raw: 4,
            len_comp: 1,
            n_slots: 1,
        };
        let rows = 4;
        let kv = vec![1.0; 2 * rows];
        let x = CompressInputs {
            kv: &kv,
            score: &kv,
            ape: &[0.0; 4],
            norm: &[1.0; 2],
            slots: &[0; 4],
            positions: &[0, 1, 2, 3],
            eps: 1e-6,
            rope: RopeParams::plain(RopeMode::Norm, 2, 1e4),
        };
        let (mut raw, mut comp) = (vec![9.0; 4 * 4], vec![9.0; 2]);
        let e = compress(&x, &s, &mut raw, &mut comp).unwrap_err();
        assert!(e.to_string().contains("compressed row 1"), "{e}");
        assert!(comp.iter().chain(&raw).all(|&v| v == 9.0));
    }
}
