//! Resolved tensors and op calls: what the host hands a kernel plugin to run.

use abi_stable::StableAbi;

use crate::op::Op;
use crate::DType;

/// A tensor in device memory: a buffer handle, a byte offset, a type and a strided shape.
///
/// `buffer` is a handle returned by the device's `alloc` or `map_host` (a plain integer; on CPU
/// devices it is the address of the buffer). `nb[i]` is the byte stride of dimension `i`; for
/// quantized types `nb[0]` is the block size in bytes and rows are whole blocks.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TensorRef {
    /// Device buffer handle.
    pub buffer: u64,
    /// Byte offset of element (0,0,0,0) in the buffer.
    pub offset: u64,
    /// Element type.
    pub dtype: DType,
    /// Extents, ne0 contiguous; unused dimensions are 1.
    pub ne: [u64; 4],
    /// Byte strides.
    pub nb: [u64; 4],
}

impl Default for DType {
    fn default() -> Self {
        DType::F32
    }
}

impl TensorRef {
    /// Contiguous byte strides for `ne` of type `dtype`, or `None` for an unknown type or a row
    /// that is not whole blocks.
    pub fn contiguous_strides(dtype: DType, ne: [u64; 4]) -> Option<[u64; 4]> {
        let row = dtype.row_bytes(ne[0])?;
        let l = dtype.layout()?;
        let nb1 = row;
        let nb2 = nb1.checked_mul(ne[1])?;
        let nb3 = nb2.checked_mul(ne[2])?;
        Some([u64::from(l.bytes), nb1, nb2, nb3])
    }

    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Rows (product of ne1..ne3).
    pub fn rows(&self) -> u64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// True when the strides are the contiguous ones for the shape.
    pub fn is_contiguous(&self) -> bool {
        TensorRef::contiguous_strides(self.dtype, self.ne) == Some(self.nb)
    }

    /// Bytes spanned from the first to one past the last element, for bounds checks.
    pub fn span_bytes(&self) -> Option<u64> {
        let row = self.dtype.row_bytes(self.ne[0])?;
        let mut end = row;
        for d in 1..4 {
            if self.ne[d] == 0 {
                return Some(0);
            }
            end = end.checked_add(self.nb[d].checked_mul(self.ne[d] - 1)?)?;
        }
        Some(end)
    }

    /// Whether `self` and `other` share a byte of one buffer (a tensor without a valid layout is
    /// taken to cover all of its buffer).
    pub fn shares_bytes(&self, other: &TensorRef) -> bool {
        let bytes = |t: &TensorRef| {
            t.span_bytes()
                .map_or((0, u64::MAX), |n| (t.offset, t.offset.saturating_add(n)))
        };
        let ((s1, e1), (s2, e2)) = (bytes(self), bytes(other));
        self.buffer == other.buffer && s1 < e2 && s2 < e1
    }
}

/// The most sources an op takes (a verify pass's `DeltaRule`: eight and its row states).
pub const MAX_SRCS: usize = 9;

/// One op to run: the op, its sources and its destination, all resolved to device memory.
/// Built once per graph by the host and replayed every step (inputs change, handles do not).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct OpCall {
    /// The op and its parameters.
    pub op: Op,
    /// Sources used (the first `n_srcs` of `srcs`).
    pub n_srcs: u32,
    /// Sources.
    pub srcs: [TensorRef; MAX_SRCS],
    /// Destination.
    pub dst: TensorRef,
}

impl OpCall {
    /// A call of `op` on `srcs` (at most [`MAX_SRCS`]; the unused slots repeat `dst`) into `dst`.
    pub fn new(op: Op, srcs: &[TensorRef], dst: TensorRef) -> OpCall {
        assert!(srcs.len() <= MAX_SRCS, "{} sources", srcs.len());
        let mut all = [dst; MAX_SRCS];
        all[..srcs.len()].copy_from_slice(srcs);
        OpCall {
            op,
            n_srcs: srcs.len() as u32,
            srcs: all,
            dst,
        }
    }

    /// The sources in use.
    pub fn srcs(&self) -> &[TensorRef] {
        &self.srcs[..(self.n_srcs as usize).min(MAX_SRCS)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_and_span() {
        let ne = [512, 3, 2, 1];
        let nb = TensorRef::contiguous_strides(DType::Q4_K, ne).unwrap();
        assert_eq!(nb, [144, 288, 864, 1728]);
        let t = TensorRef {
            buffer: 1,
            offset: 0,
            dtype: DType::Q4_K,
            ne,
            nb,
        };
        assert!(t.is_contiguous());
        assert_eq!(t.span_bytes(), Some(1728));
        assert_eq!(t.rows(), 6);
    }

    #[test]
    fn shared_bytes_need_one_buffer_and_overlapping_spans() {
        let f32 = |buffer, offset, n| TensorRef {
            buffer,
            offset,
            dtype: DType::F32,
            ne: [n, 1, 1, 1],
            nb: TensorRef::contiguous_strides(DType::F32, [n, 1, 1, 1]).unwrap(),
        };
        let a = f32(1, 64, 16);
        assert!(a.shares_bytes(&f32(1, 124, 4)));
        assert!(!a.shares_bytes(&f32(1, 128, 4)));
        assert!(!a.shares_bytes(&f32(1, 0, 16)));
        assert!(!a.shares_bytes(&f32(2, 64, 16)));
        // Without a layout (a row of Q4_K that is not whole blocks), the whole buffer.
        let odd = TensorRef {
            dtype: DType::Q4_K,
            ne: [100, 1, 1, 1],
            ..f32(1, 4096, 1)
        };
        assert!(odd.shares_bytes(&a) && a.shares_bytes(&odd));
    }
}
