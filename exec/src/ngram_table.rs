//! Hashed n-gram tables gathered on the host (`WeightClass::NgramTable`: Qwen3.8's PLE table,
//! DeepSeek-V4.1's Engram tables), a pass's rows at a time, into the f32 batch input
//! [`BatchInput::NgramEmbd`](bloomery_plugin_api::graph::BatchInput::NgramEmbd).
//!
//! No card holds such a table (28.8 GB for Qwen3.8's): each token reads a few rows (16 of 160
//! values for Qwen3.8, 24 of 256 per Engram site), which the host reads from the mapped file,
//! or with the tiering's file reader (`O_DIRECT`, no page cache) when the placement plan puts
//! the tables on disk, and dequantizes with the CPU kernels' row dequantization (the one the
//! CPU's `GetRows` runs, so the rows are bit for bit what a `GetRows` over the table gave).
//! Dequantizing here rather than in the graph keeps the graph's input an ordinary f32 tensor
//! (no op reads the table, so no device needs the table's type), at 10 KB a token for Qwen3.8
//! and 48 KB for V4.1's two sites: nothing beside a pass's other uploads.
//!
//! The row ids depend only on tokens, so once token t is sampled its rows for the next pass are
//! known: [`NgramTables::prefetch`] hands them to a thread that gathers them while the rest of
//! the step runs, and the next pass takes them ready (keyed by the ids themselves: rows whose
//! ids were not fetched ahead, or fetched for another context, are gathered then). Prefetching
//! changes no value, only when the gather happens.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bloomery_kernels_cpu::quant::dequantize_row;
use bloomery_plugin_api::DType;
use bloomery_tiering::arena::{ExpertFiles, ReadJob, StackSource};
use bloomery_tiering::HostSlice;

use crate::ngram_cache::{RowCache, RowKey};

/// One table: where its rows lie and how they are stored.
pub(crate) struct Table {
    /// The weight's name.
    pub(crate) name: String,
    /// How its rows are stored.
    pub(crate) dtype: DType,
    /// Values a row.
    pub(crate) width: u64,
    /// Bytes a row.
    pub(crate) row_bytes: usize,
    /// Rows.
    pub(crate) rows: u64,
    /// The rows in the mapped file (read when the tables are in host RAM).
    pub(crate) mapped: HostSlice,
    /// The rows in the file (read when the tables are on disk).
    pub(crate) source: StackSource,
}

/// Where the rows are read from.
enum Reader {
    /// The mapped file (the page cache holds the tables).
    Mapped,
    /// The file's parts, read with `O_DIRECT` where the file system allows it, through a
    /// bounded cache of rows.
    Disk {
        files: ExpertFiles,
        cache: Mutex<RowCache>,
        /// Rows read from the file, and rows the cache served.
        reads: AtomicU64,
        cached: AtomicU64,
    },
}

/// Counts of the gathers passes made since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NgramStats {
    /// Token rows whose table rows a pass needed.
    pub rows: u64,
    /// Of those, rows taken ready from a prefetch.
    pub prefetched: u64,
    /// Time the passes spent on the tables: gathering, or waiting for a prefetch still running.
    pub exposed: Duration,
    /// Table rows read from disk (passes and prefetches).
    pub disk_reads: u64,
    /// Table rows the disk reader's cache served instead.
    pub cached: u64,
}

/// What the prefetch thread and the passes share.
struct Shared {
    tables: Vec<Table>,
    reader: Reader,
    /// Row ids per table and token row.
    per_table: usize,
    /// Values a table row.
    width: usize,
    /// Gathered rows by their token row's ids, and the ids being gathered.
    ready: Mutex<Ready>,
    done: Condvar,
}

#[derive(Default)]
struct Ready {
    rows: HashMap<Vec<i32>, Vec<f32>>,
    pending: HashSet<Vec<i32>>,
}

/// The model's n-gram tables, with the prefetch thread. Field order is drop order: the thread
/// ends before the rows it reads.
pub struct NgramTables {
    jobs: Option<mpsc::Sender<Vec<Vec<i32>>>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    stats: Mutex<NgramStats>,
}

impl NgramTables {
    /// The gatherer of `tables` (at least one, all rows `width` values), `per_table` row ids of
    /// each a token, read from the mapped file, or from `disk`'s file parts through a cache of
    /// that many bytes of rows; starts the prefetch thread. `names` are the tables' names, for
    /// the log.
    pub(crate) fn new(
        tables: Vec<Table>,
        per_table: usize,
        disk: Option<(&[&Path], u64)>,
    ) -> Result<NgramTables, String> {
        let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
        let declared = names.join(", ");
        let width = tables[0].width as usize;
        let reader = match disk {
            Some((paths, bytes)) => Reader::Disk {
                files: ExpertFiles::open(paths)
                    .map_err(|e| format!("opening the model file for n-gram tables: {e}"))?,
                cache: Mutex::new(RowCache::new(usize::try_from(bytes).unwrap_or(usize::MAX))),
                reads: AtomicU64::new(0),
                cached: AtomicU64::new(0),
            },
            None => Reader::Mapped,
        };
        let on_disk = disk.is_some();
        let shared = Arc::new(Shared {
            tables,
            reader,
            per_table,
            width,
            ready: Mutex::new(Ready::default()),
            done: Condvar::new(),
        });
        let (tx, rx) = mpsc::channel::<Vec<Vec<i32>>>();
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("bloomery-ngram-prefetch".into())
            .spawn(move || {
                while let Ok(keys) = rx.recv() {
                    worker.fetch(keys);
                }
            })
            .map_err(|e| format!("starting the n-gram prefetch: {e}"))?;
        tracing::info!(
            "n-gram tables {}: {:.2} GiB, rows gathered from {}",
            declared,
            shared
                .tables
                .iter()
                .map(|t| t.rows * t.row_bytes as u64)
                .sum::<u64>() as f64
                / (1u64 << 30) as f64,
            if on_disk { "disk" } else { "host RAM" }
        );
        Ok(NgramTables {
            jobs: Some(tx),
            thread: Some(thread),
            shared,
            stats: Mutex::new(NgramStats::default()),
        })
    }

    /// Values a table row.
    pub fn width(&self) -> usize {
        self.shared.width
    }

    /// The tables' bytes in the file mapping, `(start, end)` addresses.
    pub fn mapped_ranges(&self) -> Vec<(usize, usize)> {
        self.shared
            .tables
            .iter()
            .map(|t| (t.mapped.addr, t.mapped.addr + t.mapped.len))
            .collect()
    }

    /// Row ids a token row.
    pub fn n_ids(&self) -> usize {
        self.shared.n_ids()
    }

    /// Whether the rows are read from disk.
    pub fn on_disk(&self) -> bool {
        matches!(self.shared.reader, Reader::Disk { .. })
    }

    /// Starts gathering the rows of the token rows whose ids are `ids` (`n_ids` a token row,
    /// as [`NgramSpec::extend_rows`] gives them) on the prefetch thread, for the next pass.
    pub fn prefetch(&self, ids: &[i32]) {
        let n_ids = self.shared.n_ids();
        if n_ids == 0 || ids.is_empty() || !ids.len().is_multiple_of(n_ids) {
            return;
        }
        let mut ready = self.shared.lock();
        let keys: Vec<Vec<i32>> = ids
            .chunks(n_ids)
            .filter(|k| !ready.rows.contains_key(*k) && !ready.pending.contains(*k))
            .map(<[i32]>::to_vec)
            .collect();
        if keys.is_empty() {
            return;
        }
        ready.pending.extend(keys.iter().cloned());
        drop(ready);
        if let Some(Err(mpsc::SendError(keys))) = self.jobs.as_ref().map(|j| j.send(keys)) {
            // The thread ended (only dropping the tables ends it): nothing will gather them.
            let mut ready = self.shared.lock();
            keys.iter().for_each(|k| {
                ready.pending.remove(k);
            });
        }
    }

    /// Writes the table rows of every token row of `ids` into `out` (`width` values a table
    /// row, in `ids` order), taking those a prefetch gathered; then forgets what was fetched
    /// ahead (a prefetch serves the next pass only).
    pub fn gather(&self, ids: &[i32], out: &mut [f32]) -> Result<(), String> {
        let began = Instant::now();
        let (n_ids, width) = (self.shared.n_ids(), self.shared.width);
        if !ids.len().is_multiple_of(n_ids.max(1)) || out.len() != ids.len() * width {
            return Err(format!(
                "n-gram rows: {} ids ({n_ids} a row) for {} values of rows of {width}",
                ids.len(),
                out.len()
            ));
        }
        let mut missed = Vec::new();
        let mut taken = 0u64;
        {
            let mut ready = self.shared.lock();
            for (r, key) in ids.chunks(n_ids).enumerate() {
                while ready.pending.contains(key) {
                    ready = self
                        .shared
                        .done
                        .wait(ready)
                        .unwrap_or_else(|p| p.into_inner());
                }
                match ready.rows.get(key) {
                    Some(rows) => {
                        out[r * n_ids * width..][..n_ids * width].copy_from_slice(rows);
                        taken += 1;
                    }
                    None => missed.push(r),
                }
            }
            ready.rows.clear();
        }
        for r in missed {
            self.shared.rows(
                &ids[r * n_ids..][..n_ids],
                &mut out[r * n_ids * width..][..n_ids * width],
            )?;
        }
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.rows += (ids.len() / n_ids.max(1)) as u64;
        s.prefetched += taken;
        s.exposed += began.elapsed();
        Ok(())
    }

    /// The counts since load.
    pub fn stats(&self) -> NgramStats {
        let mut s = *self.stats.lock().unwrap_or_else(|p| p.into_inner());
        if let Reader::Disk { reads, cached, .. } = &self.shared.reader {
            s.disk_reads = reads.load(Ordering::Relaxed);
            s.cached = cached.load(Ordering::Relaxed);
        }
        s
    }
}

impl Drop for NgramTables {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn n_ids(&self) -> usize {
        self.per_table * self.tables.len()
    }

    fn lock(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The prefetch thread's work: gathers each key's rows and hands them over. A failed
    /// gather hands over nothing: the pass gathers those rows itself and reports the error.
    fn fetch(&self, keys: Vec<Vec<i32>>) {
        let per_key = self.n_ids() * self.width;
        for key in keys {
            let mut rows = vec![0f32; per_key];
            let got = self.rows(&key, &mut rows);
            let mut ready = self.lock();
            ready.pending.remove(&key);
            if got.is_ok() {
                ready.rows.insert(key, rows);
            }
            drop(ready);
            self.done.notify_all();
        }
    }

    /// Gathers one token row's table rows (`ids`, `n_ids` of them) into `out`.
    fn rows(&self, ids: &[i32], out: &mut [f32]) -> Result<(), String> {
        let mut picked = Vec::with_capacity(ids.len());
        for (k, &id) in ids.iter().enumerate() {
            let ti = k / self.per_table.max(1);
            let t = &self.tables[ti];
            let row = u64::try_from(id)
                .ok()
                .filter(|&r| r < t.rows)
                .ok_or_else(|| {
                    format!(
                        "n-gram row id {id} outside table `{}` ({} rows)",
                        t.name, t.rows
                    )
                })?;
            picked.push((ti, row));
        }
        // From disk: the rows the cache lacks read first (several reads in flight), then all
        // dequantized.
        let raw = match &self.reader {
            Reader::Disk {
                files,
                cache,
                reads,
                cached,
            } => Some(self.read_rows(&picked, files, cache, (reads, cached))?),
            Reader::Mapped => None,
        };
        for (k, &(ti, row)) in picked.iter().enumerate() {
            let t = &self.tables[ti];
            let bytes = match &raw {
                Some(raw) => &raw[k][..],
                None => &t.mapped.bytes()[row as usize * t.row_bytes..][..t.row_bytes],
            };
            dequantize_row(t.dtype, bytes, &mut out[k * self.width..][..self.width])
                .map_err(|e| format!("n-gram table `{}`: {e}", t.name))?;
        }
        Ok(())
    }

    /// The raw bytes of the rows `picked` (table, row): from `cache`, else read from `files`
    /// (and then held in `cache`); counts both.
    fn read_rows(
        &self,
        picked: &[RowKey],
        files: &ExpertFiles,
        cache: &Mutex<RowCache>,
        (reads, cached): (&AtomicU64, &AtomicU64),
    ) -> Result<Vec<Vec<u8>>, String> {
        let lock = || cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut raw: Vec<Vec<u8>> = Vec::with_capacity(picked.len());
        let mut missed = Vec::new();
        {
            let mut c = lock();
            for (k, &key) in picked.iter().enumerate() {
                match c.get(key) {
                    Some(b) => raw.push(b.to_vec()),
                    None => {
                        raw.push(vec![0u8; self.tables[key.0].row_bytes]);
                        missed.push(k);
                    }
                }
            }
        }
        let jobs = raw
            .iter_mut()
            .enumerate()
            .filter(|(k, _)| missed.contains(k))
            .map(|(k, out)| {
                let (ti, row) = picked[k];
                ReadJob::new(row as u32, self.tables[ti].source, out)
            })
            .collect();
        files.read_all(jobs)?;
        let mut c = lock();
        for &k in &missed {
            c.put(picked[k], &raw[k]);
        }
        reads.fetch_add(missed.len() as u64, Ordering::Relaxed);
        cached.fetch_add((picked.len() - missed.len()) as u64, Ordering::Relaxed);
        Ok(raw)
    }
}
