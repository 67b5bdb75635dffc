//! Behaviour of the worker pool: every index exactly once (in a row, under contention, nested, with
//! one thread), parked workers waking, panics re-raised, pinning.

use bloomery_kernels_cpu::pool::{Pinning, Pool, PoolError, PoolOptions};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Mutex;
use std::time::Duration;

fn counts(n: usize) -> Vec<AtomicU32> {
    (0..n).map(|_| AtomicU32::new(0)).collect()
}

fn assert_once(c: &[AtomicU32]) {
    for (i, c) in c.iter().enumerate() {
        assert_eq!(c.load(SeqCst), 1, "index {i}");
    }
}

#[test]
fn every_index_exactly_once_over_many_calls_in_a_row() {
    // more threads than this machine's cores, so workers are preempted mid-job
    let pool = Pool::with_threads(6).unwrap();
    assert_eq!(pool.threads(), 6);
    for round in 0..300 {
        let n = [0, 1, 2, 3, 7, 64, 1000][round % 7];
        let c = counts(n);
        pool.parallel_for(n, |i| {
            c[i].fetch_add(1, SeqCst);
        });
        assert_once(&c);
    }
}

#[test]
fn one_thread_runs_inline() {
    let pool = Pool::with_threads(1).unwrap();
    assert_eq!(pool.threads(), 1);
    let c = counts(37);
    let caller = std::thread::current().id();
    pool.parallel_for(37, |i| {
        assert_eq!(std::thread::current().id(), caller);
        c[i].fetch_add(1, SeqCst);
    });
    assert_once(&c);
    assert!(matches!(Pool::with_threads(0), Err(PoolError::NoThreads)));
}

#[test]
fn concurrent_and_nested_callers_each_get_every_index_once() {
    let pool = Pool::with_threads(3).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let pool = &pool;
            s.spawn(move || {
                for round in 0..50 {
                    let n = 10 + (t * 7 + round) % 50;
                    let c = counts(n);
                    pool.parallel_for(n, |i| {
                        c[i].fetch_add(1, SeqCst);
                    });
                    assert_once(&c);
                }
            });
        }
    });
    let c = counts(8 * 5);
    pool.parallel_for(8, |i| {
        pool.parallel_for(5, |j| {
            c[i * 5 + j].fetch_add(1, SeqCst);
        })
    });
    assert_once(&c);
}

#[test]
fn parked_workers_wake_and_tasks_really_spread() {
    let pool = Pool::new(PoolOptions {
        spin: Duration::from_micros(1),
        ..PoolOptions::new(3)
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(20)); // let every worker park
    let threads = Mutex::new(Vec::new());
    let c = counts(64);
    pool.parallel_for(64, |i| {
        c[i].fetch_add(1, SeqCst);
        std::thread::sleep(Duration::from_millis(1));
        let mut t = threads.lock().unwrap();
        let id = std::thread::current().id();
        if !t.contains(&id) {
            t.push(id);
        }
    });
    assert_once(&c);
    assert!(
        threads.lock().unwrap().len() >= 2,
        "tasks ran on one thread only"
    );
}

#[test]
fn a_panicking_task_is_reraised_and_the_pool_survives() {
    let pool = Pool::with_threads(4).unwrap();
    for bad in [0, 63] {
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.parallel_for(64, |i| {
                std::thread::sleep(Duration::from_micros(50));
                assert!(i != bad, "task {i} fails");
            })
        }));
        assert!(r.is_err());
        let c = counts(100);
        pool.parallel_for(100, |i| {
            c[i].fetch_add(1, SeqCst);
        });
        assert_once(&c);
    }
}

#[test]
fn pinning() {
    let auto = Pool::new(PoolOptions {
        pinning: Pinning::Auto,
        ..PoolOptions::new(3)
    })
    .unwrap();
    let c = counts(50);
    auto.parallel_for(50, |i| {
        c[i].fetch_add(1, SeqCst);
    });
    assert_once(&c);
    let few = Pool::new(PoolOptions {
        pinning: Pinning::Cores(vec![0]),
        ..PoolOptions::new(3)
    });
    assert!(matches!(
        few,
        Err(PoolError::TooFewCores {
            given: 1,
            workers: 2
        })
    ));
    if cfg!(target_os = "linux") {
        let bad = Pool::new(PoolOptions {
            pinning: Pinning::Cores(vec![1 << 20]),
            ..PoolOptions::new(2)
        });
        assert!(matches!(bad, Err(PoolError::Pin { .. })));
    }
}
