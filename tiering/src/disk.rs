//! The disk tier as the executor uses it: host experts paged from the model file into a bounded
//! arena ([`arena`](super::arena)), and a thread that reads ahead the experts the next layer
//! will likely call.
//!
//! The guess is the card's: in the segment before a layer's host experts, the card also applies
//! the next tier layer's router to this layer's MoE input (the residual stream changes little
//! from one layer to the next, so that router mostly picks the same experts from either) and
//! packs the ids with the inputs. Once this layer's experts are resident, the host claims slots
//! for the guessed experts the arena lacks (slots the running call does not use) and the thread
//! reads them while the CPU computes, so the next layer's call finds them resident or waits only
//! for the rest of their read. A wrong guess costs a read and the least recently used slot,
//! never a result: the call reads what it needs itself, and each row sums its experts in pick
//! order whatever their slots. Off unless asked (`--disk-prefetch N`): where the reads saturate
//! the drive, a right guess hides only one layer's CPU time while a wrong one costs a whole read
//! (docs/performance.md).

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use bloomery_gguf::GgufModel;
use bloomery_plugin_api::tensor::TensorRef;

use super::arena::{ArenaStats, PagedExperts, Reserved, StackSource};
use super::error::dev_err;
use super::error::TierError;
use super::layer::TierLayer;
use super::plan::{Plan, PlanError};
use bloomery_devices::{Buffer, Device};

/// What the read-ahead thread shares with the executor's calls.
pub struct Paging {
    /// The arena.
    pub experts: PagedExperts,
    /// Per tier layer, where each of its stacks lies in the file.
    pub sources: Vec<Vec<StackSource>>,
}

impl Paging {
    /// Reads a reservation's experts from their layer's sources (none known: the read fails and
    /// the slots end empty, never left pending).
    fn read(&self, r: Reserved) -> Result<(), String> {
        let sources = self.sources.get(r.layer()).map_or(&[][..], |s| s);
        self.experts.read(r, sources)
    }
}

/// The thread that reads claimed guesses; dropping it ends and joins the thread.
struct ReadAhead {
    /// Experts guessed per row.
    guesses: u32,
    jobs: Option<mpsc::Sender<Reserved>>,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    fn spawn(paging: Arc<Paging>, guesses: u32) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Reserved>();
        let thread = std::thread::Builder::new()
            .name("bloomery-read-ahead".into())
            .spawn(move || {
                while let Ok(r) = rx.recv() {
                    // A failed read leaves its slots empty and no longer pending: the call that
                    // needs the expert reads it and reports.
                    if let Err(e) = paging.read(r) {
                        tracing::debug!("reading a guessed expert ahead failed: {e}");
                    }
                }
            })?;
        Ok(ReadAhead {
            guesses,
            jobs: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Host experts read from the file on demand into a bounded arena, and read ahead. Field order
/// is drop order: the thread and the device's views before the memory they use.
pub struct DiskTier {
    read_ahead: Option<ReadAhead>,
    _views: Vec<Buffer>,
    /// The arena and its sources.
    pub paging: Arc<Paging>,
}

impl DiskTier {
    /// Makes the experts `needed` of tier layer `layer` resident; returns the layer's host map.
    pub fn ensure(
        &self,
        layer: usize,
        needed: &[u32],
        n_expert: usize,
    ) -> Result<Vec<i32>, String> {
        let sources = self
            .paging
            .sources
            .get(layer)
            .ok_or_else(|| format!("no tier layer {layer}"))?;
        self.paging.experts.ensure(layer, needed, n_expert, sources)
    }

    /// Experts guessed per row and read ahead (the card computes the guesses); 0: none.
    pub fn guesses_per_row(&self) -> u32 {
        self.read_ahead.as_ref().map_or(0, |r| r.guesses)
    }

    /// Claims slots for the experts `guessed` of tier layer `layer` that the arena lacks and
    /// hands their reads to the read-ahead thread.
    pub fn read_ahead(&self, layer: usize, guessed: &[u32]) -> Result<(), String> {
        let Some(jobs) = self.read_ahead.as_ref().and_then(|p| p.jobs.as_ref()) else {
            return Ok(());
        };
        if let Some(r) = self.paging.experts.claim_ahead(layer, guessed)? {
            if let Err(mpsc::SendError(r)) = jobs.send(r) {
                // The thread ended (only dropping the tier ends it): read here instead, so the
                // claimed slots do not stay pending.
                self.paging.read(r)?;
            }
        }
        Ok(())
    }

    /// The arena's counters.
    pub fn stats(&self) -> Result<ArenaStats, String> {
        self.paging.experts.stats()
    }
}

/// Sets up the disk tier for `layers`: an arena of as many expert slots as the host budget holds
/// (at least one layer's experts), shown to the host device, each layer's host stacks pointed at
/// it, and (with `guesses` per row, above 0) the read-ahead thread. Every layer's experts must
/// have the same size per stack.
pub fn disk_tier(
    host: &Arc<Device>,
    file: &GgufModel,
    plan: &Plan,
    layers: &mut [TierLayer],
    sources: Vec<Vec<StackSource>>,
    guesses: u32,
) -> Result<DiskTier, TierError> {
    let strides: Vec<u64> = sources[0].iter().map(|s| s.stride).collect();
    if sources
        .iter()
        .any(|l| l.iter().map(|s| s.stride).ne(strides.iter().copied()))
    {
        return Err(PlanError(
            "the host budget is below the host experts, and the disk tier needs experts of one \
             size per stack across layers; this file mixes them (raise --host-budget)"
                .into(),
        )
        .into());
    }
    let slot_bytes: u64 = strides.iter().sum();
    let most = layers
        .iter()
        .map(|l| l.card_map.ne[0] as usize)
        .max()
        .unwrap_or(0);
    let n_slots = (plan.host_budget / slot_bytes.max(1)) as usize;
    if n_slots < most {
        return Err(PlanError(format!(
            "host budget {} holds {n_slots} experts of {slot_bytes} bytes; reading experts from \
             disk needs room for one layer's {most}",
            plan.host_budget
        ))
        .into());
    }
    let n_slots = n_slots.min(layers.iter().map(|l| l.card_map.ne[0] as usize).sum());
    let paths: Vec<&std::path::Path> = file.parts().iter().map(|p| p.path()).collect();
    let experts =
        PagedExperts::new(&paths, strides, n_slots).map_err(|source| TierError::System {
            context: "opening the model file for the disk tier",
            source,
        })?;
    let mut views = Vec::new();
    for k in 0..experts.strides.len() {
        let (at, len) = experts.stack_memory(k);
        // SAFETY: the arena's memory never moves or changes size and lives in the Paging
        // behind this DiskTier, whose views are dropped first (field order).
        let view = unsafe { host.map_host(at, len as u64) }
            .map_err(dev_err("showing the disk tier's arena to the CPU device"))?;
        views.push(view);
    }
    for l in layers.iter_mut() {
        for (k, s) in l.host_stacks.iter_mut().enumerate() {
            let ne = [s.ne[0], s.ne[1], n_slots as u64, 1];
            *s = TensorRef {
                buffer: views[k].handle,
                offset: 0,
                dtype: s.dtype,
                ne,
                nb: TensorRef::contiguous_strides(s.dtype, ne).ok_or(TierError::Layout)?,
            };
        }
    }
    let paging = Arc::new(Paging { experts, sources });
    let read_ahead =
        match guesses > 0 {
            true => Some(ReadAhead::spawn(paging.clone(), guesses).map_err(|source| {
                TierError::System {
                    context: "starting the disk tier's read-ahead thread",
                    source,
                }
            })?),
            false => None,
        };
    tracing::info!(
        "host experts exceed the host budget: {n_slots} expert slots ({:.2} GiB) read from disk \
         on demand{}",
        (n_slots as u64 * slot_bytes) as f64 / (1u64 << 30) as f64,
        if read_ahead.is_some() {
            format!(", each row's {guesses} likeliest experts of the next layer read ahead")
        } else {
            String::new()
        }
    );
    Ok(DiskTier {
        read_ahead,
        _views: views,
        paging,
    })
}
