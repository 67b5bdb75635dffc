//! The positions a row of sparse attention sees ([`bloomery_plugin_api::op::AttentionParams`]'s
//! `selected`): the listed cache positions that are not −1 and not after the row's own, each once,
//! plus the row's sliding window when it has one, in ascending order (so that a row listing every
//! position it may see sums in the same order as dense attention).

use super::OpError;

/// Each row's list of selected positions: `ids` is i32 `[n_sel, rows]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection<'a> {
    /// The lists, `n_sel` entries per row.
    pub ids: &'a [i32],
    /// Entries per row.
    pub n_sel: usize,
}

impl<'a> Selection<'a> {
    /// Row `r`'s list (checked against the rows by the caller).
    pub fn row(&self, r: usize) -> &'a [i32] {
        &self.ids[r * self.n_sel..][..self.n_sel]
    }
}

/// Writes into `out` (cleared first) the positions a row at `pos` sees: `list`'s entries `≤ pos`
/// (−1 entries skipped, duplicates once) and, with `window` `Some(w)`, `pos − w + 1 ..= pos`;
/// ascending. A listed position the cache no longer holds (`pos − t ≥ cache_len`: its row was
/// overwritten in a ring cache) and any other negative entry are refused. Grows `out` at most
/// once per thread's scratch.
pub fn selected_positions(
    list: &[i32],
    pos: usize,
    window: Option<usize>,
    cache_len: usize,
    out: &mut Vec<usize>,
) -> Result<(), OpError> {
    const OP: &str = "attention";
    out.clear();
    for &id in list {
        if id == -1 {
            continue;
        }
        let t = usize::try_from(id).map_err(|_| OpError::Parameter {
            op: OP,
            what: format!("selected position {id} is negative (only -1 marks an unused entry)"),
        })?;
        if t > pos {
            continue;
        }
        if pos - t >= cache_len {
            return Err(OpError::Parameter {
                op: OP,
                what: format!(
                    "the row at position {pos} selects position {t}, which a cache of {cache_len} \
                     rows per slot no longer holds"
                ),
            });
        }
        out.push(t);
    }
    if let Some(w) = window {
        out.extend((pos + 1).saturating_sub(w)..=pos);
    }
    out.sort_unstable();
    out.dedup();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(list: &[i32], pos: usize, window: Option<usize>) -> Vec<usize> {
        let mut out = vec![99];
        selected_positions(list, pos, window, 64, &mut out).unwrap();
        out
    }

    #[test]
    fn lists_once_ascending_without_unused_or_later_entries() {
        assert_eq!(seen(&[5, -1, 2, 9, 5, 0], 6, None), vec![0, 2, 5]);
        assert_eq!(seen(&[-1, -1], 6, None), Vec::<usize>::new());
        assert_eq!(seen(&[0, 7], 7, None), vec![0, 7]);
    }

    #[test]
    fn a_window_joins_the_list() {
        assert_eq!(seen(&[0, 9, 5], 9, Some(3)), vec![0, 5, 7, 8, 9]);
        assert_eq!(seen(&[-1], 1, Some(4)), vec![0, 1]);
    }

    #[test]
    fn overwritten_and_negative_positions_are_refused() {
        let mut out = Vec::new();
        let e = selected_positions(&[3], 80, None, 64, &mut out).unwrap_err();
        assert!(e.to_string().contains("no longer holds"), "{e}");
        let e = selected_positions(&[-2], 8, None, 64, &mut out).unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
    }
}
