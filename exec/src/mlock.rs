//! `--mlock`: the model's bytes that the host reads during a run held in RAM (read in at load,
//! never paged out), as llama.cpp's `--mlock` locks its host buffers. On the CPU that is the
//! whole mapped file; with a card, the routed experts and token tables left in host RAM (the
//! card's page-locking of them already holds them, unless it failed); never the experts the disk
//! tier reads into its own arena (locking those would hold in RAM what the host budget leaves on
//! disk), nor the hashed n-gram tables when their rows are read from disk (with a card they are
//! locked when read from the mapping, which no card holds). A lock the kernel refuses (`RLIMIT_MEMLOCK`) is a warning naming how much was locked,
//! and the model runs with the rest pageable, as llama.cpp does.

use bloomery_devices::pages::{page_size, whole_pages};

/// Locks the pages of the address ranges `ranges` (`(start, end)`, in the model's mappings);
/// logs the bytes locked and the kernel's count of the process's locked memory (`VmLck`), or a
/// warning on refusal. Returns the bytes locked.
pub fn lock_ranges(ranges: &[(usize, usize)]) -> u64 {
    let mut locked = 0u64;
    for (lo, hi) in whole_pages(ranges, page_size()) {
        if let Err(e) = lock_range(lo, hi - lo) {
            tracing::warn!(
                "--mlock: locking {:.1} MiB of the model failed after {:.1} MiB ({e}); the rest \
                 stays pageable (raise RLIMIT_MEMLOCK: `ulimit -l`)",
                (hi - lo) as f64 / MIB,
                locked as f64 / MIB
            );
            return locked;
        }
        locked += (hi - lo) as u64;
    }
    let vm_lck = vm_locked_kib().map_or("unknown".to_owned(), |k| format!("{k} kB"));
    tracing::info!(
        "--mlock: {:.1} MiB of the model locked in RAM (VmLck {vm_lck})",
        locked as f64 / MIB
    );
    locked
}

const MIB: f64 = (1u64 << 20) as f64;

/// `ranges` less every byte of `holes` (all `(start, end)`).
pub fn without(ranges: &[(usize, usize)], holes: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = ranges.to_vec();
    for &(h0, h1) in holes {
        out = out
            .into_iter()
            .flat_map(|(a, b)| [(a, b.min(h0)), (a.max(h1), b)])
            .filter(|&(a, b)| a < b)
            .collect();
    }
    out
}

/// `mlock` of `len` bytes from `lo` (page-aligned).
fn lock_range(lo: usize, len: usize) -> std::io::Result<()> {
    // SAFETY: mlock reads no memory through the pointer; it fails with ENOMEM on a range that is
    // not mapped, and only pins pages of this process's own mappings.
    if unsafe { libc::mlock(lo as *const libc::c_void, len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The process's locked memory in kB, from `/proc/self/status`.
fn vm_locked_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_are_cut_out_of_ranges() {
        let r = [(0, 100), (200, 300)];
        assert_eq!(without(&r, &[(50, 250)]), [(0, 50), (250, 300)]);
        assert_eq!(
            without(&r, &[(10, 20), (0, 5)]),
            [(5, 10), (20, 100), (200, 300)]
        );
        assert_eq!(without(&r, &[(0, 300)]), []);
        assert_eq!(without(&r, &[(100, 200)]), r);
    }

    #[test]
    fn locking_what_is_not_mapped_is_an_error_and_a_mapped_page_locks() {
        let p = page_size();
        // The first page of the address space is never mapped.
        assert!(lock_range(0, p).is_err());
        assert_eq!(lock_ranges(&[(0, 1)]), 0);
        let v = vec![7u8; 4 * p];
        let lo = (v.as_ptr() as usize).div_ceil(p) * p;
        assert_eq!(lock_ranges(&[(lo + 1, lo + 2)]), p as u64);
        assert!(vm_locked_kib().unwrap() >= (p / 1024) as u64);
        // SAFETY: the page lies in `v`, alive here.
        assert_eq!(unsafe { libc::munlock(lo as *const libc::c_void, p) }, 0);
    }
}
