//! A pinned worker pool for data-parallel kernels: threads started once (each optionally pinned to
//! a core with `sched_setaffinity` on Linux; pinning is a no-op elsewhere) and a blocking
//! [`Pool::parallel_for`] cheap enough to call hundreds of times per decode step.
//!
//! Protocol: the caller publishes a job (a borrowed closure, a task count, a shared claim counter)
//! by bumping a generation word with its "open" bit set, wakes parked workers if any, and then
//! claims tasks itself. A worker joins by registering in `active` and re-checking that the same
//! generation is still open; it then claims task indices until none are left. When the caller runs
//! out of tasks it closes the generation and waits for `active` to reach zero, so no worker can
//! touch the borrowed closure after `parallel_for` returns. Idle workers spin for
//! [`PoolOptions::spin`] and then park on a condition variable. A call allocates nothing.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why a pool could not start, or a thread could not be pinned.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// `threads` was zero.
    #[error("a pool needs at least one thread (the caller), got 0")]
    NoThreads,
    /// [`Pinning::Cores`] lists fewer cores than there are worker threads.
    #[error("pinning lists {given} cores for {workers} worker threads")]
    TooFewCores {
        /// Cores listed.
        given: usize,
        /// Worker threads to pin (`threads - 1`).
        workers: usize,
    },
    /// `sched_setaffinity` refused.
    #[error("pinning a thread to core {core} failed: {reason}")]
    Pin {
        /// The core asked for.
        core: usize,
        /// The OS error.
        reason: String,
    },
    /// The OS would not start a thread.
    #[error("starting worker thread {worker} failed: {source}")]
    Spawn {
        /// Index of the worker (0-based).
        worker: usize,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Where the worker threads run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinning {
    /// Leave placement to the OS.
    None,
    /// Worker `i` (0-based) is pinned to `cores[i]`; the caller is not pinned (see
    /// [`pin_current_thread`]).
    Cores(Vec<usize>),
    /// Worker `i` is pinned to the `(i + 1)`-th core this process may run on (wrapping), leaving the
    /// first for the calling thread. No pinning outside Linux.
    Auto,
}

/// How to build a [`Pool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOptions {
    /// Threads that run tasks, the calling thread included: `threads - 1` workers are started.
    pub threads: usize,
    /// Placement of the workers.
    pub pinning: Pinning,
    /// How long an idle worker spins before parking.
    pub spin: Duration,
}

impl PoolOptions {
    /// `threads` threads (caller included), no pinning, 50 µs spin.
    pub fn new(threads: usize) -> Self {
        Self {
            threads,
            pinning: Pinning::None,
            spin: Duration::from_micros(50),
        }
    }
}

type Task = dyn Fn(usize) + Sync;

/// The generation word's "open" bit: a job is published and may be joined.
const OPEN: u64 = 1;

struct Shared {
    /// `generation << 1 | OPEN`.
    state: AtomicU64,
    /// The current job's closure, lifetime erased. Written only by the caller holding `call`
    /// while the state is closed and `active` is zero; read only by a worker that registered in
    /// `active` and then saw the state still open with the job's generation.
    job: UnsafeCell<Option<*const Task>>,
    n_tasks: AtomicUsize,
    next: AtomicUsize,
    active: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    spin: Duration,
}

// SAFETY: every field but `job` is Sync; `job` is accessed only under the protocol documented on
// it, which orders the caller's write before any worker's read (SeqCst store/load of `state`) and
// every read before the next write (the caller waits for `active == 0`). The closure it points to
// is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads running [`Pool::parallel_for`] jobs; dropping it stops and joins
/// them.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held for the duration of a parallel call; a second caller (or a nested call) that finds it
    /// taken runs its tasks serially instead of waiting.
    call: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl Pool {
    /// Starts `options.threads - 1` workers, pinned as asked. Fails if a thread cannot start or be
    /// pinned (the started ones are stopped).
    pub fn new(options: PoolOptions) -> Result<Pool, PoolError> {
        let n_workers = options.threads.checked_sub(1).ok_or(PoolError::NoThreads)?;
        let cores: Vec<Option<usize>> = match &options.pinning {
            Pinning::None => vec![None; n_workers],
            Pinning::Cores(c) if c.len() < n_workers => {
                return Err(PoolError::TooFewCores {
                    given: c.len(),
                    workers: n_workers,
                })
            }
            Pinning::Cores(c) => c.iter().take(n_workers).map(|&c| Some(c)).collect(),
            Pinning::Auto => {
                let allowed = allowed_cores();
                (0..n_workers)
                    .map(|i| (!allowed.is_empty()).then(|| allowed[(i + 1) % allowed.len()]))
                    .collect()
            }
        };
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            spin: options.spin,
        });
        let mut pool = Pool {
            shared,
            workers: Vec::with_capacity(n_workers),
            call: Mutex::new(()),
        };
        let (tx, rx) = mpsc::channel();
        for (worker, core) in cores.into_iter().enumerate() {
            let (shared, tx) = (Arc::clone(&pool.shared), tx.clone());
            let handle = std::thread::Builder::new()
                .name(format!("bloomery-pool-{worker}"))
                .spawn(move || {
                    let pinned = core.map_or(Ok(()), pin_current_thread);
                    // The receiver lives until every worker has reported; a failed send only
                    // means `new` already returned an error.
                    let _ = tx.send(pinned);
                    drop(tx);
                    worker_loop(&shared);
                })
                .map_err(|source| PoolError::Spawn { worker, source })?;
            pool.workers.push(handle);
        }
        drop(tx);
        // One report per worker; the iterator ends once every worker has sent and dropped its sender.
        for pinned in rx.iter() {
            pinned?;
        }
        Ok(pool)
    }

    /// A pool of `threads` threads (the caller included), unpinned.
    pub fn with_threads(threads: usize) -> Result<Pool, PoolError> {
        Pool::new(PoolOptions::new(threads))
    }

    /// Threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every `i` in `0..n_tasks`, each exactly once, spread over the workers and
    /// the calling thread, and returns when all have finished. Tasks may run in any order and
    /// concurrently. If this pool is already running a job (a call from another thread, or from
    /// inside a task) the tasks run serially on the calling thread. A panicking task is re-raised
    /// here after every other task has finished. No allocation.
    pub fn parallel_for<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if n_tasks == 0 {
            return;
        }
        let guard = match self.call.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if guard.is_none() || self.workers.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let sh = &*self.shared;
        let f: &(dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: only the lifetime bound of the trait object is changed. The pointer is published
        // below and cleared before this function returns, after every worker that could have
        // read it has left the job (`active == 0` once the generation is closed).
        let erased: *const Task =
            unsafe { std::mem::transmute(f as *const (dyn Fn(usize) + Sync + '_)) };
        // SAFETY: we hold `call`, the state is closed and the previous call waited for
        // `active == 0`, so no worker reads `job` now (see `Shared::job`).
        unsafe { *sh.job.get() = Some(erased) };
        sh.n_tasks.store(n_tasks, SeqCst);
        sh.next.store(0, SeqCst);
        let generation = (sh.state.load(SeqCst) >> 1) + 1;
        sh.state.store(generation << 1 | OPEN, SeqCst);
        if sh.sleepers.load(SeqCst) > 0 {
            let _lock = sh.lock.lock().unwrap_or_else(PoisonError::into_inner);
            sh.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| claim_tasks(sh, f)));
        sh.state.store(generation << 1, SeqCst);
        let mut spins = 0u32;
        while sh.active.load(SeqCst) != 0 {
            spins = spins.saturating_add(1);
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: closed and `active == 0`: no worker reads `job` (see `Shared::job`).
        unsafe { *sh.job.get() = None };
        drop(guard);
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        if sh.panicked.swap(false, SeqCst) {
            panic!("a task run by Pool::parallel_for panicked on a worker thread");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _lock = self
                .shared
                .lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            // A worker catches task panics, so join only fails if the runtime itself failed.
            let _ = w.join();
        }
    }
}

/// Claims and runs task indices until none are left.
fn claim_tasks(sh: &Shared, f: &(dyn Fn(usize) + Sync + '_)) {
    let n = sh.n_tasks.load(SeqCst);
    loop {
        let i = sh.next.fetch_add(1, SeqCst);
        if i >= n {
            return;
        }
        f(i);
    }
}

fn worker_loop(sh: &Shared) {
    let mut seen = 0u64;
    while let Some(state) = wait_for_job(sh, seen) {
        seen = state >> 1;
        sh.active.fetch_add(1, SeqCst);
        if sh.state.load(SeqCst) == state {
            // SAFETY: we are registered in `active` and the job's generation is still open, so
            // the caller has not closed it and will not clear `job` (or return, ending the
            // closure's borrow) before we deregister.
            let job = unsafe { *sh.job.get() };
            if let Some(ptr) = job {
                // SAFETY: as above, the closure outlives our use of it.
                let f = unsafe { &*ptr };
                if catch_unwind(AssertUnwindSafe(|| claim_tasks(sh, f))).is_err() {
                    sh.panicked.store(true, SeqCst);
                }
            }
        }
        sh.active.fetch_sub(1, SeqCst);
    }
}

/// Waits for an open job of a generation other than `seen`: spins for `sh.spin`, then parks.
/// `None` on shutdown.
fn wait_for_job(sh: &Shared, seen: u64) -> Option<u64> {
    let fresh = |s: u64| s & OPEN == OPEN && s >> 1 != seen;
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        if sh.shutdown.load(SeqCst) {
            return None;
        }
        let s = sh.state.load(SeqCst);
        if fresh(s) {
            return Some(s);
        }
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) && start.elapsed() >= sh.spin {
            break;
        }
        std::hint::spin_loop();
    }
    let mut lock = sh.lock.lock().unwrap_or_else(PoisonError::into_inner);
    sh.sleepers.fetch_add(1, SeqCst);
    let result = loop {
        if sh.shutdown.load(SeqCst) {
            break None;
        }
        let s = sh.state.load(SeqCst);
        if fresh(s) {
            break Some(s);
        }
        lock = sh.wake.wait(lock).unwrap_or_else(PoisonError::into_inner);
    };
    sh.sleepers.fetch_sub(1, SeqCst);
    result
}

/// Pins the calling thread to `core` (Linux `sched_setaffinity`; a no-op returning `Ok` elsewhere).
pub fn pin_current_thread(core: usize) -> Result<(), PoolError> {
    imp::pin(core).map_err(|reason| PoolError::Pin { core, reason })
}

/// The cores this process may run on, ascending (empty where unknown).
fn allowed_cores() -> Vec<usize> {
    imp::allowed()
}

#[cfg(target_os = "linux")]
mod imp {
    use std::mem::{size_of, zeroed};

    const SET_SIZE: usize = libc::CPU_SETSIZE as usize;

    pub(super) fn pin(core: usize) -> Result<(), String> {
        if core >= SET_SIZE {
            return Err(format!("core {core} is beyond CPU_SETSIZE {SET_SIZE}"));
        }
        // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
        let mut set: libc::cpu_set_t = unsafe { zeroed() };
        // SAFETY: `core < CPU_SETSIZE`, checked above, so the bit is inside the set.
        unsafe { libc::CPU_SET(core, &mut set) };
        // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().to_string())
        }
    }

    pub(super) fn allowed() -> Vec<usize> {
        // SAFETY: as in `pin`, all zeroes is the empty set.
        let mut set: libc::cpu_set_t = unsafe { zeroed() };
        // SAFETY: pid 0 is the calling thread; `set` is writable and of the size passed.
        let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return Vec::new();
        }
        // SAFETY: `c < CPU_SETSIZE`; CPU_ISSET only reads the set.
        (0..SET_SIZE)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    pub(super) fn pin(_core: usize) -> Result<(), String> {
        Ok(())
    }

    pub(super) fn allowed() -> Vec<usize> {
        Vec::new()
    }
}

// Tests: `tests/ops_pool.rs` (behaviour) and `tests/ops_pool_alloc.rs` (no allocation per call).
