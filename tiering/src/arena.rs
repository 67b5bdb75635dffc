//! The disk tier: when host RAM cannot hold the host experts (`--host-budget` or MemAvailable
//! below their size), they are read from the model file on demand into an arena of expert slots
//! of that budget, least recently used first out. The CPU computes host experts from the arena
//! instead of the mapped file, so resident memory stays inside the budget however large the file.
//!
//! Files are read with `O_DIRECT` where the file system allows it (aligned reads through a bounce
//! buffer, so the page cache does not grow), and with ordinary reads elsewhere (tmpfs). The
//! experts one call misses are read by up to [`READ_THREADS`] threads at once, so an NVMe drive
//! sees several requests in flight.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Alignment `O_DIRECT` reads need (offset, length and buffer).
const DIRECT_ALIGN: u64 = 4096;

/// Expert stacks read at once when a call misses several.
const READ_THREADS: usize = 8;

/// One model file part, opened for expert reads.
struct Source {
    /// Opened with `O_DIRECT` where the file system allows it (`direct` says whether it was).
    file: File,
    /// The same file through the page cache, for when direct reads are refused.
    buffered: File,
    /// Whether reads still go around the page cache (cleared when the file system refuses).
    direct: AtomicBool,
}

impl Source {
    fn open(path: &Path) -> std::io::Result<Source> {
        // O_DIRECT from libc's headers on Linux (0o40000 on x86-64 and aarch64).
        const O_DIRECT: i32 = 0o40000;
        let buffered = File::open(path)?;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(O_DIRECT)
            .open(path)
        {
            Ok(file) => Ok(Source {
                file,
                buffered,
                direct: AtomicBool::new(true),
            }),
            Err(_) => Ok(Source {
                file: buffered.try_clone()?,
                buffered,
                direct: AtomicBool::new(false),
            }),
        }
    }

    /// Reads `out.len()` bytes at `offset`.
    fn read(&self, offset: u64, out: &mut [u8], bounce: &mut Vec<u8>) -> std::io::Result<()> {
        if self.direct.load(Ordering::Relaxed) {
            let lo = offset / DIRECT_ALIGN * DIRECT_ALIGN;
            let hi = (offset + out.len() as u64).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
            let len = (hi - lo) as usize;
            // An aligned window inside the bounce buffer.
            bounce.resize(len + DIRECT_ALIGN as usize, 0);
            let skew = bounce.as_ptr().align_offset(DIRECT_ALIGN as usize);
            let window = &mut bounce[skew..skew + len];
            match read_full(&self.file, lo, window) {
                Ok(n) if n >= (offset - lo) as usize + out.len() => {
                    let from = (offset - lo) as usize;
                    out.copy_from_slice(&window[from..from + out.len()]);
                    return Ok(());
                }
                // The file ends first: the same error an ordinary read gives.
                Ok(_) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                // The file system refused the direct read: read through the page cache from now.
                Err(_) => self.direct.store(false, Ordering::Relaxed),
            }
        }
        self.buffered.read_exact_at(out, offset)
    }
}

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full(file: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(done)
}

/// Where one expert stack of a layer lies: file part, byte offset of expert 0, bytes per expert.
#[derive(Clone, Copy, Debug)]
pub struct StackSource {
    /// File part index.
    pub part: usize,
    /// Offset of the stack in that part.
    pub offset: u64,
    /// Bytes per expert.
    pub stride: u64,
}

/// The model file's parts, opened for expert reads; shared by every thread that reads experts.
pub struct ExpertFiles(Vec<Source>);

/// One stack of one expert to read: its source and the slot bytes it goes to.
pub struct ReadJob<'a> {
    expert: u32,
    src: StackSource,
    out: &'a mut [u8],
}

impl<'a> ReadJob<'a> {
    /// Reads item `index` of `src` (expert `index` of a stack, or row `index` of a table whose
    /// `stride` is its row's bytes) into `out`.
    pub fn new(index: u32, src: StackSource, out: &'a mut [u8]) -> ReadJob<'a> {
        ReadJob {
            expert: index,
            src,
            out,
        }
    }
}

impl ExpertFiles {
    /// Opens the file's `parts`.
    pub fn open(parts: &[&Path]) -> std::io::Result<Self> {
        parts
            .iter()
            .map(|p| Source::open(p))
            .collect::<std::io::Result<Vec<_>>>()
            .map(ExpertFiles)
    }

    /// Reads every job, up to [`READ_THREADS`] at once; the first error names the expert.
    pub fn read_all(&self, jobs: Vec<ReadJob<'_>>) -> Result<(), String> {
        let read = |j: ReadJob<'_>, bounce: &mut Vec<u8>| {
            let file = self
                .0
                .get(j.src.part)
                .ok_or_else(|| format!("expert {} names file part {}", j.expert, j.src.part))?;
            file.read(
                j.src.offset + u64::from(j.expert) * j.src.stride,
                j.out,
                bounce,
            )
            .map_err(|err| format!("reading expert {} from the model file: {err}", j.expert))
        };
        let threads = jobs.len().min(READ_THREADS);
        if threads <= 1 {
            let mut bounce = Vec::new();
            return jobs.into_iter().try_for_each(|j| read(j, &mut bounce));
        }
        let mut lanes: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, j) in jobs.into_iter().enumerate() {
            lanes[i % threads].push(j);
        }
        std::thread::scope(|scope| {
            let running: Vec<_> = lanes
                .into_iter()
                .map(|lane| {
                    scope.spawn(move || {
                        let mut bounce = Vec::new();
                        lane.into_iter().try_for_each(|j| read(j, &mut bounce))
                    })
                })
                .collect();
            running.into_iter().try_for_each(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("an expert read panicked".into()))
            })
        })
    }
}

/// One stack position's slots: heap memory written a slot at a time by whichever thread reserved
/// the slot (a call or the prefetch, outside the arena's lock) while the CPU device reads other
/// slots through a view. Only raw pointers reach it, so no reference spans a slot being written.
struct SlotMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: SlotMemory owns its allocation; which thread may touch which slot is decided under the
// arena's lock (pending slots belong to their reader, resident ones are only read).
unsafe impl Send for SlotMemory {}
// SAFETY: as above; shared access hands out no references, only raw addresses.
unsafe impl Sync for SlotMemory {}

impl SlotMemory {
    fn zeroed(len: usize) -> Self {
        let boxed: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).unwrap_or(NonNull::dangling());
        SlotMemory { ptr, len }
    }
}

impl Drop for SlotMemory {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: `raw` is the Box made in `zeroed` (a zero-length Box is dangling, as here),
        // freed once.
        drop(unsafe { Box::from_raw(raw) });
    }
}

/// Experts claimed for reading, (expert, slot) of tier layer `layer`: read them (outside the
/// arena's lock, [`PagedExperts`]), then hand them to [`ExpertArena::finish`]. Made only by
/// the arena's claims, so its slots are pending for it alone.
#[derive(Debug)]
pub struct Reserved {
    /// Tier layer.
    layer: usize,
    /// (expert, slot) pairs, pending until `finish` takes the reservation.
    slots: Vec<(u32, u32)>,
    /// Claimed by the prefetch (counted apart).
    prefetch: bool,
}

impl Reserved {
    /// The tier layer whose experts it claimed.
    pub fn layer(&self) -> usize {
        self.layer
    }
}

/// What the arena has read, and how well the prefetch guessed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Experts read from the file (by calls and by the prefetch).
    pub reads: u64,
    /// Of those, read ahead by the prefetch.
    pub prefetched: u64,
    /// Prefetched experts a call then used (before they were evicted).
    pub prefetch_hits: u64,
}

impl std::fmt::Display for ArenaStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "disk tier: {} experts read from the file, {} of them read ahead, {} of those used",
            self.reads, self.prefetched, self.prefetch_hits
        )
    }
}

/// Slots of experts in host memory, one byte array per stack position, least recently used out.
/// An expert is resident (readable through its slot), pending (being read into its slot) or
/// absent.
pub struct ExpertArena {
    /// Slots.
    pub n_slots: usize,
    owner: Vec<Option<(usize, u32)>>,
    last_used: Vec<u64>,
    /// Per slot: read by the prefetch and not yet used by a call.
    unused_prefetch: Vec<bool>,
    resident: HashMap<(usize, u32), u32>,
    pending: HashMap<(usize, u32), u32>,
    /// Advanced by each call's claim; slots stamped with it hold the latest call's experts.
    clock: u64,
    /// Counters.
    pub stats: ArenaStats,
}

impl ExpertArena {
    /// The bookkeeping of `n_slots` slots.
    pub fn new(n_slots: usize) -> Self {
        ExpertArena {
            n_slots,
            owner: vec![None; n_slots],
            last_used: vec![0; n_slots],
            unused_prefetch: vec![false; n_slots],
            resident: HashMap::new(),
            pending: HashMap::new(),
            clock: 0,
            stats: ArenaStats::default(),
        }
    }

    /// Whether a call wanting `wanted` (sorted, distinct) of tier layer `layer` can claim them
    /// now: no expert of its layer is still being read (wanted or not: the slots a claim takes
    /// must not depend on whether a wrong guess's read has ended yet), and slots outside the
    /// pending reads suffice for the missing ones.
    pub fn can_claim(&self, layer: usize, wanted: &[u32]) -> bool {
        if self.pending.keys().any(|&(l, _)| l == layer) {
            return false;
        }
        self.n_slots - self.pending.len() >= wanted.len()
    }

    /// A call's claim of `wanted` (sorted, distinct ids below `n_expert`) of tier layer `layer`:
    /// its resident experts are marked used, and the least recently used slots no pending read
    /// or wanted expert holds are reserved for the others. Call only when
    /// [`ExpertArena::can_claim`] says so.
    pub fn claim(
        &mut self,
        layer: usize,
        wanted: &[u32],
        n_expert: usize,
    ) -> Result<Reserved, String> {
        if wanted.len() > self.n_slots {
            return Err(format!(
                "{} host experts in one call, the disk tier's arena holds {}",
                wanted.len(),
                self.n_slots
            ));
        }
        if let Some(e) = wanted.iter().find(|&&e| e as usize >= n_expert) {
            return Err(format!("expert {e} of {n_expert}"));
        }
        self.clock += 1;
        let mut missed = Vec::new();
        for &e in wanted {
            match self.resident.get(&(layer, e)) {
                Some(&s) => {
                    self.last_used[s as usize] = self.clock;
                    if std::mem::take(&mut self.unused_prefetch[s as usize]) {
                        self.stats.prefetch_hits += 1;
                    }
                }
                None => missed.push(e),
            }
        }
        let slots = self.reserve(layer, &missed, false, |_, _| false);
        if slots.len() != missed.len() {
            return Err(format!(
                "{} experts to read and too few free slots in the disk tier's arena",
                missed.len()
            ));
        }
        Ok(Reserved {
            layer,
            slots,
            prefetch: false,
        })
    }

    /// The prefetch's claim of the guessed experts `guessed` of tier layer `layer`: slots for
    /// those neither resident nor pending, taken from the least recently used ones that the
    /// latest call's experts, pending reads and the guessed experts themselves do not hold (as
    /// many as there are).
    pub fn claim_prefetch(&mut self, layer: usize, guessed: &[u32]) -> Reserved {
        let mut r = Reserved {
            layer,
            slots: Vec::new(),
            prefetch: true,
        };
        let mut absent: Vec<u32> = guessed
            .iter()
            .copied()
            .filter(|&e| {
                !self.resident.contains_key(&(layer, e)) && !self.pending.contains_key(&(layer, e))
            })
            .collect();
        // Several rows guess the same expert: one slot each.
        absent.sort_unstable();
        absent.dedup();
        r.slots = self.reserve(layer, &absent, true, |a, s| {
            a.owner[s].is_some_and(|(l, e)| l == layer && guessed.contains(&e))
        });
        r
    }

    /// Reserves a slot for each of `experts` (absent from the arena) of tier layer `layer`: the
    /// least recently used slots that are not pending, not stamped by the latest claim and not
    /// `kept`; they become pending. Fewer slots than experts: the first experts get them when
    /// `partial`, none otherwise.
    fn reserve(
        &mut self,
        layer: usize,
        experts: &[u32],
        partial: bool,
        kept: impl Fn(&Self, usize) -> bool,
    ) -> Vec<(u32, u32)> {
        let busy: std::collections::HashSet<u32> = self.pending.values().copied().collect();
        let mut free: Vec<usize> = (0..self.n_slots)
            .filter(|&s| {
                !busy.contains(&(s as u32)) && self.last_used[s] < self.clock && !kept(self, s)
            })
            .collect();
        if free.len() < experts.len() && !partial {
            return Vec::new();
        }
        free.sort_by_key(|&s| (self.last_used[s], s));
        let mut out = Vec::with_capacity(experts.len());
        for (&e, &s) in experts.iter().zip(&free) {
            if let Some(old) = self.owner[s].take() {
                if self.resident.get(&old) == Some(&(s as u32)) {
                    self.resident.remove(&old);
                }
            }
            self.unused_prefetch[s] = false;
            self.pending.insert((layer, e), s as u32);
            out.push((e, s as u32));
        }
        out
    }

    /// Ends a reservation's reads: its experts become resident (used at the current clock), or,
    /// when the reads failed, their slots hold nothing.
    pub fn finish(&mut self, r: Reserved, read: bool) {
        for &(e, s) in &r.slots {
            self.pending.remove(&(r.layer, e));
            let s = s as usize;
            if read {
                self.owner[s] = Some((r.layer, e));
                self.resident.insert((r.layer, e), s as u32);
                self.last_used[s] = self.clock;
                self.unused_prefetch[s] = r.prefetch;
            } else {
                self.owner[s] = None;
                self.last_used[s] = 0;
            }
        }
        if read {
            self.stats.reads += r.slots.len() as u64;
            if r.prefetch {
                self.stats.prefetched += r.slots.len() as u64;
            }
        }
    }

    /// Tier layer `layer`'s host map for a call that claimed `wanted`: the slot of each resident
    /// wanted expert, -1 for the rest.
    pub fn map(&self, layer: usize, wanted: &[u32], n_expert: usize) -> Vec<i32> {
        let mut map = vec![-1i32; n_expert];
        for &e in wanted {
            if let (Some(&s), Some(m)) = (self.resident.get(&(layer, e)), map.get_mut(e as usize)) {
                *m = s as i32;
            }
        }
        map
    }
}

/// The arena as the executor's calls and the prefetch share it: slots are claimed under a lock
/// and read outside it, and a call waits for the pending reads of the experts it needs.
pub struct PagedExperts {
    files: ExpertFiles,
    /// Per stack position, the slots' memory (outside the lock: its layout never changes).
    stacks: Vec<SlotMemory>,
    /// Bytes per expert per stack position.
    pub strides: Vec<u64>,
    /// Slots.
    pub n_slots: usize,
    arena: Mutex<ExpertArena>,
    /// Signalled whenever reads finish.
    loaded: Condvar,
}

impl PagedExperts {
    /// An arena of `n_slots` experts of `strides` bytes per stack, reading from the file's
    /// `parts`.
    pub fn new(parts: &[&Path], strides: Vec<u64>, n_slots: usize) -> std::io::Result<Self> {
        Ok(PagedExperts {
            files: ExpertFiles::open(parts)?,
            stacks: strides
                .iter()
                .map(|&s| SlotMemory::zeroed(s as usize * n_slots))
                .collect(),
            strides,
            n_slots,
            arena: Mutex::new(ExpertArena::new(n_slots)),
            loaded: Condvar::new(),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, ExpertArena>, String> {
        self.arena
            .lock()
            .map_err(|_| "the disk tier's arena is poisoned".to_string())
    }

    /// Stack position `k`'s memory (address and length), for the CPU device's view of it.
    pub fn stack_memory(&self, k: usize) -> (*const u8, usize) {
        let m = &self.stacks[k];
        (m.ptr.as_ptr().cast_const(), m.len)
    }

    /// The counters so far.
    pub fn stats(&self) -> Result<ArenaStats, String> {
        Ok(self.lock()?.stats)
    }

    /// The reads a reservation needs: every stack of each expert into its slot.
    fn read_jobs(&self, r: &Reserved, sources: &[StackSource]) -> Result<Vec<ReadJob<'_>>, String> {
        if sources.len() != self.strides.len()
            || sources
                .iter()
                .zip(&self.strides)
                .any(|(s, &k)| s.stride != k)
        {
            return Err(format!(
                "tier layer {} has {:?} bytes per expert per stack, the arena's slots {:?}",
                r.layer,
                sources.iter().map(|s| s.stride).collect::<Vec<_>>(),
                self.strides
            ));
        }
        let mut jobs = Vec::with_capacity(r.slots.len() * sources.len());
        for &(e, s) in &r.slots {
            for (mem, src) in self.stacks.iter().zip(sources) {
                let stride = src.stride as usize;
                // SAFETY: slot `s` < n_slots lies inside this stack's allocation of n_slots ×
                // stride bytes (checked above). A Reserved is made only by the arena's claims
                // and its slots stay pending until `finish` takes it, so no other thread writes
                // them and no expert map points at them (the CPU device does not read them); no
                // reference spans the stack (SlotMemory hands out raw addresses only).
                let out = unsafe {
                    std::slice::from_raw_parts_mut(
                        mem.ptr.as_ptr().add(s as usize * stride),
                        stride,
                    )
                };
                jobs.push(ReadJob {
                    expert: e,
                    src: *src,
                    out,
                });
            }
        }
        Ok(jobs)
    }

    /// Reads a reservation's experts outside the lock, then ends it; the reads' error.
    pub fn read(&self, r: Reserved, sources: &[StackSource]) -> Result<(), String> {
        let done = self
            .read_jobs(&r, sources)
            .and_then(|jobs| self.files.read_all(jobs));
        self.lock()?.finish(r, done.is_ok());
        self.loaded.notify_all();
        done
    }

    /// Makes the experts `needed` of tier layer `layer` resident (waiting for those being read,
    /// reading the missing ones over the least recently used slots no expert of this call needs)
    /// and returns the layer's host map: the slot of each needed expert, -1 for the rest.
    pub fn ensure(
        &self,
        layer: usize,
        needed: &[u32],
        n_expert: usize,
        sources: &[StackSource],
    ) -> Result<Vec<i32>, String> {
        let mut wanted = needed.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let mut arena = self.lock()?;
        while wanted.len() <= self.n_slots && !arena.can_claim(layer, &wanted) {
            arena = self
                .loaded
                .wait(arena)
                .map_err(|_| "the disk tier's arena is poisoned".to_string())?;
        }
        let r = arena.claim(layer, &wanted, n_expert)?;
        drop(arena);
        if !r.slots.is_empty() {
            self.read(r, sources)?;
        }
        Ok(self.lock()?.map(layer, &wanted, n_expert))
    }

    /// Claims slots to read ahead the experts `guessed` of tier layer `layer` that the arena
    /// lacks (see [`ExpertArena::claim_prefetch`]); None when it lacks none or has no room.
    pub fn claim_ahead(&self, layer: usize, guessed: &[u32]) -> Result<Option<Reserved>, String> {
        let r = self.lock()?.claim_prefetch(layer, guessed);
        Ok((!r.slots.is_empty()).then_some(r))
    }

    /// Slot `s` of stack position `k` (tests: what a read put there).
    #[cfg(test)]
    fn slot(&self, k: usize, s: usize) -> Vec<u8> {
        let m = &self.stacks[k];
        let stride = self.strides[k] as usize;
        // SAFETY: inside the allocation; the tests read slots no read is writing.
        unsafe { std::slice::from_raw_parts(m.ptr.as_ptr().add(s * stride), stride) }.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A "file" of 2 stacks × 6 experts (stack k expert e holds bytes 10·k + e) and its
    /// sources.
    fn file() -> (tempfile::NamedTempFile, [StackSource; 2]) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let stride = 16u64;
        for k in 0..2u8 {
            for e in 0..6u8 {
                f.write_all(&[10 * k + e; 16]).unwrap();
            }
        }
        f.flush().unwrap();
        let src = |k: u64| StackSource {
            part: 0,
            offset: k * 6 * stride,
            stride,
        };
        (f, [src(0), src(1)])
    }

    fn check(a: &PagedExperts, map: &[i32]) {
        for (e, &s) in map.iter().enumerate() {
            if s >= 0 {
                for k in 0..2 {
                    assert!(a
                        .slot(k, s as usize)
                        .iter()
                        .all(|&b| b == 10 * k as u8 + e as u8));
                }
            }
        }
    }

    fn resident(a: &PagedExperts, layer: usize, e: u32) -> bool {
        a.lock().unwrap().resident.contains_key(&(layer, e))
    }

    #[test]
    fn reads_evict_least_recently_used_and_keep_needed_experts() {
        let (f, srcs) = file();
        let a = PagedExperts::new(&[f.path()], vec![16, 16], 3).unwrap();
        let reads = || a.stats().unwrap().reads;
        let m = a.ensure(0, &[1, 4, 1], 6, &srcs).unwrap();
        assert_eq!(m.iter().filter(|&&s| s >= 0).count(), 2);
        check(&a, &m);
        assert_eq!(reads(), 2);
        // Expert 1 again costs nothing; 5 takes the free slot.
        let m = a.ensure(0, &[1, 5], 6, &srcs).unwrap();
        check(&a, &m);
        assert_eq!(reads(), 3);
        // Full: 2 evicts the least recently used (4), never 1 or 5 which this call needs.
        let m = a.ensure(0, &[2, 1, 5], 6, &srcs).unwrap();
        check(&a, &m);
        assert_eq!(reads(), 4);
        assert!(!resident(&a, 0, 4));
        // The same expert id of another layer is another expert.
        let m = a.ensure(1, &[1], 6, &srcs).unwrap();
        check(&a, &m);
        assert_eq!(reads(), 5);
        assert!(a.ensure(0, &[0, 1, 2, 3], 6, &srcs).is_err());
        // An expert past the end of the file: a named error, nothing claimed, and the arena
        // still serves the others (two missed experts: their stacks read concurrently).
        let e = a.ensure(0, &[3, 9], 10, &srcs).unwrap_err();
        assert!(e.contains("reading expert 9"), "{e}");
        assert!(!resident(&a, 0, 9) && !resident(&a, 0, 3));
        let m = a.ensure(0, &[3, 0], 6, &srcs).unwrap();
        check(&a, &m);
        assert_eq!(a.stats().unwrap().prefetched, 0);
    }

    #[test]
    fn prefetch_reads_ahead_into_slots_the_latest_call_does_not_use() {
        let (f, srcs) = file();
        let a = PagedExperts::new(&[f.path()], vec![16, 16], 4).unwrap();
        let ahead = |layer: usize, guessed: &[u32]| match a.claim_ahead(layer, guessed).unwrap() {
            Some(r) => {
                let n = r.slots.len();
                a.read(r, &srcs).unwrap();
                n
            }
            None => 0,
        };
        a.ensure(0, &[1, 2], 6, &srcs).unwrap();
        // Layer 1's guess while layer 0's call computes: two free slots, so two of the three
        // guessed experts are read; layer 0's experts stay.
        assert_eq!(ahead(1, &[0, 3, 5]), 2);
        assert!(resident(&a, 0, 1) && resident(&a, 0, 2));
        assert!(resident(&a, 1, 0) && resident(&a, 1, 3) && !resident(&a, 1, 5));
        // Nothing absent: nothing claimed.
        assert_eq!(ahead(1, &[0, 3]), 0);
        // Layer 1's call finds the guessed expert it needs (3); its miss (4) takes the least
        // recently used slot (layer 0's expert 1, the lowest of four stamped alike).
        let m = a.ensure(1, &[3, 4], 6, &srcs).unwrap();
        check(&a, &m);
        assert!(!resident(&a, 0, 1) && resident(&a, 1, 0) && resident(&a, 0, 2));
        let s = a.stats().unwrap();
        assert_eq!((s.reads, s.prefetched, s.prefetch_hits), (5, 2, 1), "{s:?}");
        // A hit counts once: the same expert again is no new hit.
        a.ensure(1, &[3], 6, &srcs).unwrap();
        assert_eq!(a.stats().unwrap().prefetch_hits, 1);
    }

    #[test]
    fn a_call_waits_for_its_pending_experts_and_pending_slots_are_never_taken() {
        let mut a = ExpertArena::new(3);
        let c = a.claim(0, &[1], 6).unwrap();
        a.finish(c, true);
        // Rows guessing the same expert claim one slot for it.
        let p = a.claim_prefetch(1, &[2, 4, 2, 4, 2]);
        assert_eq!(p.slots.len(), 2);
        // Experts 2 and 4 of layer 1 are being read: a call of layer 1 waits for both, wanted
        // or not; one of another layer fits in the slot left.
        assert!(!a.can_claim(1, &[2]));
        assert!(!a.can_claim(1, &[5]));
        assert!(a.can_claim(0, &[5]));
        assert!(!a.can_claim(0, &[3, 5]));
        let c = a.claim(0, &[5], 6).unwrap();
        assert!(c.slots.iter().all(|s| !p.slots.iter().any(|q| q.1 == s.1)));
        a.finish(c, true);
        a.finish(p, false);
        // A failed read leaves its slots empty, and the call may claim again.
        assert!(a.can_claim(1, &[2]));
        let c = a.claim(1, &[2], 6).unwrap();
        assert_eq!(c.slots.len(), 1);
    }
}
