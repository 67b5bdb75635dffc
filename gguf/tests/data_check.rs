//! `check_tensor_data` against ggml's own `ggml_validate_row_data` (llama.cpp b11434, what
//! `--check-tensors` runs): for every type, a two-block buffer with one word set at each offset
//! of the second block must pass or fail as ggml says (`fixtures/data_check.jsonl`, made by
//! `tests/oracle/make_data_check_golden.sh`).

use bloomery_gguf::check_tensor_data;
use bloomery_plugin_api::DType;
use serde_json::Value;

/// The buffer the oracle built for `(block size, offset, word)`.
fn buffer(bs: usize, off: usize, w: u16) -> Vec<u8> {
    let [lo, hi] = w.to_le_bytes();
    let mut buf = vec![0u8; 2 * bs + 8];
    let at = bs + off;
    buf[at] = lo;
    if at + 1 < buf.len() {
        buf[at + 1] = hi;
    }
    if bs == 4 || bs == 8 {
        buf[bs..2 * bs].fill(0);
        buf[2 * bs - 2] = lo;
        buf[2 * bs - 1] = hi;
    }
    if bs == 1 {
        buf[1] = hi;
    }
    buf.truncate(2 * bs);
    buf
}

#[test]
fn every_type_is_judged_as_ggml_judges_it() {
    let text = include_str!("fixtures/data_check.jsonl");
    let (mut n, mut bad) = (0, 0);
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let dtype = DType(v["type"].as_u64().unwrap() as u32);
        let bs = v["block"].as_u64().unwrap() as usize;
        assert_eq!(
            dtype.layout().map(|l| l.bytes as usize),
            Some(bs),
            "{dtype:?}"
        );
        for c in v["cases"].as_array().unwrap() {
            let off = c[0].as_u64().unwrap() as usize;
            let w = c[1].as_u64().unwrap() as u16;
            let want = c[2].as_bool().unwrap();
            let got = check_tensor_data(dtype, &buffer(bs, off, w));
            assert_eq!(
                got.is_ok(),
                want,
                "{dtype:?} offset {off} word {w:#x}: {got:?}"
            );
            if let Err(f) = got {
                assert_eq!(f.index, 1, "{dtype:?}: the fault is in the second block");
                bad += 1;
            }
            n += 1;
        }
    }
    assert!(n > 4000 && bad > 90, "{n} cases, {bad} faults");
}
