//! Writer → reader round trips: every value type, versions 2 and 3, alignments 32 and 64, split
//! files, and the writer's refusals.

mod common;

use bloomery_gguf::{
    parse, write_split, Array, GgufError, GgufFile, GgufModel, GgufWriter, SplitLimits, Value,
    MAX_ARRAY_DEPTH,
};
use bloomery_plugin_api::DType;
use common::*;
use std::io::Write;

#[test]
fn every_value_type_round_trips_in_v2_and_v3_at_alignments_32_and_64() {
    let dir = tempfile::tempdir().unwrap();
    for version in [2, 3] {
        for alignment in [None, Some(64)] {
            let w = sample_writer(version, alignment);
            let path = dir.path().join(format!("v{version}-{alignment:?}.gguf"));
            let len = w.write_file(&path, fill).unwrap();
            assert_eq!(len, w.file_len());
            let f = GgufFile::open(&path).unwrap();
            let h = f.header();
            assert_eq!(h.version, version);
            assert_eq!(h.alignment, alignment.map_or(32, u64::from));
            assert_eq!(h.file_len, len);
            assert_eq!(h.data_offset, w.data_offset());
            let mut expected = all_values();
            if let Some(a) = alignment {
                expected.insert(0, ("general.alignment", Value::U32(a)));
            }
            let got: Vec<_> = h
                .metadata
                .entries()
                .iter()
                .map(|e| (e.key.as_str(), e.value.clone()))
                .collect();
            assert_eq!(got, expected);
            assert_eq!(h.tensors.len(), 5);
            for (t, wt) in h.tensors.iter().zip(w.tensors()) {
                assert_eq!(
                    (&t.name, &t.shape, t.dtype, t.offset, t.start, t.size),
                    (&wt.name, &wt.shape, wt.dtype, wt.offset, wt.start, wt.size)
                );
                assert_eq!(t.start % h.alignment, 0);
                assert_eq!(f.tensor_data(t).unwrap(), tensor_bytes(t).as_slice());
            }
            assert_eq!(f.data("q4k.weight").unwrap().len(), 288);
            // The pure parser over the same bytes agrees with the mapped file.
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(parse(&bytes, "x").unwrap().tensors, h.tensors);
        }
    }
}

#[test]
fn split_files_round_trip_from_any_part() {
    let dir = tempfile::tempdir().unwrap();
    let w = sample_writer(3, Some(64));
    let prefix = dir.path().join("model");
    let limits = SplitLimits {
        max_tensors: Some(2),
        max_bytes: None,
    };
    let paths = write_split(&w, &prefix, limits, fill).unwrap();
    assert_eq!(paths.len(), 3);
    assert!(paths[2].ends_with("model-00003-of-00003.gguf"));
    for p in &paths {
        let m = GgufModel::open(p).unwrap();
        assert_eq!(m.parts().len(), 3);
        assert_eq!(m.tensors().len(), 5);
        let parts: Vec<_> = m.tensors().iter().map(|t| t.part).collect();
        assert_eq!(parts, [0, 0, 1, 1, 2]);
        for t in m.tensors() {
            assert_eq!(m.tensor_data(t).unwrap(), tensor_bytes(&t.info).as_slice());
            assert_eq!(t.info.start % 64, 0);
        }
        assert_eq!(m.metadata().get_str("t.str").unwrap(), "héllo ✓");
        assert_eq!(m.metadata().get_uint("split.count").unwrap(), 3);
        assert_eq!(
            m.parts()[2]
                .metadata()
                .get_u32("general.alignment")
                .unwrap(),
            64
        );
    }
    // A byte limit: each Q4_K/F32 tensor pads to 64 bytes or more; 320 bytes per part.
    let limits = SplitLimits {
        max_tensors: None,
        max_bytes: Some(320),
    };
    let paths = write_split(&w, &dir.path().join("b"), limits, fill).unwrap();
    let m = GgufModel::open(&paths[0]).unwrap();
    assert_eq!(m.tensors().len(), 5);
    for part in m.parts() {
        let data: u64 = part
            .tensors()
            .iter()
            .map(|t| t.size.div_ceil(64) * 64)
            .sum();
        assert!(data <= 320 || part.tensors().len() == 1, "{data}");
    }
}

#[test]
fn missing_and_inconsistent_split_parts_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let w = sample_writer(3, None);
    let prefix = dir.path().join("m");
    let limits = SplitLimits {
        max_tensors: Some(2),
        max_bytes: None,
    };
    let paths = write_split(&w, &prefix, limits, fill).unwrap();
    std::fs::remove_file(&paths[1]).unwrap();
    let e = GgufModel::open(&paths[0]).unwrap_err();
    match &e {
        GgufError::MissingSplitPart {
            file,
            part: 2,
            count: 3,
            ..
        } => assert!(file.ends_with("m-00002-of-00003.gguf")),
        other => panic!("{other}"),
    }
    // Part 2 replaced by a file claiming to be part 3.
    let mut bad = GgufWriter::new();
    bad.set("split.no", Value::U16(2)).unwrap();
    bad.set("split.count", Value::U16(3)).unwrap();
    bad.set("split.tensors.count", Value::I32(5)).unwrap();
    bad.write_file(&paths[1], fill).unwrap();
    let e = GgufModel::open(&paths[0]).unwrap_err();
    assert!(
        matches!(&e, GgufError::SplitMismatch { key: "split.no", expected: 1, found: 2, offset, file } if *offset > 0 && file.ends_with("m-00002-of-00003.gguf")),
        "{e}"
    );
    // A part renamed to a plain name claims 3 parts but is opened alone.
    let lone = dir.path().join("renamed.gguf");
    std::fs::copy(&paths[0], &lone).unwrap();
    let e = GgufModel::open(&lone).unwrap_err();
    assert!(
        matches!(
            &e,
            GgufError::SplitMismatch {
                key: "split.count",
                expected: 1,
                found: 3,
                ..
            }
        ),
        "{e}"
    );
    // A split-named part with no split keys at all.
    GgufWriter::new().write_file(&paths[1], fill).unwrap();
    let e = GgufModel::open(&paths[2]).unwrap_err();
    assert!(
        matches!(&e, GgufError::MissingKey { key, .. } if key == "split.count"),
        "{e}"
    );
}

#[test]
fn an_unsplit_file_opens_as_a_one_part_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.gguf");
    sample_writer(3, None).write_file(&path, fill).unwrap();
    let m = GgufModel::open(&path).unwrap();
    assert_eq!(m.parts().len(), 1);
    assert_eq!(m.tensor("i32.ids").unwrap().part, 0);
    assert_eq!(m.data("i32.ids").unwrap().len(), 20);
}

#[test]
fn arrays_nest_up_to_the_reader_limit_and_no_deeper() {
    let nest = |levels: usize| {
        let mut a = Array::U8(vec![1]);
        for _ in 1..levels {
            a = Array::Array(vec![a]);
        }
        Value::Array(a)
    };
    let mut w = GgufWriter::new();
    w.set("deep", nest(MAX_ARRAY_DEPTH)).unwrap();
    let e = w.set("too.deep", nest(MAX_ARRAY_DEPTH + 1)).unwrap_err();
    assert!(matches!(e, GgufError::ArrayTooDeep { .. }), "{e}");
    let bytes = common::sample_bytes(&w);
    assert_eq!(
        parse(&bytes, "d").unwrap().metadata.get("deep"),
        Some(&nest(MAX_ARRAY_DEPTH))
    );
}

#[test]
fn opening_a_missing_or_empty_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let e = GgufFile::open(&missing).unwrap_err();
    assert!(
        matches!(&e, GgufError::Io { file, .. } if file.ends_with("nope.gguf")),
        "{e}"
    );
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = GgufFile::open(&empty).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                offset: 0,
                what: "magic",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn the_writer_refuses_wrong_data_sizes_and_bad_tensors() {
    let mut w = GgufWriter::new();
    w.add_tensor("a", DType::F32, &[4]).unwrap();
    let short = w.write_to(Vec::new(), "o.gguf", |_, s| s.write_all(&[0; 15]));
    assert!(matches!(
        short,
        Err(GgufError::TensorDataSize {
            expected: 16,
            written: 15,
            ..
        })
    ));
    let long = w.write_to(Vec::new(), "o.gguf", |_, s| s.write_all(&[0; 17]));
    assert!(matches!(
        long,
        Err(GgufError::TensorDataSize {
            expected: 16,
            written: 17,
            ..
        })
    ));
    assert!(matches!(
        w.add_tensor("a", DType::F32, &[4]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    assert!(matches!(
        w.add_tensor("b", DType::Q4_K, &[100]),
        Err(GgufError::PartialBlock { .. })
    ));
    assert!(matches!(
        w.add_tensor("c", DType(4), &[1]),
        Err(GgufError::UnknownTensorType { .. })
    ));
    assert!(matches!(
        w.add_tensor("d", DType::F32, &[1, 0]),
        Err(GgufError::BadShape { .. })
    ));
    assert!(matches!(
        w.add_tensor("e", DType::F32, &[1; 5]),
        Err(GgufError::BadDimCount { .. })
    ));
    assert!(matches!(
        w.set_alignment(48),
        Err(GgufError::BadAlignment { .. })
    ));
    assert!(matches!(
        GgufWriter::with_version(1),
        Err(GgufError::Invalid { .. })
    ));
}
