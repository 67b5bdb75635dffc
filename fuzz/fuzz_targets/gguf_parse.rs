//! Fuzz target: the pure GGUF parser over arbitrary bytes. It must never panic, and a header it
//! accepts must have every tensor range aligned, inside the input and disjoint from the others.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(h) = bloomery_gguf::parse(data, "fuzz.gguf") else {
        return;
    };
    let mut ranges: Vec<_> = h.tensors.iter().map(|t| t.range()).collect();
    for r in &ranges {
        assert!(r.start >= h.data_offset && r.end <= data.len() as u64 && r.start < r.end);
        assert!(r.start % h.alignment == 0);
    }
    ranges.sort_by_key(|r| r.start);
    assert!(ranges.windows(2).all(|w| w[0].end <= w[1].start));
});
