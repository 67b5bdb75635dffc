//! A counting global allocator for the test binaries that check a path allocates nothing (each
//! such test is alone in its binary, so no other test's allocations are counted).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Allocations made by this thread (const-initialized: reading it never allocates).
    static MINE: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, SeqCst);
        MINE.with(|m| m.set(m.get() + 1));
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by the whole process so far.
#[allow(dead_code)] // each test binary uses one of the two counts
pub fn allocations() -> usize {
    ALLOCATIONS.load(SeqCst)
}

/// Allocations made by the calling thread so far: for single-threaded paths, which the test
/// harness's own threads must not disturb.
#[allow(dead_code)] // each test binary uses one of the two counts
pub fn thread_allocations() -> usize {
    MINE.with(Cell::get)
}
