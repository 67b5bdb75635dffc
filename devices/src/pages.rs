//! Page rounding of address ranges (page-locking, `mlock`, releasing resident pages).

/// The system's page size in bytes.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(1)
}

/// Address ranges `(start, end)` rounded out to whole pages of `page` bytes and merged where
/// they touch or overlap: sorted and disjoint, empty ranges dropped (what page-locking and
/// `mlock` take).
pub fn whole_pages(ranges: &[(usize, usize)], page: usize) -> Vec<(usize, usize)> {
    let mut r: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|&&(a, b)| a < b)
        .map(|&(a, b)| (a / page * page, b.div_ceil(page) * page))
        .collect();
    r.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(r.len());
    for (a, b) in r {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::whole_pages;

    #[test]
    fn ranges_are_rounded_out_to_pages_and_merged() {
        let p = 4096;
        assert_eq!(whole_pages(&[(100, 3 * p + 5)], p), vec![(0, 4 * p)]);
        // Unsorted; two sharing a page merge; one touching the next merges; an empty one goes.
        assert_eq!(
            whole_pages(
                &[
                    (9 * p, 9 * p + 1),
                    (p + 5, 2 * p + 1),
                    (3 * p - 1, 4 * p),
                    (4 * p, 5 * p),
                    (7 * p, 7 * p),
                ],
                p
            ),
            vec![(p, 5 * p), (9 * p, 10 * p)]
        );
        assert!(whole_pages(&[], p).is_empty());
    }
}
