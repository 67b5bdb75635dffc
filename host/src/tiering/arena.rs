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
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Slots of experts in host memory, one byte array per stack position.
pub struct ExpertArena {
    /// Per stack position: `n_slots` experts' bytes, slot after slot.
    pub stacks: Vec<Vec<u8>>,
    /// Bytes per expert per stack position.
    pub strides: Vec<u64>,
    /// Slots.
    pub n_slots: usize,
    owner: Vec<Option<(usize, u32)>>,
    last_used: Vec<u64>,
    resident: HashMap<(usize, u32), u32>,
    clock: u64,
    sources: Vec<Source>,
    /// Experts read from the file so far.
    pub reads: u64,
}

impl ExpertArena {
    /// An arena of `n_slots` experts of `strides` bytes per stack, reading from `parts`.
    pub fn new(parts: &[&Path], strides: Vec<u64>, n_slots: usize) -> std::io::Result<Self> {
        let sources = parts
            .iter()
            .map(|p| Source::open(p))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(ExpertArena {
            stacks: strides
                .iter()
                .map(|&s| vec![0u8; s as usize * n_slots])
                .collect(),
            strides,
            n_slots,
            owner: vec![None; n_slots],
            last_used: vec![0; n_slots],
            resident: HashMap::new(),
            clock: 0,
            sources,
            reads: 0,
        })
    }

    /// Makes the experts `needed` of tier layer `layer` resident (reading the missing ones over
    /// the least recently used slots no expert of this call needs) and returns the layer's host
    /// map: the slot of each needed expert, -1 for the rest.
    pub fn ensure(
        &mut self,
        layer: usize,
        needed: &[u32],
        n_expert: usize,
        sources: &[StackSource],
    ) -> Result<Vec<i32>, String> {
        let mut wanted: Vec<u32> = needed.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        if wanted.len() > self.n_slots {
            return Err(format!(
                "{} host experts in one call, the disk tier's arena holds {}",
                wanted.len(),
                self.n_slots
            ));
        }
        self.clock += 1;
        // Mark the resident ones used first, so eviction never takes a slot this call needs.
        for &e in &wanted {
            if let Some(&s) = self.resident.get(&(layer, e)) {
                self.last_used[s as usize] = self.clock;
            }
        }
        let mut map = vec![-1i32; n_expert];
        // Slots first (the same choices as reading one by one), then the reads together.
        let mut missed = Vec::new();
        for &e in &wanted {
            if e as usize >= n_expert {
                return Err(format!("expert {e} of {n_expert}"));
            }
            let slot = match self.resident.get(&(layer, e)) {
                Some(&s) => s,
                None => {
                    let s = (0..self.n_slots)
                        .min_by_key(|&s| (self.last_used[s], s))
                        .unwrap_or(0) as u32;
                    if let Some(old) = self.owner[s as usize].take() {
                        self.resident.remove(&old);
                    }
                    self.last_used[s as usize] = self.clock;
                    missed.push((e, s));
                    s
                }
            };
            map[e as usize] = slot as i32;
        }
        if let Err(err) = self.read_experts(layer, &missed, sources) {
            // The missed slots hold no whole expert now: leave them unowned.
            for &(_, s) in &missed {
                self.last_used[s as usize] = 0;
            }
            return Err(err);
        }
        for &(e, s) in &missed {
            self.owner[s as usize] = Some((layer, e));
            self.resident.insert((layer, e), s);
        }
        self.reads += missed.len() as u64;
        Ok(map)
    }

    /// Reads every stack of experts `missed` (expert, slot) of tier layer `layer` into their slots,
    /// up to [`READ_THREADS`] stacks at once.
    fn read_experts(
        &mut self,
        layer: usize,
        missed: &[(u32, u32)],
        sources: &[StackSource],
    ) -> Result<(), String> {
        for (k, src) in sources.iter().enumerate() {
            if self.strides.get(k) != Some(&src.stride) || src.part >= self.sources.len() {
                return Err(format!(
                    "stack {k} of tier layer {layer} has {} bytes per expert in part {}, the \
                     arena's slots {:?}",
                    src.stride,
                    src.part,
                    self.strides.get(k)
                ));
            }
        }
        // One job per (expert, stack): the file range and the slot's bytes, borrowed apart.
        let mut slots: Vec<Vec<Option<&mut [u8]>>> = self
            .stacks
            .iter_mut()
            .zip(&self.strides)
            .map(|(st, &stride)| st.chunks_mut(stride as usize).map(Some).collect())
            .collect();
        let mut jobs = Vec::with_capacity(missed.len() * sources.len());
        for &(e, s) in missed {
            for (k, src) in sources.iter().enumerate() {
                let out = slots[k][s as usize]
                    .take()
                    .ok_or_else(|| format!("slot {s} taken twice in one call"))?;
                jobs.push((e, src, out));
            }
        }
        let files = &self.sources;
        let read = |(e, src, out): (u32, &StackSource, &mut [u8]), bounce: &mut Vec<u8>| {
            files[src.part]
                .read(src.offset + u64::from(e) * src.stride, out, bounce)
                .map_err(|err| format!("reading expert {e} from the model file: {err}"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_evict_least_recently_used_and_keep_needed_experts() {
        // A "file" of 2 stacks × 6 experts: stack k expert e holds bytes 10·k + e.
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let stride = 16u64;
        for k in 0..2u8 {
            for e in 0..6u8 {
                f.write_all(&[10 * k + e; 16]).unwrap();
            }
        }
        f.flush().unwrap();
        let srcs = [
            StackSource {
                part: 0,
                offset: 0,
                stride,
            },
            StackSource {
                part: 0,
                offset: 6 * stride,
                stride,
            },
        ];
        let mut a = ExpertArena::new(&[f.path()], vec![stride, stride], 3).unwrap();
        let check = |a: &ExpertArena, map: &[i32]| {
            for (e, &s) in map.iter().enumerate() {
                if s >= 0 {
                    for k in 0..2 {
                        let at = s as usize * 16;
                        assert!(a.stacks[k][at..at + 16]
                            .iter()
                            .all(|&b| b == 10 * k as u8 + e as u8));
                    }
                }
            }
        };
        let m = a.ensure(0, &[1, 4, 1], 6, &srcs).unwrap();
        assert_eq!(m.iter().filter(|&&s| s >= 0).count(), 2);
        check(&a, &m);
        assert_eq!(a.reads, 2);
        // Expert 1 again costs nothing; 5 takes the free slot.
        let m = a.ensure(0, &[1, 5], 6, &srcs).unwrap();
        check(&a, &m);
        assert_eq!(a.reads, 3);
        // Full: 2 evicts the least recently used (4), never 1 or 5 which this call needs.
        let m = a.ensure(0, &[2, 1, 5], 6, &srcs).unwrap();
        check(&a, &m);
        assert_eq!(a.reads, 4);
        assert!(!a.resident.contains_key(&(0, 4)));
        // The same expert id of another layer is another expert.
        let m = a.ensure(1, &[1], 6, &srcs).unwrap();
        check(&a, &m);
        assert_eq!(a.reads, 5);
        assert!(a.ensure(0, &[0, 1, 2, 3], 6, &srcs).is_err());
        // An expert past the end of the file: a named error, nothing claimed, and the arena
        // still serves the others (two missed experts: their stacks read concurrently).
        let e = a.ensure(0, &[3, 9], 10, &srcs).unwrap_err();
        assert!(e.contains("reading expert 9"), "{e}");
        assert!(!a.resident.contains_key(&(0, 9)) && !a.resident.contains_key(&(0, 3)));
        let m = a.ensure(0, &[3, 0], 6, &srcs).unwrap();
        check(&a, &m);
    }
}
