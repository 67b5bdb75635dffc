//! The disk tier: when host RAM cannot hold the host experts (`--host-budget` or MemAvailable
//! below their size), they are read from the model file on demand into an arena of expert slots
//! of that budget, least recently used first out. The CPU computes host experts from the arena
//! instead of the mapped file, so resident memory stays inside the budget however large the file.
//!
//! Files are read with `O_DIRECT` where the file system allows it (aligned reads through a bounce
//! buffer, so the page cache does not grow), and with ordinary reads elsewhere (tmpfs).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Alignment `O_DIRECT` reads need (offset, length and buffer).
const DIRECT_ALIGN: u64 = 4096;

/// One model file part, opened for expert reads.
struct Source {
    file: File,
    direct: bool,
}

impl Source {
    fn open(path: &Path) -> std::io::Result<Source> {
        // O_DIRECT from libc's headers on Linux (0o40000 on x86-64 and aarch64).
        const O_DIRECT: i32 = 0o40000;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(O_DIRECT)
            .open(path)
        {
            Ok(file) => Ok(Source { file, direct: true }),
            Err(_) => Ok(Source {
                file: File::open(path)?,
                direct: false,
            }),
        }
    }

    /// Reads `out.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, out: &mut [u8], bounce: &mut Vec<u8>) -> std::io::Result<()> {
        if self.direct {
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
                // The file system refused the direct read: read through the page cache from now.
                _ => self.direct = false,
            }
        }
        self.file.read_exact_at(out, offset)
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
    bounce: Vec<u8>,
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
            bounce: Vec::new(),
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
                    for (k, src) in sources.iter().enumerate() {
                        let stride = self.strides[k];
                        if src.stride != stride {
                            return Err(format!(
                                "stack {k} of tier layer {layer} has {} bytes per expert, the \
                                 arena's slots {stride}",
                                src.stride
                            ));
                        }
                        let at = s as usize * stride as usize;
                        let out = &mut self.stacks[k][at..at + stride as usize];
                        self.sources[src.part]
                            .read(src.offset + u64::from(e) * stride, out, &mut self.bounce)
                            .map_err(|err| {
                                format!("reading expert {e} from the model file: {err}")
                            })?;
                    }
                    self.owner[s as usize] = Some((layer, e));
                    self.resident.insert((layer, e), s);
                    self.last_used[s as usize] = self.clock;
                    self.reads += 1;
                    s
                }
            };
            map[e as usize] = slot as i32;
        }
        Ok(map)
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
    }
}
