//! Reference ops on f32 rows: norms, rope, softmax, attention, routing, activations, elementwise
//! arithmetic, embedding gathers, the recurrent causal conv and delta rule, and the
//! hyper-connections' Sinkhorn and stream mixing, and DeepSeek-V4.1's Engram gate.
//!
//! Every op is a plain function over slices in ggml order: `ne0` is the contiguous dimension and a
//! "row" is `ne0` contiguous values, so hidden states are `[n_embd, n_rows]`, a query tensor is
//! `[head_dim, n_head, n_rows]`, and a layer's KV cache is `[width, cache_len, n_slots]`. Lengths are
//! checked up front and an inconsistent shape is an [`OpError`], never a panic. No op allocates:
//! each works in place or writes to a caller-owned output (copy first for an out-of-place call), so
//! all of them are safe on the decode hot path. They are single-threaded and callers split rows
//! across the [`crate::pool::Pool`] themselves, except the recurrent ops ([`conv`], [`delta_rule`]):
//! their tasks split channels or heads (and heads' value columns), which interleave in the output,
//! so they take the pool; and the stream ops of [`hyper`], which split rows over it.

pub mod activations;
pub mod attention;
pub mod attention_dense;
pub mod attention_select;
pub mod compress;
pub mod conv;
pub mod delta_rule;
pub mod elementwise;
pub mod embedding;
pub mod engram;
pub mod hadamard;
pub mod hyper;
pub mod kpool;
pub mod norms;
pub mod rope;
pub mod router;
pub mod softmax;
pub mod span_mean;

/// An op was called with shapes or parameters that do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    /// A buffer's length is not what the other arguments imply.
    #[error("{op}: `{what}` has {found} values, expected {expected}")]
    Length {
        /// The op that refused.
        op: &'static str,
        /// The argument with the wrong length.
        what: &'static str,
        /// Its length in elements.
        found: usize,
        /// The length the other arguments imply, in elements.
        expected: usize,
    },
    /// A buffer's length is not a whole number of rows.
    #[error("{op}: `{what}` has {found} values, not a multiple of the row length {row}")]
    NotWholeRows {
        /// The op that refused.
        op: &'static str,
        /// The argument with the wrong length.
        what: &'static str,
        /// Its length in elements.
        found: usize,
        /// The row length in elements.
        row: usize,
    },
    /// A parameter is outside the range the op supports.
    #[error("{op}: {what}")]
    Parameter {
        /// The op that refused.
        op: &'static str,
        /// What is wrong, with the numbers.
        what: String,
    },
    /// An index (token id, slot, position) points outside the table it indexes.
    #[error("{op}: {what} {index} is out of range 0..{bound}")]
    Index {
        /// The op that refused.
        op: &'static str,
        /// What kind of index it is.
        what: &'static str,
        /// The index found.
        index: i64,
        /// The exclusive upper bound.
        bound: usize,
    },
}

/// `Ok(())` when `found == expected`, else [`OpError::Length`].
pub(crate) fn check_len(
    op: &'static str,
    what: &'static str,
    found: usize,
    expected: usize,
) -> Result<(), OpError> {
    if found == expected {
        Ok(())
    } else {
        Err(OpError::Length {
            op,
            what,
            found,
            expected,
        })
    }
}

/// The number of rows of length `row` in `found` values, or an error when `row` is zero or does
/// not divide `found`.
pub(crate) fn whole_rows(
    op: &'static str,
    what: &'static str,
    found: usize,
    row: usize,
) -> Result<usize, OpError> {
    if row == 0 {
        return Err(OpError::Parameter {
            op,
            what: format!("row length of `{what}` is zero"),
        });
    }
    if !found.is_multiple_of(row) {
        return Err(OpError::NotWholeRows {
            op,
            what,
            found,
            row,
        });
    }
    Ok(found / row)
}

/// `a * b` for shape arithmetic, or an error when it overflows `usize`.
pub(crate) fn mul_dims(op: &'static str, a: usize, b: usize) -> Result<usize, OpError> {
    a.checked_mul(b).ok_or_else(|| OpError::Parameter {
        op,
        what: format!("shape {a} x {b} overflows usize"),
    })
}

/// `true` when `x` is greater than zero (and so not NaN).
#[inline]
pub(crate) fn positive(x: f32) -> bool {
    x > 0.0
}

/// Logistic sigmoid `1 / (1 + e^-x)`, written so that neither branch overflows.
#[inline]
pub(crate) fn sigmoid_f32(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// A mutable slice (f32 unless named) handed to the tasks of one parallel loop, each of which
/// writes only its own elements (the recurrent ops split channels or heads, which interleave in
/// memory).
pub(crate) struct SharedMut<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: the wrapper is a `&mut [T]` split between threads; `SharedMut::part` requires that the
// parts in use at one time are disjoint, so no element is reached from two threads at once.
unsafe impl<T: Send> Send for SharedMut<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    /// Shares `s` for the duration of the borrow.
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Elements `start..start + len` (bounds checked: out of range panics).
    ///
    /// # Safety
    ///
    /// While the returned slice lives, no other slice obtained from this wrapper (on any thread)
    /// may overlap it.
    #[allow(clippy::mut_from_ref)] // unsafe: the contract keeps parts disjoint
    pub(crate) unsafe fn part(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "part {start}+{len} of {}",
            self.len
        );
        // SAFETY: in bounds (checked above) of a slice borrowed mutably for 'a; the caller
        // guarantees no overlapping part is alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
