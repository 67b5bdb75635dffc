//! `Pool::parallel_for` allocates nothing per call, on the caller or on the workers: a counting global
//! allocator sees no allocation over many calls once the pool is started. (One test in its own
//! binary, so no other test's allocations are counted.)

mod alloc_common;

use bloomery_kernels_cpu::pool::{Pool, PoolOptions};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

#[test]
fn parallel_for_does_not_allocate() {
    let pool = Pool::new(PoolOptions {
        spin: Duration::from_micros(20),
        ..PoolOptions::new(4)
    })
    .expect("pool starts");
    let data: Vec<AtomicUsize> = (0..256).map(|_| AtomicUsize::new(0)).collect();
    // warm up: threads started, parked and woken at least once
    for _ in 0..10 {
        pool.parallel_for(256, |i| {
            data[i].fetch_add(1, SeqCst);
        });
    }
    std::thread::sleep(Duration::from_millis(10));
    let before = alloc_common::allocations();
    for round in 0..500 {
        let n = 1 + round % 256;
        pool.parallel_for(n, |i| {
            data[i].fetch_add(1, SeqCst);
        });
        if round % 100 == 0 {
            std::thread::sleep(Duration::from_millis(1)); // the park/wake path too
        }
    }
    let after = alloc_common::allocations();
    assert_eq!(after - before, 0, "parallel_for allocated");
    let total: usize = data.iter().map(|d| d.load(SeqCst)).sum();
    assert_eq!(
        total,
        10 * 256 + (0..500).map(|r| 1 + r % 256).sum::<usize>()
    );
}
