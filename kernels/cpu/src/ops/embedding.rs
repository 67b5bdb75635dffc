//! Embedding gathers: rows of a table picked by i32 ids, from an f32 table or from any table through
//! a row-dequantizer callback (how the quant module serves quantized tables). No allocation.

use super::{check_len, mul_dims, whole_rows, OpError};

/// Gathers rows of `table`, `[row_len, n_table_rows]` f32, into `out`, `[row_len, ids.len()]`:
/// `out` row `i` is table row `ids[i]`. An id outside `0..n_table_rows` is [`OpError::Index`] and
/// leaves `out` partly written.
pub fn get_rows(
    table: &[f32],
    row_len: usize,
    ids: &[i32],
    out: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "get_rows";
    let n_table_rows = whole_rows(OP, "table", table.len(), row_len)?;
    get_rows_with(n_table_rows, row_len, ids, out, |r, dst| {
        dst.copy_from_slice(&table[r * row_len..(r + 1) * row_len]);
    })
}

/// Gathers `ids.len()` rows of `row_len` values (f32, or i32 for an integer table) into `out`,
/// `[row_len, ids.len()]`, by calling `dequantize_row(row_index, dst)` with a checked
/// `row_index < n_table_rows` and `dst` the `row_len`-value output row to fill. An out-of-range id
/// is [`OpError::Index`]; the callback is not called for it.
pub fn get_rows_with<T>(
    n_table_rows: usize,
    row_len: usize,
    ids: &[i32],
    out: &mut [T],
    mut dequantize_row: impl FnMut(usize, &mut [T]),
) -> Result<(), OpError> {
    const OP: &str = "get_rows";
    check_len(OP, "out", out.len(), mul_dims(OP, row_len, ids.len())?)?;
    if row_len == 0 {
        return Ok(());
    }
    for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(row_len)) {
        let r = usize::try_from(id)
            .ok()
            .filter(|&r| r < n_table_rows)
            .ok_or(OpError::Index {
                op: OP,
                what: "id",
                index: i64::from(id),
                bound: n_table_rows,
            })?;
        dequantize_row(r, dst);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_rows_and_refuses_bad_ids() {
        let row_len = 3;
        let table: Vec<f32> = (0..5 * row_len).map(|i| i as f32).collect();
        let ids = [4, 0, 2, 2, 1, 3, 0];
        let mut out = vec![0.0f32; row_len * ids.len()];
        get_rows(&table, row_len, &ids, &mut out).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            for j in 0..row_len {
                assert_eq!(out[i * row_len + j], (id as usize * row_len + j) as f32);
            }
        }
        for bad in [-1, 5] {
            let r = get_rows(&table, row_len, &[bad], &mut out[..row_len]);
            assert!(matches!(r, Err(OpError::Index { .. })), "{bad}");
        }
        assert!(matches!(
            get_rows(&table, row_len, &ids, &mut out[..3]),
            Err(OpError::Length { .. })
        ));
    }

    #[test]
    fn callback_version_serves_a_quantized_table() {
        // a fake "quantized" table: row r dequantizes to r * 0.5 + column
        let mut calls = Vec::new();
        let mut out = vec![0.0f32; 4 * 2];
        get_rows_with(10, 4, &[9, 3], &mut out, |r, dst| {
            calls.push(r);
            for (j, d) in dst.iter_mut().enumerate() {
                *d = r as f32 * 0.5 + j as f32;
            }
        })
        .unwrap();
        assert_eq!(calls, vec![9, 3]);
        assert_eq!(out, vec![4.5, 5.5, 6.5, 7.5, 1.5, 2.5, 3.5, 4.5]);
        let bad = get_rows_with(10, 4, &[10], &mut out[..4], |_, _| {
            panic!("must not be called")
        });
        assert!(matches!(bad, Err(OpError::Index { .. })));
    }
}
