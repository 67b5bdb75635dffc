//! Unit tests of the parser: one hand-built file per named error, each checking the variant and
//! the byte offset it reports.

use super::*;

/// A raw GGUF v3 byte builder.
struct B(Vec<u8>);

impl B {
    fn new(n_tensors: u64, n_kv: u64) -> B {
        let mut b = B(b"GGUF".to_vec());
        b.u32(3).u64(n_tensors).u64(n_kv);
        b
    }
    fn u32(&mut self, x: u32) -> &mut B {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(&mut self, x: u64) -> &mut B {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut B {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// A tensor info: name, dims, type, offset.
    fn ti(&mut self, name: &str, dims: &[u64], ty: u32, off: u64) -> &mut B {
        self.str(name).u32(dims.len() as u32);
        dims.iter().for_each(|&d| {
            self.u64(d);
        });
        self.u32(ty).u64(off)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> &mut B {
        while !self.0.len().is_multiple_of(32) {
            self.0.push(0);
        }
        self.0.resize(self.0.len() + n, 7);
        self
    }
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
}

fn err(b: &B) -> GgufError {
    match parse(&b.0, "t.gguf") {
        Ok(h) => panic!("parsed: {h:?}"),
        Err(e) => {
            assert_eq!(e.file(), "t.gguf");
            e
        }
    }
}

#[test]
fn a_minimal_file_parses() {
    let mut b = B::new(1, 1);
    b.str("k").u32(8).str("v").ti("w", &[4], 0, 0).data(16);
    let h = parse(&b.0, "t.gguf").unwrap();
    assert_eq!(h.data_offset, 96);
    assert_eq!(h.tensors[0].range(), 96..112);
    assert_eq!(h.metadata.get_str("k").unwrap(), "v");
}

#[test]
fn bad_magic_versions_and_byte_order_are_named() {
    let mut b = B::new(0, 0);
    b.0[0] = b'X';
    assert!(matches!(err(&b), GgufError::BadMagic { offset: 0, found, .. } if &found == b"XGUF"));
    let mut b = B::new(0, 0);
    b.0[4] = 1;
    assert!(matches!(err(&b), GgufError::Version1 { offset: 4, .. }));
    let mut b = B::new(0, 0);
    b.0[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(matches!(
        err(&b),
        GgufError::BigEndian {
            offset: 4,
            version: 3,
            ..
        }
    ));
    let mut b = B::new(0, 0);
    b.0[4] = 9;
    assert!(matches!(
        err(&b),
        GgufError::UnsupportedVersion {
            offset: 4,
            version: 9,
            ..
        }
    ));
}

#[test]
fn truncation_in_each_section_is_named_with_its_offset() {
    let mut b = B::new(1, 1);
    b.str("key").u32(4).u32(5).ti("w", &[4], 0, 0);
    let full = b.0.clone();
    // (cut, field expected to be truncated, its offset)
    let cases: &[(usize, &str, u64)] = &[
        (2, "magic", 0),
        (6, "version", 4),
        (10, "tensor count", 8),
        (20, "metadata key/value count", 16),
        (26, "metadata key", 24),
        (33, "metadata key", 32),
        (37, "value type", 35),
        (41, "metadata value", 39),
        (45, "tensor name", 43),
        (54, "tensor n_dims", 52),
        (58, "tensor dimension", 56),
        (66, "tensor type", 64),
        (74, "tensor offset", 68),
    ];
    for &(cut, what_expected, off) in cases {
        let e = err(&B(full[..cut].to_vec()));
        match e {
            GgufError::Truncated { what, offset, .. } => {
                assert_eq!((what, offset), (what_expected, off), "cut at {cut}")
            }
            // Counts are checked against the bytes left before anything is read.
            GgufError::CountTooLarge { .. } if cut >= 20 => {}
            other => panic!("cut at {cut}: {other}"),
        }
    }
    // Without data the tensor lies outside the file.
    assert!(matches!(
        err(&B(full)),
        GgufError::TensorOutOfBounds { offset: 43, .. }
    ));
}

#[test]
fn huge_counts_are_refused_before_allocating() {
    let b = B::new(1 << 60, 0);
    assert!(
        matches!(err(&b), GgufError::CountTooLarge { offset: 8, count, .. } if count == 1 << 60)
    );
    let b = B::new(0, u64::MAX);
    assert!(matches!(
        err(&b),
        GgufError::CountTooLarge { offset: 16, .. }
    ));
    let mut b = B::new(0, 1);
    b.u64(1 << 60).0.extend_from_slice(&[0; 64]);
    assert!(matches!(
        err(&b),
        GgufError::CountTooLarge {
            offset: 24,
            what: "metadata key",
            ..
        }
    ));
    let mut b = B::new(0, 1);
    b.str("a")
        .u32(9)
        .u32(8)
        .u64(1 << 60)
        .0
        .extend_from_slice(&[0; 64]);
    assert!(matches!(
        err(&b),
        GgufError::CountTooLarge {
            offset: 41,
            what: "array count",
            ..
        }
    ));
    // u64 elements: 2^61 * 8 overflows, still refused by name.
    let mut b = B::new(0, 1);
    b.str("a").u32(9).u32(10).u64(1 << 61);
    assert!(matches!(
        err(&b),
        GgufError::CountTooLarge { offset: 41, .. }
    ));
}

#[test]
fn bad_values_and_keys_are_named() {
    let mut b = B::new(0, 1);
    b.str("a").u32(13).u32(0);
    assert!(matches!(
        err(&b),
        GgufError::UnknownValueType {
            offset: 33,
            type_id: 13,
            ..
        }
    ));
    let mut b = B::new(0, 1);
    b.str("a").u32(9).u32(99).u64(0);
    assert!(matches!(
        err(&b),
        GgufError::UnknownValueType {
            offset: 37,
            type_id: 99,
            ..
        }
    ));
    let mut b = B::new(0, 1);
    b.u64(2).0.extend_from_slice(&[0xff, 0xfe]);
    b.u32(0).0.push(0);
    assert!(matches!(err(&b), GgufError::InvalidUtf8 { offset: 32, .. }));
    let mut b = B::new(0, 2);
    b.str("a").u32(0).0.push(1);
    b.str("a").u32(0).0.push(2);
    assert!(matches!(
        err(&b),
        GgufError::DuplicateKey { offset: 38, .. }
    ));
    // Arrays of arrays nested past the limit.
    let mut b = B::new(0, 1);
    b.str("a").u32(9);
    for _ in 0..MAX_ARRAY_DEPTH + 2 {
        b.u32(9).u64(1);
    }
    b.0.extend_from_slice(&[0; 32]);
    assert!(matches!(err(&b), GgufError::ArrayTooDeep { .. }));
}

#[test]
fn bad_alignment_is_named() {
    for (ty, payload) in [(4u32, 0u32), (4, 48), (5, 64)] {
        let mut b = B::new(0, 1);
        b.str("general.alignment").u32(ty).u32(payload);
        assert!(
            matches!(err(&b), GgufError::BadAlignment { offset: 24, .. }),
            "{ty} {payload}"
        );
    }
    let mut b = B::new(0, 1);
    b.str("general.alignment").u32(4).u32(64);
    assert_eq!(parse(&b.0, "t").unwrap().alignment, 64);
}

#[test]
fn bad_tensor_infos_are_named() {
    let mut b = B::new(1, 0);
    b.ti("w", &[4], 4, 0).data(32);
    assert!(matches!(
        err(&b),
        GgufError::UnknownTensorType {
            offset: 45,
            dtype: DType(4),
            ..
        }
    ));
    let mut b = B::new(1, 0);
    b.ti("w", &[1, 1, 1, 1, 1], 0, 0).data(32);
    assert!(matches!(
        err(&b),
        GgufError::BadDimCount {
            offset: 33,
            n_dims: 5,
            ..
        }
    ));
    let mut b = B::new(1, 0);
    b.ti("w", &[], 0, 0).data(32);
    assert!(matches!(err(&b), GgufError::BadDimCount { n_dims: 0, .. }));
    let mut b = B::new(1, 0);
    b.ti("w", &[4, 0], 0, 0).data(32);
    assert!(matches!(err(&b), GgufError::BadShape { offset: 24, .. }));
    let mut b = B::new(1, 0);
    b.ti("w", &[1 << 32, 1 << 32], 0, 0).data(32);
    assert!(matches!(
        err(&b),
        GgufError::BadShape {
            why: "element count overflows",
            ..
        }
    ));
    let mut b = B::new(1, 0);
    b.ti("w", &[1 << 62], 0, 0).data(32);
    assert!(matches!(
        err(&b),
        GgufError::BadShape {
            why: "row size overflows",
            ..
        }
    ));
    let mut b = B::new(1, 0);
    b.ti("w", &[100], 12, 0).data(32);
    assert!(matches!(
        err(&b),
        GgufError::PartialBlock {
            offset: 24,
            ne0: 100,
            block: 256,
            ..
        }
    ));
}

#[test]
fn bad_tensor_placement_is_named() {
    let mut b = B::new(1, 0);
    b.ti("w", &[4], 0, 8).data(64);
    assert!(matches!(
        err(&b),
        GgufError::MisalignedTensor {
            offset: 24,
            data_offset: 8,
            alignment: 32,
            ..
        }
    ));
    let mut b = B::new(1, 0);
    b.ti("w", &[4], 0, 0).data(15);
    let len = b.len();
    assert!(
        matches!(err(&b), GgufError::TensorOutOfBounds { offset: 24, file_len, .. } if file_len == len)
    );
    let mut b = B::new(1, 0);
    b.ti("w", &[4], 0, u64::MAX - 31).data(64);
    assert!(matches!(
        err(&b),
        GgufError::TensorOutOfBounds { end: u64::MAX, .. }
    ));
    let mut b = B::new(2, 0);
    b.ti("a", &[16], 0, 0).ti("b", &[4], 0, 32).data(128);
    assert!(
        matches!(err(&b), GgufError::OverlappingTensors { offset: 57, ref tensor, ref other, .. } if tensor == "b" && other == "a")
    );
    let mut b = B::new(2, 0);
    b.ti("a", &[4], 0, 0).ti("a", &[4], 0, 32).data(128);
    assert!(matches!(
        err(&b),
        GgufError::DuplicateTensor { offset: 57, .. }
    ));
    // The same two tensors side by side are fine.
    let mut b = B::new(2, 0);
    b.ti("a", &[8], 0, 0).ti("b", &[4], 0, 32).data(48);
    assert_eq!(parse(&b.0, "t").unwrap().tensors[1].range(), 128..144);
}

#[test]
fn parse_prefix_checks_ranges_against_the_file_length() {
    let mut b = B::new(1, 0);
    b.ti("w", &[4], 0, 0);
    assert!(parse_prefix(&b.0, 80, "t").is_ok());
    assert!(matches!(
        parse_prefix(&b.0, 79, "t"),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
}
