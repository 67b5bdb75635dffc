//! Mutation property test: thousands of seeded corruptions of valid files (byte flips, truncation
//! at every offset, huge values injected into every length and count field). The parser must
//! never panic, and must either name an error at an offset inside the file or return a header
//! whose every tensor range is aligned, inside the file and disjoint from the others.

mod common;

use bloomery_gguf::{parse, GgufError, Header, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// xorshift64*: a tiny seeded generator, so a failing case can be replayed from its number.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Values that stress length and count fields.
const HUGE: [u64; 10] = [
    1 << 60,
    u64::MAX,
    u64::MAX - 7,
    1 << 63,
    1 << 32,
    u32::MAX as u64,
    1 << 61,
    0x0100_0000,
    0,
    5,
];

/// Offsets of the u64 length/count fields of a valid file: counts, key and string lengths, array
/// counts, tensor name lengths, dimensions and tensor offsets; plus the u32 type fields.
fn fields(h: &Header) -> (Vec<usize>, Vec<usize>) {
    let (mut u64s, mut u32s) = (vec![8, 16], vec![4]);
    for e in h.metadata.entries() {
        let at = e.offset as usize;
        u64s.push(at);
        let value = at + 8 + e.key.len() + 4;
        u32s.push(value - 4);
        match &e.value {
            Value::String(_) => u64s.push(value),
            Value::Array(_) => {
                u32s.push(value);
                u64s.push(value + 4);
            }
            _ => {}
        }
    }
    for t in &h.tensors {
        let at = t.info_offset as usize;
        u64s.push(at);
        let dims = at + 8 + t.name.len();
        u32s.push(dims);
        u64s.extend((0..t.shape.len()).map(|i| dims + 4 + 8 * i));
        let ty = dims + 4 + 8 * t.shape.len();
        u32s.push(ty);
        u64s.push(ty + 4);
    }
    (u64s, u32s)
}

/// Parses `bytes` and checks the property; returns whether it parsed.
fn check(bytes: &[u8], case: &str) -> bool {
    let r = catch_unwind(AssertUnwindSafe(|| parse(bytes, "m.gguf")));
    let len = bytes.len() as u64;
    match r {
        Err(_) => panic!("parse panicked on {case}"),
        Ok(Err(e)) => {
            assert_eq!(e.file(), "m.gguf", "{case}");
            if let Some(off) = e.offset() {
                assert!(
                    off <= len,
                    "{case}: error offset {off} past the end {len}: {e}"
                );
            }
            assert!(!e.to_string().is_empty());
            assert!(!matches!(e, GgufError::Io { .. }), "{case}");
            false
        }
        Ok(Ok(h)) => {
            let mut ranges: Vec<_> = h.tensors.iter().map(|t| t.range()).collect();
            for (t, r) in h.tensors.iter().zip(&ranges) {
                assert!(
                    r.start >= h.data_offset && r.end <= len,
                    "{case}: {} {r:?} outside {len}",
                    t.name
                );
                assert!(
                    r.start % h.alignment == 0 && t.size > 0,
                    "{case}: {}",
                    t.name
                );
            }
            ranges.sort_by_key(|r| r.start);
            assert!(
                ranges.windows(2).all(|w| w[0].end <= w[1].start),
                "{case}: overlap"
            );
            true
        }
    }
}

fn bases() -> Vec<Vec<u8>> {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_all_types.gguf");
    vec![
        common::sample_bytes(&common::sample_writer(3, None)),
        common::sample_bytes(&common::sample_writer(2, Some(64))),
        std::fs::read(fixture).unwrap(),
    ]
}

#[test]
fn truncation_at_every_offset_is_refused_by_name() {
    for (b, base) in bases().iter().enumerate() {
        assert!(check(base, "unmutated"));
        // Only cuts at or past the last tensor's end may parse.
        let h = parse(base, "m.gguf").unwrap();
        let last_end = h.tensors.iter().map(|t| t.range().end).max().unwrap();
        for cut in 0..base.len() {
            let parsed = check(&base[..cut], &format!("base {b} cut at {cut}"));
            assert_eq!(parsed, cut as u64 >= last_end, "base {b} cut at {cut}");
        }
    }
}

#[test]
fn five_thousand_seeded_mutations_never_panic_or_escape_the_file() {
    let bases = bases();
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let (mut parsed, mut refused) = (0, 0);
    for case in 0..5000 {
        let b = case % bases.len();
        let mut bytes = bases[b].clone();
        let h = parse(&bytes, "m.gguf").unwrap();
        let (u64s, u32s) = fields(&h);
        let kind = rng.below(4);
        match kind {
            // 1 to 8 random byte flips anywhere.
            0 => {
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(bytes.len());
                    bytes[i] ^= 1 << rng.below(8);
                }
            }
            // A huge or odd value in a length/count field.
            1 => {
                let at = u64s[rng.below(u64s.len())];
                let v = HUGE[rng.below(HUGE.len())];
                bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            // A random value in a type/n_dims field.
            2 => {
                let at = u32s[rng.below(u32s.len())];
                let v = [0u32, 1, 4, 5, 9, 12, 13, 40, 99, u32::MAX][rng.below(10)];
                bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            // A field corrupted and the file cut short.
            _ => {
                let at = u64s[rng.below(u64s.len())];
                bytes[at..at + 8].copy_from_slice(&(rng.next() >> rng.below(64)).to_le_bytes());
                bytes.truncate(rng.below(bytes.len() + 1));
            }
        }
        if check(&bytes, &format!("case {case} (base {b}, kind {kind})")) {
            parsed += 1;
        } else {
            refused += 1;
        }
    }
    println!("5000 mutations: {parsed} parsed, {refused} refused by name");
    // Both outcomes must actually occur, or the mutations are not testing anything.
    assert!(
        parsed > 100 && refused > 1000,
        "parsed {parsed}, refused {refused}"
    );
}
