//! Which later calls of a pass read the results a fused kernel leaves unwritten. Byte ranges are
//! followed, not tensors: the memory planner places later tensors over dead ones, so a later
//! write can stop part of a result being live.

use bloomery_plugin_api::tensor::{OpCall, TensorRef};

/// Whether a call of `later` (the rest of the pass, in order) reads memory of `t` before other
/// calls have overwritten all of it. Byte ranges within `t`'s buffer are followed: a later
/// tensor that the planner placed over part of `t` stops that part being `t`'s once written.
pub(super) fn read_later(t: &TensorRef, later: &[OpCall]) -> bool {
    let Some(len) = t.span_bytes() else {
        return true;
    };
    let mut live = vec![(t.offset, t.offset + len)];
    for c in later {
        let meets = |u: &TensorRef| {
            u.buffer == t.buffer
                && u.span_bytes()
                    .is_none_or(|n| live.iter().any(|&(s, e)| u.offset < e && s < u.offset + n))
        };
        if c.srcs().iter().any(meets) {
            return true;
        }
        if c.dst.buffer == t.buffer {
            let Some(n) = c.dst.span_bytes() else {
                return true;
            };
            let (ws, we) = (c.dst.offset, c.dst.offset + n);
            live = live
                .into_iter()
                .flat_map(|(s, e)| [(s, e.min(ws)), (s.max(we), e)])
                .filter(|(s, e)| s < e)
                .collect();
            if live.is_empty() {
                return false;
            }
        }
    }
    false
}

/// A byte range of one buffer: buffer, start, end.
type Range = (u64, u64, u64);

/// The bytes of `t` (`None` without a layout).
fn range(t: &TensorRef) -> Option<Range> {
    t.span_bytes().map(|n| (t.buffer, t.offset, t.offset + n))
}

/// `live` less the bytes of `w`.
fn without(live: Vec<Range>, (b, ws, we): Range) -> Vec<Range> {
    live.into_iter()
        .flat_map(|(lb, s, e)| {
            if lb == b {
                [(lb, s, e.min(ws)), (lb, s.max(we), e)]
            } else {
                [(lb, s, e), (lb, 0, 0)]
            }
        })
        .filter(|&(_, s, e)| s < e)
        .collect()
}

/// Whether `t` touches a byte of `live` (a tensor without a layout touches all of its buffer).
fn touches(t: &TensorRef, live: &[Range]) -> bool {
    let (b, s, e) = range(t).unwrap_or((t.buffer, 0, u64::MAX));
    live.iter().any(|&(lb, ls, le)| lb == b && s < le && ls < e)
}

/// Whether a call of `later` reads bytes that the calls of `group`, run one by one, would leave
/// holding a result the fused kernels do not write (every result not in `written`), before a call
/// writes over them. Reads of `copy_of` by the first later call do not count: it takes that
/// result's Q8_1 copy instead. A result without a layout counts as read.
pub(super) fn skipped_read_later(
    group: &[OpCall],
    written: &[TensorRef],
    later: &[OpCall],
    copy_of: Option<&TensorRef>,
) -> bool {
    let mut stale = Vec::new();
    for c in group {
        let Some(r) = range(&c.dst) else {
            return true;
        };
        stale = without(stale, r);
        if !written.contains(&c.dst) {
            stale.push(r);
        }
    }
    for (i, c) in later.iter().enumerate() {
        if stale.is_empty() {
            return false;
        }
        let takes_copy = |u: &TensorRef| {
            i == 0 && copy_of.is_some_and(|o| u.buffer == o.buffer && u.offset == o.offset)
        };
        if c.srcs()
            .iter()
            .any(|u| !takes_copy(u) && touches(u, &stale))
        {
            return true;
        }
        let Some(r) = range(&c.dst) else {
            return true;
        };
        stale = without(stale, r);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::tensor_at;
    use bloomery_plugin_api::op::Op;
    use bloomery_plugin_api::DType;

    fn tensor(buffer: u64, dtype: DType, ne: [u64; 4]) -> TensorRef {
        tensor_at(buffer, 0, dtype, ne)
    }

    #[test]
    fn a_norm_result_counts_as_read_until_all_its_bytes_are_overwritten() {
        // q's normed rows: 4 heads of 8 floats (128 bytes) at offset 0 of buffer 1; k's normed
        // rows are later placed over its first 32 bytes.
        let at = |offset, ne: [u64; 4]| TensorRef {
            offset,
            ..tensor(1, DType::F32, ne)
        };
        let q_normed = at(0, [8, 4, 1, 1]);
        let k_normed = at(0, [8, 1, 1, 1]);
        let k_x = tensor(2, DType::F32, [8, 1, 1, 1]);
        let k_out = tensor(3, DType::F32, [8, 1, 1, 1]);
        let k_norm = OpCall::new(Op::RmsNorm { eps: 1e-6 }, &[k_x], k_normed);
        let k_rope = OpCall::new(Op::Add, &[k_normed, k_x], k_out);
        // Reading k's rows reads bytes k's norm wrote, not q's.
        assert!(!read_later(&q_normed, &[k_norm, k_rope]));
        // A read of q's other bytes is a read of q's rows...
        let tail = at(64, [8, 1, 1, 1]);
        let reader = OpCall::new(Op::Add, &[tail, k_x], k_out);
        assert!(read_later(&q_normed, &[k_norm, k_rope, reader]));
        // ...unless a write covered them first.
        let cover = OpCall::new(Op::Add, &[k_x, k_x], at(32, [24, 1, 1, 1]));
        assert!(!read_later(&q_normed, &[k_norm, cover, reader]));
        // Without the k norm's write, k's rope reads q's bytes.
        assert!(read_later(&q_normed, &[k_rope]));
    }
}
